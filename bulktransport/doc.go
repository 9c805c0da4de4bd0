// Package bulktransport is one node's transport stack over the emulated
// Blue Gene torus (package netsim): reliable messages by delta-t
// (bulktransport/deltat), large messages by bulk messaging with
// receiver-initiated remote get (bulktransport/bulk), and unreliable
// datagrams of up to 64 KiB by fragmentation (bulktransport/frag).
//
// [Endpoint] composes them behind a readmsg/writemsg style API: WriteMsg
// takes a [Msg] whose Data is kept by reference (not copied until it goes
// on the wire; a Bulk message not at all at the sender), ReadMsg returns a
// Msg whose Data points into the packet or reassembly buffer. The
// protocol is chosen by size, as UCX does (seed 002): one packet (Short),
// a fragmented copy over delta-t (Copy), or a bulk remote get (Bulk), with
// configurable thresholds (see [Config.Select] and BenchmarkProtocols).
// Per-peer state (the torus header with both coordinates) is resolved once
// while a peer is active and dropped with its protocol records, so an
// endpoint whose peers are all quiet holds nothing per peer.
//
// Everything here is a pure core: no goroutines, sockets or clock. The
// caller passes the time in and moves the packets (netsim.Sim in tests,
// netsim/udplink between processes). Wire formats, state diagrams and
// timers are in PROTOCOL.md; bulktransport/bglayers decodes every header
// with gopacket and writes pcap traces for deploy/radic-bg.lua.
//
// Status: the cores, the simulation and the packet layers are done;
// radicd does not use them yet (no --fabric flag).
package bulktransport
