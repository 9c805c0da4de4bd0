package protector

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Specification constants. A node's View loses a member about one
// heartbeat timeout (300 ms) after its last heartbeat; the defaults then
// fence a cut-off node 300 ms later and let the majority confirm its death
// 600 ms later, so detection plus confirmation stays under 1 s.
const (
	DefaultProtectors        = 1
	DefaultFenceTimeout      = 300 * time.Millisecond
	DefaultDeclareTimeout    = 600 * time.Millisecond
	DefaultFenceMargin       = 200 * time.Millisecond
	DefaultRestartTimeout    = 5 * time.Second
	DefaultReconnectTimeout  = 10 * time.Second
	DefaultReplayTimeout     = 10 * time.Minute
	DefaultReprotectTimeout  = 30 * time.Second
	DefaultReprotectAttempts = 3
	DefaultAnnounceEvery     = time.Second
)

// GroupSpec is a semi-coordinated group as launched: the processes of one
// node, which checkpoint and restart together.
type GroupSpec struct {
	ID    GroupID
	Node  NodeID   // where it was launched
	Procs []ProcID // logical ids of its processes (for Announce)
}

// Config is the cluster as launched and this node's timers. Every node's
// Machine gets the same Config but for Self.
type Config struct {
	Self NodeID
	// Nodes are the active ring members, Spares the nodes that host no
	// group until one is restarted there. Together they are the ring (both
	// are watched, both count for the majority); order does not matter.
	Nodes  []NodeID
	Spares []NodeID
	Groups []GroupSpec
	// Protectors (k): a group's critical data lives on the next k alive
	// active nodes after its host in id order, so k simultaneous losses
	// are survived.
	Protectors int

	// FenceTimeout: a node whose View has shown no strict majority of the
	// ring for this long fences itself. DeclareTimeout: a node may be
	// confirmed dead only after it has been out of this node's View for
	// this long. DeclareTimeout - FenceTimeout must be at least
	// FenceMargin (> 0), which covers the difference between two nodes'
	// View latencies and the time the edge needs to kill the fenced
	// node's processes: that ordering is what makes "fence before declare"
	// hold, so Validate enforces it.
	FenceTimeout   time.Duration
	DeclareTimeout time.Duration
	FenceMargin    time.Duration

	RestartTimeout   time.Duration // Restart sent -> Started seen, per target
	ReconnectTimeout time.Duration // Started -> Reconnected
	ReplayTimeout    time.Duration // Reconnected -> Live (size it to the log)
	ReprotectTimeout time.Duration // Reprotect sent -> acknowledged, per attempt
	// ReprotectAttempts before the group is reported unprotected.
	ReprotectAttempts int
	// AnnounceEvery: each machine repeats the placements it writes this
	// often (anti-entropy), because an announcement is best effort: one
	// lost to a node that never left anybody's View (a short freeze, a
	// push that timed out) would otherwise never be repeated.
	AnnounceEvery time.Duration
}

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Protectors == 0 {
		c.Protectors = DefaultProtectors
	}
	def(&c.FenceTimeout, DefaultFenceTimeout)
	def(&c.DeclareTimeout, DefaultDeclareTimeout)
	def(&c.FenceMargin, DefaultFenceMargin)
	def(&c.RestartTimeout, DefaultRestartTimeout)
	def(&c.ReconnectTimeout, DefaultReconnectTimeout)
	def(&c.ReplayTimeout, DefaultReplayTimeout)
	def(&c.ReprotectTimeout, DefaultReprotectTimeout)
	def(&c.AnnounceEvery, DefaultAnnounceEvery)
	if c.ReprotectAttempts == 0 {
		c.ReprotectAttempts = DefaultReprotectAttempts
	}
}

// ErrConfig prefixes configuration errors.
var ErrConfig = errors.New("protector: config")

// Validate checks a defaulted Config.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	for _, d := range []time.Duration{c.FenceTimeout, c.DeclareTimeout, c.FenceMargin,
		c.RestartTimeout, c.ReconnectTimeout, c.ReplayTimeout, c.ReprotectTimeout, c.AnnounceEvery} {
		if d <= 0 {
			return bad("every timeout and the fence margin must be positive")
		}
	}
	if c.DeclareTimeout-c.FenceTimeout < c.FenceMargin {
		return bad("fence timeout %v must be at least the fence margin %v below the declare timeout %v, or a cut-off node could still run its processes when the majority restarts them",
			c.FenceTimeout, c.FenceMargin, c.DeclareTimeout)
	}
	if c.Protectors < 1 {
		return bad("protectors %d: at least 1", c.Protectors)
	}
	if c.ReprotectAttempts < 1 {
		return bad("reprotect attempts %d: at least 1", c.ReprotectAttempts)
	}
	all := append(slices.Clone(c.Nodes), c.Spares...)
	if len(c.Nodes) == 0 {
		return bad("no active node")
	}
	slices.Sort(all)
	for i := range all {
		if all[i] == None {
			return bad("node id %d is reserved", None)
		}
		if i > 0 && all[i] == all[i-1] {
			return bad("node %d listed twice (a spare is not also an active node)", all[i])
		}
	}
	if !slices.Contains(all, c.Self) {
		return bad("self %d is not a node", c.Self)
	}
	seen := map[GroupID]bool{}
	for _, g := range c.Groups {
		if seen[g.ID] {
			return bad("group %d listed twice", g.ID)
		}
		seen[g.ID] = true
		if !slices.Contains(c.Nodes, g.Node) {
			return bad("group %d on node %d, which is not an active node", g.ID, g.Node)
		}
	}
	return nil
}
