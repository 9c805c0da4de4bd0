package jobrun

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/launch"
)

// TestDedup: a restarted instance's output is compared with what was
// delivered and dropped up to there; only what goes beyond is written;
// a difference is a divergence at its first differing byte.
func TestDedup(t *testing.T) {
	var out strings.Builder
	d := newDedup(1, "stdout")
	feed := func(off uint64, s string) error {
		b, err := d.feed(off, []byte(s))
		out.Write(b)
		return err
	}
	if err := feed(0, "one\ntwo\n"); err != nil {
		t.Fatal(err)
	}
	if err := feed(8, "thr"); err != nil {
		t.Fatal(err)
	}
	d.restart() // the rank died after "thr"; its next instance starts again
	for _, c := range []struct {
		off uint64
		s   string
	}{{0, "one"}, {3, "\ntwo\nt"}, {9, "hree\nfour\n"}} {
		if err := feed(c.off, c.s); err != nil {
			t.Fatalf("feed(%d, %q) = %v", c.off, c.s, err)
		}
	}
	if got, want := out.String(), "one\ntwo\nthree\nfour\n"; got != want {
		t.Errorf("output %q, want %q", got, want)
	}
	d.restart()
	err := feed(0, "one\ntwo\nthrX")
	var de *DivergenceError
	if !errors.As(err, &de) || de.Offset != 11 || de.Rank != 1 {
		t.Fatalf("diverging instance: %v, want a divergence of rank 1 at byte 11", err)
	}
	if got := out.String(); got != "one\ntwo\nthree\nfour\n" {
		t.Errorf("a divergent instance wrote out %q", got)
	}
}

// TestDedupHashed: beyond what is kept, the prefix is compared by hash.
// The shim's lines (launch.Radic) are each instance's own: a restarted
// instance's are printed whole, never compared with the first's.
func TestDedupRadicStream(t *testing.T) {
	var out strings.Builder
	d := newDedup(1, launch.Radic)
	for _, c := range []struct {
		off     uint64
		s       string
		restart bool
	}{{0, "radic[7]: connection 1:0 broken\n", false}, {0, "radic[9]: restarted (epoch 1)\n", true}, {30, "radic[9]: replay done: live\n", false}} {
		if c.restart {
			d.restart()
		}
		b, err := d.feed(c.off, []byte(c.s))
		if err != nil {
			t.Fatalf("feed(%d, %q) = %v", c.off, c.s, err)
		}
		out.Write(b)
	}
	want := "radic[7]: connection 1:0 broken\nradic[9]: restarted (epoch 1)\nradic[9]: replay done: live\n"
	if got := out.String(); got != want {
		t.Errorf("output %q, want %q", got, want)
	}
}

func TestDedupHashed(t *testing.T) {
	d := newDedup(0, "stdout")
	d.kept = nil
	if _, err := d.feed(0, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	d.kept = nil // as if beyond keepDelivered
	d.restart()
	_, err := d.feed(0, []byte("abd"))
	var de *DivergenceError
	if !errors.As(err, &de) || !de.Hashed || de.Offset != 3 {
		t.Fatalf("feed = %v, want a hashed divergence at 3", err)
	}
}

func TestWhereAndDescribe(t *testing.T) {
	w := newWhere(2)
	_, _, moved := w.get()
	if w.move(4, 0) {
		t.Error("move to epoch 0 accepted")
	}
	if !w.move(4, 1) {
		t.Fatal("move to epoch 1 refused")
	}
	select {
	case <-moved:
	default:
		t.Error("moved not closed")
	}
	if n, e, _ := w.get(); n != 4 || e != 1 {
		t.Errorf("get = %d, %d, want 4, 1", n, e)
	}
}

// TestWhereFinish: a rank its daemons report finished gives its exit to
// radic run even if its node is gone; an older instance's report does
// not.
func TestWhereFinish(t *testing.T) {
	w := newWhere(2)
	w.move(4, 2)
	_, _, moved := w.get()
	w.finish(2, 1, launch.Exit{Code: 7})
	if _, ok := w.finished(); ok {
		t.Fatal("an older instance's exit was taken")
	}
	w.finish(4, 2, launch.Exit{Code: 3})
	if e, ok := w.finished(); !ok || e.Code != 3 {
		t.Fatalf("finished = %+v, %v; want code 3", e, ok)
	}
	select {
	case <-moved:
	default:
		t.Error("moved not closed by finish: watchExit would wait out its retry")
	}
	f := &follower{wh: []*where{newWhere(0)}, logf: t.Logf}
	f.learn(launch.JobRecovery{Ranks: []launch.RankLoc{{Rank: 0, Node: 1, Finished: true, Exit: &launch.Exit{Code: 5}}}})
	if e, ok := f.wh[0].finished(); !ok || e.Code != 5 {
		t.Errorf("learn of a finished rank: finished = %+v, %v; want code 5", e, ok)
	}
}

func TestDescribeRecovery(t *testing.T) {
	at := time.Date(2026, 1, 1, 12, 1, 3, 120e6, time.Local)
	mb38 := uint64(38_000_000)
	zero := uint64(0)
	ok := launch.RecoveryEvent{Group: 2, Cause: "node", From: 2, To: 4, Epoch: 1, Start: at, Seconds: 0.84}
	with := func(f func(*launch.RecoveryEvent)) launch.RecoveryEvent {
		ev := ok
		f(&ev)
		return ev
	}
	cases := []struct {
		ev    launch.RecoveryEvent
		ranks []int
		want  string
	}{
		{ok, []int{2}, "node 2 died at 12:01:03.120; rank 2 restarted on node 4 in 0.84 s; live again"},
		{with(func(e *launch.RecoveryEvent) { e.Replayed = &mb38 }), []int{2, 6},
			"node 2 died at 12:01:03.120; ranks 2,6 restarted on node 4 in 0.84 s; replayed 38 MB; live again"},
		{with(func(e *launch.RecoveryEvent) { e.Replayed = &zero }), []int{2, 6},
			"node 2 died at 12:01:03.120; ranks 2,6 restarted on node 4 in 0.84 s; replayed 0 B; live again"},
		{with(func(e *launch.RecoveryEvent) { e.Cause, e.From, e.To = "process", 1, 1 }), []int{1},
			"a rank of node 1 died at 12:01:03.120; rank 1 restarted on node 1 in 0.84 s; live again"},
		{with(func(e *launch.RecoveryEvent) {
			e.Phase, e.Warning = "reprotect", "protector: no other active node left to protect the group"
		}), []int{2},
			"node 2 died at 12:01:03.120; rank 2 restarted on node 4 in 0.84 s; live again, but unprotected (a further failure of node 4 is fatal): protector: no other active node left to protect the group"},
		{with(func(e *launch.RecoveryEvent) {
			e.Phase, e.Warning = "replay", "protector: the new host died during recovery; the recovery starts again"
		}), []int{2},
			"node 2 died at 12:01:03.120; the restart of rank 2 on node 4 was interrupted in replay after 0.84 s: protector: the new host died during recovery; the recovery starts again"},
		{with(func(e *launch.RecoveryEvent) {
			e.Phase, e.Error, e.Seconds = "restart", "protector: no node to restart on", 5
		}), []int{2, 6},
			"recovery of ranks 2,6 (group 2, from node 2) failed in restart after 5.00 s: protector: no node to restart on"},
		{launch.RecoveryEvent{Group: 3, From: 3, To: -1, Phase: "confirm", Error: "protector: every holder of the group's critical data died", Start: at}, nil,
			"recovery of the ranks of node 3 (group 3) failed in confirm: protector: every holder of the group's critical data died"},
	}
	for _, c := range cases {
		if got := DescribeRecovery(c.ev, c.ranks); got != c.want {
			t.Errorf("DescribeRecovery(%+v, %v) =\n\t%q\nwant\n\t%q", c.ev, c.ranks, got, c.want)
		}
	}
}

func TestSizeSI(t *testing.T) {
	for _, c := range []struct {
		n    uint64
		want string
	}{{0, "0 B"}, {999, "999 B"}, {1000, "1.0 kB"}, {1536, "1.5 kB"}, {38_000_000, "38 MB"}, {38 << 20, "40 MB"}, {2_100_000_000, "2.1 GB"}} {
		if got := SizeSI(c.n); got != c.want {
			t.Errorf("SizeSI(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

// TestLearnPrintsAndFails: new events are printed once, older than the
// job are skipped, and a failed recovery stops the job with its line.
func TestLearnPrintsAndFails(t *testing.T) {
	var lines []string
	since := time.Now()
	f := &follower{job: "j", nodes: []int{0}, wh: []*where{newWhere(0), newWhere(1)}, failed: make(chan error, 1), since: since,
		logf: func(format string, a ...any) { lines = append(lines, fmt.Sprintf(format, a...)) }}
	jr := launch.JobRecovery{Job: "j", Ranks: []launch.RankLoc{{Job: "j", Rank: 1, Group: 1, Node: 2, Epoch: 1}},
		Events: []launch.RecoveryEvent{
			{Group: 1, Cause: "node", From: 1, To: 2, Epoch: 1, Start: since.Add(-time.Hour), Seconds: 1}, // a previous job's
			{Group: 1, Cause: "node", From: 1, To: 2, Epoch: 1, Start: since.Add(time.Second), Seconds: 0.5},
		}}
	f.learn(jr)
	f.learn(jr)
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "radic run: node 1 died at ") || !strings.HasSuffix(lines[0], "; rank 1 restarted on node 2 in 0.50 s; live again") {
		t.Errorf("printed %q, want one recovery line", lines)
	}
	if n, e, _ := f.wh[1].get(); n != 2 || e != 1 {
		t.Errorf("rank 1 is at node %d epoch %d, want 2, 1", n, e)
	}
	jr.Events = append(jr.Events, launch.RecoveryEvent{Group: 1, Cause: "node", From: 2, To: 3, Epoch: 2, Start: since.Add(2 * time.Second),
		Seconds: 5, Phase: "restart", Error: "protector: no node to restart on"})
	f.learn(jr)
	select {
	case err := <-f.failed:
		if want := "recovery of rank 1 (group 1, from node 2) failed in restart after 5.00 s: protector: no node to restart on"; err.Error() != want {
			t.Errorf("failure %q, want %q", err, want)
		}
	default:
		t.Error("a failed recovery did not stop the job")
	}
	// A group whose ranks had all finished is not restarted: the line
	// says so rather than naming a restart.
	lines = nil
	jr.Ranks = append(jr.Ranks, launch.RankLoc{Job: "j", Rank: 0, Group: 0, Node: 0, Finished: true, Exit: &launch.Exit{}})
	jr.Events = append(jr.Events, launch.RecoveryEvent{Group: 0, Cause: "node", From: 0, To: 4, Epoch: 1, Start: since.Add(3 * time.Second), Seconds: 0.2})
	f.learn(jr)
	if len(lines) != 1 || !strings.HasSuffix(lines[0], "; rank 0 had finished: nothing to restart") {
		t.Errorf("printed %q, want rank 0 had finished", lines)
	}
}
