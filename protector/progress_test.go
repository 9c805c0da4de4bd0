package protector

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestRecoveriesFollowPhases: a kill-rank recovery driven by node 1's own
// machine is listed with its phase and since when it is in it, until it
// ends.
func TestRecoveriesFollowPhases(t *testing.T) {
	m := newMachine(t, baseConfig(1))
	if got := m.Recoveries(); len(got) != 0 {
		t.Fatalf("Recoveries() before any failure = %v, want none", got)
	}
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	want := func(ph Phase, epoch uint64, to NodeID, since time.Time) []Progress {
		return []Progress{{Group: 1, Cause: CauseProcess, From: 1, To: to, Epoch: epoch, Phase: ph, Start: at(10), Since: since, Attempts: min(int(epoch), 1)}}
	}
	check := func(step string, w []Progress) {
		t.Helper()
		m.Ready()
		if d := cmp.Diff(w, m.Recoveries()); d != "" {
			t.Errorf("after %s: Recoveries() (-want +got):\n%s", step, d)
		}
	}
	if err := m.Exited(at(10), 1, 7); err != nil {
		t.Fatal(err)
	}
	check("Exited", want(PhaseConfirm, 0, None, at(10)))
	if err := m.Stopped(at(30), 1, 0); err != nil {
		t.Fatal(err)
	}
	// The restart is ordered on this node at once.
	check("Stopped", want(PhaseRestart, 1, 1, at(30)))
	if err := m.Started(at(50), 1, 1); err != nil {
		t.Fatal(err)
	}
	check("Started", want(PhaseReconnect, 1, 1, at(50)))
	if err := m.Reconnected(at(70), 1, 1); err != nil {
		t.Fatal(err)
	}
	check("Reconnected", want(PhaseReplay, 1, 1, at(70)))
	if err := m.Live(at(90), 1, 1); err != nil {
		t.Fatal(err)
	}
	rd := m.Ready()
	if got := m.Recoveries(); len(got) != 0 {
		t.Errorf("Recoveries() after Live = %v, want none (records %v)", got, rd.Records)
	}
}

// TestRecoveriesWhileConfirming: a declared node's group is listed by its
// steward (the recoverer to be) in PhaseConfirm until the death is
// confirmed, then in PhaseRestart; no other machine lists it.
func TestRecoveriesWhileConfirming(t *testing.T) {
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ms := map[NodeID]*Machine{}
	for _, id := range []NodeID{0, 2} {
		ms[id] = newMachine(t, baseConfig(id))
	}
	for id, m := range ms {
		m.View(at(100), []NodeID{0, 2, 3, 4})
		m.Suspect(at(50), 1)
		m.Declared(at(300), 1, false)
		m.Ready()
		if id == 0 {
			if got := m.Recoveries(); len(got) != 0 {
				t.Errorf("node 0 (not group 1's steward) lists %v", got)
			}
		}
	}
	m := ms[2]
	cfg := m.Config()
	want := []Progress{{Group: 1, Cause: CauseNode, From: 1, To: None, Phase: PhaseConfirm, Start: at(50), Since: at(300)}}
	if d := cmp.Diff(want, m.Recoveries()); d != "" {
		t.Errorf("declared, not confirmed: Recoveries() (-want +got):\n%s", d)
	}
	done := at(100).Add(cfg.DeclareTimeout)
	for now := at(400); !now.After(done); now = now.Add(100 * time.Millisecond) {
		m.Tick(now) // at least every FenceTimeout, or the machine takes itself as stalled
	}
	m.Ready()
	got := m.Recoveries()
	if len(got) != 1 || got[0].Phase != PhaseRestart || got[0].Start != at(50) || got[0].Since != done {
		t.Errorf("confirmed: Recoveries() = %+v, want group 1 in restart since %v", got, done)
	}
}

// TestDetectStartForgetsHealedSigns: a refuted suspicion and an absence
// that healed do not start a later failure's detect phase.
func TestDetectStartForgetsHealedSigns(t *testing.T) {
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	m := newMachine(t, baseConfig(2))
	all := []NodeID{0, 1, 2, 3, 4}
	tick := func(from, to int, reach []NodeID) {
		for ms := from; ms <= to; ms += 100 {
			m.View(at(ms), reach)
		}
	}
	m.Suspect(at(50), 1)
	m.Refuted(at(80), 1)
	tick(100, 1000, all)
	tick(1100, 1100, []NodeID{0, 2, 3, 4}) // a blip
	tick(1200, 3000, all)
	tick(3100, 3100, []NodeID{0, 2, 3, 4}) // the death
	m.Declared(at(3150), 1, false)
	got := m.Recoveries()
	if len(got) != 1 || got[0].Start != at(3100) {
		t.Fatalf("Recoveries() = %+v, want group 1 from %v (its last absence)", got, at(3100))
	}
}
