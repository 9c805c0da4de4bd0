package timerq

import (
	"slices"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

var t0 = time.Unix(1000, 0)

// Entries come out earliest first, and only when due.
func TestPopDueInOrder(t *testing.T) {
	rng := testenv.Rand(t)
	var q Queue[int]
	var want []time.Duration
	for i := range 1000 {
		d := time.Duration(rng.IntN(500)) * time.Millisecond
		q.Push(t0.Add(d), i)
		want = append(want, d)
	}
	slices.Sort(want)
	var got []time.Duration
	for now := t0; q.Len() > 0; now = now.Add(100 * time.Millisecond) {
		for {
			_, at, ok := q.PopDue(now)
			if !ok {
				break
			}
			if at.After(now) {
				t.Fatalf("PopDue(%v) = entry at %v: not due", now.Sub(t0), at.Sub(t0))
			}
			got = append(got, at.Sub(t0))
		}
		if n := q.Next(); !n.IsZero() && !n.After(now) {
			t.Fatalf("Next() = %v after popping everything due at %v", n.Sub(t0), now.Sub(t0))
		}
	}
	if !slices.Equal(got, want) {
		t.Fatal("entries not popped in time order")
	}
	if q.h != nil || !q.Next().IsZero() {
		t.Fatal("an empty queue holds memory or a deadline")
	}
}

// Schedule pushes only when the new deadline is earlier than the
// record's current entry.
func TestSchedule(t *testing.T) {
	var q Queue[string]
	var cur time.Time
	for _, tc := range []struct {
		at   time.Duration
		push bool
	}{
		{10, true},  // no entry yet
		{20, false}, // later: the entry at 10 comes up first and reschedules
		{10, false}, // the same
		{5, true},   // earlier
	} {
		n := q.Len()
		q.Schedule(t0.Add(tc.at), "r", &cur)
		if pushed := q.Len() > n; pushed != tc.push {
			t.Errorf("Schedule(%v) pushed = %v, want %v", tc.at, pushed, tc.push)
		}
	}
	if !cur.Equal(t0.Add(5)) || !q.Next().Equal(t0.Add(5)) {
		t.Errorf("cur %v, Next %v; want both at 5", cur.Sub(t0), q.Next().Sub(t0))
	}
}

func BenchmarkPushPop(b *testing.B) {
	var q Queue[uint32]
	for i := range 64 {
		q.Push(t0.Add(time.Duration(i)), uint32(i))
	}
	now := t0.Add(64)
	b.ReportAllocs()
	for b.Loop() {
		k, at, _ := q.PopDue(now)
		q.Push(at.Add(64), k)
		now = now.Add(1)
	}
}
