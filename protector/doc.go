// Package protector is the RADIC protector's recovery state machine: per
// node, it decides who restarts which group where, when a node may be
// treated as dead, when this node must fence itself, and who re-protects
// whose critical data (DESIGN.md contracts 7 and 9, issue 10; RADIC
// thesis 2.4 and 3.3).
//
// The core ([Machine]) is pure: no goroutines, sockets or clock. Time
// comes in with every input; outputs are drained with [Machine.Ready]:
// [Action]s for the radicd edge to execute, finished recoveries
// ([Record], for radic_recovery_seconds and the per-phase histograms),
// and when to call [Machine.Tick] next. The edge must call Tick by then:
// a gap longer than FenceTimeout is taken as a stall of this node.
//
// # Model
//
// The nodes are a ring in id order: the active nodes and the spares
// (watched like the others, counted for the majority). A semi-coordinated
// group is the processes of one node; it is named by the node it was
// launched on ([GroupID]), checkpoints and restarts as a whole, and keeps
// its name and its processes' logical ids when it moves. A group's
// critical data (launch records, checkpoint, log) lives on the next k
// alive active nodes after its host (Config.Protectors), as in heartbeat's
// Protectors; a spare becomes active, and protects others, once it hosts
// a group.
//
// The only shared state is one [Placement] per group, with two parts of
// one writer each: the host part (host, epoch, stage), written by the
// machine of the node that runs the group, and the protection part (the
// ordered holders of its data), written by the group's steward. The
// steward is the first alive holder other than the host; failing that the
// host itself (with a fresh checkpoint when it holds no copy). The steward
// of a group whose host died is its recoverer. Every change is sent to all
// machines (ActAnnounce -> [Machine.Learn]); they are repeated when a node
// comes back into reach.
//
// # Inputs
//
//	View(reachable)        heartbeat: who this node hears from (majority, fencing)
//	Suspect(x)             watchdog fired or an observer escalated: detect clock starts
//	Refuted(x)             the suspicion was cleared: a later failure's clock starts afresh
//	Declared(x, fenced)    heartbeat declared x dead (fenced: x announced its fence)
//	Learn(placement)       another machine's Announce
//	Started/Reconnected/Live(g, epoch)   this node's edge, for a group it (re)started
//	Exited(g, proc)        a process of a group hosted here died (kill-rank)
//	Stopped(g, epoch)      after ActStop
//	RestartFailed/Aborted  after ActRestart / ActAbort
//	Reprotected/ReprotectFailed  after ActReprotect
//	Tick(now)              timers
//
// # Recovery of a dead node's group
//
//	 Suspect       Declared          confirmed           Started         Reconnected      Live
//	---------> detect -------> confirm ------> restart -------> reconnect -----> replay -----> live
//	                              |               |  ^  |                                        |
//	                              |     timeout:  |  |  | target died, refused, or aborted       | and
//	                              |     Abort ----+  +--+ -> next target; none: ErrNoTarget      | protected
//	                              |                     +--> reprotect (beside reconnect/replay) -+--> Record
//	                              +-- no holder alive: ErrDataLost
//
// Confirm: a declaration is acted on only by a machine whose View holds a
// strict majority of the ring, and only once the node's processes are
// known gone: it announced its fence, or it has been out of this node's
// View for DeclareTimeout while that View held a majority (what a node
// misses while it is itself cut off says nothing of the missing node,
// which may have kept its majority and not fenced). The recoverer then restarts the group on the
// lowest free spare in reach (the one the heartbeat promotes), else on its
// own node. Each attempt has its own epoch; a target that does not start
// the group within RestartTimeout is sent ActAbort, and the next target is
// tried only once it answers Aborted or is itself confirmed dead, so that
// a slow start never makes a second copy. The new host announces itself
// (Started); the ring repair (ActRepairRing) is emitted by every machine
// that confirms a death; the steward re-protects as soon as the group has
// started, because until then its data may sit on its new host alone.
//
// Announcements are best effort: one lost to a node that never left
// anybody's View (a freeze shorter than the heartbeat timeout, a push that
// timed out) is repaired because every machine repeats the placements it
// writes every AnnounceEvery, and at once when a node comes back into reach.
//
// A recovery ends with a Record when the group is live and its data is on
// all its new protectors; ReconnectTimeout and ReplayTimeout bound those
// phases, and a failure is an ActFailed with a [*RecoveryError] naming the
// group, the phase and the node.
//
// Kill-rank: a single process of a live node exits. Its group restarts as
// a whole, in place: the host stops the rest of the group (ActStop,
// Stopped), then restarts it on itself from its data on the steward. The
// node is healthy, so no fence, ring repair, spare or re-protection is
// needed; a spare is the fallback if the in-place restart fails.
//
// The death of a node that protects others needs no restart of those
// groups: their steward (the next holder, or their host with a fresh
// checkpoint when it was the only one) sends their data to their new
// protectors. With the exec backend a host cannot checkpoint, so with k=1
// the loss of its only protector is reported (ErrUnprotected) and the
// group runs on unprotected.
//
// # Timers
//
//	FenceTimeout      no majority in the View for this long: fence (ActFence)
//	DeclareTimeout    out of the View for this long: may be confirmed dead
//	FenceMargin       DeclareTimeout - FenceTimeout >= FenceMargin > 0 (Validate)
//	RestartTimeout    per restart target (and for ActStop)
//	ReconnectTimeout, ReplayTimeout, ReprotectTimeout (x ReprotectAttempts)
//	AnnounceEvery     repeat this machine's placements (anti-entropy)
//
// Views lag the truth by about a heartbeat timeout on both sides of a cut,
// so a cut-off node fences about FenceTimeout after the cut and its peers
// confirm it about DeclareTimeout after; FenceMargin covers the difference
// between their lags and the time the edge takes to kill the processes.
// A node that was not scheduled for longer than FenceTimeout (frozen)
// fences on its first input, before it acts on anything.
//
// # Invariants (checked after every step of the simulated ring in the tests)
//
//   - No group runs in two places: a group is restarted only after its
//     host is confirmed dead (fenced or out of reach longer than it may run
//     without a majority), or stopped by its own host (kill-rank), and an
//     attempt is abandoned only when its target says so or dies.
//   - Restarts are ordered only from a strict majority of the ring; a
//     minority fences itself; a ring split in halves fences everyone.
//   - A node is treated as dead only if it crashed, froze or fenced.
//   - After recovery, every group runs once, live, and its data is on its
//     k protectors, none of them its host — or a failure was reported.
//
// Beyond the model: more than k simultaneous losses of a group's host and
// holders (ErrDataLost), no other active node to protect a group
// (ErrNoProtector), and asymmetric reachability (A hears B, B does not hear
// A), which the View cannot express.
package protector
