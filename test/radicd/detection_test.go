package radicd_test

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

const trials = 20

// TestKillDetection SIGKILLs a node 20 times (rotating through the ring),
// measures the time until its monitor declares it dead, and restarts it.
func TestKillDetection(t *testing.T) {
	const n = 4
	r := startRing(t, 1, n, nil)
	var took []time.Duration
	for trial := range trials {
		x := trial % n
		mon := (x + 1) % n
		before, _ := r.status(mon)
		oldInc := member(before, x).Inc
		f0 := r.metric(mon, "radic_failures_detected_total", `kind="unreachable"`)
		h0 := r.metric(mon, "radic_detection_seconds_count", "")
		t0 := time.Now()
		r.kill(x)
		m, ok := r.waitDeclared(mon, x, 3*time.Second)
		if !ok {
			t.Fatalf("trial %d: node %d not declared dead by %d within 3s", trial, x, mon)
		}
		if m.Inc != oldInc || m.Cause != "unreachable" {
			t.Errorf("trial %d: declared %+v, want incarnation %d, cause unreachable", trial, m, oldInc)
		}
		d := m.DeclaredAt.Sub(t0)
		took = append(took, d)
		// Counted once, by the monitor; the others only learn of it.
		if df := r.metric(mon, "radic_failures_detected_total", `kind="unreachable"`) - f0; df != 1 {
			t.Errorf("trial %d: monitor's radic_failures_detected_total{kind=unreachable} grew by %v, want 1", trial, df)
		}
		if dh := r.metric(mon, "radic_detection_seconds_count", "") - h0; dh != 1 {
			t.Errorf("trial %d: monitor's radic_detection_seconds_count grew by %v, want 1", trial, dh)
		}
		for i := range n {
			if i != mon && i != x && r.failures(i) != 0 {
				t.Errorf("trial %d: node %d (not the monitor) counted a failure", trial, i)
			}
		}
		r.start(x)
		r.waitRing(n, 5*time.Second)
	}
	slices.Sort(took)
	t.Logf("detection after SIGKILL, %d trials: min %v  median %v  p90 %v  max %v",
		len(took), took[0].Round(time.Millisecond), percentile(took, 0.5).Round(time.Millisecond),
		percentile(took, 0.9).Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
	t.Logf("all: %v", roundAll(took))
	if max := took[len(took)-1]; max >= time.Second {
		t.Errorf("slowest detection %v, want < 1s", max)
	}
}

func roundAll(d []time.Duration) []time.Duration {
	out := make([]time.Duration, len(d))
	for i, x := range d {
		out[i] = x.Round(time.Millisecond)
	}
	return out
}

// TestLongFreezeDetected SIGSTOPs a node for longer than the timeout: it
// is declared dead; on SIGCONT it fences itself, learns it was declared and
// rejoins as a new incarnation.
func TestLongFreezeDetected(t *testing.T) {
	const n = 4
	r := startRing(t, 11, n, nil)
	before, _ := r.status(2)
	old := before.Ring.Inc
	t0 := time.Now()
	if err := syscall.Kill(r.pid(2), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	m, ok := r.waitDeclared(3, 2, 3*time.Second)
	if !ok {
		syscall.Kill(r.pid(2), syscall.SIGCONT)
		t.Fatal("a node frozen for 3s was not declared dead")
	}
	t.Logf("frozen node declared %s after %v", m.Cause, m.DeclaredAt.Sub(t0).Round(time.Millisecond))
	time.Sleep(time.Second) // frozen for > 1.5 s in all
	if err := syscall.Kill(r.pid(2), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	r.waitRing(n, 5*time.Second)
	after, err := r.status(2)
	if err != nil {
		t.Fatal(err)
	}
	if after.Ring.Inc <= old {
		t.Errorf("thawed node kept incarnation %d, want a new one > %d", after.Ring.Inc, old)
	}
	if r.metric(2, "radic_fences_total", "") != 1 {
		t.Errorf("thawed node did not fence itself once")
	}
	var stale float64
	for i := range n {
		stale += r.metric(i, "radic_stale_rejected_total", "")
	}
	t.Logf("datagrams of the dead incarnation rejected: %v; new incarnation %d", stale, after.Ring.Inc)
}

// TestShortFreezeNoFalsePositive freezes a node 20 times for 250 ms: the
// watchdog may fire (the silence its monitor sees is the freeze plus up to
// one period) but the node answers the probes once thawed, so nothing is
// declared; the freeze is shorter than the fence timeout, so it does not
// fence itself either.
func TestShortFreezeNoFalsePositive(t *testing.T) {
	const n = 4
	r := startRing(t, 21, n, nil)
	rng := testenv.Rand(t)
	before, _ := r.status(2)
	for trial := range trials {
		// Freeze at a random phase of the heartbeat period.
		time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
		if err := syscall.Kill(r.pid(2), syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(250 * time.Millisecond)
		if err := syscall.Kill(r.pid(2), syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		time.Sleep(700 * time.Millisecond)
		for i := range n {
			if f := r.failures(i); f != 0 {
				t.Fatalf("trial %d: node %d counted %v failures after a 250ms freeze", trial, i, f)
			}
		}
	}
	after, _ := r.status(2)
	if after.Ring.Inc != before.Ring.Inc || after.Ring.Fenced {
		t.Errorf("node 2 changed incarnation or fenced: %d -> %d, fenced %v", before.Ring.Inc, after.Ring.Inc, after.Ring.Fenced)
	}
	missed := r.metric(3, "radic_heartbeats_missed_total", "")
	refuted := r.metric(3, "radic_suspicions_refuted_total", "")
	t.Logf("%d freezes of 250ms: no false positive; the watchdog fired %v times and the probes refuted %v suspicions", trials, missed, refuted)
}
