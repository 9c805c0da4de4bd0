package main

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/internal/launch"
	"github.com/radic-project/radic/internal/radicd"
)

// TestMergeRecoveries: per group the newest report under way wins
// whichever daemon gave it, its times measured on that daemon's clock;
// finished recoveries known to several daemons are shown once, oldest
// first, the last recentShown.
func TestMergeRecoveries(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 1, 3, 0, time.Local)
	n := uint64(12_000_000)
	fresh := launch.RecoveryProgress{Group: 2, Cause: "node", From: 2, To: 4, Epoch: 1, Phase: "replay", Start: t0, Since: t0.Add(900 * time.Millisecond),
		Attempts: 1, By: 3, Replayed: &n, ReplayTotal: 38_000_000, Updated: t0.Add(1100 * time.Millisecond)}
	stale := fresh
	stale.Phase, stale.Replayed, stale.ReplayTotal, stale.Updated = "restart", nil, 0, t0.Add(500*time.Millisecond)
	var evs []launch.RecoveryEvent
	for i := range recentShown + 2 {
		evs = append(evs, launch.RecoveryEvent{Group: 1, Cause: "process", From: 1, To: 1, Epoch: uint64(i + 1), Start: t0.Add(-time.Duration(10-i) * time.Minute), Seconds: 0.5})
	}
	st := func(now time.Time, ps []launch.RecoveryProgress, evs []launch.RecoveryEvent) *radicd.NodeStatus {
		return &radicd.NodeStatus{Now: now, Recovery: &launch.RecoveryStatus{InProgress: ps, Recent: evs}}
	}
	daems := []statusNode{
		{Addr: "a", Status: st(t0.Add(1200*time.Millisecond), []launch.RecoveryProgress{stale}, evs[:4])},
		{Addr: "b", Error: "connection refused"},
		{Addr: "c", Status: st(t0.Add(1500*time.Millisecond), []launch.RecoveryProgress{fresh}, evs[2:])},
	}
	got := mergeRecoveries(daems)
	want := recoveryReport{
		InProgress: []recoveryRow{{RecoveryProgress: fresh, Elapsed: 1500 * time.Millisecond, InPhase: 600 * time.Millisecond}},
		Recent:     evs[len(evs)-recentShown:],
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("mergeRecoveries (-want +got):\n%s", d)
	}

	var b strings.Builder
	printRecoveries(&b, got)
	out := b.String()
	for _, want := range []string{
		"recoveries in progress:",
		"GROUP  CAUSE  FROM -> TO  PHASE   ELAPSED  IN PHASE  ATTEMPTS  REPLAYED              DRIVEN BY",
		"2      node   2 -> 4      replay  1.5 s    0.6 s     1         12 MB of 38 MB (32%)  node 3",
		"recent recoveries:\n  a rank of node 1 died at 11:53:03.000; the ranks of node 1 restarted on node 1 in 0.50 s; live again\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("radic status output lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "died at") != recentShown {
		t.Errorf("%d finished recoveries printed, want %d:\n%s", strings.Count(out, "died at"), recentShown, out)
	}

	b.Reset()
	printRecoveries(&b, mergeRecoveries(nil))
	if b.Len() != 0 {
		t.Errorf("no recoveries printed %q, want nothing", b.String())
	}
}

// TestStatusSilentDaemons: a daemon that did not answer is listed after
// the table with its node and what the ring says of it, and a timeout
// says how long was waited (not "context deadline exceeded").
func TestStatusSilentDaemons(t *testing.T) {
	rep := statusReport{Ring: []heartbeat.NodeID{0, 1}, Rows: []statusRow{
		{ID: 0, Addr: "10.77.0.1:9470", Health: "ok"},
		{ID: 2, Addr: "10.77.0.3:9470", Health: "dead"},
	}, Daems: []statusNode{{Addr: "10.77.0.1:9470"}, {Addr: "10.77.0.3:9470", Error: "no answer within 2s"}}}
	var b strings.Builder
	printStatus(&b, rep)
	if want := "\ndaemons that did not answer:\n  10.77.0.3:9470 (node 2, dead): no answer within 2s\n"; !strings.Contains(b.String(), want) {
		t.Errorf("radic status output lacks %q:\n%s", want, b.String())
	}
	// A daemon that does not answer at all, through collectStatus.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := collectStatus([]string{l.Addr().String()}, 50*time.Millisecond)
	if len(got.Daems) != 1 || got.Daems[0].Error != "no answer within 50ms" {
		t.Errorf("a silent daemon: %+v, want the error \"no answer within 50ms\"", got.Daems)
	}
}
