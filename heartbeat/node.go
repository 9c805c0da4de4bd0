package heartbeat

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// Failure causes, the `kind` label of radic_failures_detected_total.
const (
	// CauseUnreachable: the watchdog fired and no direct or indirect probe
	// was answered (the node died, hung, or is cut off from everybody).
	CauseUnreachable = "unreachable"
	// CauseFenced: the node announced that it fenced itself.
	CauseFenced = "fenced"
	// CauseRestarted: the node came back with a new incarnation before its
	// old one was declared (a daemon crash and quick restart).
	CauseRestarted = "restarted"
)

// Causes lists every failure cause.
var Causes = []string{CauseUnreachable, CauseFenced, CauseRestarted}

// EventKind says what an Event reports.
type EventKind uint8

// Events for the protector and the logs.
const (
	// EventDeclared: Node at incarnation Inc is dead (Cause); its
	// processes must be recovered by its protector. ByMe marks the
	// declarer; Detection is the silence before the declaration.
	EventDeclared EventKind = iota + 1
	// EventJoined: Node at incarnation Inc joined the ring.
	EventJoined
	// EventSuspect: the watchdog on Node fired; probes are under way.
	EventSuspect
	// EventRefuted: Node answered; the suspicion is cleared.
	EventRefuted
	// EventFence: this node must stop its managed processes now.
	EventFence
	// EventRejoin: this node was declared dead and rejoins as a new
	// incarnation Inc (its processes are already stopped).
	EventRejoin
	// EventPromoted: spare Node becomes active.
	EventPromoted
	// EventSuperseded: a newer incarnation of this very node exists; this
	// process is stale and must stop (it has fenced itself).
	EventSuperseded
)

func (k EventKind) String() string {
	switch k {
	case EventDeclared:
		return "declared"
	case EventJoined:
		return "joined"
	case EventSuspect:
		return "suspect"
	case EventRefuted:
		return "refuted"
	case EventFence:
		return "fence"
	case EventRejoin:
		return "rejoin"
	case EventPromoted:
		return "promoted"
	case EventSuperseded:
		return "superseded"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is one thing that happened to the ring.
type Event struct {
	Kind      EventKind
	Node      NodeID
	Inc       uint64
	Cause     string
	ByMe      bool
	Detection time.Duration
	At        time.Time
}

// Ready is what the core wants done: datagrams to send, events to act on,
// and when to call Tick next.
type Ready struct {
	Messages []Message
	Events   []Event
	NextTick time.Time
}

// Stats are the core's counters; read them with atomic loads from any
// goroutine.
type Stats struct {
	HeartbeatsSent     atomic.Uint64
	HeartbeatsReceived atomic.Uint64
	HeartbeatsMissed   atomic.Uint64 // watchdog deadlines missed
	ProbesSent         atomic.Uint64 // direct probes and probe requests
	Refuted            atomic.Uint64 // suspicions cleared by an answer
	IndirectSaves      atomic.Uint64 // ... of which through another member
	StaleRejected      atomic.Uint64 // datagrams from dead or older incarnations
	Stalls             atomic.Uint64 // this node was not scheduled for > 2 periods
	Fences             atomic.Uint64
	Unreachable        atomic.Uint64 // declarations by this node, per cause
	Fenced             atomic.Uint64
	Restarted          atomic.Uint64
	// DetectionNanos receives the detection time of each unreachable
	// declaration made here (set before use; may be nil).
	DetectionHook func(time.Duration)
}

type member struct {
	Entry
	heard       bool
	lastHeard   time.Time // last datagram from it, or indirect proof of life
	suspect     bool
	suspectAt   time.Time
	probedAt    time.Time // the last round of probes of a suspect
	nonce       uint64
	fencedSeen  time.Time // first heartbeat with the fenced flag, this incarnation
	declaredAt  time.Time
	cause       string
	lastNotice  time.Time
	lastSeq     uint64
	joinedAt    time.Time
	indirectAck bool // last proof of life came through a prober
}

// Node is the pure heartbeat/watchdog core of one ring member. It is not
// safe for concurrent use; one goroutine (the Runner) owns it.
type Node struct {
	cfg         Config
	self        *member
	fenced      bool
	fencedAt    time.Time
	lastContact time.Time
	lastTick    time.Time
	nextHB      time.Time
	seq         uint64
	nonce       uint64
	members     map[NodeID]*member
	ids         []NodeID // all members, sorted
	monitored   NodeID
	out         Ready
	stats       *Stats
}

// New makes a core. cfg is defaulted and validated; now starts the clocks.
func New(cfg Config, stats *Stats, now time.Time) (*Node, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if stats == nil {
		stats = new(Stats)
	}
	n := &Node{
		cfg:         cfg,
		members:     make(map[NodeID]*member, len(cfg.Members)),
		ids:         slices.Sorted(slices.Values(cfg.Members)),
		lastContact: now,
		lastTick:    now,
		nextHB:      now,
		monitored:   None,
		stats:       stats,
	}
	for _, id := range n.ids {
		n.members[id] = &member{Entry: Entry{ID: id, Role: RoleActive}}
	}
	n.self = n.members[cfg.Self]
	n.self.Inc = cfg.Incarnation
	n.self.State = Alive
	n.self.heard = true
	n.self.lastHeard = now
	n.self.joinedAt = now
	if cfg.Spare {
		n.self.Role = RoleSpare
	}
	return n, nil
}

// Self returns this node's id and current incarnation.
func (n *Node) Self() (NodeID, uint64) { return n.self.ID, n.self.Inc }

// Fenced reports whether this node has fenced itself.
func (n *Node) Fenced() bool { return n.fenced }

// Config returns the defaulted configuration.
func (n *Node) Config() Config { return n.cfg }

// Ready drains the pending output.
func (n *Node) Ready() Ready {
	r := n.out
	n.out = Ready{}
	r.NextTick = n.nextDeadline()
	return r
}

func (n *Node) emit(e Event) { n.out.Events = append(n.out.Events, e) }

func (n *Node) send(m Message) {
	m.From = n.self.ID
	m.FromInc = n.self.Inc
	m.Fenced = n.fenced
	m.Spare = n.self.Role == RoleSpare
	n.out.Messages = append(n.out.Messages, m)
}

func (n *Node) view() []Entry {
	v := make([]Entry, 0, len(n.ids))
	for _, id := range n.ids {
		if m := n.members[id]; m.State != Unknown {
			v = append(v, m.Entry)
		}
	}
	return v
}

// ring returns the alive members in id order.
func (n *Node) ring() []NodeID {
	r := make([]NodeID, 0, len(n.ids))
	for _, id := range n.ids {
		if n.members[id].State == Alive {
			r = append(r, id)
		}
	}
	return r
}

// neighbours returns the ring predecessor and successor of id (None when
// alone). id need not be alive: the neighbours of a dead node are the
// alive members around its position.
func neighbours(ring []NodeID, id NodeID) (pred, succ NodeID) {
	pred, succ = None, None
	var others []NodeID
	for _, r := range ring {
		if r != id {
			others = append(others, r)
		}
	}
	if len(others) == 0 {
		return None, None
	}
	i, _ := slices.BinarySearch(others, id)
	succ = others[i%len(others)]
	pred = others[(i-1+len(others))%len(others)]
	return pred, succ
}

func (n *Node) nextDeadline() time.Time {
	d := n.nextHB
	min := func(t time.Time) {
		if !t.IsZero() && t.Before(d) {
			d = t
		}
	}
	if m := n.members[n.monitored]; m != nil && m.State == Alive && !n.fenced {
		if m.suspect {
			min(m.suspectAt.Add(n.cfg.ProbeTimeout))
		} else {
			min(m.lastHeard.Add(n.cfg.Timeout))
		}
	}
	for _, m := range n.members {
		if m.suspect && m.ID != n.monitored {
			min(m.suspectAt.Add(n.cfg.ProbeTimeout))
		}
	}
	if !n.fenced && len(n.ring()) > 1 {
		min(n.lastContact.Add(n.cfg.FenceTimeout))
	}
	return d
}

// Tick advances the core to now: heartbeats, watchdog, probes, fencing.
func (n *Node) Tick(now time.Time) {
	if gap := now.Sub(n.lastTick); gap > 2*n.cfg.Period {
		n.stats.Stalls.Add(1)
		if gap > n.cfg.FenceTimeout && !n.fenced && len(n.ring()) > 1 {
			// We were not running for longer than we may be out of
			// contact: the ring may have declared us already.
			n.fence(now)
		}
		// Do not blame the peers for our own stall.
		shift := gap - n.cfg.Period
		for _, m := range n.members {
			if m.heard {
				m.lastHeard = m.lastHeard.Add(shift)
			}
			if m.suspect {
				m.suspectAt = m.suspectAt.Add(shift)
			}
		}
		n.lastContact = n.lastContact.Add(shift)
		n.nextHB = now
	}
	n.lastTick = now

	ring := n.ring()
	pred, succ := neighbours(ring, n.self.ID)

	n.updateMonitor(ring, now)

	if !n.fenced && len(ring) > 1 && now.Sub(n.lastContact) >= n.cfg.FenceTimeout {
		n.fence(now)
	}

	if !n.fenced {
		if m := n.members[pred]; m != nil {
			if !m.suspect && now.Sub(m.lastHeard) >= n.cfg.Timeout {
				n.stats.HeartbeatsMissed.Add(1)
				n.suspect(m, now)
			}
		}
		for _, id := range n.ids {
			m := n.members[id]
			if m.suspect && m.State == Alive && now.Sub(m.suspectAt) < n.cfg.ProbeTimeout &&
				now.Sub(m.probedAt) >= n.cfg.Period {
				n.probe(m, now)
			}
			if m.suspect && m.State == Alive && now.Sub(m.suspectAt) >= n.cfg.ProbeTimeout {
				if id == pred {
					n.declare(m, CauseUnreachable, now)
				} else {
					// Escalated by an observer but watched by
					// another member: that member decides.
					m.suspect = false
				}
			}
		}
		// A fenced neighbour that nobody else declared.
		for _, id := range n.ids {
			m := n.members[id]
			if m.State == Alive && !m.fencedSeen.IsZero() && now.Sub(m.fencedSeen) > n.cfg.Timeout {
				n.declare(m, CauseFenced, now)
			}
		}
	}

	if !now.Before(n.nextHB) {
		n.seq++
		view := n.view()
		targets := []NodeID{}
		for _, t := range []NodeID{pred, succ} {
			if t != None && !slices.Contains(targets, t) {
				targets = append(targets, t)
			}
		}
		for _, id := range n.ids {
			if n.members[id].State == Unknown && id != n.self.ID {
				targets = append(targets, id) // discovery
			}
		}
		for _, t := range targets {
			n.stats.HeartbeatsSent.Add(1)
			n.send(Message{Type: MsgHeartbeat, To: t, Seq: n.seq, View: view})
		}
		n.nextHB = n.nextHB.Add(n.cfg.Period)
		if !n.nextHB.After(now) {
			n.nextHB = now.Add(n.cfg.Period)
		}
	}
	n.updateMonitor(n.ring(), now)
}

// updateMonitor points the watchdog at the ring predecessor; a new
// predecessor starts with a fresh deadline.
func (n *Node) updateMonitor(ring []NodeID, now time.Time) {
	pred, _ := neighbours(ring, n.self.ID)
	if pred == n.monitored {
		return
	}
	n.monitored = pred
	if m := n.members[pred]; m != nil {
		m.lastHeard, m.heard = now, true
		m.suspect = false
	}
}

// Suspect starts diagnosis of id at once, as when an observer escalates a
// safe socket's error. Only id's monitor may declare it; elsewhere the
// probes just refresh the view.
func (n *Node) Suspect(id NodeID, now time.Time) {
	m := n.members[id]
	if m == nil || m.State != Alive || m == n.self || m.suspect || n.fenced {
		return
	}
	n.suspect(m, now)
}

func (n *Node) suspect(m *member, now time.Time) {
	m.suspect = true
	m.suspectAt = now
	n.nonce++
	m.nonce = n.nonce
	n.emit(Event{Kind: EventSuspect, Node: m.ID, Inc: m.Inc, At: now})
	n.probe(m, now)
}

// probe sends a round of probes of suspect m: one direct, and requests to
// up to Probers other members. Rounds repeat every Period until the
// suspicion ends: with one round, a lossy network alone declared nodes
// dead (20% loss: in 2.2% of 20-second runs of 5 nodes, all three paths
// of the one round and the suspect's heartbeats lost), with a round every
// Period all of them must be lost ProbeTimeout/Period times over.
func (n *Node) probe(m *member, now time.Time) {
	m.probedAt = now
	n.stats.ProbesSent.Add(1)
	n.send(Message{Type: MsgProbe, To: m.ID, Origin: n.self.ID, Nonce: m.nonce})
	// Probers: the other members, nearest to the suspect first.
	ring := n.ring()
	i, _ := slices.BinarySearch(ring, m.ID)
	k := 0
	for j := 1; j < len(ring) && k < n.cfg.Probers; j++ {
		p := ring[(i-j+len(ring))%len(ring)]
		if p == m.ID || p == n.self.ID {
			continue
		}
		n.stats.ProbesSent.Add(1)
		n.send(Message{Type: MsgProbeReq, To: p, Target: m.ID, TargetInc: m.Inc, Nonce: m.nonce})
		k++
	}
}

func (n *Node) refute(m *member, now time.Time, indirect bool) {
	m.lastHeard, m.heard = now, true
	m.indirectAck = indirect
	if m.suspect {
		m.suspect = false
		n.stats.Refuted.Add(1)
		if indirect {
			n.stats.IndirectSaves.Add(1)
		}
		n.emit(Event{Kind: EventRefuted, Node: m.ID, Inc: m.Inc, At: now, Cause: map[bool]string{true: "indirect", false: "direct"}[indirect]})
	}
}

func (n *Node) fence(now time.Time) {
	n.fenced = true
	n.fencedAt = now
	n.stats.Fences.Add(1)
	for _, m := range n.members {
		m.suspect = false
	}
	n.emit(Event{Kind: EventFence, Node: n.self.ID, Inc: n.self.Inc, At: now})
}

func (n *Node) declare(m *member, cause string, now time.Time) {
	n.markDead(m, cause, now, true)
	// Everyone learns at once, not only at the next heartbeats.
	view := n.view()
	for _, id := range n.ring() {
		if id != n.self.ID {
			n.send(Message{Type: MsgNotice, To: id, View: view})
		}
	}
}

func (n *Node) markDead(m *member, cause string, now time.Time, byMe bool) {
	det := now.Sub(m.lastHeard)
	m.State = Dead
	m.suspect = false
	m.fencedSeen = time.Time{}
	m.declaredAt = now
	m.cause = cause
	ev := Event{Kind: EventDeclared, Node: m.ID, Inc: m.Inc, Cause: cause, ByMe: byMe, At: now}
	if byMe {
		switch cause {
		case CauseUnreachable:
			n.stats.Unreachable.Add(1)
			ev.Detection = det
			if h := n.stats.DetectionHook; h != nil {
				h(det)
			}
		case CauseFenced:
			n.stats.Fenced.Add(1)
		case CauseRestarted:
			n.stats.Restarted.Add(1)
		}
	}
	n.emit(ev)
	if byMe && m.Role == RoleActive {
		for _, id := range n.ids {
			s := n.members[id]
			if s.State == Alive && s.Role == RoleSpare {
				s.Role = RoleActive
				n.emit(Event{Kind: EventPromoted, Node: s.ID, Inc: s.Inc, At: now})
				break
			}
		}
	}
}

func (n *Node) join(m *member, inc uint64, role Role, now time.Time) {
	m.Inc = inc
	m.State = Alive
	m.Role = role
	m.lastHeard, m.heard = now, true
	m.suspect = false
	m.fencedSeen = time.Time{}
	m.joinedAt = now
	n.emit(Event{Kind: EventJoined, Node: m.ID, Inc: inc, At: now})
}

func (n *Node) rejoin(now time.Time, minInc uint64) {
	n.self.Inc = max(n.self.Inc, minInc) + 1
	n.self.State = Alive
	n.self.joinedAt = now
	n.fenced = false
	n.lastContact = now
	n.emit(Event{Kind: EventRejoin, Node: n.self.ID, Inc: n.self.Inc, At: now})
}

// Step takes one datagram received at now.
func (n *Node) Step(msg Message, now time.Time) {
	if msg.To != n.self.ID || msg.From == n.self.ID {
		return
	}
	m := n.members[msg.From]
	if m == nil {
		return // not a member of this ring
	}
	if now.Sub(n.lastTick) > 2*n.cfg.Period {
		// We stalled (frozen, descheduled) and datagrams queued meanwhile
		// arrive before the next Tick: let Tick judge the stall first, so
		// that news of our own death finds us already fenced, and the
		// stall is not judged again after we rejoined.
		n.Tick(now)
	}
	switch {
	case msg.FromInc < m.Inc || (msg.FromInc == m.Inc && m.State == Dead):
		// A dead or older incarnation: reject, and tell it.
		n.stats.StaleRejected.Add(1)
		if now.Sub(m.lastNotice) >= n.cfg.Period {
			m.lastNotice = now
			n.send(Message{Type: MsgNotice, To: m.ID, View: n.view()})
		}
		if msg.Type != MsgNotice {
			return
		}
		// A notice from a stale sender still carries news about us.
		n.merge(msg.View, now)
		return
	case msg.FromInc > m.Inc:
		role := RoleActive
		if msg.Spare {
			role = RoleSpare
		}
		if m.State == Alive && m.Inc != 0 {
			// The old incarnation ended without being declared.
			n.markDead(m, CauseRestarted, now, n.monitored == m.ID)
		}
		n.join(m, msg.FromInc, role, now)
	}
	n.lastContact = now
	if n.monitored == m.ID || m.suspect {
		n.refute(m, now, false)
	} else {
		m.lastHeard, m.heard = now, true
		m.indirectAck = false
	}

	switch msg.Type {
	case MsgHeartbeat:
		n.stats.HeartbeatsReceived.Add(1)
		m.lastSeq = msg.Seq
	case MsgProbe:
		n.send(Message{Type: MsgProbeAck, To: m.ID, Origin: msg.Origin, Nonce: msg.Nonce})
	case MsgProbeReq:
		if t := n.members[msg.Target]; t != nil && t != n.self {
			n.send(Message{Type: MsgProbe, To: msg.Target, Origin: m.ID, Nonce: msg.Nonce})
		}
	case MsgProbeAck:
		if msg.Origin != n.self.ID && msg.Origin != None {
			n.send(Message{Type: MsgProbeResp, To: msg.Origin, Target: m.ID, TargetInc: msg.FromInc, Nonce: msg.Nonce})
		}
	case MsgProbeResp:
		if t := n.members[msg.Target]; t != nil && t.State == Alive && t.Inc == msg.TargetInc && t.suspect {
			n.refute(t, now, true)
		}
	}
	if msg.Fenced && m.State == Alive {
		if n.monitored == m.ID {
			n.markDead(m, CauseFenced, now, true)
			n.declareNotice()
		} else if m.fencedSeen.IsZero() {
			m.fencedSeen = now
		}
	}
	n.merge(msg.View, now)
	n.updateMonitor(n.ring(), now)
}

func (n *Node) declareNotice() {
	view := n.view()
	for _, id := range n.ring() {
		if id != n.self.ID {
			n.send(Message{Type: MsgNotice, To: id, View: view})
		}
	}
}

// merge folds a gossiped view into ours.
func (n *Node) merge(view []Entry, now time.Time) {
	for _, e := range view {
		m := n.members[e.ID]
		if m == nil || !e.newer(m.Entry) {
			continue
		}
		if m == n.self {
			switch {
			case e.Inc > n.self.Inc:
				if !n.fenced {
					n.fence(now)
				}
				n.emit(Event{Kind: EventSuperseded, Node: e.ID, Inc: e.Inc, At: now})
			case e.State == Dead:
				if !n.fenced {
					n.fence(now)
				}
				n.rejoin(now, e.Inc)
			case e.Role == RoleActive && n.self.Role == RoleSpare:
				n.self.Role = RoleActive
				n.emit(Event{Kind: EventPromoted, Node: e.ID, Inc: e.Inc, At: now})
			}
			continue
		}
		switch {
		case e.State == Dead && m.State == Alive:
			m.Inc = e.Inc
			m.Role = max(m.Role, e.Role)
			n.markDead(m, "", now, false)
		case e.State == Dead:
			m.Entry = e
			m.suspect = false
		case e.State == Alive && e.Inc > m.Inc:
			if m.State == Alive && m.Inc != 0 {
				n.markDead(m, CauseRestarted, now, false)
			}
			n.join(m, e.Inc, e.Role, now)
		case e.State == Alive && e.Inc == m.Inc && e.Role > m.Role:
			m.Role = e.Role
			n.emit(Event{Kind: EventPromoted, Node: m.ID, Inc: m.Inc, At: now})
		}
	}
}
