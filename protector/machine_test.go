package protector

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Unix(1_000_000, 0)

func baseConfig(self NodeID) Config {
	return Config{Self: self, Nodes: []NodeID{0, 1, 2, 3}, Spares: []NodeID{4},
		Groups: []GroupSpec{{ID: 0, Node: 0}, {ID: 1, Node: 1}, {ID: 2, Node: 2}, {ID: 3, Node: 3}}}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*Config)
		ok   bool
	}{
		{"defaults", func(*Config) {}, true},
		{"fence equal to declare", func(c *Config) { c.FenceTimeout = c.DeclareTimeout }, false},
		{"fence above declare", func(c *Config) { c.FenceTimeout = 2 * c.DeclareTimeout }, false},
		{"fence within the margin of declare", func(c *Config) { c.FenceTimeout = c.DeclareTimeout - c.FenceMargin/2 }, false},
		{"fence exactly the margin below declare", func(c *Config) { c.FenceTimeout = c.DeclareTimeout - c.FenceMargin }, true},
		{"negative margin", func(c *Config) { c.FenceMargin = -time.Millisecond }, false},
		{"k = 0 after defaults", func(c *Config) { c.Protectors = -1 }, false},
		{"spare also active", func(c *Config) { c.Spares = []NodeID{3} }, false},
		{"self unknown", func(c *Config) { c.Self = 9 }, false},
		{"group on a spare", func(c *Config) { c.Groups[0].Node = 4 }, false},
		{"group twice", func(c *Config) { c.Groups[1].ID = 0 }, false},
		{"reserved id", func(c *Config) { c.Nodes = append(c.Nodes, None) }, false},
		{"no active node", func(c *Config) { c.Nodes, c.Groups, c.Self = nil, nil, 4 }, false},
	}
	for _, c := range cases {
		cfg := baseConfig(0)
		cfg.SetDefaults()
		c.mod(&cfg)
		err := cfg.Validate()
		if (err == nil) != c.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", c.name, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v does not wrap ErrConfig", c.name, err)
		}
	}
}

func TestDefaultsFenceBeforeDeclare(t *testing.T) {
	var c Config
	c.SetDefaults()
	if c.FenceTimeout+c.FenceMargin > c.DeclareTimeout {
		t.Errorf("defaults: fence %v + margin %v > declare %v", c.FenceTimeout, c.FenceMargin, c.DeclareTimeout)
	}
}

func newMachine(t *testing.T, cfg Config) *Machine {
	t.Helper()
	m, err := New(cfg, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func kinds(rd Ready) []ActionKind {
	var k []ActionKind
	for _, a := range rd.Actions {
		k = append(k, a.Kind)
	}
	return k
}

func TestProtectorsOf(t *testing.T) {
	cases := []struct {
		k    int
		dead []NodeID
		host NodeID
		want []NodeID
	}{
		{1, nil, 0, []NodeID{1}},
		{1, nil, 3, []NodeID{0}}, // wraps; the spare 4 protects nobody
		{2, nil, 3, []NodeID{0, 1}},
		{1, []NodeID{1}, 0, []NodeID{2}},
		{1, nil, 4, []NodeID{0}}, // a group on the spare (after a restart)
		{3, []NodeID{1, 2}, 0, []NodeID{3}},
	}
	for _, c := range cases {
		cfg := baseConfig(0)
		cfg.Protectors = c.k
		m := newMachine(t, cfg)
		for _, d := range c.dead {
			m.nodes[d].dead = true
		}
		if got := m.protectorsOf(c.host); !slices.Equal(got, c.want) {
			t.Errorf("k=%d dead=%v: protectorsOf(%d) = %v, want %v", c.k, c.dead, c.host, got, c.want)
		}
	}
}

// The confirmation rule: a declaration is acted on only with a majority,
// and only once the node is known fenced or has been out of reach for
// DeclareTimeout.
func TestConfirmRule(t *testing.T) {
	const decl = DefaultDeclareTimeout
	cases := []struct {
		name      string
		reachable []NodeID // View from node 3
		fenced    bool
		wait      time.Duration
		want      bool
	}{
		{"in reach", []NodeID{0, 1, 2, 4}, false, 2 * decl, false},
		{"out of reach, too early", []NodeID{0, 1, 4}, false, decl - time.Millisecond, false},
		{"out of reach for the declare timeout", []NodeID{0, 1, 4}, false, decl, true},
		{"announced its fence", []NodeID{0, 1, 2, 4}, true, 0, true},
		{"no majority", []NodeID{4}, false, 2 * decl, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newMachine(t, baseConfig(3))
			m.View(t0, c.reachable)
			now := t0
			m.Declared(now, 2, c.fenced)
			for now.Before(t0.Add(c.wait)) {
				now = now.Add(10 * time.Millisecond)
				if now.After(t0.Add(c.wait)) {
					now = t0.Add(c.wait)
				}
				m.Tick(now)
			}
			if got := !m.alive(2); got != c.want {
				t.Errorf("confirmed = %v, want %v", got, c.want)
			}
			var restart bool
			for _, a := range m.Ready().Actions {
				restart = restart || a.Kind == ActRestart
			}
			if restart != c.want {
				t.Errorf("restart ordered = %v, want %v (3 protects 2)", restart, c.want)
			}
		})
	}
}

// TestRejoinConfirms: node 2, declared dead (unreachable), is back in
// reach before the declare timeout as a new incarnation: it fenced (or
// restarted), so its groups are restarted elsewhere at once. A node that
// joins without having been declared is not touched.
func TestRejoinConfirms(t *testing.T) {
	m := newMachine(t, baseConfig(3))
	m.View(t0, []NodeID{0, 1, 4})
	m.Declared(t0, 2, false)
	m.View(t0.Add(300*time.Millisecond), []NodeID{0, 1, 2, 4}) // back, before the declare timeout
	m.Tick(t0.Add(310 * time.Millisecond))
	if !m.alive(2) {
		t.Fatal("node 2 confirmed dead before it rejoined")
	}
	m.Rejoined(t0.Add(320*time.Millisecond), 2)
	if m.alive(2) {
		t.Error("node 2 came back as a new incarnation after it was declared: not confirmed dead")
	}
	var restart bool
	for _, a := range m.Ready().Actions {
		restart = restart || a.Kind == ActRestart
	}
	if !restart {
		t.Error("no restart of node 2's group ordered (3 protects 2)")
	}

	m = newMachine(t, baseConfig(3))
	m.View(t0, []NodeID{0, 1, 2, 4})
	m.Rejoined(t0.Add(10*time.Millisecond), 1) // a first join
	if !m.alive(1) {
		t.Error("a node that joined without being declared was confirmed dead")
	}
}

// A node cut off for less than FenceTimeout does not fence; the peers it
// missed meanwhile kept their majority and did not fence either. Their
// absence counts toward DeclareTimeout only from when this node's View
// holds a majority again.
func TestConfirmCountsOnlyMajorityTime(t *testing.T) {
	const decl = DefaultDeclareTimeout
	m := newMachine(t, baseConfig(3))
	m.View(t0, []NodeID{4}) // 3 is cut off: 2 of 5
	back := t0.Add(200 * time.Millisecond)
	m.View(back, []NodeID{0, 1, 4}) // back in the majority; 2 is still out
	m.Declared(back, 2, false)
	for now := back; now.Before(back.Add(decl)); now = now.Add(10 * time.Millisecond) {
		m.Tick(now)
		if !m.alive(2) {
			t.Fatalf("node 2 confirmed dead %v after 3 regained its majority, %v after 3 lost it; want %v after the regain",
				now.Sub(back), now.Sub(t0), decl)
		}
	}
	m.Tick(back.Add(decl))
	if m.alive(2) {
		t.Errorf("node 2 not confirmed dead %v after 3 regained its majority", decl)
	}
}

// Every machine repeats the placements it writes every AnnounceEvery, so
// that an announcement lost to a node that never left anybody's View is
// repaired.
func TestAnnouncementsRepeat(t *testing.T) {
	m := newMachine(t, baseConfig(2))
	every := m.Config().AnnounceEvery
	got := map[time.Duration][]GroupID{}
	for now := t0; !now.After(t0.Add(5 * every / 2)); {
		m.Tick(now)
		rd := m.Ready()
		for _, a := range rd.Actions {
			if a.Kind == ActAnnounce {
				got[now.Sub(t0)] = append(got[now.Sub(t0)], a.Group)
			}
		}
		now = rd.NextTick
	}
	// Node 2 hosts group 2 and stewards group 1 (it is 1's protector).
	want := map[time.Duration][]GroupID{every: {1, 2}, 2 * every: {1, 2}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("announcements by time since start (-want +got):\n%s", diff)
	}
}

func TestFenceTimer(t *testing.T) {
	cases := []struct {
		name   string
		lost   time.Duration // majority lost for
		regain bool
		want   bool
	}{
		{"brief loss", DefaultFenceTimeout - time.Millisecond, true, false},
		{"loss for the fence timeout", DefaultFenceTimeout, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newMachine(t, baseConfig(0))
			m.View(t0, []NodeID{1}) // 2 of 5
			for now := t0; !now.After(t0.Add(c.lost)); now = now.Add(time.Millisecond) {
				m.Tick(now)
			}
			if c.regain {
				m.View(t0.Add(c.lost), []NodeID{1, 2})
				m.Tick(t0.Add(2 * c.lost))
			}
			rd := m.Ready()
			if got := m.Fenced(); got != c.want {
				t.Fatalf("fenced = %v, want %v (actions %v)", got, c.want, kinds(rd))
			}
			if c.want {
				if diff := cmp.Diff([]ActionKind{ActFence}, kinds(rd)); diff != "" {
					t.Errorf("actions (-want +got):\n%s", diff)
				}
				if a := rd.Actions[0]; !slices.Equal(a.Groups, []GroupID{0}) || !errors.Is(a.Err, ErrFenced) {
					t.Errorf("fence %+v, want groups [0] and ErrFenced", a)
				}
			}
		})
	}
}

func TestStallFences(t *testing.T) {
	m := newMachine(t, baseConfig(1))
	m.Tick(t0.Add(10 * time.Millisecond))
	// Frozen: the next input comes after more than FenceTimeout, and it
	// is news that node 0 is dead. The machine fences before it acts.
	m.Declared(t0.Add(10*time.Millisecond+DefaultFenceTimeout+time.Millisecond), 0, true)
	if diff := cmp.Diff([]ActionKind{ActFence}, kinds(m.Ready())); diff != "" {
		t.Errorf("actions after a stall (-want +got):\n%s", diff)
	}
	// Fenced, it stays inert.
	m.Tick(t0.Add(2 * time.Second))
	if err := m.Started(t0.Add(2*time.Second), 0, 1); !errors.Is(err, ErrFenced) {
		t.Errorf("Started on a fenced node = %v, want ErrFenced", err)
	}
	if rd := m.Ready(); len(rd.Actions) != 0 {
		t.Errorf("a fenced machine acted: %v", kinds(rd))
	}
}

// TestRingFenceStopsRestarts: the ring fenced the node (its own
// heartbeats found it cut off or stalled) and its fence kills the job's
// processes. Their exits must not restart them here: the ring's peers
// restart the group elsewhere, and it would run twice (a loaded spare
// that hosted a restarted rank fenced itself, and restarted the rank the
// fence had killed, while node 0 restarted it too).
func TestRingFenceStopsRestarts(t *testing.T) {
	m := newMachine(t, baseConfig(0))
	m.Tick(t0.Add(10 * time.Millisecond))
	m.Fence(t0.Add(20*time.Millisecond), "out of contact with the ring for 400ms")
	rd := m.Ready()
	if diff := cmp.Diff([]ActionKind{ActFence}, kinds(rd)); diff != "" {
		t.Errorf("actions after the ring's fence (-want +got):\n%s", diff)
	}
	if !m.Fenced() || !errors.Is(rd.Actions[0].Err, ErrFenced) {
		t.Errorf("fenced = %v, action %+v; want fenced with ErrFenced", m.Fenced(), rd.Actions[0])
	}
	if err := m.Exited(t0.Add(30*time.Millisecond), 0, 0); !errors.Is(err, ErrFenced) {
		t.Errorf("Exited on a fenced node = %v, want ErrFenced", err)
	}
	if rd := m.Ready(); len(rd.Actions) != 0 {
		t.Errorf("a fenced machine acted on an exit: %v", kinds(rd))
	}
}

func TestStaleAcknowledgments(t *testing.T) {
	m := newMachine(t, baseConfig(1))
	now := t0.Add(time.Millisecond)
	checks := []struct {
		name string
		err  error
	}{
		{"Started at the current epoch", m.Started(now, 1, 0)},
		{"Live for a group hosted elsewhere", m.Live(now, 2, 0)},
		{"Stopped without a Stop", m.Stopped(now, 1, 0)},
		{"RestartFailed without a Restart", m.RestartFailed(now, 1, 1, errors.New("x"))},
		{"Aborted without an Abort", m.Aborted(now, 1, 1)},
		{"Reprotected without a Reprotect", m.Reprotected(now, 1, []NodeID{2})},
		{"Exited for a group hosted elsewhere", m.Exited(now, 3, 30)},
	}
	for _, c := range checks {
		if !errors.Is(c.err, ErrStale) {
			t.Errorf("%s = %v, want ErrStale", c.name, c.err)
		}
	}
}

func TestLearnMergesPartsIndependently(t *testing.T) {
	m := newMachine(t, baseConfig(0))
	now := t0.Add(time.Millisecond)
	m.Learn(now, Placement{Group: 2, Host: 4, Epoch: 1, Stage: StageStarted})
	m.Learn(now, Placement{Group: 2, Host: 2, Epoch: 0, Stage: StageLive, Holders: []NodeID{1}, HoldersVer: 1, HoldersBy: 3})
	g := m.groups[2]
	want := Placement{Group: 2, Host: 4, Epoch: 1, Stage: StageStarted, Holders: []NodeID{1}, HoldersVer: 1, HoldersBy: 3}
	got := g.Placement
	got.Procs = nil
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("placement (-want +got):\n%s", diff)
	}
}

func TestNextTickAlwaysAhead(t *testing.T) {
	m := newMachine(t, baseConfig(0))
	rd := m.Ready()
	if !rd.NextTick.After(t0) || rd.NextTick.Sub(t0) > DefaultFenceTimeout/4 {
		t.Errorf("NextTick = %v after start, want within FenceTimeout/4 (a longer gap is a stall)", rd.NextTick.Sub(t0))
	}
}
