// Package timerq is the timer heap of the protocol cores (delta-t, bulk,
// frag): deadlines keyed by the record they belong to, earliest first, so
// that a Tick pops only the entries that are due and an idle record costs
// nothing.
//
// Entries are never removed before they come up. A record remembers the
// time of its earliest entry (Schedule's cur); when it comes up, the
// owner looks the record up by key and handles the entry only if the
// record still exists and cur equals the entry's time (then it sets cur
// to zero and schedules the record's next deadline). Any other entry is
// stale and dropped. A record whose deadline moves later therefore does no
// heap work at all (its old entry comes up early, once, and reschedules);
// one whose deadline moves earlier pushes one entry.
package timerq

import "time"

// Queue is a min-heap of deadlines. The zero value is empty and ready;
// an empty queue holds no memory.
type Queue[K comparable] struct {
	h []entry[K]
}

type entry[K comparable] struct {
	at  time.Time
	key K
}

// Len is the number of entries, stale ones included.
func (q *Queue[K]) Len() int { return len(q.h) }

// Next is the earliest entry's time (zero: none).
func (q *Queue[K]) Next() time.Time {
	if len(q.h) == 0 {
		return time.Time{}
	}
	return q.h[0].at
}

// Schedule makes sure an entry for k at at or earlier exists, given that
// *cur is the time of k's earliest entry (zero: none): it pushes one and
// sets *cur only when at is before *cur.
func (q *Queue[K]) Schedule(at time.Time, k K, cur *time.Time) {
	if !cur.IsZero() && !at.Before(*cur) {
		return
	}
	*cur = at
	q.Push(at, k)
}

// Push adds an entry.
func (q *Queue[K]) Push(at time.Time, k K) {
	q.h = append(q.h, entry[K]{at, k})
	// Sift up.
	i := len(q.h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q.h[i].at.Before(q.h[p].at) {
			break
		}
		q.h[i], q.h[p] = q.h[p], q.h[i]
		i = p
	}
}

// PopDue removes and returns the earliest entry if it is due at now (its
// time is not after now).
func (q *Queue[K]) PopDue(now time.Time) (k K, at time.Time, ok bool) {
	if len(q.h) == 0 || now.Before(q.h[0].at) {
		return k, at, false
	}
	e := q.h[0]
	last := len(q.h) - 1
	q.h[0] = q.h[last]
	q.h[last] = entry[K]{}
	q.h = q.h[:last]
	if last == 0 {
		q.h = nil // an idle core holds no memory
		return e.key, e.at, true
	}
	// Sift down.
	i := 0
	for {
		l := 2*i + 1
		if l >= last {
			break
		}
		m := l
		if r := l + 1; r < last && q.h[r].at.Before(q.h[l].at) {
			m = r
		}
		if !q.h[m].at.Before(q.h[i].at) {
			break
		}
		q.h[i], q.h[m] = q.h[m], q.h[i]
		i = m
	}
	return e.key, e.at, true
}

// Clear drops every entry: for a core that has no records left, whose
// entries are all stale.
func (q *Queue[K]) Clear() { q.h = nil }
