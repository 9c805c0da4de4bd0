package jobrun

import (
	"errors"
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
	at := time.Date(2026, 1, 1, 12, 1, 3, 120e6, time.Local)
	got := describe(launch.RecoveryEvent{Group: 2, Cause: "node", From: 2, To: 4, Epoch: 1, Start: at, Seconds: 0.84}, []int{2})
	if want := "node 2 died at 12:01:03.120; rank 2 restarted on node 4 in 0.84 s"; got != want {
		t.Errorf("describe = %q, want %q", got, want)
	}
}
