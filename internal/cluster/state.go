package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/radic-project/radic/internal/cluster/proc"
)

// Modes of a cluster.
const (
	ModeNetns    = "netns"    // a network namespace and a cgroup per node (root)
	ModeLoopback = "loopback" // a 127.x.y.z address and process groups per node
)

// Well-known ports of a node's radicd.
const (
	RadicdPort  = 7470
	MetricsPort = 9470
)

// StateFile is the name of the state file inside the state directory.
const StateFile = "state.json"

// State describes one cluster. It is the single record `cluster down` works
// from, so everything the cluster creates is written here before it is
// created.
type State struct {
	Version   int       `json:"version"`
	Name      string    `json:"name"`
	Mode      string    `json:"mode"`
	Dir       string    `json:"dir"`
	Subnet    string    `json:"subnet"`              // e.g. 10.77.0.0/16
	HostAddr  string    `json:"host_addr,omitempty"` // host side of the bridge (netns)
	Bridge    string    `json:"bridge,omitempty"`
	NftTable  string    `json:"nft_table,omitempty"` // bridge-family table
	Cgroup    string    `json:"cgroup,omitempty"`    // the cluster's cgroup directory
	Daemons   bool      `json:"daemons"`             // radicd runs on every node
	FenceKill bool      `json:"fence_kill"`          // radicd kills a cut-off node's job
	Fabric    string    `json:"fabric,omitempty"`    // radicd --fabric; "": radicd's default
	Phase     string    `json:"phase"`               // "creating", "up"
	Created   time.Time `json:"created"`

	Nodes     []Node     `json:"nodes"`
	Resources []Resource `json:"resources"` // in creation order
	Jobs      []Job      `json:"jobs,omitempty"`
	Faults    []Fault    `json:"faults,omitempty"`
	NextJob   int        `json:"next_job"`
	NextFault int        `json:"next_fault"`
}

// Node is one node of the cluster.
type Node struct {
	ID          int      `json:"id"`
	Name        string   `json:"name"`         // n0, n1, ...
	Addr        string   `json:"addr"`         // current address
	LogicalAddr string   `json:"logical_addr"` // the address it was created with
	Generation  int      `json:"generation"`   // how many times it was readdressed
	Spare       bool     `json:"spare"`
	Netns       string   `json:"netns,omitempty"`  // namespace name (netns mode)
	Veth        string   `json:"veth,omitempty"`   // host end of its veth pair
	Cgroup      string   `json:"cgroup,omitempty"` // node cgroup directory
	DaemonCg    string   `json:"daemon_cgroup,omitempty"`
	JobCg       string   `json:"job_cgroup,omitempty"`
	RadicdAddr  string   `json:"radicd_addr"`  // IP:port of its radicd
	MetricsAddr string   `json:"metrics_addr"` // IP:port, reachable from the host
	StateDir    string   `json:"state_dir"`    // radicd's --state-dir
	Radicd      *proc.ID `json:"radicd,omitempty"`

	Dead     bool `json:"dead,omitempty"`      // kill-node
	LinkDown bool `json:"link_down,omitempty"` // cut-link
	Frozen   bool `json:"frozen,omitempty"`    // freeze
}

// Resource kinds, in the order `down` would meet them reversed.
const (
	ResNetns  = "netns"
	ResLink   = "link"
	ResNft    = "nft"
	ResCgroup = "cgroup"
	ResProc   = "proc"
	ResDir    = "dir"
)

// Resource is one thing the cluster created.
type Resource struct {
	Kind string   `json:"kind"`
	Name string   `json:"name"`           // netns/link/table name, cgroup or dir path
	Proc *proc.ID `json:"proc,omitempty"` // for ResProc
	What string   `json:"what,omitempty"` // for ResProc: "radicd n2", ...
}

// Job is a running `radic run`.
type Job struct {
	ID       string    `json:"id"`
	Launcher proc.ID   `json:"launcher"` // the `radic run` process
	Started  time.Time `json:"started"`
	Argv     []string  `json:"argv"`
	Ranks    []Rank    `json:"ranks"`
}

// Rank is one process of a job.
type Rank struct {
	Rank int     `json:"rank"`
	Node int     `json:"node"`
	Addr string  `json:"addr"` // its RADIC_PEERS entry
	Proc proc.ID `json:"proc"`
}

// Fault kinds, as named on the command line.
const (
	FaultKillNode  = "kill-node"
	FaultKillRank  = "kill-rank"
	FaultCutLink   = "cut-link"
	FaultPartition = "partition"
	FaultFreeze    = "freeze"
	FaultReaddress = "readdress"
)

// Fault is an active fault that can be undone (cut-link, partition,
// freeze); instantaneous ones (kill-*, readdress) are not kept.
type Fault struct {
	ID    int       `json:"id"`
	Kind  string    `json:"kind"`
	Nodes []int     `json:"nodes"`
	Chain string    `json:"chain,omitempty"` // partition: its nft chain
	Since time.Time `json:"since"`
	Until time.Time `json:"until,omitzero"`  // zero: until healed
	Timer *proc.ID  `json:"timer,omitempty"` // the fault-timer process
}

// DefaultStateDir is where the cluster state lives: $RADIC_STATE_DIR, else
// /run/radic/cluster as root, else a per-user runtime directory.
func DefaultStateDir() string {
	if d := os.Getenv("RADIC_STATE_DIR"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/run/radic/cluster"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "radic", "cluster")
	}
	return filepath.Join(os.TempDir(), "radic-"+strconv.Itoa(os.Geteuid()), "cluster")
}

// ErrNoCluster is returned when the state directory holds no cluster.
var ErrNoCluster = errors.New("cluster: no cluster")

// Load reads the state of the cluster kept in stateDir.
func Load(stateDir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, StateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s (start one with `radic cluster up`)", ErrNoCluster, stateDir)
	}
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("cluster: read %s: %w", filepath.Join(stateDir, StateFile), err)
	}
	return &s, nil
}

// save writes s atomically (temporary file + rename).
func save(dir string, s *State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, StateFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, StateFile))
}

// lock takes the state directory's lock; the caller calls the returned
// function to release it.
func lock(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("state lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("state lock: %w", err)
	}
	return func() { f.Close() }, nil
}

// Update loads the state under the lock, calls fn and saves the result if fn
// succeeds.
func Update(dir string, fn func(*State) error) error {
	unlock, err := lock(dir)
	if err != nil {
		return err
	}
	defer unlock()
	s, err := Load(dir)
	if err != nil {
		return err
	}
	if err := fn(s); err != nil {
		return err
	}
	return save(dir, s)
}

// Node returns the node with that id.
func (s *State) Node(id int) (*Node, error) {
	for i := range s.Nodes {
		if s.Nodes[i].ID == id {
			return &s.Nodes[i], nil
		}
	}
	return nil, fmt.Errorf("no node %d (the cluster has nodes 0..%d)", id, len(s.Nodes)-1)
}

// Workers returns the ids of the live, non-spare nodes.
func (s *State) Workers() []int {
	var ids []int
	for _, n := range s.Nodes {
		if !n.Spare && !n.Dead {
			ids = append(ids, n.ID)
		}
	}
	return ids
}

// record appends a resource to the state and saves it: called before the
// resource is created.
func (s *State) record(r Resource) error {
	s.Resources = append(s.Resources, r)
	return save(s.Dir, s)
}

// pruneJobs forgets jobs whose launcher and ranks are all gone (a `radic
// run` that was killed before it could remove its job).
func (s *State) pruneJobs() {
	kept := s.Jobs[:0]
	for _, j := range s.Jobs {
		alive := j.Launcher.Alive()
		for _, r := range j.Ranks {
			alive = alive || r.Proc.Alive()
		}
		if alive {
			kept = append(kept, j)
		}
	}
	s.Jobs = kept
}
