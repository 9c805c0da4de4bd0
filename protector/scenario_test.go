package protector

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The scenarios of issue 10, each on a simulated ring. Every step also
// checks: no group runs in two places, a node is treated as dead only once
// it crashed, froze or fenced itself, and restarts are ordered only from a
// majority (world.check, world.checkMajority).

func TestNodeDeathRestartsOnSpare(t *testing.T) {
	w := newWorld(t, 4, []NodeID{4}, nil)
	w.run(200 * time.Millisecond)
	w.crash(2)
	w.run(3 * time.Second)
	w.settled()
	if got := w.hostOf(2); got != 4 {
		t.Errorf("group 2 runs on %d, want 4 (the free spare)", got)
	}
	if len(w.restarts) != 1 || w.restarts[0].on != 3 {
		t.Errorf("restarts %+v, want one, ordered by node 3 (group 2's protector)", w.restarts)
	}
	// Group 4 on the promoted spare is protected by the next active node
	// (0); group 3, whose next active node was 4, by 4 now.
	if diff := cmp.Diff([]NodeID{0}, w.ms[0].groups[2].Holders); diff != "" {
		t.Errorf("holders of group 2 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]NodeID{4}, w.ms[0].groups[3].Holders); diff != "" {
		t.Errorf("holders of group 3 (-want +got):\n%s", diff)
	}
	rs := w.recordsFor(2)
	if len(rs) != 1 || rs[0].Err != nil {
		t.Fatalf("records of group 2 = %+v, want one success", rs)
	}
	r := rs[0]
	for ph := range NumPhases {
		if r.Phases[ph] <= 0 {
			t.Errorf("phase %v took %v, want > 0", ph, r.Phases[ph])
		}
	}
	// Detection = view lag + heartbeat probe; confirm waits the rest of
	// the declare timeout; restart = start delay.
	want := map[Phase]time.Duration{PhaseDetect: 300 * time.Millisecond, PhaseConfirm: 300 * time.Millisecond,
		PhaseReconnect: 30 * time.Millisecond, PhaseReplay: 100 * time.Millisecond}
	for ph, d := range want {
		if got := r.Phases[ph]; got < d || got > d+5*time.Millisecond {
			t.Errorf("phase %v = %v, want %v (+5ms)", ph, got, d)
		}
	}
	if r.Total < r.Phases[PhaseDetect]+r.Phases[PhaseConfirm]+r.Phases[PhaseRestart]+r.Phases[PhaseReconnect]+r.Phases[PhaseReplay] {
		t.Errorf("total %v shorter than its sequential phases %v", r.Total, r.Phases)
	}
	for _, id := range []NodeID{0, 1, 3, 4} {
		if got := w.ms[id].ring(); !slices.Equal(got, []NodeID{0, 1, 3, 4}) {
			t.Errorf("node %d ring %v, want [0 1 3 4]", id, got)
		}
	}
	if len(w.rings) != 4 {
		t.Errorf("%d RepairRing actions, want 4 (one per surviving node)", len(w.rings))
	}
}

func TestNodeDeathWithoutSpareRestartsOnProtector(t *testing.T) {
	w := newWorld(t, 4, nil, nil)
	w.run(100 * time.Millisecond)
	w.crash(1)
	w.run(3 * time.Second)
	w.settled()
	if got := w.hostOf(1); got != 2 {
		t.Errorf("group 1 runs on %d, want 2 (its protector's own node)", got)
	}
	// Node 2 now hosts groups 1 and 2; both are protected by 3.
	for _, g := range []GroupID{1, 2} {
		if got := w.ms[0].groups[g].Holders; !slices.Equal(got, []NodeID{3}) {
			t.Errorf("holders of group %d = %v, want [3]", g, got)
		}
	}
	// Group 0 lost its protector (1) and is protected by 2 now.
	if got := w.ms[3].groups[0].Holders; !slices.Equal(got, []NodeID{2}) {
		t.Errorf("holders of group 0 = %v, want [2]", got)
	}
}

func TestKillRankRestartsGroupInPlace(t *testing.T) {
	w := newWorld(t, 4, []NodeID{4}, nil)
	w.run(100 * time.Millisecond)
	w.exitProc(1)
	w.run(2 * time.Second)
	w.settled()
	if got := w.running[1]; !slices.Equal(got, []instance{{1, 1}}) {
		t.Errorf("group 1 runs as %v, want on node 1 at epoch 1", got)
	}
	if len(w.rings) != 0 || len(w.fences) != 0 {
		t.Errorf("ring repairs %v, fences %v: a process crash changes neither", w.rings, w.fences)
	}
	rs := w.recordsFor(1)
	if len(rs) != 1 || rs[0].Err != nil || rs[0].Cause != CauseProcess || rs[0].To != 1 {
		t.Fatalf("records = %+v, want one in-place success", rs)
	}
	if w.hostOf(4) != None {
		t.Errorf("the spare was used")
	}
	// Again, on the restarted copy.
	w.exitProc(1)
	w.run(time.Second)
	w.settled()
	if got := w.running[1]; !slices.Equal(got, []instance{{1, 2}}) {
		t.Errorf("group 1 runs as %v, want on node 1 at epoch 2", got)
	}
}

func TestSecondFailureAfterRecovery(t *testing.T) {
	w := newWorld(t, 4, []NodeID{4}, nil)
	w.run(100 * time.Millisecond)
	w.crash(2)
	w.run(2 * time.Second)
	w.settled()
	// The spare that now runs group 2 dies: group 2 goes to its new
	// protector's node (0: no spare left), group 3 (protected by 4) is
	// re-protected.
	w.crash(4)
	w.run(3 * time.Second)
	w.settled()
	if got := w.hostOf(2); got != 0 {
		t.Errorf("group 2 runs on %d, want 0", got)
	}
	if n := len(w.recordsFor(2)); n != 2 {
		t.Errorf("%d recoveries of group 2, want 2", n)
	}
}

func TestProtectorDeath(t *testing.T) {
	// Node 3 hosts group 3 and protects group 2.
	w := newWorld(t, 4, nil, nil)
	w.run(100 * time.Millisecond)
	w.crash(3)
	w.run(3 * time.Second)
	w.settled()
	if got := w.hostOf(3); got != 0 {
		t.Errorf("group 3 runs on %d, want 0 (its protector)", got)
	}
	if got := w.ms[0].groups[2].Holders; !slices.Equal(got, []NodeID{0}) {
		t.Errorf("holders of group 2 = %v, want [0]: re-protected", got)
	}
	// With k=1 the only copy of group 2's log died with 3; its host sent
	// a fresh checkpoint.
	if !w.data[2][0] {
		t.Errorf("group 2's data is not on node 0: %v", w)
	}
}

func TestProtectorDeathWithoutCheckpointIsReported(t *testing.T) {
	w := newWorld(t, 4, nil, nil)
	w.noCheckpoint = true
	w.run(100 * time.Millisecond)
	w.crash(3)
	w.run(3 * time.Second)
	var unprot []emitted
	for _, f := range w.failed {
		if errors.Is(f.Err, ErrUnprotected) {
			unprot = append(unprot, f)
		}
	}
	if len(unprot) != 1 || unprot[0].Group != 2 || unprot[0].on != 2 {
		t.Errorf("failures %+v, want one ErrUnprotected for group 2 from its host", w.failed)
	}
	if w.hostOf(2) != 2 || w.hostOf(3) != 0 {
		t.Errorf("groups moved: %v", w)
	}
}

func TestTwoFailuresInARow(t *testing.T) {
	// Two non-adjacent nodes, 150 ms apart: the second dies while the
	// first is being confirmed.
	w := newWorld(t, 5, nil, nil)
	w.run(100 * time.Millisecond)
	w.crash(1)
	w.run(150 * time.Millisecond)
	w.crash(3)
	w.run(4 * time.Second)
	w.settled()
	if w.hostOf(1) != 2 || w.hostOf(3) != 4 {
		t.Errorf("group 1 on %d (want 2), group 3 on %d (want 4)", w.hostOf(1), w.hostOf(3))
	}
}

func TestAdjacentFailuresNeedTwoProtectors(t *testing.T) {
	for _, k := range []int{1, 2} {
		t.Run(map[int]string{1: "k=1", 2: "k=2"}[k], func(t *testing.T) {
			w := newWorld(t, 5, nil, func(c *Config) { c.Protectors = k })
			w.run(100 * time.Millisecond)
			// Group 2's data is on 3 (and 4 with k=2).
			w.crash(2)
			w.crash(3)
			w.run(4 * time.Second)
			lost := w.fatal(2)
			if k == 1 {
				if len(lost) == 0 || !errors.Is(lost[0].Err, ErrDataLost) {
					t.Fatalf("failures %+v, want ErrDataLost for group 2", w.failed)
				}
				var re *RecoveryError
				if !errors.As(lost[0].Err, &re) || re.Group != 2 || re.Node != 2 {
					t.Errorf("error %v does not name group 2 and node 2", lost[0].Err)
				}
			} else if len(lost) != 0 {
				t.Fatalf("failures %+v, want none with k=2", w.failed)
			}
			w.settled()
			if k == 2 && (w.hostOf(2) != 4 || w.hostOf(3) != 4) {
				t.Errorf("groups 2, 3 on %d, %d, want both on 4", w.hostOf(2), w.hostOf(3))
			}
		})
	}
}

func TestPartitionMinorityFencesMajorityRecovers(t *testing.T) {
	cases := []struct {
		name     string
		k        int
		minority []NodeID
		want     map[GroupID]NodeID // new hosts; None: lost (reported)
	}{
		// 0 and 2 protect nobody in the minority: 1 recovers 0, 3 recovers 2.
		{"apart k=1", 1, []NodeID{0, 2}, map[GroupID]NodeID{0: 1, 2: 3}},
		// Group 0's only copy is on 1, fenced with it: beyond k, reported.
		{"adjacent k=1", 1, []NodeID{0, 1}, map[GroupID]NodeID{0: None, 1: 2}},
		{"adjacent k=2", 2, []NodeID{0, 1}, map[GroupID]NodeID{0: 2, 1: 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, 5, nil, func(cfg *Config) { cfg.Protectors = c.k })
			w.run(100 * time.Millisecond)
			w.partition(c.minority...)
			w.run(3 * time.Second)
			for _, id := range w.ids {
				if w.fenced[id] != slices.Contains(c.minority, id) {
					t.Errorf("node %d fenced = %v", id, w.fenced[id])
				}
			}
			for _, r := range w.restarts {
				if slices.Contains(c.minority, r.on) {
					t.Errorf("restart ordered in the minority: %+v", r)
				}
			}
			// Every fence came before its node left anybody's ring.
			for _, f := range w.fences {
				for _, r := range w.rings {
					if !slices.Contains(r.Ring, f.on) && r.at.Before(f.at) {
						t.Errorf("node %d dropped from the ring at %v by %d, before it fenced at %v", f.on, r.at, r.on, f.at)
					}
				}
			}
			w.heal()
			w.run(time.Second)
			w.settled()
			for g, want := range c.want {
				if got := w.hostOf(g); got != want {
					t.Errorf("group %d on %d, want %d", g, got, want)
				}
				if lost := w.fatal(g); (want == None) != (len(lost) > 0) || want == None && !errors.Is(lost[0].Err, ErrDataLost) {
					t.Errorf("group %d failures %+v", g, lost)
				}
			}
		})
	}
}

func TestFreezeLongerThanDetection(t *testing.T) {
	w := newWorld(t, 4, []NodeID{4}, nil)
	w.run(100 * time.Millisecond)
	w.freeze(1)
	w.run(2 * time.Second)
	if w.hostOf(1) != None { // the frozen copy and the restarted one
		if got := w.running[1]; len(got) != 2 {
			t.Fatalf("group 1 runs as %v, want a frozen copy on 1 and one on 4", got)
		}
	}
	w.thaw(1)
	w.run(time.Second)
	if !w.fenced[1] {
		t.Fatal("node 1 did not fence itself on waking")
	}
	w.settled()
	if got := w.hostOf(1); got != 4 {
		t.Errorf("group 1 on %d, want 4", got)
	}
}

func TestShortFreezeIsNoFailure(t *testing.T) {
	w := newWorld(t, 4, []NodeID{4}, nil)
	w.run(100 * time.Millisecond)
	w.freeze(1)
	w.run(250 * time.Millisecond) // < FenceTimeout
	w.thaw(1)
	w.run(2 * time.Second)
	if len(w.fences)+len(w.restarts)+len(w.rings) != 0 {
		t.Errorf("fences %v restarts %v rings %v, want none", w.fences, w.restarts, w.rings)
	}
	w.settled()
}

func TestRestartTargetFallsBack(t *testing.T) {
	cases := []struct {
		name  string
		setup func(*world)
		want  NodeID
	}{
		{"spare refuses", func(w *world) { w.refuse[4] = true }, 2},
		{"spare silent, aborted", func(w *world) { w.silent[4] = true }, 2},
		{"first spare refuses, second used", func(w *world) { w.refuse[4] = true }, 5},
		{"spare dies during restart", func(w *world) {
			w.after(720*time.Millisecond, None, func() { w.crash(4) })
		}, 2},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spares := []NodeID{4}
			if i == 2 {
				spares = []NodeID{4, 5}
			}
			w := newWorld(t, 4, spares, func(c *Config) { c.RestartTimeout = 300 * time.Millisecond })
			c.setup(w)
			w.run(100 * time.Millisecond)
			w.crash(1)
			w.run(4 * time.Second)
			w.settled()
			if got := w.hostOf(1); got != c.want {
				t.Errorf("group 1 on %d, want %d", got, c.want)
			}
			if rs := w.recordsFor(1); len(rs) != 1 || rs[0].Attempts != 2 {
				t.Errorf("records %+v, want one with 2 attempts", rs)
			}
		})
	}
}

func TestNoNodeToRestartOn(t *testing.T) {
	w := newWorld(t, 3, []NodeID{3}, nil)
	w.refuse[3], w.refuse[2] = true, true
	w.run(100 * time.Millisecond)
	w.crash(1)
	w.run(3 * time.Second)
	f := w.fatal(1)
	if len(f) != 1 || !errors.Is(f[0].Err, ErrNoTarget) {
		t.Fatalf("failures %+v, want one ErrNoTarget for group 1", w.failed)
	}
	t.Logf("error: %v", f[0].Err)
	if rs := w.recordsFor(1); len(rs) != 1 || !errors.Is(rs[0].Err, ErrNoTarget) {
		t.Errorf("records %+v, want the failure recorded", rs)
	}
}

func TestNoProtectorLeftIsReported(t *testing.T) {
	w := newWorld(t, 3, nil, nil)
	w.run(100 * time.Millisecond)
	w.crash(1)
	w.run(2 * time.Second)
	w.crash(2) // node 0 now hosts everything, alone... but has no majority
	w.run(2 * time.Second)
	if !w.fenced[0] {
		t.Errorf("node 0 alone of a ring of 2 kept running")
	}
	w2 := newWorld(t, 2, nil, nil)
	w2.run(100 * time.Millisecond)
	w2.partition(1) // 1 of 2: nobody holds a strict majority
	w2.run(2 * time.Second)
	if !w2.fenced[0] || !w2.fenced[1] || len(w2.restarts) != 0 {
		t.Errorf("ring of 2 split: fences %v restarts %v, want both fenced and no restart", w2.fences, w2.restarts)
	}
}

func TestPhaseTimeouts(t *testing.T) {
	w := newWorld(t, 4, []NodeID{4}, nil)
	w.reconnectDelay = time.Hour
	w.run(100 * time.Millisecond)
	w.crash(1)
	w.run(w.cfg.ReconnectTimeout + DefaultReconnectTimeout + 2*time.Second)
	f := w.fatal(1)
	var re *RecoveryError
	if len(f) != 1 || !errors.As(f[0].Err, &re) || re.Phase != PhaseReconnect || !errors.Is(re, ErrTimeout) {
		t.Fatalf("failures %+v, want a reconnect timeout for group 1", w.failed)
	}
}

func TestKillRankFallsBackToSpare(t *testing.T) {
	w := newWorld(t, 4, []NodeID{4}, nil)
	w.refuse[1] = true // the in-place restart fails
	w.run(100 * time.Millisecond)
	w.exitProc(1)
	w.run(2 * time.Second)
	w.settled()
	if got := w.hostOf(1); got != 4 {
		t.Errorf("group 1 on %d, want the spare 4", got)
	}
	if rs := w.recordsFor(1); len(rs) != 1 || rs[0].Err != nil || rs[0].Attempts != 2 {
		t.Errorf("records %+v, want one success after 2 attempts", rs)
	}
}
