// Package hbtest is the in-memory twin of the heartbeat transports: a
// Network of endpoints with per-link cuts, isolation and loss, for tests of
// heartbeat.Runner (inside testing/synctest) and of the daemon.
package hbtest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"

	"github.com/radic-project/radic/heartbeat"
)

var _ heartbeat.Transport = (*Endpoint)(nil)

// Network connects Endpoints in memory. Its methods are safe for
// concurrent use.
type Network struct {
	mu sync.Mutex
	// +checklocks:mu
	eps map[heartbeat.NodeID]*Endpoint
	// +checklocks:mu
	cut map[[2]heartbeat.NodeID]bool
	// +checklocks:mu
	loss float64
	// +checklocks:mu
	rng *rand.Rand
}

// NewNetwork makes an empty network; seed drives the loss.
func NewNetwork(seed uint64) *Network {
	return &Network{
		eps: map[heartbeat.NodeID]*Endpoint{},
		cut: map[[2]heartbeat.NodeID]bool{},
		rng: rand.New(rand.NewPCG(seed, seed)),
	}
}

// Endpoint attaches node id; an earlier endpoint of id is closed.
func (n *Network) Endpoint(id heartbeat.NodeID) *Endpoint {
	n.mu.Lock()
	defer n.mu.Unlock()
	if old := n.eps[id]; old != nil {
		old.close()
	}
	e := &Endpoint{net: n, id: id, in: make(chan []byte, 256), done: make(chan struct{})}
	n.eps[id] = e
	return e
}

// Cut drops datagrams between a and b, both ways.
func (n *Network) Cut(a, b heartbeat.NodeID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[[2]heartbeat.NodeID{a, b}] = true
	n.cut[[2]heartbeat.NodeID{b, a}] = true
}

// Isolate cuts every link of id.
func (n *Network) Isolate(id heartbeat.NodeID, members []heartbeat.NodeID) {
	for _, o := range members {
		if o != id {
			n.Cut(id, o)
		}
	}
}

// Heal removes all cuts.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = map[[2]heartbeat.NodeID]bool{}
}

// SetLoss drops each datagram with probability p.
func (n *Network) SetLoss(p float64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.loss = p
}

func (n *Network) deliver(from, to heartbeat.NodeID, b []byte) error {
	n.mu.Lock()
	dst := n.eps[to]
	drop := n.cut[[2]heartbeat.NodeID{from, to}] || (n.loss > 0 && n.rng.Float64() < n.loss)
	n.mu.Unlock()
	if dst == nil {
		return nil // nobody listens: lost, like UDP
	}
	if drop {
		return nil
	}
	select {
	case dst.in <- append([]byte(nil), b...):
	default: // queue full: lost
	}
	return nil
}

// Endpoint is one node's attachment to a Network.
type Endpoint struct {
	net       *Network
	id        heartbeat.NodeID
	in        chan []byte
	closeOnce sync.Once
	done      chan struct{}
}

// Send implements heartbeat.Transport.
func (e *Endpoint) Send(to heartbeat.NodeID, b []byte) error {
	select {
	case <-e.done:
		return fmt.Errorf("hbtest: send on node %d: %w", e.id, net.ErrClosed)
	default:
	}
	return e.net.deliver(e.id, to, b)
}

// Recv implements heartbeat.Transport.
func (e *Endpoint) Recv(b []byte) (int, error) {
	select {
	case p := <-e.in:
		return copy(b, p), nil
	case <-e.done:
		return 0, fmt.Errorf("hbtest: recv on node %d: %w", e.id, net.ErrClosed)
	}
}

// Close implements heartbeat.Transport.
func (e *Endpoint) Close() error {
	e.net.mu.Lock()
	if e.net.eps[e.id] == e {
		delete(e.net.eps, e.id)
	}
	e.net.mu.Unlock()
	e.close()
	return nil
}

func (e *Endpoint) close() { e.closeOnce.Do(func() { close(e.done) }) }
