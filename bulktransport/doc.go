// Package bulktransport holds the transports over netsim: fragmentation of messages up
// to 64 KiB, the delta-t reliable connectionless protocol, and bulk messaging
// (32-byte header, receiver-initiated remote get, Nak/cancel) behind a
// readmsg/writemsg style API.
//
// Status: planned; nothing is implemented yet.
package bulktransport
