package jobrun

import (
	"context"
	"sync"
	"time"
)

// refreshEvery is how often a running job asks where its nodes' daemons
// are: a readdressed node's polls in flight to its old address are ended
// within it, instead of hanging until their timeouts.
const refreshEvery = 250 * time.Millisecond

// book caches where the job's daemons are and says when one moved. One
// goroutine refreshes it (run), so the Daemons func is asked a few times a
// second per node, not per poll.
type book struct {
	lookup Daemons

	mu sync.Mutex
	// +checklocks:mu
	addr map[int]string
	// +checklocks:mu
	moved map[int]chan struct{} // closed when the node's address changes
}

func newBook(lookup Daemons) *book {
	return &book{lookup: lookup, addr: map[int]string{}, moved: map[int]chan struct{}{}}
}

// daemon is a Daemons func answering from the cache (asking lookup on a
// miss).
func (b *book) daemon(node int) (string, error) {
	b.mu.Lock()
	a, ok := b.addr[node]
	b.mu.Unlock()
	if ok {
		return a, nil
	}
	a, err := b.lookup(node)
	if err != nil {
		return "", err
	}
	b.set(node, a)
	return a, nil
}

// set records node's address, waking the polls made to the old one.
func (b *book) set(node int, a string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	old, ok := b.addr[node]
	if ok && old == a {
		return
	}
	b.addr[node] = a
	if ch := b.moved[node]; ch != nil {
		close(ch)
	}
	b.moved[node] = make(chan struct{})
}

// movedFrom returns a channel closed once node is no longer at addr
// (closed already if it is not there now).
func (b *book) movedFrom(node int, addr string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.addr[node] != addr || b.moved[node] == nil {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return b.moved[node]
}

// run refreshes the addresses of nodes until ctx ends.
func (b *book) run(ctx context.Context, nodes []int) {
	t := time.NewTicker(refreshEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, n := range nodes {
			if a, err := b.lookup(n); err == nil {
				b.set(n, a)
			}
		}
	}
}
