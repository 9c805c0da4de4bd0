package netsim

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"time"
)

// Handler receives the packets addressed to a node: whole torus packets
// (magic 'T') and collective packets (magic 'C'). pkt belongs to the
// handler. now is the simulation's virtual time.
type Handler func(now time.Time, pkt []byte)

// Faults are the seeded faults a Sim injects into torus traffic. Each
// packet draws once when it is sent, so a run is reproducible from the
// seed alone.
type Faults struct {
	Drop      float64 // probability a packet is lost
	Duplicate float64 // probability a packet arrives twice
	Reorder   float64 // probability a packet is held back ...
	// Delay is the most a packet is held back, so that later ones
	// overtake it. Delta-t assumes a maximum packet lifetime (deltat MPL):
	// keep Delay plus the route's latency below it, or old duplicates can
	// outlive the connection records.
	Delay time.Duration
}

// SimConfig configures a Sim.
type SimConfig struct {
	Shape Shape
	// HopLatency is the time a packet takes across one link (default
	// 100 ns; the BG/P torus is of that order).
	HopLatency time.Duration
	Faults     Faults
	Seed       uint64
	Start      time.Time // virtual time zero (default Unix 1e9)
	// Tap, if set, sees every packet put on a network (torus packets as
	// sent, before faults; collective packets on every link), for traces.
	// It must not keep or modify pkt.
	Tap func(now time.Time, pkt []byte)
}

// SimStats counts what the network did.
type SimStats struct {
	Sent, Delivered, Hops                  uint64
	Dropped, Duplicated, Reordered         uint64 // by the seeded faults
	LinkDownDrops, CrashedDrops, BadPacket uint64
	TreeSent, TreeDelivered                uint64
}

// Sim is an in-memory Blue Gene machine: a torus and a collective network
// driven by a virtual clock. Packets move hop by hop along dimension-order
// routes, so a link that is down or a crashed node on the route loses the
// packet, as it would on the machine. Sim is not safe for concurrent use:
// one goroutine runs the whole machine, which is what makes it
// deterministic.
type Sim struct {
	cfg      SimConfig
	tree     Tree
	now      int64 // ns since cfg.Start
	seq      uint64
	events   eventHeap
	rng      *rand.Rand
	handlers []Handler
	switches []*Switch // created on first collective use
	crashed  []bool
	down     map[linkKey]bool
	Stats    SimStats
}

type linkKey struct {
	node NodeID
	dir  Dir
}

// NewSim makes a machine of cfg.Shape.Nodes() nodes with no handlers.
func NewSim(cfg SimConfig) (*Sim, error) {
	if err := cfg.Shape.Validate(); err != nil {
		return nil, err
	}
	if cfg.HopLatency == 0 {
		cfg.HopLatency = 100 * time.Nanosecond
	}
	if cfg.Start.IsZero() {
		cfg.Start = time.Unix(1_000_000_000, 0)
	}
	n := cfg.Shape.Nodes()
	return &Sim{
		cfg:      cfg,
		tree:     Tree{N: n},
		rng:      rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		handlers: make([]Handler, n),
		crashed:  make([]bool, n),
		down:     map[linkKey]bool{},
	}, nil
}

// Shape is the torus shape.
func (s *Sim) Shape() Shape { return s.cfg.Shape }

// Now is the virtual time.
func (s *Sim) Now() time.Time { return s.cfg.Start.Add(time.Duration(s.now)) }

// Handle sets the receiver of node id.
func (s *Sim) Handle(id NodeID, h Handler) { s.handlers[id] = h }

// Crash stops node id: it receives nothing and forwards nothing (its
// router is part of the node). Restart undoes it.
func (s *Sim) Crash(id NodeID)   { s.crashed[id] = true }
func (s *Sim) Restart(id NodeID) { s.crashed[id] = false }

// SetLink takes link d of node id (both directions of the cable) down or
// up.
func (s *Sim) SetLink(id NodeID, d Dir, up bool) {
	other := s.cfg.Shape.ID(s.cfg.Shape.Neighbour(s.cfg.Shape.Coord(id), d))
	for _, k := range []linkKey{{id, d}, {other, d.Reverse()}} {
		if up {
			delete(s.down, k)
		} else {
			s.down[k] = true
		}
	}
}

// SetFaults replaces the fault model from now on.
func (s *Sim) SetFaults(f Faults) { s.cfg.Faults = f }

// At runs fn at virtual time t (at once if t has passed, after the events
// already due).
func (s *Sim) At(t time.Time, fn func(now time.Time)) {
	s.push(event{at: max(int64(t.Sub(s.cfg.Start)), s.now), kind: evTimer, fn: fn})
}

// After runs fn d from now.
func (s *Sim) After(d time.Duration, fn func(now time.Time)) { s.At(s.Now().Add(d), fn) }

// Send injects a torus packet at its source node. The packet must be a
// valid torus packet whose Src is on the torus; the Sim owns it from now
// on. Faults are drawn here.
func (s *Sim) Send(pkt []byte) error {
	h, _, err := DecodeTorus(pkt)
	if err != nil {
		return err
	}
	if !s.cfg.Shape.Contains(h.Src) || !s.cfg.Shape.Contains(h.Dst) {
		return fmt.Errorf("%w: %v -> %v off the torus", ErrBadPacket, h.Src, h.Dst)
	}
	src := s.cfg.Shape.ID(h.Src)
	s.Stats.Sent++
	if s.cfg.Tap != nil {
		s.cfg.Tap(s.Now(), pkt)
	}
	f := s.cfg.Faults
	if f.Drop > 0 && s.rng.Float64() < f.Drop {
		s.Stats.Dropped++
		return nil
	}
	copies := 1
	if f.Duplicate > 0 && s.rng.Float64() < f.Duplicate {
		s.Stats.Duplicated++
		copies = 2
	}
	for i := range copies {
		p := pkt
		if i > 0 {
			p = append([]byte(nil), pkt...)
		}
		var delay int64
		if f.Reorder > 0 && f.Delay > 0 && s.rng.Float64() < f.Reorder {
			s.Stats.Reordered++
			delay = s.rng.Int64N(int64(f.Delay)) + 1
		}
		s.push(event{at: s.now + delay, kind: evTorus, node: src, pkt: p})
	}
	return nil
}

// SendTorus builds and injects a packet from src to dst.
func (s *Sim) SendTorus(src, dst NodeID, proto Proto, payload []byte) error {
	sh := s.cfg.Shape
	buf := make([]byte, 0, TorusHeaderLen+len(payload))
	return s.Send(AppendTorus(buf, TorusHeader{Proto: proto, Src: sh.Coord(src), Dst: sh.Coord(dst)}, payload))
}

// SendTree puts a collective packet (a broadcast or this node's reduce
// contribution) on the collective network at node src.
func (s *Sim) SendTree(src NodeID, pkt []byte) error {
	sw := s.switchOf(src)
	if err := sw.Inject(pkt); err != nil {
		return err
	}
	s.drainSwitch(src, sw)
	return nil
}

func (s *Sim) switchOf(id NodeID) *Switch {
	if s.switches == nil {
		s.switches = make([]*Switch, len(s.handlers))
	}
	if s.switches[id] == nil {
		s.switches[id] = NewSwitch(s.tree, id)
	}
	return s.switches[id]
}

func (s *Sim) drainSwitch(id NodeID, sw *Switch) {
	sends, deliver := sw.Ready()
	for _, d := range deliver {
		s.Stats.TreeDelivered++
		if h := s.handlers[id]; h != nil && !s.crashed[id] {
			h(s.Now(), d)
		}
	}
	for _, snd := range sends {
		s.Stats.TreeSent++
		if s.cfg.Tap != nil {
			s.cfg.Tap(s.Now(), snd.Pkt)
		}
		s.push(event{at: s.now + int64(s.cfg.HopLatency), kind: evTree, node: snd.To, from: id, pkt: snd.Pkt})
	}
}

// Run processes every event due up to and including t, then sets the
// clock to t.
func (s *Sim) Run(t time.Time) {
	end := int64(t.Sub(s.cfg.Start))
	for len(s.events) > 0 && s.events[0].at <= end {
		e := heap.Pop(&s.events).(event)
		s.now = e.at
		switch e.kind {
		case evTimer:
			e.fn(s.Now())
		case evTorus:
			s.hop(e.node, e.pkt)
		case evTree:
			s.treeHop(e.from, e.node, e.pkt)
		}
	}
	s.now = max(s.now, end)
}

// RunFor runs d of virtual time.
func (s *Sim) RunFor(d time.Duration) { s.Run(s.Now().Add(d)) }

// Idle reports whether no event is queued.
func (s *Sim) Idle() bool { return len(s.events) == 0 }

// hop handles a torus packet that has arrived at node at.
func (s *Sim) hop(at NodeID, pkt []byte) {
	if s.crashed[at] {
		s.Stats.CrashedDrops++
		return
	}
	sh := s.cfg.Shape
	dst := Coord{uint16(pkt[10])<<8 | uint16(pkt[11]), uint16(pkt[12])<<8 | uint16(pkt[13]), uint16(pkt[14])<<8 | uint16(pkt[15])}
	here := sh.Coord(at)
	d, ok := sh.NextHopRoute(here, dst, Route(pkt[1]>>4))
	if !ok {
		s.Stats.Delivered++
		if h := s.handlers[at]; h != nil {
			h(s.Now(), pkt)
		}
		return
	}
	if s.down[linkKey{at, d}] {
		s.Stats.LinkDownDrops++
		return
	}
	pkt[2]++ // hops
	s.Stats.Hops++
	s.push(event{at: s.now + int64(s.cfg.HopLatency), kind: evTorus, node: sh.ID(sh.Neighbour(here, d)), pkt: pkt})
}

func (s *Sim) treeHop(from, at NodeID, pkt []byte) {
	if s.crashed[at] {
		s.Stats.CrashedDrops++
		return
	}
	sw := s.switchOf(at)
	if err := sw.Step(from, pkt); err != nil {
		s.Stats.BadPacket++
		return
	}
	s.drainSwitch(at, sw)
}

func (s *Sim) push(e event) {
	s.seq++
	e.seq = s.seq
	heap.Push(&s.events, e)
}

type evKind uint8

const (
	evTimer evKind = iota
	evTorus
	evTree
)

type event struct {
	at   int64
	seq  uint64 // FIFO among events due at the same time
	kind evKind
	node NodeID
	from NodeID
	pkt  []byte
	fn   func(time.Time)
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = event{}
	*h = old[:len(old)-1]
	return e
}
