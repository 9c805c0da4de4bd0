// Package heartbeat is the protectors' failure detector: a ring of radicd
// daemons ordered by node id, in which every member heartbeats its ring
// neighbours and watches its predecessor with a watchdog, as the RADIC
// protectors do (thesis 2.4, 3.3).
//
// The protocol core ([Node]) is pure: it has no goroutines, sockets or clock.
// Inputs are [Node.Step] (a datagram from a peer), [Node.Tick] (time has
// passed) and [Node.Suspect] (an observer escalated a socket error); outputs
// are drained with [Node.Ready]: datagrams to send, events for the protector
// (a node declared dead, a node joined, fence yourself, rejoin) and the time
// of the next deadline. [Runner] drives one Node over a [Transport] with real
// (or synctest) time; hbtest holds an in-memory Transport with drop, cut and
// isolate, and hbudp the UDP one.
//
// # Detection
//
// Each member sends a heartbeat every Period to its ring predecessor and
// successor. The watchdog of node X runs on X's ring successor (its monitor):
//
//	      heartbeat or any datagram from X
//	     +--------------------------------+
//	     v                                |
//	+---------+  silence > Timeout   +---------+  no answer within  +------+
//	|  alive  | -------------------> | suspect | -----------------> | dead |
//	+---------+  (watchdog fires,    +---------+  ProbeTimeout      +------+
//	     ^        direct probe +          |        (declared,
//	     |        indirect probes         |         gossiped)
//	     +--------------------------------+
//	        X answers directly or through a prober
//
// A missed deadline is only a suspicion: the monitor probes X directly and
// asks up to Probers other members to probe X for it. An answer through any
// path refutes the suspicion, so a cut link or one slow path is not a dead
// node. A node that announces it fenced itself, or that reappears with a new
// incarnation before its old one was declared, is declared at once.
//
// # Fencing and incarnations
//
// A member that has heard from no other ring member for FenceTimeout fences
// itself: the runner stops its managed processes. FenceTimeout is shorter
// than the earliest moment a peer can declare the member dead
// (Timeout + ProbeTimeout - Period), so a cut-off node has stopped its
// processes before anybody restarts them elsewhere. A fenced node keeps
// announcing that it is fenced and stays fenced until it learns that it was
// declared dead; then it rejoins under a new incarnation.
//
// Every member carries an incarnation number that grows with each start and
// each rejoin. Membership entries (id, incarnation, state, role) are
// gossiped in every heartbeat and merged by taking the larger of
// (incarnation, state, role), so a declaration reaches the whole ring and
// datagrams from a dead or older incarnation are rejected.
//
// # Ring, spares and protection
//
// The ring is the set of alive members in id order. Spare members are in
// the ring (they are watched like everyone else) but protect nobody and are
// protected by nobody until the monitor of a dead active member promotes the
// lowest-numbered alive spare. A node's critical data lives on its next
// Protectors alive active members ([Status].Members[].Protectors).
package heartbeat
