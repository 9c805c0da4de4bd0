package deltat

import (
	"errors"
	"fmt"
	"time"

	"github.com/radic-project/radic/bulktransport/internal/seqnum"
	"github.com/radic-project/radic/bulktransport/internal/timerq"
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
	// MaxHeadroom bounds Config.Headroom.
	MaxHeadroom = 256
)

// Config holds the timers. The zero value of a field means its default.
type Config struct {
	MPL, R, A, RTO time.Duration
	Window         int
	// Headroom is the bytes reserved in front of every packet for the
	// link's own header (see Packet.Frame), so that the link sends a
	// segment without copying it. Zero: none.
	Headroom int
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
	if c.Headroom < 0 || c.Headroom > MaxHeadroom {
		return fmt.Errorf("%w: headroom %d", ErrConfig, c.Headroom)
	}
	return nil
}

// Peer names the other end: a node id.
type Peer uint32

// Packet is a delta-t packet for Peer.
//
// Frame is B with Config.Headroom bytes in front of it, in the same array
// (B is Frame[Headroom:]): the link may write its own header there and
// send Frame, keeping it, without copying B. The core never writes to a
// packet's bytes once it has returned it, and it keeps B of a segment's
// first transmission to copy from for retransmissions, so the link must
// not change B (a retransmission or an ack is a fresh packet).
type Packet struct {
	To    Peer
	B     []byte
	Frame []byte
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
	frame     []byte // Config.Headroom bytes, then the delta-t packet
	tag       uint64
	eom       bool
	firstSent time.Time
	lastSent  time.Time
}

// sendRecord is the sender's connection record for one peer. It exists
// while segments are outstanding and for SenderTimer delta-t after the
// last transmission.
type sendRecord struct {
	peer Peer
	next seqnum.Value // next sequence number to assign
	una  seqnum.Value // oldest unacknowledged
	// segs are the unacknowledged segments in seq order: segs[:sent]
	// have been transmitted, the rest wait for the window. Segments go
	// out in order, so the transmitted ones are always a prefix, and
	// segs[0] has the earliest first transmission (the give-up deadline).
	segs []seg
	sent int
	// arr is the array segs lives in, whole: acks move segs forward in
	// it, and room moves segs back to its start rather than grow it
	// while half of it is free, so a steady stream reuses one array.
	// Both are dropped when the queue empties.
	arr []seg
	// rexmit is a lower bound on the earliest retransmission due among
	// segs[:sent] (zero: none transmitted). A transmission at now can only
	// lower it to now+RTO; acks leave it, early; tickSend, the only code
	// that scans the segments, sets it exactly.
	rexmit   time.Time
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
	// runMsg: a segment of the message being assembled carried DRF
	// (the sender had nothing else outstanding); its end is acked at once.
	runMsg bool
	timer  time.Time
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
	timers timerq.Queue[timerKey]
	out    Ready
	Stats  Stats
	// visits counts the segments pump and sendDeadline look at: a test
	// checks that a Send or an ack looks at O(1) segments however many
	// are in flight (tickSend's scan is not counted: it runs once per
	// RTO at most).
	visits uint64
}

// timerKey names the record a timer entry belongs to.
type timerKey struct {
	peer Peer
	send bool
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
	r.NextTick = e.timers.Next()
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
	hr := e.cfg.Headroom
	s.room(max(1, (total+SegData-1)/SegData))
	for off := 0; ; off += SegData {
		n := min(SegData, total-off)
		eom := off+n == total
		flags := uint8(FlagData)
		if off == 0 {
			flags |= FlagBOM
		}
		if eom {
			flags |= FlagEOM
		}
		// The one copy of the message at the sender: straight into the
		// frame the link sends (the link's header goes in the headroom).
		b := Append(make([]byte, hr, hr+HeaderLen+n), Header{Flags: flags, Seq: uint32(s.next)}, nil)
		if off < len(prefix) {
			b = append(b, prefix[off:min(len(prefix), off+n)]...)
		}
		if end := off + n - len(prefix); end > 0 {
			b = append(b, msg[max(0, off-len(prefix)):end]...)
		}
		s.segs = append(s.segs, seg{seq: s.next, frame: b, tag: tag, eom: eom})
		s.next++
		if eom {
			break
		}
	}
	e.pump(now, s)
	return nil
}

// room makes room for k more segments at the end of the queue: it moves
// the queue back to the start of its array if that leaves half the array
// free, else into a new array, of exactly the size needed for a queue
// that was empty and twice that otherwise.
func (s *sendRecord) room(k int) {
	if cap(s.segs)-len(s.segs) >= k {
		return
	}
	n := len(s.segs)
	a := s.arr
	if 2*(n+k) > len(a) {
		size := n + k // an empty queue: this message's segments
		if n > 0 {
			size *= 2 // a stream: room to move back into
		}
		a = make([]seg, size)
	}
	// When a is arr, segs starts at len(a)-cap(segs) > len(a)-n-k >=
	// len(a)/2 >= n: the copy does not overlap it.
	copy(a, s.segs)
	clear(s.segs)
	s.arr, s.segs = a, a[:n]
}

// Has reports whether the endpoint holds a record for peer.
func (e *Endpoint) Has(peer Peer) bool { return e.send[peer] != nil || e.recv[peer] != nil }

// pump transmits unsent segments that fit the window. It starts at the
// first unsent one: the segments in flight cost it nothing.
func (e *Endpoint) pump(now time.Time, s *sendRecord) {
	hr := e.cfg.Headroom
	for lim := min(len(s.segs), e.cfg.Window, s.window); s.sent < lim; s.sent++ {
		g := &s.segs[s.sent]
		e.visits++
		if g.seq == s.una {
			// Nothing before it is outstanding: mark the data run so
			// that a receiver without a record can start one.
			g.frame[hr] |= FlagDRF
		}
		g.firstSent, g.lastSent = now, now
		s.lastSend = now
		s.rexmit = earliest(s.rexmit, now.Add(e.cfg.RTO))
		e.Stats.Segments++
		e.out.Packets = append(e.out.Packets, Packet{s.peer, g.frame[hr:], g.frame})
	}
	e.timers.Schedule(e.sendDeadline(s), timerKey{s.peer, true}, &s.timer)
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
	for i := range s.segs[:n] {
		if g := &s.segs[i]; g.eom {
			e.out.Acked = append(e.out.Acked, Acked{from, g.tag})
		}
	}
	clear(s.segs[:n])
	s.segs = s.segs[n:]
	s.sent = max(0, s.sent-n) // an ack cannot cover unsent segments, unless forged
	if len(s.segs) == 0 {
		s.segs, s.arr = nil, nil // the record may live 3Δt more: keep nothing
	}
	if s.sent == 0 {
		s.rexmit = time.Time{}
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
		r.expected, r.ooo, r.asm, r.runMsg = seq, nil, nil, false
	}
	r.lastRecv = now
	switch {
	case seq.LessThan(r.expected):
		e.Stats.Duplicates++
		r.ackDue = now // tell the sender at once: its ack was lost
	case seq == r.expected:
		// A segment with DRF is in order here (a record is created at
		// it, or reset to it): the sender had nothing else outstanding.
		r.runMsg = r.runMsg || drf
		runEnd := e.accept(r, data, h.Flags&FlagEOM != 0)
		for {
			o, ok := r.ooo[r.expected]
			if !ok {
				break
			}
			delete(r.ooo, r.expected)
			runEnd = e.accept(r, o.data, o.eom) || runEnd
		}
		if len(r.ooo) == 0 {
			r.ooo = nil
		}
		// Acks wait up to A so that one covers many segments, but at
		// once: past half the window, on a gap, and at the end of a
		// message that began a data run (its sender is idle, waiting:
		// a lone message's write completes in a round trip, not A; at
		// most one such ack per round trip, as the next data run
		// starts only once everything before it is acked).
		if runEnd || r.unacked >= e.cfg.Window/2 || r.ooo != nil {
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
	e.timers.Schedule(e.recvDeadline(r), timerKey{r.peer, false}, &r.timer)
}

// accept takes the next in-order segment. It reports whether the
// segment ended a message that began a data run.
func (e *Endpoint) accept(r *recvRecord, data []byte, eom bool) (runEnd bool) {
	r.expected++
	r.unacked++
	if !eom {
		r.asm = append(r.asm, data)
		return false
	}
	runEnd, r.runMsg = r.runMsg, false
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
	return runEnd
}

func (e *Endpoint) flushAck(now time.Time, r *recvRecord) {
	if r.ackDue.IsZero() || now.Before(r.ackDue) {
		return
	}
	r.ackDue, r.unacked = time.Time{}, 0
	e.Stats.Acks++
	win := e.cfg.Window - len(r.ooo)
	hr := e.cfg.Headroom
	f := Append(make([]byte, hr, hr+HeaderLen), Header{Flags: FlagACK, Window: uint16(max(1, win)), Ack: uint32(r.expected)}, nil)
	e.out.Packets = append(e.out.Packets, Packet{r.peer, f[hr:], f})
}

// sendDeadline is when s has work next: the record's expiry when nothing
// is outstanding, else the earlier of the give-up time of its oldest
// segment and the retransmission bound. It looks at no segment but the
// first.
func (e *Endpoint) sendDeadline(s *sendRecord) time.Time {
	if len(s.segs) == 0 {
		return s.lastSend.Add(SenderTimer * e.cfg.DeltaT())
	}
	if s.sent == 0 {
		return time.Time{} // not reached: pump sends at least one segment
	}
	e.visits++
	return earliest(s.rexmit, s.segs[0].firstSent.Add(e.cfg.R))
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
	for {
		k, at, ok := e.timers.PopDue(now)
		if !ok {
			break
		}
		if k.send {
			if s := e.send[k.peer]; s != nil && s.timer.Equal(at) {
				s.timer = time.Time{}
				e.tickSend(now, s)
			}
		} else if r := e.recv[k.peer]; r != nil && r.timer.Equal(at) {
			r.timer = time.Time{}
			e.tickRecv(now, r)
		}
	}
	if len(e.send)+len(e.recv) == 0 {
		e.timers.Clear() // every entry left is stale
	}
}

// tickSend gives up, retransmits and sets the retransmission bound
// exactly: the one scan of the segments in flight, once per RTO at most.
func (e *Endpoint) tickSend(now time.Time, s *sendRecord) {
	if len(s.segs) == 0 {
		if !now.Before(s.lastSend.Add(SenderTimer * e.cfg.DeltaT())) {
			e.expireSend(s)
			return
		}
		e.timers.Schedule(e.sendDeadline(s), timerKey{s.peer, true}, &s.timer)
		return
	}
	// Segments are first sent in order, so segs[0] was first sent
	// earliest. (Not its lastSent: after a partial retransmission a later
	// segment may be due before it.)
	if s.sent > 0 && !now.Before(s.segs[0].firstSent.Add(e.cfg.R)) {
		e.giveUp(s)
	}
	hr := e.cfg.Headroom
	s.rexmit = time.Time{}
	for i := range s.segs[:s.sent] {
		g := &s.segs[i]
		if !now.Before(g.lastSent.Add(e.cfg.RTO)) {
			g.lastSent, s.lastSend = now, now
			e.Stats.Retransmits++
			// A fresh frame: the first one belongs to the link now,
			// which may still hold it and writes its header.
			f := append(make([]byte, hr, len(g.frame)), g.frame[hr:]...)
			e.out.Packets = append(e.out.Packets, Packet{s.peer, f[hr:], f})
		}
		s.rexmit = earliest(s.rexmit, g.lastSent.Add(e.cfg.RTO))
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
	for i := range s.segs {
		if g := &s.segs[i]; g.eom {
			f.Tags = append(f.Tags, g.tag)
		}
	}
	e.Stats.GaveUp += uint64(len(s.segs))
	clear(s.segs)
	s.segs, s.arr, s.sent, s.rexmit = nil, nil, 0, time.Time{}
	s.una = s.next
	e.out.Failures = append(e.out.Failures, f)
}

func (e *Endpoint) tickRecv(now time.Time, r *recvRecord) {
	e.flushAck(now, r)
	if !now.Before(r.lastRecv.Add(ReceiverTimer * e.cfg.DeltaT())) {
		e.expireRecv(r)
		return
	}
	e.timers.Schedule(e.recvDeadline(r), timerKey{r.peer, false}, &r.timer)
}

// NextTick is when Tick has work next (zero: no timers).
func (e *Endpoint) NextTick() time.Time { return e.timers.Next() }
