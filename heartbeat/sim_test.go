package heartbeat

import (
	"slices"
	"testing"
	"time"
)

// sim drives pure cores over a simulated network with a manual clock, in
// 1 ms steps: drop/cut/isolate links, crash, freeze and restart nodes.
type sim struct {
	t        *testing.T
	now      time.Time
	cfg      Config
	nodes    map[NodeID]*Node
	stats    map[NodeID]*Stats
	next     map[NodeID]time.Time
	frozen   map[NodeID]bool
	cut      map[[2]NodeID]bool // from, to
	queue    []flight
	held     map[NodeID][]Message // for frozen nodes
	latency  time.Duration
	events   []simEvent
	sent     int
	incCount map[NodeID]uint64
}

type flight struct {
	at  time.Time
	msg []byte
	to  NodeID
}

type simEvent struct {
	at time.Time
	on NodeID
	Event
}

func newSim(t *testing.T, n int, spares ...NodeID) *sim {
	t.Helper()
	s := &sim{
		t: t, now: time.Unix(1_000_000, 0),
		nodes: map[NodeID]*Node{}, stats: map[NodeID]*Stats{}, next: map[NodeID]time.Time{},
		frozen: map[NodeID]bool{}, cut: map[[2]NodeID]bool{}, held: map[NodeID][]Message{},
		latency: time.Millisecond, incCount: map[NodeID]uint64{},
	}
	for i := range n {
		s.cfg.Members = append(s.cfg.Members, NodeID(i))
	}
	for i := range n {
		s.start(NodeID(i), slices.Contains(spares, NodeID(i)))
	}
	return s
}

func (s *sim) start(id NodeID, spare bool) {
	s.t.Helper()
	cfg := s.cfg
	cfg.Self = id
	cfg.Spare = spare
	s.incCount[id]++
	cfg.Incarnation = s.incCount[id] * 10
	st := new(Stats)
	n, err := New(cfg, st, s.now)
	if err != nil {
		s.t.Fatal(err)
	}
	s.nodes[id], s.stats[id], s.next[id] = n, st, s.now
	s.drain(id)
}

func (s *sim) crash(id NodeID) { delete(s.nodes, id) }

// isolate cuts every link of id, both ways; heal undoes all cuts.
func (s *sim) isolate(id NodeID) {
	for _, o := range s.cfg.Members {
		s.cut[[2]NodeID{id, o}] = true
		s.cut[[2]NodeID{o, id}] = true
	}
}
func (s *sim) cutLink(a, b NodeID) {
	s.cut[[2]NodeID{a, b}] = true
	s.cut[[2]NodeID{b, a}] = true
}
func (s *sim) heal() { s.cut = map[[2]NodeID]bool{} }

func (s *sim) freeze(id NodeID) { s.frozen[id] = true }
func (s *sim) thaw(id NodeID) {
	delete(s.frozen, id)
	// A frozen process finds its socket buffer full on waking: the
	// runner ticks and reads in some order; tick first (the harder case).
	if n := s.nodes[id]; n != nil {
		n.Tick(s.now)
		s.drain(id)
		for _, m := range s.held[id] {
			n.Step(m, s.now)
			s.drain(id)
		}
	}
	delete(s.held, id)
}

// thawReadFirst is thaw with the other order, the real runner's: the
// datagrams queued while frozen are read before the first tick, and the
// first of them is news, from a live neighbour, that id was declared dead.
func (s *sim) thawReadFirst(id NodeID, from NodeID) {
	delete(s.frozen, id)
	if n := s.nodes[id]; n != nil {
		news := Message{Type: MsgHeartbeat, From: from, To: id, View: s.nodes[from].view()}
		_, news.FromInc = s.nodes[from].Self()
		for _, m := range append([]Message{news}, s.held[id]...) {
			n.Step(m, s.now)
			s.drain(id)
		}
		n.Tick(s.now)
		s.drain(id)
	}
	delete(s.held, id)
}

func (s *sim) drain(id NodeID) {
	n := s.nodes[id]
	rd := n.Ready()
	for _, m := range rd.Messages {
		s.sent++
		if s.cut[[2]NodeID{id, m.To}] {
			continue
		}
		s.queue = append(s.queue, flight{at: s.now.Add(s.latency), msg: m.Append(nil), to: m.To})
	}
	for _, e := range rd.Events {
		s.events = append(s.events, simEvent{at: s.now, on: id, Event: e})
	}
	s.next[id] = rd.NextTick
}

// run advances the clock by d.
func (s *sim) run(d time.Duration) {
	end := s.now.Add(d)
	for s.now.Before(end) {
		s.now = s.now.Add(time.Millisecond)
		q := s.queue
		s.queue = nil
		for _, f := range q {
			if f.at.After(s.now) {
				s.queue = append(s.queue, f)
				continue
			}
			n := s.nodes[f.to]
			if n == nil {
				continue
			}
			m, err := Decode(f.msg)
			if err != nil {
				s.t.Fatalf("decode: %v", err)
			}
			if s.frozen[f.to] {
				s.held[f.to] = append(s.held[f.to], m)
				continue
			}
			n.Step(m, s.now)
			s.drain(f.to)
		}
		for _, id := range s.cfg.Members {
			n := s.nodes[id]
			if n == nil || s.frozen[id] || s.now.Before(s.next[id]) {
				continue
			}
			n.Tick(s.now)
			s.drain(id)
			if !s.next[id].After(s.now) {
				s.t.Fatalf("node %d: after Tick(%v), NextTick = %v: the runner would spin", id, s.now, s.next[id])
			}
		}
	}
}

// find returns the events of a kind (on any node when on == None).
func (s *sim) find(kind EventKind, on NodeID, about NodeID) []simEvent {
	var out []simEvent
	for _, e := range s.events {
		if e.Kind == kind && (on == None || e.on == on) && (about == None || e.Node == about) {
			out = append(out, e)
		}
	}
	return out
}

func (s *sim) ring(id NodeID) []NodeID { return s.nodes[id].Status(s.now).Ring }
