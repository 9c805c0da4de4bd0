package heartbeat

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Specification constants: the defaults detect a dead node in
// Timeout + ProbeTimeout - (time since its last heartbeat) ≈ 0.5-0.6 s.
const (
	DefaultPeriod       = 100 * time.Millisecond
	DefaultTimeout      = 300 * time.Millisecond
	DefaultProbeTimeout = 300 * time.Millisecond
	DefaultProbers      = 2
	DefaultProtectors   = 1
)

// Config is one member's view of the ring and its timing.
type Config struct {
	Self NodeID
	// Members lists every node, including Self and the spares. Order does
	// not matter: the ring is ordered by id.
	Members []NodeID
	Spare   bool // Self starts as a spare
	// Incarnation of Self; must be larger than any earlier one of the same
	// node (the runner derives it from a counter in the state directory).
	Incarnation uint64

	Period       time.Duration // between heartbeats to each neighbour
	Timeout      time.Duration // silence of the watched node before suspicion
	ProbeTimeout time.Duration // time the indirect probes get before a declaration
	// FenceTimeout is how long a member may hear from nobody before it
	// fences itself. Default Timeout + ProbeTimeout - 2 Periods; it must
	// stay below Timeout + ProbeTimeout - Period, the earliest moment a
	// peer can declare it dead.
	FenceTimeout time.Duration
	Probers      int // indirect probers per suspicion
	Protectors   int // k: a node's critical data lives on its next k active members
}

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	if c.Period == 0 {
		c.Period = DefaultPeriod
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = DefaultProbeTimeout
	}
	if c.FenceTimeout == 0 {
		c.FenceTimeout = c.Timeout + c.ProbeTimeout - 2*c.Period
	}
	if c.Probers == 0 {
		c.Probers = DefaultProbers
	}
	if c.Protectors == 0 {
		c.Protectors = DefaultProtectors
	}
}

// ErrConfig prefixes configuration errors.
var ErrConfig = errors.New("heartbeat: config")

// Validate checks a defaulted Config.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if c.Period <= 0 || c.Timeout <= 0 || c.ProbeTimeout <= 0 || c.FenceTimeout <= 0 {
		return bad("period, timeout, probe timeout and fence timeout must be positive")
	}
	if c.Timeout < 2*c.Period {
		return bad("timeout %v must be at least twice the period %v", c.Timeout, c.Period)
	}
	if c.FenceTimeout < 2*c.Period {
		return bad("fence timeout %v must be at least twice the period %v", c.FenceTimeout, c.Period)
	}
	if c.FenceTimeout >= c.Timeout+c.ProbeTimeout-c.Period {
		return bad("fence timeout %v must be below timeout+probe timeout-period = %v, or a cut-off node could still run when its peers restart its processes",
			c.FenceTimeout, c.Timeout+c.ProbeTimeout-c.Period)
	}
	if c.Probers < 0 || c.Protectors < 0 {
		return bad("probers and protectors must not be negative")
	}
	if c.Incarnation == 0 {
		return bad("incarnation must be positive")
	}
	if len(c.Members) > MaxViewEntries {
		return bad("%d members, at most %d", len(c.Members), MaxViewEntries)
	}
	if !slices.Contains(c.Members, c.Self) {
		return bad("self %d is not among the members", c.Self)
	}
	s := slices.Clone(c.Members)
	slices.Sort(s)
	for i := 1; i < len(s); i++ {
		if s[i] == s[i-1] {
			return bad("member %d listed twice", s[i])
		}
	}
	if slices.Contains(s, None) {
		return bad("member id %d is reserved", None)
	}
	return nil
}
