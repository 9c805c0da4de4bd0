// Package deltat is the delta-t transport (Watson; seed 001, "Transport
// protocols"): reliable, in-order messages between any two nodes with no
// connection set-up or tear-down. A logical connection exists between
// every pair of nodes; it costs nothing until a message is sent, the
// first packet carries data, and the records on both sides disappear by
// timer alone:
//
//	delta-t = MPL + R + A   (maximum packet lifetime, maximum
//	                         retransmission time, maximum ack delay)
//	receiver record: 2 delta-t after the last packet it accepted
//	sender record:   3 delta-t after its last transmission
//
// The sender's record outlives the receiver's, so when a sender starts
// afresh (any initial sequence number) its receiver has forgotten the old
// connection and no old packet is still alive. A receiver without a
// record accepts only a segment marked DRF (data run flag: nothing before
// it was outstanding); the sender retransmits until acknowledged or R has
// passed, then reports the message failed and starts a new data run.
//
// [Endpoint] is a pure core: Send, Step and Tick take the time, Ready
// returns packets, delivered messages, acknowledged and failed messages,
// and the next deadline. Timers sit in one heap, so Tick visits only the
// records that are due; idle peers cost no work and no memory.
// bulktransport/PROTOCOL.md has the wire format and state diagrams.
package deltat
