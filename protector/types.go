package protector

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/radic-project/radic/heartbeat"
)

// NodeID names a radicd node, as in the heartbeat ring.
type NodeID = heartbeat.NodeID

// None is the NodeID used where no node is meant.
const None = heartbeat.None

// GroupID names a semi-coordinated group. It is the id of the node the
// group was launched on and never changes when the group moves.
type GroupID uint32

// ProcID is a process's logical id (contract 3): the same after a restart.
type ProcID uint64

// Stage is how far a (re)started group has come, as its host reports it.
type Stage uint8

// Stages in order: a larger stage wins at equal epoch.
const (
	StageStarted     Stage = iota + 1 // processes started, replaying or waiting for peers
	StageReconnected                  // the peers' safe sockets resumed with it
	StageLive                         // replay exhausted, running live (launched groups start here)
)

func (s Stage) String() string {
	switch s {
	case StageStarted:
		return "started"
	case StageReconnected:
		return "reconnected"
	case StageLive:
		return "live"
	}
	return fmt.Sprintf("Stage(%d)", uint8(s))
}

// Placement is what the cluster knows of one group: where it runs and who
// holds its critical data. It is the only state machines share (through
// Announce and Learn). It has two parts with one writer each, merged
// independently, so no two machines ever race to write the same field:
// the host part is written by the machine of the group's host, the
// protection part by the group's steward (see doc.go).
type Placement struct {
	Group GroupID
	Procs []ProcID

	// Host part: newer (Epoch, Stage) wins.
	Host  NodeID
	Epoch uint64 // 0 as launched, +1 for each restart attempt
	Stage Stage

	// Protection part: newer (HoldersVer, HoldersBy) wins.
	Holders    []NodeID // ordered: the first alive one is the steward
	HoldersVer uint64
	HoldersBy  NodeID
}

func (p Placement) clone() Placement {
	p.Procs = slices.Clone(p.Procs)
	p.Holders = slices.Clone(p.Holders)
	return p
}

// ActionKind says what an Action asks the edge to do.
type ActionKind uint8

// Actions, executed by the radicd edge of the node whose Machine emitted
// them. Each names the acknowledgment it expects.
const (
	// ActFence: stop every job process on this node now (Groups lists the
	// groups hosted here). No acknowledgment: the Machine is inert from
	// now on; the edge makes a new one when the node rejoins.
	ActFence ActionKind = iota + 1
	// ActStop: kill-rank. A process of Group (at Epoch) exited; stop the
	// rest of the group on this node, then call Stopped.
	ActStop
	// ActRestart: start Group at Epoch on Node from its launch records,
	// checkpoint and log, fetched from From. The edge on Node calls its
	// Machine's Started (then Reconnected, Live); if it cannot, the edge
	// here calls RestartFailed. Node must never start an Epoch it was told
	// to Abort.
	ActRestart
	// ActAbort: a Restart of Group at Epoch on Node timed out; Node must
	// not start it (and stop it if it did). Then call Aborted here.
	ActAbort
	// ActAnnounce: send Placement to every other node's Machine (Learn)
	// and, when the host part changed, publish the new locations of its
	// processes' logical addresses in the location table (reconfigure/).
	ActAnnounce
	// ActRepairRing: the ring changed: Ring, and this node's Pred and
	// Succ in it. Informational for the heartbeat ring and the logs.
	ActRepairRing
	// ActReprotect: send Group's critical data from From (this node) to
	// the nodes To, then call Reprotected or ReprotectFailed. With
	// Checkpoint, From is the group's host and no holder is left: take a
	// fresh checkpoint of the running group and send that.
	ActReprotect
	// ActFailed: recovery or protection of Group failed in Phase with
	// Err (a *RecoveryError). The job must stop with Err, except for
	// ErrUnprotected and ErrNoProtector, where it runs on unprotected
	// (a warning, and a further failure of its host is fatal).
	ActFailed
)

func (k ActionKind) String() string {
	switch k {
	case ActFence:
		return "fence"
	case ActStop:
		return "stop"
	case ActRestart:
		return "restart"
	case ActAbort:
		return "abort"
	case ActAnnounce:
		return "announce"
	case ActRepairRing:
		return "repair-ring"
	case ActReprotect:
		return "reprotect"
	case ActFailed:
		return "failed"
	}
	return fmt.Sprintf("ActionKind(%d)", uint8(k))
}

// Action is one thing for the edge to do. Fields not named by the Kind's
// comment are zero.
type Action struct {
	Kind       ActionKind
	Group      GroupID
	Epoch      uint64
	Node       NodeID   // Restart, Abort: the target
	From       NodeID   // Restart, Reprotect: where the data comes from
	To         []NodeID // Reprotect
	Procs      []ProcID // Restart, Stop
	Checkpoint bool     // Reprotect
	Groups     []GroupID
	Placement  Placement // Announce
	Ring       []NodeID  // RepairRing
	Pred, Succ NodeID    // RepairRing
	Phase      Phase     // Failed
	Err        error     // Failed; Fence: why
}

// Phase is a step of a recovery; each is timed.
type Phase uint8

// Phases. Reprotect runs beside Reconnect and Replay: it starts when the
// group has started, because until then its data may sit on its new host
// alone.
const (
	PhaseDetect    Phase = iota // first suspicion -> declared by the heartbeat (kill-rank: 0)
	PhaseConfirm                // declared -> confirmed: fence deadline passed (kill-rank: group stopped)
	PhaseRestart                // confirmed -> the group started somewhere (all attempts)
	PhaseReconnect              // started -> peers resumed
	PhaseReplay                 // reconnected -> live
	PhaseReprotect              // started -> its data on its new protectors
	NumPhases
)

func (p Phase) String() string {
	switch p {
	case PhaseDetect:
		return "detect"
	case PhaseConfirm:
		return "confirm"
	case PhaseRestart:
		return "restart"
	case PhaseReconnect:
		return "reconnect"
	case PhaseReplay:
		return "replay"
	case PhaseReprotect:
		return "reprotect"
	}
	return fmt.Sprintf("Phase(%d)", uint8(p))
}

// Recovery causes (Record.Cause, a metrics label).
const (
	CauseNode    = "node"    // the group's node died
	CauseProcess = "process" // one of its processes exited (kill-rank)
)

// Record is one finished recovery, for radic_recovery_seconds and the
// per-phase histograms. It is produced by the machine that drove the
// recovery (the recoverer), which is where all its phases were seen.
type Record struct {
	Group    GroupID
	Cause    string
	From, To NodeID // old and new host
	Epoch    uint64
	Start    time.Time // first suspicion (or the process exit)
	End      time.Time // live and re-protected, or the failure
	Total    time.Duration
	Phases   [NumPhases]time.Duration // zero for phases not reached
	Attempts int                      // restart targets tried
	Err      error                    // nil when the group is live and protected again
}

// Sentinels; a *RecoveryError wraps one of them.
var (
	ErrNoTarget    = errors.New("protector: no node to restart on")
	ErrDataLost    = errors.New("protector: every holder of the group's critical data died")
	ErrNoProtector = errors.New("protector: no other active node left to protect the group")
	ErrUnprotected = errors.New("protector: re-protection failed")
	ErrTimeout     = errors.New("protector: phase timed out")
	ErrHostDied    = errors.New("protector: the new host died during recovery")
	ErrFenced      = errors.New("protector: this node fenced itself")
	ErrStale       = errors.New("protector: unexpected acknowledgment")
)

// RecoveryError says which group failed where.
type RecoveryError struct {
	Group GroupID
	Phase Phase
	Node  NodeID // the host involved (old or target)
	Err   error
}

func (e *RecoveryError) Error() string {
	return fmt.Sprintf("recovery of group %d (node %d) failed in %v: %v", e.Group, e.Node, e.Phase, e.Err)
}

func (e *RecoveryError) Unwrap() error { return e.Err }

// Stats are the machine's counters; read them with atomic loads from any
// goroutine.
type Stats struct {
	Confirmed       atomic.Uint64 // nodes confirmed dead here
	Fences          atomic.Uint64
	Recoveries      atomic.Uint64 // finished here, successful
	Failures        atomic.Uint64 // ActFailed emitted
	Restarts        atomic.Uint64 // ActRestart emitted
	RestartsAborted atomic.Uint64 // attempts that timed out or failed
	KillRank        atomic.Uint64 // recoveries started for an exited process
	Reprotects      atomic.Uint64 // ActReprotect emitted
}
