package heartbeat

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func defaults() Config {
	var c Config
	c.SetDefaults()
	return c
}

func TestDefaultsDetectUnderOneSecond(t *testing.T) {
	c := defaults()
	if worst := c.Timeout + c.ProbeTimeout + c.Period; worst >= time.Second {
		t.Errorf("worst-case detection %v, want < 1s", worst)
	}
	c.Self, c.Members, c.Incarnation = 0, []NodeID{0}, 1
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestConfigRejectsUnsafeFence(t *testing.T) {
	c := Config{Self: 0, Members: []NodeID{0, 1}, Incarnation: 1, FenceTimeout: time.Second}
	c.SetDefaults()
	if err := c.Validate(); err == nil {
		t.Fatal("Validate() = nil, want an error: fencing after the peers may declare the node is unsafe")
	}
}

func TestRingFormsAndAllJoin(t *testing.T) {
	s := newSim(t, 4)
	s.run(time.Second)
	for id := range NodeID(4) {
		if diff := cmp.Diff([]NodeID{0, 1, 2, 3}, s.ring(id)); diff != "" {
			t.Errorf("node %d ring (-want +got):\n%s", id, diff)
		}
	}
	if d := s.find(EventDeclared, None, None); len(d) > 0 {
		t.Errorf("declarations in a healthy ring: %+v", d)
	}
	st := s.nodes[1].Status(s.now)
	if st.Monitored != 0 {
		t.Errorf("node 1 monitors %d, want 0 (its predecessor)", st.Monitored)
	}
	if got := st.Members[0].Protectors; !cmp.Equal(got, []NodeID{1}) {
		t.Errorf("protectors of 0 = %v, want [1]", got)
	}
	if got := st.Members[3].Protectors; !cmp.Equal(got, []NodeID{0}) {
		t.Errorf("protectors of 3 = %v, want [0] (the ring wraps)", got)
	}
	if s.stats[1].HeartbeatsSent.Load() < 15 {
		t.Errorf("node 1 sent %d heartbeats in 1s, want >= 15", s.stats[1].HeartbeatsSent.Load())
	}
}

func TestCrashDetectedByMonitor(t *testing.T) {
	s := newSim(t, 4)
	s.run(time.Second)
	crashAt := s.now
	s.crash(2)
	s.run(2 * time.Second)
	d := s.find(EventDeclared, 3, 2)
	if len(d) != 1 || !d[0].ByMe || d[0].Cause != CauseUnreachable {
		t.Fatalf("node 3's declarations of 2 = %+v, want one by itself, cause unreachable", d)
	}
	c := defaults()
	took := d[0].at.Sub(crashAt)
	if took < c.Timeout || took > c.Timeout+c.ProbeTimeout+c.Period {
		t.Errorf("detected %v after the crash, want within [%v, %v]", took, c.Timeout, c.Timeout+c.ProbeTimeout+c.Period)
	}
	for _, id := range []NodeID{0, 1, 3} {
		if diff := cmp.Diff([]NodeID{0, 1, 3}, s.ring(id)); diff != "" {
			t.Errorf("node %d ring after repair (-want +got):\n%s", id, diff)
		}
		if len(s.find(EventDeclared, id, 2)) != 1 {
			t.Errorf("node %d did not learn that 2 died exactly once", id)
		}
	}
	if n := len(s.find(EventDeclared, None, None)); n != 3 {
		t.Errorf("%d declaration events, want 3 (one per survivor)", n)
	}
	if s.stats[3].Unreachable.Load() != 1 || s.stats[0].Unreachable.Load()+s.stats[1].Unreachable.Load() != 0 {
		t.Errorf("only the monitor counts the failure")
	}
	// Repaired ring: 3 now watches 1 and 1 protects... 2's data lived on 3.
	if st := s.nodes[3].Status(s.now); st.Monitored != 1 {
		t.Errorf("node 3 monitors %d after repair, want 1", st.Monitored)
	}
	if f := s.find(EventFence, None, None); len(f) > 0 {
		t.Errorf("fences: %+v", f)
	}
}

func TestIndirectProbesSaveNodeBehindCutLink(t *testing.T) {
	s := newSim(t, 4)
	s.run(time.Second)
	s.cutLink(2, 3) // 3 monitors 2; 2 still reaches 1 and 0
	s.run(5 * time.Second)
	if d := s.find(EventDeclared, None, None); len(d) > 0 {
		t.Fatalf("a cut link was taken for a dead node: %+v", d)
	}
	if f := s.find(EventFence, None, None); len(f) > 0 {
		t.Fatalf("fences: %+v", f)
	}
	if s.stats[3].IndirectSaves.Load() == 0 {
		t.Errorf("node 3 never needed an indirect probe")
	}
	if s.stats[3].HeartbeatsMissed.Load() == 0 {
		t.Errorf("no missed deadline counted")
	}
}

func TestShortIsolationIsNoFailure(t *testing.T) {
	c := defaults()
	s := newSim(t, 4)
	s.run(time.Second)
	for trial := range 20 {
		s.isolate(2)
		s.run(c.FenceTimeout - 2*c.Period)
		s.heal()
		s.run(time.Second)
		if d := s.find(EventDeclared, None, None); len(d) > 0 {
			t.Fatalf("trial %d: false positive: %+v", trial, d)
		}
	}
	if d := s.find(EventDeclared, None, None); len(d) > 0 {
		t.Fatalf("false positive: %+v", d)
	}
	if f := s.find(EventFence, None, None); len(f) > 0 {
		t.Fatalf("fenced on a short cut: %+v", f)
	}
}

func TestShortFreezeIsNoFailure(t *testing.T) {
	c := defaults()
	s := newSim(t, 4)
	s.run(time.Second)
	for range 20 {
		s.freeze(2)
		s.run(c.FenceTimeout - c.Period/2) // the watchdog may fire; probes wait
		s.thaw(2)
		s.run(time.Second)
	}
	if d := s.find(EventDeclared, None, None); len(d) > 0 {
		t.Fatalf("false positive: %+v", d)
	}
	if s.stats[3].HeartbeatsMissed.Load() == 0 {
		t.Errorf("the freezes never fired the watchdog; the test is too weak")
	}
}

func TestLongFreezeDetectedAndStaleIncarnationRejected(t *testing.T) {
	for _, readFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("readFirst=%v", readFirst), func(t *testing.T) {
			testLongFreeze(t, readFirst)
		})
	}
}

// testLongFreeze: whichever the thawed node does first, tick or read the
// news of its own death, it fences exactly once and rejoins once.
func testLongFreeze(t *testing.T, readFirst bool) {
	s := newSim(t, 4)
	s.run(time.Second)
	_, oldInc := s.nodes[2].Self()
	s.freeze(2)
	s.run(1500 * time.Millisecond)
	if d := s.find(EventDeclared, 3, 2); len(d) != 1 || d[0].Cause != CauseUnreachable {
		t.Fatalf("a frozen node was not declared: %+v", d)
	}
	if readFirst {
		s.thawReadFirst(2, 3)
	} else {
		s.thaw(2)
	}
	// It fences at once (it was stalled for longer than FenceTimeout),
	// learns that it was declared, and rejoins as a new incarnation.
	s.run(time.Second)
	if f := s.find(EventFence, 2, None); len(f) != 1 {
		t.Fatalf("fences on 2: %+v", f)
	}
	rj := s.find(EventRejoin, 2, None)
	if len(rj) != 1 || rj[0].Inc <= oldInc {
		t.Fatalf("rejoin of 2 = %+v, want one with incarnation > %d", rj, oldInc)
	}
	var stale uint64
	for _, st := range s.stats {
		stale += st.StaleRejected.Load()
	}
	if stale == 0 {
		t.Errorf("no datagram of the dead incarnation was rejected")
	}
	for id := range NodeID(4) {
		if diff := cmp.Diff([]NodeID{0, 1, 2, 3}, s.ring(id)); diff != "" {
			t.Errorf("node %d ring after rejoin (-want +got):\n%s", id, diff)
		}
	}
	if j := s.find(EventJoined, 0, 2); len(j) == 0 || j[len(j)-1].Inc != rj[0].Inc {
		t.Errorf("node 0 did not see 2 join at its new incarnation: %+v", j)
	}
}

func TestIsolatedNodeFencesBeforeItIsDeclared(t *testing.T) {
	s := newSim(t, 4)
	s.run(time.Second)
	s.isolate(2)
	s.run(2 * time.Second)
	f := s.find(EventFence, 2, None)
	d := s.find(EventDeclared, 3, 2)
	if len(f) != 1 || len(d) != 1 {
		t.Fatalf("fence %+v, declaration %+v; want one each", f, d)
	}
	if !f[0].at.Before(d[0].at) {
		t.Errorf("fenced at %v, declared at %v: the cut-off side must stop first", f[0].at, d[0].at)
	} else {
		t.Logf("fenced %v before the declaration", d[0].at.Sub(f[0].at))
	}
	if len(s.find(EventFence, None, None)) != 1 {
		t.Errorf("the majority side fenced too")
	}
	if !s.nodes[2].Fenced() {
		t.Errorf("node 2 unfenced while still cut off")
	}
	s.heal()
	s.run(time.Second)
	if s.nodes[2].Fenced() || len(s.find(EventRejoin, 2, None)) != 1 {
		t.Errorf("node 2 did not rejoin after the cut healed")
	}
	for id := range NodeID(4) {
		if diff := cmp.Diff([]NodeID{0, 1, 2, 3}, s.ring(id)); diff != "" {
			t.Errorf("node %d ring after heal (-want +got):\n%s", id, diff)
		}
	}
}

func TestFencedAnnouncementIsDeclared(t *testing.T) {
	// One-way cut: 2 hears nobody but everybody hears 2. It fences, says
	// so, and its monitor declares it at once.
	s := newSim(t, 4)
	s.run(time.Second)
	for _, o := range []NodeID{0, 1, 3} {
		s.cut[[2]NodeID{o, 2}] = true
	}
	s.run(2 * time.Second)
	d := s.find(EventDeclared, 3, 2)
	if len(d) != 1 || d[0].Cause != CauseFenced {
		t.Fatalf("declarations of 2 by 3 = %+v, want one, cause fenced", d)
	}
	if s.stats[3].Fenced.Load() != 1 {
		t.Errorf("fenced failures counted on 3 = %d", s.stats[3].Fenced.Load())
	}
}

func TestQuickRestartIsAFailureOfTheOldIncarnation(t *testing.T) {
	s := newSim(t, 4)
	s.run(time.Second)
	_, old := s.nodes[2].Self()
	s.crash(2)
	s.run(50 * time.Millisecond)
	s.start(2, false)
	s.run(time.Second)
	d := s.find(EventDeclared, 3, 2)
	if len(d) != 1 || d[0].Cause != CauseRestarted || d[0].Inc != old || !d[0].ByMe {
		t.Fatalf("node 3 declared %+v, want the old incarnation %d, cause restarted", d, old)
	}
	for id := range NodeID(4) {
		if diff := cmp.Diff([]NodeID{0, 1, 2, 3}, s.ring(id)); diff != "" {
			t.Errorf("node %d ring (-want +got):\n%s", id, diff)
		}
	}
}

func TestSpareJoinsLateAndIsPromoted(t *testing.T) {
	s := newSim(t, 3)
	s.cfg.Members = append(s.cfg.Members, 3)
	for id := range NodeID(3) { // the spare was in the peer list all along
		cfg := s.nodes[id].cfg
		cfg.Members = s.cfg.Members
		st := new(Stats)
		n, err := New(cfg, st, s.now)
		if err != nil {
			t.Fatal(err)
		}
		s.nodes[id], s.stats[id] = n, st
	}
	s.run(time.Second)
	if diff := cmp.Diff([]NodeID{0, 1, 2}, s.ring(0)); diff != "" {
		t.Errorf("ring before the spare starts (-want +got):\n%s", diff)
	}
	s.start(3, true)
	s.run(time.Second)
	if diff := cmp.Diff([]NodeID{0, 1, 2, 3}, s.ring(0)); diff != "" {
		t.Errorf("ring after the spare joined (-want +got):\n%s", diff)
	}
	st := s.nodes[0].Status(s.now)
	if st.Members[3].Role != "spare" || len(st.Members[3].Protectors) != 0 || len(st.Members[3].Protects) != 0 {
		t.Errorf("spare status %+v: a spare protects nobody and is protected by nobody", st.Members[3])
	}
	if got := st.Members[2].Protectors; !cmp.Equal(got, []NodeID{0}) {
		t.Errorf("protectors of 2 = %v, want [0] (not the spare)", got)
	}
	s.crash(1)
	s.run(2 * time.Second)
	if p := s.find(EventPromoted, 3, 3); len(p) != 1 {
		t.Fatalf("spare 3 was not promoted: %+v", s.find(EventPromoted, None, None))
	}
	st = s.nodes[0].Status(s.now)
	if st.Members[3].Role != "active" {
		t.Errorf("node 0 sees 3 as %s, want active", st.Members[3].Role)
	}
	if got := st.Members[2].Protectors; !cmp.Equal(got, []NodeID{3}) {
		t.Errorf("protectors of 2 after promotion = %v, want [3]", got)
	}
}

func TestEscalationStartsProbes(t *testing.T) {
	s := newSim(t, 4)
	s.run(time.Second)
	s.crash(2)
	s.run(5 * time.Millisecond) // datagrams already in flight arrive
	s.nodes[3].Suspect(2, s.now)
	s.drain(3)
	s.run(defaults().ProbeTimeout + 10*time.Millisecond)
	if d := s.find(EventDeclared, 3, 2); len(d) != 1 {
		t.Fatalf("escalated crash not declared within the probe timeout: %+v", d)
	}
}

func TestProtectorsK2(t *testing.T) {
	s := newSim(t, 4)
	for _, n := range s.nodes {
		n.cfg.Protectors = 2
	}
	s.run(time.Second)
	st := s.nodes[0].Status(s.now)
	if got := st.Members[3].Protectors; !cmp.Equal(got, []NodeID{0, 1}) {
		t.Errorf("protectors of 3 = %v, want [0 1]", got)
	}
	if got := st.Members[1].Protects; !cmp.Equal(got, []NodeID{3, 0}) && !cmp.Equal(got, []NodeID{0, 3}) {
		t.Errorf("1 protects %v, want 0 and 3", got)
	}
}

func TestTwoSimultaneousCrashes(t *testing.T) {
	s := newSim(t, 5)
	s.run(time.Second)
	s.crash(1)
	s.crash(2)
	s.run(3 * time.Second)
	if d := s.find(EventDeclared, 3, 2); len(d) != 1 || !d[0].ByMe {
		t.Fatalf("node 3 did not declare its predecessor 2: %+v", d)
	}
	if d := s.find(EventDeclared, 3, 1); len(d) != 1 || !d[0].ByMe {
		t.Fatalf("after repair node 3 watches 1 and must declare it: %+v", d)
	}
	for _, id := range []NodeID{0, 3, 4} {
		if diff := cmp.Diff([]NodeID{0, 3, 4}, s.ring(id)); diff != "" {
			t.Errorf("node %d ring (-want +got):\n%s", id, diff)
		}
	}
	if f := s.find(EventFence, None, None); len(f) > 0 {
		t.Errorf("fences: %+v", f)
	}
}

func BenchmarkStepHeartbeat(b *testing.B) {
	cfg := Config{Self: 0, Members: []NodeID{0, 1, 2, 3, 4, 5, 6, 7}, Incarnation: 1}
	now := time.Unix(1000, 0)
	n, err := New(cfg, nil, now)
	if err != nil {
		b.Fatal(err)
	}
	view := make([]Entry, 8)
	for i := range view {
		view[i] = Entry{ID: NodeID(i), Inc: 1, State: Alive, Role: RoleActive}
	}
	m := Message{Type: MsgHeartbeat, From: 1, To: 0, FromInc: 1, View: view}
	buf := m.Append(nil)
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		msg, err := Decode(buf)
		if err != nil {
			b.Fatal(err)
		}
		n.Step(msg, now)
		n.Tick(now)
		n.Ready()
	}
}
