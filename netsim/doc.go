// Package netsim emulates the Blue Gene networks the daemons talk over.
//
// The torus ([Shape], [TorusHeader]) is an X x Y x Z mesh whose every
// dimension wraps around. A packet carries at most [TorusPayload] (240)
// bytes behind a 16-byte header and moves hop by hop along the
// dimension-order route ([Shape.NextHop]): X first, then Y, then Z, each
// the shorter way round. One fixed path per pair means routing never
// reorders a flow; the faults do.
//
// The collective network ([Tree], [Switch], [TreeHeader]) is a binary tree
// over the node ids with [TreePayload] (256) byte packets. Broadcast and
// reduce are done by the switches, as on the machine: a broadcast climbs to
// the root and descends to everybody; reduce contributions are combined
// lane by lane ([ReduceOp]) on the way up and the root sends one result
// down, so a reduction over N nodes costs 2(N-1) packets.
//
// [Sim] is an in-memory machine with a virtual clock for simulations far
// larger than a real cluster (tests run 4,096 nodes), with seeded faults
// ([Faults]: drop, duplicate, reorder) plus link down and node crash.
// Package udplink runs the same packets over UDP between real processes,
// each one a torus node forwarding for the others.
//
// Wire formats are in wire.go; every header also has a gopacket layer in
// bulktransport/bglayers.
package netsim
