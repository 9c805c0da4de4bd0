package radicd

import (
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/heartbeat"
)

func TestLaunchGate(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	settle := time.Second
	ring := func(states ...string) heartbeat.Status {
		st := heartbeat.Status{Self: 0}
		for i, s := range states {
			m := heartbeat.MemberStatus{ID: heartbeat.NodeID(i), State: s}
			if s == "dead" {
				m.DeclaredAt = now.Add(-time.Duration(i) * 400 * time.Millisecond)
			}
			st.Members = append(st.Members, m)
		}
		return st
	}
	cases := []struct {
		name string
		st   heartbeat.Status
		wait bool
		err  string // "" when the launch may go on
	}{
		{"quiet ring", ring("alive", "alive", "alive", "alive", "alive"), false, ""},
		{"alone", ring("alive"), false, ""},
		{"a peer suspect", ring("alive", "suspect", "alive", "alive", "alive"), true, "not heard from: 1"},
		// Node 1 declared 400 ms ago: inside settle.
		{"just declared", ring("alive", "dead", "alive", "alive", "alive"), true, "declared dead: 1"},
		// Node 3 declared 1.2 s ago: settled, 4 of 5 left.
		{"declared long ago", ring("alive", "alive", "alive", "dead", "alive"), false, ""},
		// The minority of the CI failure: 0 and 2 left of 5.
		{"minority", ring("alive", "dead", "alive", "dead", "dead"), false, "reaches 2 of the 5"},
		{"fenced", func() heartbeat.Status { s := ring("alive", "alive", "alive"); s.Fenced = true; return s }(), false, "fenced"},
	}
	for _, c := range cases {
		wait, err := launchGate(c.st, now, settle)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: refused (%v), want a launch", c.name, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: err %v, want one saying %q", c.name, err, c.err)
		case err != nil && wait != c.wait:
			t.Errorf("%s: wait %v, want %v (%v)", c.name, wait, c.wait, err)
		}
	}
	// The shape changes with a member's state or incarnation only.
	a := ring("alive", "alive", "alive")
	b := ring("alive", "alive", "alive")
	b.Members[0], b.Members[2] = b.Members[2], b.Members[0]
	if ringShape(a) != ringShape(b) {
		t.Errorf("member order changed the shape: %q vs %q", ringShape(a), ringShape(b))
	}
	b.Members[1].Inc++
	if ringShape(a) == ringShape(b) {
		t.Errorf("a new incarnation of node 1 left the shape %q", ringShape(a))
	}
}

// TestInsteadOf: a rank is launched in place of a node lost during the
// launch only once the ring has declared that node dead, and only if the
// node had not created it (then its recovery restarts it).
func TestInsteadOf(t *testing.T) {
	st := heartbeat.Status{Self: 4, Members: []heartbeat.MemberStatus{
		{ID: 0, State: "alive"}, {ID: 1, State: "suspect"}, {ID: 2, State: "dead"}, {ID: 3, State: "alive"}, {ID: 4, State: "alive"}}}
	for _, c := range []struct {
		lost  int
		known bool
		code  int
		err   string
	}{
		{2, false, 0, ""},
		{2, true, 409, "its recovery restarts it"},
		{1, false, 503, "node 1 is suspect to node 4, not dead"},
		{0, false, 503, "node 0 is alive to node 4"},
		{4, false, 400, "in place of itself"},
		{7, false, 400, "node 7 is not a member"},
	} {
		code, err := insteadOf(st, c.lost, c.known)
		if code != c.code || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("insteadOf(lost %d, known %v) = %d, %v; want %d, %q", c.lost, c.known, code, err, c.code, c.err)
		}
	}
}
