// Package launch is the launch protocol between `radic run` (or any
// launcher) and a node's radicd: the launch record of a rank, its exit
// status, the replies of radicd's /v1/jobs endpoints, and how a launch
// record is kept in the critical-data store (package msglog) of the node's
// protectors. It is pure: no sockets, processes or clocks.
//
// # The launch record
//
// A [Record] is everything needed to start one rank again, the same way:
// job, logical rank, job size, node, program (Path, Argv), its whole
// environment and working directory, and how its stdin and stderr are
// wired. radicd stores it with its protectors before the rank runs, so
// that the protector that restarts a dead node's ranks (issue 10) re-executes
// exactly what was launched.
//
// # In the store
//
// Launch records live in msglog beside the observers' data, kept apart by
// owner: an observer's Owner is a logical process id (32 bits), so the
// 64-bit value [StoreOwner] (2^64-1) can be no process's and holds every
// launch record of the node. Within it, a rank's record is the stream
// [StreamOf](job, rank) (FNV-1a 64 of job, NUL, rank), at offset 0, with
// record kind msglog/record.KindLaunch; the payload is the record's JSON
// encoding ([Encode]), which names job and rank again, so a reader checks
// what it found ([Decode]). msglog appends are idempotent: storing the same
// record twice is harmless; storing a different record for the same job
// and rank is refused as a conflict.
package launch

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/radic-project/radic/msglog/record"
)

// Version is the version of the launch record encoding.
const Version = 1

// Record is one rank's launch record.
type Record struct {
	Version int      `json:"version"`
	Job     string   `json:"job"`
	Rank    int      `json:"rank"` // logical id within the job
	Size    int      `json:"size"` // ranks in the job
	Node    int      `json:"node"` // the node it runs on
	Path    string   `json:"path"` // the program; without a '/', looked up in Env's PATH on the node
	Argv    []string `json:"argv"` // argv[0] included
	Env     []string `json:"env"`  // the whole environment
	Cwd     string   `json:"cwd"`  // working directory (absolute)
	// Stdin asks for a stdin fed through POST .../stdin; else /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// MergeStderr gives the rank one pipe for fds 1 and 2, served as its
	// stdout, so that their order is kept (the launcher's stdout and
	// stderr are one file, as a terminal or `2>&1`).
	MergeStderr bool `json:"merge_stderr,omitempty"`
}

// Validate says what is wrong with r, or nil.
func (r *Record) Validate() error {
	var errs []error
	if r.Version != Version {
		errs = append(errs, fmt.Errorf("version %d, this radicd speaks %d", r.Version, Version))
	}
	if err := CheckJob(r.Job); err != nil {
		errs = append(errs, err)
	}
	if r.Size < 1 || r.Rank < 0 || r.Rank >= r.Size {
		errs = append(errs, fmt.Errorf("rank %d of size %d", r.Rank, r.Size))
	}
	if r.Node < 0 {
		errs = append(errs, fmt.Errorf("node %d", r.Node))
	}
	if r.Path == "" || len(r.Argv) == 0 {
		errs = append(errs, errors.New("no program (path and argv are required)"))
	}
	if !strings.HasPrefix(r.Cwd, "/") {
		errs = append(errs, fmt.Errorf("working directory %q is not absolute", r.Cwd))
	}
	if len(errs) > 0 {
		return fmt.Errorf("bad launch record: %w", errors.Join(errs...))
	}
	return nil
}

// CheckJob says whether a job id can name a job: it goes into URL paths.
func CheckJob(job string) error {
	if job == "" || len(job) > 128 {
		return fmt.Errorf("job id %q: want 1 to 128 characters", job)
	}
	for _, c := range job {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("job id %q: only letters, digits, '-', '_' and '.'", job)
		}
	}
	return nil
}

// StoreOwner is the msglog Owner of every launch record (see the package
// doc: no logical process id is 2^64-1).
const StoreOwner = ^uint64(0)

// StreamOf is the msglog Stream of the launch record of job's rank.
func StreamOf(job string, rank int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(job))
	h.Write([]byte{0})
	h.Write([]byte(strconv.Itoa(rank)))
	return h.Sum64()
}

// Encode is r as the msglog record kept by the protectors.
func Encode(r *Record) (record.Record, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return record.Record{}, err
	}
	return record.Record{Kind: record.KindLaunch, Owner: StoreOwner, Stream: StreamOf(r.Job, r.Rank), Payload: b}, nil
}

// Decode is the launch record held in rec, checked against where it was
// stored.
func Decode(rec record.Record) (*Record, error) {
	if rec.Kind != record.KindLaunch || rec.Owner != StoreOwner || rec.Offset != 0 {
		return nil, fmt.Errorf("not a launch record: kind %v owner %#x offset %d", rec.Kind, rec.Owner, rec.Offset)
	}
	var r Record
	if err := json.Unmarshal(rec.Payload, &r); err != nil {
		return nil, fmt.Errorf("launch record: %w", err)
	}
	if s := StreamOf(r.Job, r.Rank); s != rec.Stream {
		return nil, fmt.Errorf("launch record of job %s rank %d stored under stream %#x, want %#x", r.Job, r.Rank, rec.Stream, s)
	}
	return &r, nil
}

// Started is radicd's answer to a launch: the rank's process, held at its
// gate until Start.
type Started struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"` // start time in clock ticks since boot (/proc/PID/stat field 22)
	// Protectors are the nodes that stored the launch record (empty when
	// the ring has none: a one-node cluster).
	Protectors []int `json:"protectors"`
}

// ExitDiverged is the exit status of a restarted rank whose replay
// diverged (shim/c/conn.c RADIC_EXIT_DIVERGED): it regenerated other bytes
// than its peers had received, and stopped.
const ExitDiverged = 86

// Exit is how a process ended: Signal is non-zero when a signal killed
// it, else Code is its exit status.
type Exit struct {
	Code   int `json:"code"`
	Signal int `json:"signal,omitempty"`
}

// ExitOf reads a wait status.
func ExitOf(ws syscall.WaitStatus) Exit {
	if ws.Signaled() {
		return Exit{Signal: int(ws.Signal())}
	}
	return Exit{Code: ws.ExitStatus()}
}

// Status is the shell's view of e: the code, or 128+signal.
func (e Exit) Status() int {
	if e.Signal != 0 {
		return 128 + e.Signal
	}
	return e.Code
}

// String says how the process ended, as `radic run` reports it:
// "exited with status 3", "was killed by signal 9 (killed)".
func (e Exit) String() string {
	if e.Signal != 0 {
		return fmt.Sprintf("was killed by signal %d (%v)", e.Signal, syscall.Signal(e.Signal))
	}
	return fmt.Sprintf("exited with status %d", e.Code)
}

// States of a rank.
const (
	StateHeld    = "held"    // created, waiting at its gate for Start
	StateRunning = "running" // the program runs
	StateExited  = "exited"  // Exit says how it ended
	// StateRestarting: it died of a fault (a signal it was not sent by
	// its launcher) and its group is being restarted (radic run --recovery);
	// ask where it runs now (GET /v1/recovery/jobs/J on any radicd).
	StateRestarting = "restarting"
)

// RankStatus is radicd's view of one rank (GET /v1/jobs/J/ranks/R).
type RankStatus struct {
	Job   string `json:"job"`
	Rank  int    `json:"rank"`
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
	State string `json:"state"`
	Exit  *Exit  `json:"exit,omitempty"`
	// Epoch is 0 for the instance as launched and grows with each
	// restart of its group: output offsets are per instance.
	Epoch uint64 `json:"epoch,omitempty"`
	// Stdout and Stderr are the byte counts the rank has written so far.
	Stdout uint64 `json:"stdout"`
	Stderr uint64 `json:"stderr"`
}

// Streams a client reads (GET .../output?stream=). Radic is the lines a
// recovery rank's shim writes about its connections (broken, resumed, ...):
// kept out of its stderr, which a restarted instance must regenerate byte
// for byte, and forwarded as they come, never compared.
const (
	Stdout = "stdout"
	Stderr = "stderr"
	Radic  = "radic"
)

// Headers of an output reply.
const (
	// HeaderOffset is the stream offset of the reply body's first byte.
	HeaderOffset = "X-Radic-Offset"
	// HeaderEOF is "1" when the body ends where the stream ends: the rank
	// closed it (exited) and nothing follows.
	HeaderEOF = "X-Radic-Eof"
	// HeaderEpoch is the epoch of the instance that wrote the body
	// (RankStatus.Epoch); a request with epoch=E is refused (409) by any
	// other instance.
	HeaderEpoch = "X-Radic-Epoch"
)

// Signals a launcher may send (POST .../signal?sig=).
var Signals = map[string]syscall.Signal{
	"TERM": syscall.SIGTERM, "KILL": syscall.SIGKILL, "INT": syscall.SIGINT,
	"HUP": syscall.SIGHUP, "CONT": syscall.SIGCONT, "STOP": syscall.SIGSTOP,
}

// SignalName is the name of sig in [Signals] ("" when it has none).
func SignalName(sig syscall.Signal) string {
	for n, s := range Signals {
		if s == sig {
			return n
		}
	}
	return ""
}

// RankLoc is where a rank of a recovery job runs now.
type RankLoc struct {
	Job   string `json:"job"`
	Rank  int    `json:"rank"`
	Group int    `json:"group"` // the node that launched it
	Node  int    `json:"node"`  // the node it runs on now
	Epoch uint64 `json:"epoch"` // 0 as launched, the group's epoch after a restart
	// Finished: this instance exited on its own (no signal) with Exit,
	// and the launcher has read its stdout and stderr to their ends.
	// Nothing of it is left to regenerate: the death of its node no
	// longer restarts it (unless a rank of its group and job that has
	// not finished restarts with it), and the launcher takes its exit
	// from here if the node died before it collected the status.
	Finished bool  `json:"finished,omitempty"`
	Exit     *Exit `json:"exit,omitempty"`
}

// RecoveryEvent is one recovery, as `radic run` prints it.
type RecoveryEvent struct {
	Group   int       `json:"group"`
	Cause   string    `json:"cause"` // node, process
	From    int       `json:"from"`
	To      int       `json:"to"`
	Epoch   uint64    `json:"epoch"`
	Start   time.Time `json:"start"` // first suspicion, or the process exit
	Seconds float64   `json:"seconds"`
	Error   string    `json:"error,omitempty"` // the recovery failed: the job must stop
	Phase   string    `json:"phase,omitempty"` // with Error or Warning: the phase it failed in
	// Warning: the group is live again but not protected (no other node
	// to hold its data, or re-protection failed): the job goes on, and a
	// further failure of its node is fatal.
	Warning string `json:"warning,omitempty"`
	// Replayed is the bytes the restarted processes replayed from their
	// log, when the replay step reported it (absent: not known).
	Replayed *uint64 `json:"replayed_bytes,omitempty"`
	// Phases are the seconds each phase it reached took, by name (detect,
	// confirm, restart, reconnect, replay, reprotect: protector.Phase).
	Phases map[string]float64 `json:"phases,omitempty"`
}

// RecoveryProgress is a recovery under way, as its recoverer (the
// protector driving it) reports it to every daemon, with the replay
// progress its new host reports.
type RecoveryProgress struct {
	Group    int       `json:"group"`
	Cause    string    `json:"cause"` // node, process
	From     int       `json:"from"`
	To       int       `json:"to"` // the current restart target; -1 between attempts
	Epoch    uint64    `json:"epoch"`
	Phase    string    `json:"phase"` // confirm, restart, reconnect, replay, reprotect
	Start    time.Time `json:"start"` // first suspicion, or the process exit
	Since    time.Time `json:"since"` // the current phase's start
	Attempts int       `json:"attempts"`
	By       int       `json:"by"` // the recoverer
	// Replay progress, when the new host reported it: bytes replayed so
	// far, and the log's size (0: not known).
	Replayed    *uint64   `json:"replayed_bytes,omitempty"`
	ReplayTotal uint64    `json:"replay_total_bytes,omitempty"`
	Updated     time.Time `json:"updated"` // when the recoverer last reported it
}

// RecoveryStatus is what one radicd knows of the cluster's recoveries
// (in its /status): those under way, and the last finished ones.
type RecoveryStatus struct {
	InProgress []RecoveryProgress `json:"in_progress"`
	Recent     []RecoveryEvent    `json:"recent"`
}

// Divergence is radic run's report of a restarted rank whose output
// differs from what was delivered (POST /v1/recovery/divergence).
type Divergence struct {
	Job   string `json:"job"`
	Rank  int    `json:"rank"`
	Where string `json:"where"` // output (stdout/stderr), connection
	Error string `json:"error"`
}

// JobRecovery is radicd's GET /v1/recovery/jobs/{job}: where each rank of a
// job launched with recovery runs now, and the recoveries of its groups.
type JobRecovery struct {
	Job    string          `json:"job"`
	Ranks  []RankLoc       `json:"ranks"`
	Events []RecoveryEvent `json:"events"`
}

// HostedEnv is env for a rank hosted on another node than the one it was
// launched for (restarted there, or launched there in place of a lost
// node): RADIC_DAEMON names that node's radicd, daemon, unless it is the
// node-local 127.0.0.1 (netns mode: every node's radicd is there in its
// own namespace). RADIC_NODE stays: it is the rank's logical node, whose
// address the app sees as its own.
func HostedEnv(env []string, daemon string) []string {
	out := make([]string, len(env))
	for i, kv := range env {
		if strings.HasPrefix(kv, "RADIC_DAEMON=") && !strings.HasPrefix(kv, "RADIC_DAEMON=127.0.0.1:") {
			kv = "RADIC_DAEMON=" + daemon
		}
		out[i] = kv
	}
	return out
}
