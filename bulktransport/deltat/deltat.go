package deltat

import (
	"container/heap"
	"errors"
	"fmt"
	"time"

	"github.com/radic-project/radic/bulktransport/internal/seqnum"
)

// Specification constants (Watson, "Delta-t protocol specification";
// seed 001, "Transport protocols"). The defaults suit the emulated torus:
// packets live microseconds on the machine and milliseconds over UDP.
const (
	// DefaultMPL is the maximum packet lifetime: no packet survives in
	// the network longer.
	DefaultMPL = 100 * time.Millisecond
	// DefaultR is the maximum retransmission time: a sender stops
	// retransmitting a segment R after its first transmission and reports
	// the message failed.
	DefaultR = 2 * time.Second
	// DefaultA is the maximum ack delay.
	DefaultA = 20 * time.Millisecond
	// DefaultRTO is the interval between retransmissions (< R).
	DefaultRTO = 50 * time.Millisecond
	// DefaultWindow is the segments in flight per peer.
	DefaultWindow = 64
	// ReceiverTimer and SenderTimer are the lifetimes of connection
	// records, in units of delta-t, after the last packet received or
	// sent. The sender's is longer so that a receiver has always
	// forgotten a connection before its sender starts a new one.
	ReceiverTimer = 2
	SenderTimer   = 3
	// MaxMessage bounds one message. Larger data goes by bulk messaging.
	MaxMessage = 1 << 20
)

// Config holds the timers. The zero value of a field means its default.
type Config struct {
	MPL, R, A, RTO time.Duration
	Window         int
}

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	if c.MPL == 0 {
		c.MPL = DefaultMPL
	}
	if c.R == 0 {
		c.R = DefaultR
	}
	if c.A == 0 {
		c.A = DefaultA
	}
	if c.RTO == 0 {
		c.RTO = DefaultRTO
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
}

// DeltaT is MPL + R + A: the longest a packet about one segment can
// matter, from its first transmission to the last ack it can cause.
func (c Config) DeltaT() time.Duration { return c.MPL + c.R + c.A }

// Errors.
var (
	ErrConfig   = errors.New("deltat: config")
	ErrTooLarge = errors.New("deltat: message larger than MaxMessage")
)

// Validate checks a defaulted Config.
func (c Config) Validate() error {
	if c.MPL <= 0 || c.R <= 0 || c.A <= 0 || c.RTO <= 0 || c.RTO >= c.R {
		return fmt.Errorf("%w: timers must be positive and RTO < R", ErrConfig)
	}
	if c.Window < 1 || c.Window > 1<<15 {
		return fmt.Errorf("%w: window %d", ErrConfig, c.Window)
	}
	return nil
}

// Peer names the other end: a node id.
type Peer uint32

// Packet is a delta-t packet for Peer; the core keeps B for
// retransmission, so the link must not modify it.
type Packet struct {
	To Peer
	B  []byte
}

// Message is a delivered message. Data of a one-segment message aliases
// the packet passed to Step; a longer one is a fresh buffer.
type Message struct {
	From Peer
	Data []byte
}

// Failure reports messages to Peer given up after R: their segments were
// retransmitted for R without an ack. Tags are those passed to Send.
type Failure struct {
	Peer Peer
	Tags []uint64
}

// Acked reports a message the peer has received (its last segment is
// acknowledged). Tag is the one passed to Send.
type Acked struct {
	Peer Peer
	Tag  uint64
}

// Ready is what the core wants done.
type Ready struct {
	Packets  []Packet
	Messages []Message
	Failures []Failure
	Acked    []Acked // messages fully acknowledged
	NextTick time.Time
}

// Stats count the core's decisions.
type Stats struct {
	Segments, Retransmits, Acks, Delivered             uint64
	Duplicates, NoState, Resets, OutOfWindow, GaveUp   uint64
	SendRecords, RecvRecords, SendExpired, RecvExpired uint64
}

type seg struct {
	seq       seqnum.Value
	pkt       []byte
	tag       uint64
	eom       bool
	sent      bool
	firstSent time.Time
	lastSent  time.Time
}

// sendRecord is the sender's connection record for one peer. It exists
// while segments are outstanding and for SenderTimer delta-t after the
// last transmission.
type sendRecord struct {
	peer     Peer
	next     seqnum.Value // next sequence number to assign
	una      seqnum.Value // oldest unacknowledged
	segs     []*seg       // unacknowledged and unsent, in seq order
	lastSend time.Time
	window   int // peer's advertised window
	timer    time.Time
}

// recvRecord is the receiver's connection record for one peer. It exists
// for ReceiverTimer delta-t after the last packet accepted from the peer.
type recvRecord struct {
	peer     Peer
	expected seqnum.Value
	ooo      map[seqnum.Value]oooSeg // segments ahead of expected
	asm      [][]byte                // segments of the message being assembled
	lastRecv time.Time
	ackDue   time.Time // zero: nothing to acknowledge
	unacked  int
	timer    time.Time
}

type oooSeg struct {
	data []byte
	eom  bool
}

// Endpoint is the delta-t core of one node: a connection record per peer
// it is talking to, none for the rest. It is pure: time comes in through
// Send, Step and Tick, output goes out through Ready; it is not safe for
// concurrent use.
type Endpoint struct {
	cfg    Config
	send   map[Peer]*sendRecord
	recv   map[Peer]*recvRecord
	timers timerHeap
	out    Ready
	Stats  Stats
}

// New makes an endpoint.
func New(cfg Config) (*Endpoint, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Endpoint{cfg: cfg}, nil
}

// Config returns the defaulted configuration.
func (e *Endpoint) Config() Config { return e.cfg }

// Records is the number of connection records held (sender and
// receiver); an endpoint whose peers have all been quiet for the timers
// holds none.
func (e *Endpoint) Records() int { return len(e.send) + len(e.recv) }

// Ready drains the pending output.
func (e *Endpoint) Ready() Ready {
	r := e.out
	e.out = Ready{}
	if len(e.timers) > 0 {
		r.NextTick = e.timers[0].at
	}
	return r
}

// Send queues msg for peer. The data is copied into segments (the
// "fragmented copy" protocol); tag comes back in Ready.Acked or
// Ready.Failures.
func (e *Endpoint) Send(now time.Time, peer Peer, msg []byte, tag uint64) error {
	return e.SendPrefixed(now, peer, nil, msg, tag)
}

// SendPrefixed sends prefix followed by msg as one message, copying each
// once, straight into the segments.
func (e *Endpoint) SendPrefixed(now time.Time, peer Peer, prefix, msg []byte, tag uint64) error {
	total := len(prefix) + len(msg)
	if total > MaxMessage {
		return ErrTooLarge
	}
	s := e.send[peer]
	if s != nil && len(s.segs) == 0 && !now.Before(s.lastSend.Add(SenderTimer*e.cfg.DeltaT())) {
		e.expireSend(s) // its timer has not run yet; the rule holds regardless
		s = nil
	}
	if s == nil {
		// No record: the receiver has forgotten us too (SenderTimer >
		// ReceiverTimer), so any initial sequence number will do. Take
		// it from the clock, as TCP does, so that a record recreated
		// after a crash does not reuse recent numbers.
		isn := seqnum.Value(uint32(now.UnixNano()/4000) ^ uint32(peer)*0x9e3779b9)
		s = &sendRecord{peer: peer, next: isn, una: isn, window: e.cfg.Window}
		if e.send == nil {
			e.send = map[Peer]*sendRecord{}
		}
		e.send[peer] = s
		e.Stats.SendRecords++
	}
	for off := 0; ; off += SegData {
		n := min(SegData, total-off)
		eom := off+n == total
		g := &seg{seq: s.next, tag: tag, eom: eom}
		flags := uint8(FlagData)
		if off == 0 {
			flags |= FlagBOM
		}
		if eom {
			flags |= FlagEOM
		}
		b := Append(make([]byte, 0, HeaderLen+n), Header{Flags: flags, Seq: uint32(g.seq)}, nil)
		if off < len(prefix) {
			b = append(b, prefix[off:min(len(prefix), off+n)]...)
		}
		if end := off + n - len(prefix); end > 0 {
			b = append(b, msg[max(0, off-len(prefix)):end]...)
		}
		g.pkt = b
		s.segs = append(s.segs, g)
		s.next++
		if eom {
			break
		}
	}
	e.pump(now, s)
	return nil
}

// Has reports whether the endpoint holds a record for peer.
func (e *Endpoint) Has(peer Peer) bool { return e.send[peer] != nil || e.recv[peer] != nil }

// pump transmits unsent segments that fit the window.
func (e *Endpoint) pump(now time.Time, s *sendRecord) {
	for i, g := range s.segs {
		if i >= min(e.cfg.Window, s.window) {
			break
		}
		if g.sent {
			continue
		}
		if g.seq == s.una {
			// Nothing before it is outstanding: mark the data run so
			// that a receiver without a record can start one.
			g.pkt[0] |= FlagDRF
		}
		g.sent, g.firstSent, g.lastSent = true, now, now
		s.lastSend = now
		e.Stats.Segments++
		e.out.Packets = append(e.out.Packets, Packet{s.peer, g.pkt})
	}
	e.schedule(timerEntry{at: e.sendDeadline(s), peer: s.peer, send: true}, &s.timer)
}

// Step handles a delta-t packet from peer. The endpoint keeps references
// into pkt (a delivered message may alias it), so the caller must not
// reuse it.
func (e *Endpoint) Step(now time.Time, from Peer, pkt []byte) error {
	h, data, err := Decode(pkt)
	if err != nil {
		return err
	}
	if h.Flags&FlagACK != 0 {
		e.ack(now, from, h)
	}
	if h.Flags&FlagData != 0 {
		e.data(now, from, h, data)
	}
	return nil
}

func (e *Endpoint) ack(now time.Time, from Peer, h Header) {
	s := e.send[from]
	if s == nil {
		return // a late ack for a record already expired
	}
	ack := seqnum.Value(h.Ack)
	s.window = max(1, int(h.Window))
	if !s.una.LessThan(ack) || s.next.LessThan(ack) {
		e.pump(now, s) // old or impossible ack; the window may have changed
		return
	}
	n := int(s.una.Size(ack))
	for _, g := range s.segs[:n] {
		if g.eom {
			e.out.Acked = append(e.out.Acked, Acked{from, g.tag})
		}
	}
	clear(s.segs[:n])
	s.segs = s.segs[n:]
	if len(s.segs) == 0 {
		s.segs = nil
	}
	s.una = ack
	e.pump(now, s)
}

func (e *Endpoint) data(now time.Time, from Peer, h Header, data []byte) {
	seq := seqnum.Value(h.Seq)
	r := e.recv[from]
	if r != nil && !now.Before(r.lastRecv.Add(ReceiverTimer*e.cfg.DeltaT())) {
		e.expireRecv(r) // its timer has not run yet; the rule holds regardless
		r = nil
	}
	drf := h.Flags&FlagDRF != 0
	switch {
	case r == nil && !drf:
		// Rule: a receiver without a record accepts only a segment
		// that starts a data run; the sender retransmits the run's
		// first segment, and the rest follows it.
		e.Stats.NoState++
		return
	case r == nil:
		r = &recvRecord{peer: from, expected: seq}
		if e.recv == nil {
			e.recv = map[Peer]*recvRecord{}
		}
		e.recv[from] = r
		e.Stats.RecvRecords++
	case drf && r.expected.LessThan(seq):
		// A data run ahead of what we expect: the sender gave up on
		// the segments in between (it sets DRF only when nothing
		// before is outstanding). Drop them and the partial message.
		e.Stats.Resets++
		r.expected, r.ooo, r.asm = seq, nil, nil
	}
	r.lastRecv = now
	switch {
	case seq.LessThan(r.expected):
		e.Stats.Duplicates++
		r.ackDue = now // tell the sender at once: its ack was lost
	case seq == r.expected:
		e.accept(r, data, h.Flags&FlagEOM != 0)
		for {
			o, ok := r.ooo[r.expected]
			if !ok {
				break
			}
			delete(r.ooo, r.expected)
			e.accept(r, o.data, o.eom)
		}
		if len(r.ooo) == 0 {
			r.ooo = nil
		}
		if r.unacked >= e.cfg.Window/2 || r.ooo != nil {
			r.ackDue = now
		} else if r.ackDue.IsZero() {
			r.ackDue = now.Add(e.cfg.A)
		}
	case seq.InWindow(r.expected, uint32(e.cfg.Window)):
		if _, dup := r.ooo[seq]; dup {
			e.Stats.Duplicates++
		} else {
			if r.ooo == nil {
				r.ooo = map[seqnum.Value]oooSeg{}
			}
			r.ooo[seq] = oooSeg{data, h.Flags&FlagEOM != 0}
		}
		r.ackDue = now // a gap: ack at once so the sender knows
	default:
		e.Stats.OutOfWindow++
	}
	e.flushAck(now, r)
	e.schedule(timerEntry{at: e.recvDeadline(r), peer: r.peer}, &r.timer)
}

// accept takes the next in-order segment.
func (e *Endpoint) accept(r *recvRecord, data []byte, eom bool) {
	r.expected++
	r.unacked++
	if !eom {
		r.asm = append(r.asm, data)
		return
	}
	msg := data // one segment: by reference
	if len(r.asm) > 0 {
		n := len(data)
		for _, p := range r.asm {
			n += len(p)
		}
		msg = make([]byte, 0, n)
		for _, p := range r.asm {
			msg = append(msg, p...)
		}
		msg = append(msg, data...)
		clear(r.asm)
		r.asm = r.asm[:0]
	}
	e.Stats.Delivered++
	e.out.Messages = append(e.out.Messages, Message{r.peer, msg})
}

func (e *Endpoint) flushAck(now time.Time, r *recvRecord) {
	if r.ackDue.IsZero() || now.Before(r.ackDue) {
		return
	}
	r.ackDue, r.unacked = time.Time{}, 0
	e.Stats.Acks++
	win := e.cfg.Window - len(r.ooo)
	e.out.Packets = append(e.out.Packets, Packet{r.peer,
		Append(make([]byte, 0, HeaderLen), Header{Flags: FlagACK, Window: uint16(max(1, win)), Ack: uint32(r.expected)}, nil)})
}

func (e *Endpoint) sendDeadline(s *sendRecord) time.Time {
	var d time.Time
	for _, g := range s.segs {
		if !g.sent {
			break
		}
		d = earliest(d, g.lastSent.Add(e.cfg.RTO))
		d = earliest(d, g.firstSent.Add(e.cfg.R))
	}
	if len(s.segs) == 0 {
		d = s.lastSend.Add(SenderTimer * e.cfg.DeltaT())
	}
	return d
}

func (e *Endpoint) recvDeadline(r *recvRecord) time.Time {
	d := r.lastRecv.Add(ReceiverTimer * e.cfg.DeltaT())
	if !r.ackDue.IsZero() {
		d = earliest(d, r.ackDue)
	}
	return d
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// Tick runs the timers due at now: retransmissions, give-ups, delayed
// acks and the expiry of connection records. It touches only records
// whose timers are due; idle peers cost nothing.
func (e *Endpoint) Tick(now time.Time) {
	for len(e.timers) > 0 && !now.Before(e.timers[0].at) {
		t := heap.Pop(&e.timers).(timerEntry)
		if t.send {
			if s := e.send[t.peer]; s != nil && s.timer.Equal(t.at) {
				s.timer = time.Time{}
				e.tickSend(now, s)
			}
		} else if r := e.recv[t.peer]; r != nil && r.timer.Equal(t.at) {
			r.timer = time.Time{}
			e.tickRecv(now, r)
		}
	}
}

func (e *Endpoint) tickSend(now time.Time, s *sendRecord) {
	if len(s.segs) == 0 {
		if !now.Before(s.lastSend.Add(SenderTimer * e.cfg.DeltaT())) {
			e.expireSend(s)
			return
		}
		e.schedule(timerEntry{at: e.sendDeadline(s), peer: s.peer, send: true}, &s.timer)
		return
	}
	for _, g := range s.segs {
		if g.sent && !now.Before(g.firstSent.Add(e.cfg.R)) {
			e.giveUp(s)
			break
		}
	}
	for _, g := range s.segs {
		if !g.sent {
			break
		}
		if !now.Before(g.lastSent.Add(e.cfg.RTO)) {
			g.lastSent, s.lastSend = now, now
			e.Stats.Retransmits++
			e.out.Packets = append(e.out.Packets, Packet{s.peer, g.pkt})
		}
	}
	e.pump(now, s)
}

// expireSend applies the rule that the sender forgets a connection
// SenderTimer (3) delta-t after its last transmission.
func (e *Endpoint) expireSend(s *sendRecord) {
	delete(e.send, s.peer)
	e.Stats.SendExpired++
	if len(e.send) == 0 {
		e.send = nil // maps never shrink; an idle endpoint holds none
	}
}

// expireRecv applies the rule that the receiver forgets a connection
// ReceiverTimer (2) delta-t after the last packet it accepted.
func (e *Endpoint) expireRecv(r *recvRecord) {
	delete(e.recv, r.peer)
	e.Stats.RecvExpired++
	if len(e.recv) == 0 {
		e.recv = nil
	}
}

// giveUp drops every queued segment of s after one was retransmitted for
// R. The next segment starts a new data run, which resets the receiver.
func (e *Endpoint) giveUp(s *sendRecord) {
	f := Failure{Peer: s.peer}
	for _, g := range s.segs {
		if g.eom {
			f.Tags = append(f.Tags, g.tag)
		}
	}
	e.Stats.GaveUp += uint64(len(s.segs))
	s.segs = nil
	s.una = s.next
	e.out.Failures = append(e.out.Failures, f)
}

func (e *Endpoint) tickRecv(now time.Time, r *recvRecord) {
	e.flushAck(now, r)
	if !now.Before(r.lastRecv.Add(ReceiverTimer * e.cfg.DeltaT())) {
		e.expireRecv(r)
		return
	}
	e.schedule(timerEntry{at: e.recvDeadline(r), peer: r.peer}, &r.timer)
}

// schedule makes sure a timer entry at t.at or earlier exists for a
// record whose current entry is *cur. Entries are never removed; a popped
// entry that no longer matches its record's timer is ignored.
func (e *Endpoint) schedule(t timerEntry, cur *time.Time) {
	if !cur.IsZero() && !t.at.Before(*cur) {
		return
	}
	*cur = t.at
	heap.Push(&e.timers, t)
}

type timerEntry struct {
	at   time.Time
	peer Peer
	send bool
}

type timerHeap []timerEntry

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timerEntry)) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	if len(*h) == 0 {
		*h = nil
	}
	return t
}

// NextTick is when Tick has work next (zero: no timers).
func (e *Endpoint) NextTick() time.Time {
	if len(e.timers) == 0 {
		return time.Time{}
	}
	return e.timers[0].at
}
