package deltat

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/radic-project/radic/bulktransport/internal/seqnum"
	"github.com/radic-project/radic/internal/testenv"
	"github.com/radic-project/radic/netsim"
)

var t0 = time.Unix(1_000_000, 0)

func newEP(t testing.TB, cfg Config) *Endpoint {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// deliver hands every packet in r to dst as coming from `from`, and
// returns dst's output.
func deliver(t *testing.T, now time.Time, from Peer, r Ready, dst *Endpoint) Ready {
	t.Helper()
	for _, p := range r.Packets {
		if err := dst.Step(now, from, bytes.Clone(p.B)); err != nil {
			t.Fatal(err)
		}
	}
	return dst.Ready()
}

// delta-t: delta-t = maximum packet lifetime + maximum retransmission
// time + maximum ack delay.
func TestDeltaTDefinition(t *testing.T) {
	c := Config{MPL: 1 * time.Second, R: 10 * time.Second, A: 100 * time.Second}
	if c.DeltaT() != 111*time.Second {
		t.Fatalf("DeltaT = %v, want MPL+R+A = 111s", c.DeltaT())
	}
}

// delta-t: no handshake. The first packet a sender ever sends to a peer
// carries the data (marked DRF); the receiver creates its record from it
// and delivers at once. The message began a data run (its sender had
// nothing else outstanding), so the receiver acks it at once rather than
// after A (A is the maximum ack delay, not a fixed one).
func TestFirstPacketCarriesData(t *testing.T) {
	a, b := newEP(t, Config{}), newEP(t, Config{})
	a.Send(t0, 2, []byte("hello"), 7)
	ra := a.Ready()
	if len(ra.Packets) != 1 || ra.Packets[0].B[0]&FlagDRF == 0 {
		t.Fatalf("first send: %d packets, flags %#x; want one DRF packet", len(ra.Packets), ra.Packets[0].B[0])
	}
	rb := deliver(t, t0, 1, ra, b)
	if len(rb.Messages) != 1 || string(rb.Messages[0].Data) != "hello" || rb.Messages[0].From != 1 {
		t.Fatalf("delivered %+v", rb.Messages)
	}
	if len(rb.Packets) != 1 {
		t.Fatalf("%d packets from the receiver of a lone message, want its ack at once", len(rb.Packets))
	}
	ra = deliver(t, t0, 2, rb, a)
	if len(ra.Acked) != 1 || ra.Acked[0] != (Acked{2, 7}) {
		t.Fatalf("acked %v, want message 7 by peer 2", ra.Acked)
	}
}

// delta-t: the receiver acks at once the end of a message that began a
// data run (DRF: nothing before it outstanding), however many segments
// it has; a message sent while another is outstanding carries no DRF and
// its ack waits up to A, so that one ack covers a burst.
func TestAckAtOnceEndsDataRun(t *testing.T) {
	for _, size := range []int{1, 3*SegData + 1} {
		a, b := newEP(t, Config{}), newEP(t, Config{})
		a.Send(t0, 2, make([]byte, size), 1) // a data run: DRF
		a.Send(t0, 2, make([]byte, size), 2) // behind it: no DRF
		var acks []Packet
		for _, p := range a.Ready().Packets {
			if err := b.Step(t0, 1, p.B); err != nil {
				t.Fatal(err)
			}
			r := b.Ready()
			acks = append(acks, r.Packets...)
			if len(r.Messages) == 1 && len(acks) != 1 {
				t.Fatalf("%d B: message %d delivered, %d acks sent; want one, at the end of the first", size, len(r.Messages), len(acks))
			}
		}
		if ra := deliver(t, t0, 2, Ready{Packets: acks}, a); len(ra.Acked) != 1 || ra.Acked[0].Tag != 1 {
			t.Fatalf("%d B: the ack at once acknowledged %v, want message 1", size, ra.Acked)
		}
		if next := b.NextTick(); !next.Equal(t0.Add(DefaultA)) {
			t.Fatalf("%d B: the second message's ack is due at %v, want A later", size, next.Sub(t0))
		}
		b.Tick(t0.Add(DefaultA))
		if ra := deliver(t, t0.Add(DefaultA), 2, b.Ready(), a); len(ra.Acked) != 1 || ra.Acked[0].Tag != 2 {
			t.Fatalf("%d B: after A acked %v, want message 2", size, ra.Acked)
		}
	}
}

// delta-t: the receiver's record expires 2 delta-t after the last packet
// it accepted, the sender's 3 delta-t after its last transmission; after
// both, neither side holds anything for the pair.
func TestRecordsExpire(t *testing.T) {
	a, b := newEP(t, Config{}), newEP(t, Config{})
	dt := a.Config().DeltaT()
	a.Send(t0, 2, []byte("x"), 1)
	if ra := deliver(t, t0, 2, deliver(t, t0, 1, a.Ready(), b), a); len(ra.Acked) != 1 {
		t.Fatal("lone message not acked")
	}

	b.Tick(t0.Add(2*dt - 1))
	if b.Records() != 1 {
		t.Fatal("receiver record gone before 2 delta-t")
	}
	b.Tick(t0.Add(2 * dt))
	if b.Records() != 0 || b.recv != nil {
		t.Fatal("receiver record held after 2 delta-t")
	}
	a.Tick(t0.Add(3*dt - 1))
	if a.Records() != 1 {
		t.Fatal("sender record gone before 3 delta-t")
	}
	a.Tick(t0.Add(3 * dt))
	if a.Records() != 0 || a.send != nil || a.timers.Len() != 0 {
		t.Fatalf("sender holds %d records, %d timers after 3 delta-t", a.Records(), a.timers.Len())
	}
}

// delta-t: a receiver without a record drops a segment that does not
// start a data run; the run's first segment, retransmitted, opens it.
func TestNoRecordNeedsDRF(t *testing.T) {
	a, b := newEP(t, Config{}), newEP(t, Config{})
	a.Send(t0, 2, bytes.Repeat([]byte{1}, 3*SegData), 1) // three segments
	ra := a.Ready()
	lostFirst := Ready{Packets: ra.Packets[1:]}
	if rb := deliver(t, t0, 1, lostFirst, b); len(rb.Messages) != 0 || b.Records() != 0 || b.Stats.NoState != 2 {
		t.Fatalf("receiver without a record took non-DRF segments (records %d)", b.Records())
	}
	a.Tick(t0.Add(DefaultRTO))
	re := a.Ready()
	if len(re.Packets) != 3 {
		t.Fatalf("retransmitted %d segments, want 3", len(re.Packets))
	}
	if rb := deliver(t, t0.Add(DefaultRTO), 1, re, b); len(rb.Messages) != 1 || len(rb.Messages[0].Data) != 3*SegData {
		t.Fatalf("message not delivered after retransmission: %+v", rb.Messages)
	}
}

// delta-t: a segment already delivered is not delivered again, and its
// duplicate is acknowledged at once (the sender's ack was lost).
func TestDuplicateAckedAtOnce(t *testing.T) {
	a, b := newEP(t, Config{}), newEP(t, Config{})
	a.Send(t0, 2, []byte("once"), 1)
	ra := a.Ready()
	deliver(t, t0, 1, ra, b)
	b.Tick(t0.Add(DefaultA))
	b.Ready() // the ack is lost
	rb := deliver(t, t0.Add(time.Millisecond+DefaultA), 1, ra, b)
	if len(rb.Messages) != 0 || len(rb.Packets) != 1 || b.Stats.Duplicates != 1 {
		t.Fatalf("duplicate: delivered %d, sent %d packets", len(rb.Messages), len(rb.Packets))
	}
}

// delta-t: a sender retransmits a segment for at most R, then reports the
// message failed; its next message starts a new data run that resets the
// receiver past the lost segments.
func TestGiveUpAfterR(t *testing.T) {
	cfg := Config{R: 200 * time.Millisecond, RTO: 50 * time.Millisecond}
	a, b := newEP(t, cfg), newEP(t, cfg)
	a.Send(t0, 2, []byte("first"), 1)
	deliver(t, t0, 2, deliver(t, t0, 1, a.Ready(), b), a) // b has a record now; a has its ack
	now := t0.Add(DefaultA)
	a.Send(now, 2, []byte("lost"), 2)
	a.Ready() // every transmission of "lost" is dropped
	var failed []Failure
	for i := 0; i < 10; i++ {
		now = now.Add(50 * time.Millisecond)
		a.Tick(now)
		failed = append(failed, a.Ready().Failures...)
	}
	if len(failed) != 1 || fmt.Sprint(failed[0].Tags) != "[2]" {
		t.Fatalf("failures %+v, want message 2 given up", failed)
	}
	a.Send(now, 2, []byte("third"), 3)
	rb := deliver(t, now, 1, a.Ready(), b)
	if len(rb.Messages) != 1 || string(rb.Messages[0].Data) != "third" || b.Stats.Resets != 1 {
		t.Fatalf("after give-up delivered %+v (resets %d)", rb.Messages, b.Stats.Resets)
	}
}

// A one-segment message is handed up by reference: Data aliases the
// packet given to Step.
func TestOneSegmentByReference(t *testing.T) {
	a, b := newEP(t, Config{}), newEP(t, Config{})
	a.Send(t0, 2, []byte("ref"), 1)
	pkt := bytes.Clone(a.Ready().Packets[0].B)
	b.Step(t0, 1, pkt)
	if m := b.Ready().Messages; len(m) != 1 || &m[0].Data[0] != &pkt[HeaderLen] {
		t.Fatal("one-segment message copied")
	}
}

func TestDecodeTruncationAndFlags(t *testing.T) {
	b := Append(nil, Header{Flags: FlagData | FlagEOM, Seq: 9}, []byte("abc"))
	for n := range HeaderLen {
		_, _, err := Decode(b[:n])
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("Decode(%d bytes) = %v", n, err)
		}
	}
	for _, bad := range [][]byte{
		Append(nil, Header{Flags: 0x80 | FlagData}, nil),
		Append(nil, Header{}, nil),
		Append(nil, Header{Flags: FlagACK}, []byte("data on an ack")),
		Append(nil, Header{Flags: FlagData}, make([]byte, SegData+1)),
	} {
		if _, _, err := Decode(bad); !errors.Is(err, ErrBadPacket) {
			t.Errorf("Decode(%x) = %v, want ErrBadPacket", bad[:4], err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Append(nil, Header{Flags: FlagData | FlagDRF, Seq: 1}, []byte("x")))
	f.Add(Append(nil, Header{Flags: FlagACK, Ack: 5, Window: 64}, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, d, err := Decode(b)
		if err == nil && !bytes.Equal(Append(nil, h, d), b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// FuzzReceiver feeds arbitrary packets from a few peers to an endpoint:
// it never panics, never delivers more than it was sent, and its records
// all expire after the timers.
func FuzzReceiver(f *testing.F) {
	a := newEP(f, Config{})
	a.Send(t0, 2, bytes.Repeat([]byte("y"), 600), 1)
	var seed []byte
	for _, p := range a.Ready().Packets {
		seed = append(seed, byte(len(p.B)))
		seed = append(seed, p.B...)
	}
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		e := newEP(t, Config{})
		now, in := t0, 0
		for len(b) > 1 {
			n := min(int(b[0]), len(b)-1)
			pkt := bytes.Clone(b[1 : 1+n])
			in += n
			e.Step(now, Peer(b[0]&3), pkt)
			b = b[1+n:]
			now = now.Add(time.Millisecond)
			e.Tick(now)
			out := 0
			for _, m := range e.Ready().Messages {
				out += len(m.Data)
			}
			if out > in {
				t.Fatalf("delivered %d bytes of %d received", out, in)
			}
		}
		e.Tick(now.Add(3 * e.Config().DeltaT()))
		if e.Records() != 0 {
			t.Fatalf("%d records after the timers", e.Records())
		}
	})
}

// world runs delta-t endpoints on a simulated torus.
type world struct {
	t     *testing.T
	sim   *netsim.Sim
	eps   []*Endpoint
	timer []time.Time
	got   [][]Message
	fail  []Failure
	acked []Acked
}

func newWorld(t *testing.T, sh netsim.Shape, f netsim.Faults, seed uint64, cfg Config) *world {
	sim, err := netsim.NewSim(netsim.SimConfig{Shape: sh, Faults: f, Seed: seed, HopLatency: 10 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, sim: sim}
	for i := range sh.Nodes() {
		w.eps = append(w.eps, newEP(t, cfg))
		w.timer = append(w.timer, time.Time{})
		w.got = append(w.got, nil)
		sim.Handle(netsim.NodeID(i), func(now time.Time, pkt []byte) {
			h, p, err := netsim.DecodeTorus(pkt)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.eps[i].Step(now, Peer(sh.ID(h.Src)), p); err != nil {
				t.Fatal(err)
			}
			w.drain(i)
		})
	}
	return w
}

func (w *world) drain(i int) {
	r := w.eps[i].Ready()
	for _, p := range r.Packets {
		w.sim.SendTorus(netsim.NodeID(i), netsim.NodeID(p.To), netsim.ProtoDeltaT, p.B)
	}
	w.got[i] = append(w.got[i], r.Messages...)
	w.fail = append(w.fail, r.Failures...)
	w.acked = append(w.acked, r.Acked...)
	if n := r.NextTick; !n.IsZero() && (w.timer[i].IsZero() || n.Before(w.timer[i])) {
		w.timer[i] = n
		w.sim.At(n, func(now time.Time) {
			if w.timer[i].Equal(n) {
				w.timer[i] = time.Time{}
			}
			w.eps[i].Tick(now)
			w.drain(i)
		})
	}
}

// Exactly-once, in-order delivery under seeded loss (20%), duplication
// (10%) and reordering (30%, up to 5 ms): four senders each send 200
// messages of 1 B to 3 KiB to one receiver; each sender's messages arrive
// exactly once, in order, intact, and every record expires afterwards.
func TestExactlyOnceInOrderUnderFaults(t *testing.T) {
	seed := testenv.Rand(t).Uint64()
	w := newWorld(t, netsim.Shape{X: 3, Y: 2, Z: 1}, netsim.Faults{Drop: 0.2, Duplicate: 0.1, Reorder: 0.3, Delay: 5 * time.Millisecond}, seed, Config{RTO: 20 * time.Millisecond, R: 5 * time.Second})
	const perSender = 200
	senders := []int{1, 2, 3, 5}
	msg := func(s, k int) []byte {
		b := make([]byte, 1+(k*37+s*11)%3000)
		for i := range b {
			b[i] = byte(s*7 + k + i)
		}
		return b
	}
	for _, s := range senders {
		for k := range perSender {
			w.sim.At(w.sim.Now().Add(time.Duration(k)*time.Millisecond), func(now time.Time) {
				w.eps[s].Send(now, 0, msg(s, k), uint64(s*1000+k))
				w.drain(s)
			})
		}
	}
	w.sim.RunFor(30 * time.Second)
	next := map[Peer]int{}
	for _, m := range w.got[0] {
		k := next[m.From]
		if k >= perSender || !bytes.Equal(m.Data, msg(int(m.From), k)) {
			t.Fatalf("from %d: message %d is not the %d-th sent (len %d): duplicated, reordered or corrupt", m.From, k, k, len(m.Data))
		}
		next[m.From]++
	}
	for _, s := range senders {
		if next[Peer(s)] != perSender {
			t.Fatalf("sender %d: %d of %d delivered (failures %v)", s, next[Peer(s)], perSender, w.fail)
		}
	}
	if len(w.acked) != len(senders)*perSender {
		t.Errorf("%d messages acked, want %d", len(w.acked), len(senders)*perSender)
	}
	t.Logf("sim stats %+v; receiver %+v", w.sim.Stats, w.eps[0].Stats)
	w.sim.RunFor(4 * w.eps[0].Config().DeltaT())
	for i, e := range w.eps {
		if e.Records() != 0 {
			t.Errorf("node %d holds %d records after the timers", i, e.Records())
		}
	}
}

// BenchmarkSendDeliver measures one one-segment message through the
// sender and receiver cores (no network): messages/s and allocations.
func BenchmarkSendDeliver(b *testing.B) {
	for _, size := range []int{8, SegData, 4096} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			a, r := newEP(b, Config{}), newEP(b, Config{})
			msg := make([]byte, size)
			now := t0
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				a.Send(now, 2, msg, 1)
				for _, p := range a.Ready().Packets {
					r.Step(now, 1, p.B)
				}
				for _, p := range r.Ready().Packets {
					a.Step(now, 2, p.B) // an ack at once: the message began a data run
				}
				now = now.Add(DefaultA)
				r.Tick(now)
				for _, p := range r.Ready().Packets {
					a.Step(now, 2, p.B) // a delayed ack
				}
				a.Ready()
			}
		})
	}
}

// SendPrefixed sends prefix+msg as one message across segment
// boundaries.
func TestSendPrefixed(t *testing.T) {
	for _, plen := range []int{0, 1, SegData - 1, SegData, SegData + 5} {
		a, b := newEP(t, Config{}), newEP(t, Config{})
		prefix := bytes.Repeat([]byte{'p'}, plen)
		msg := bytes.Repeat([]byte{'m'}, 2*SegData+3)
		a.SendPrefixed(t0, 2, prefix, msg, 1)
		rb := deliver(t, t0, 1, a.Ready(), b)
		if len(rb.Messages) != 1 || !bytes.Equal(rb.Messages[0].Data, append(prefix, msg...)) {
			t.Fatalf("prefix %d: got %d messages", plen, len(rb.Messages))
		}
	}
}

// A send or an ack costs the sender O(1) whatever is in flight: pump
// starts at the first unsent segment and the deadline comes from the
// oldest segment and a retransmission bound, not from a scan of the
// window. With the window full (64 segments in flight, more queued),
// each Send and each ack that lets one more segment out looks at no more
// than two segments.
func TestPumpIgnoresSegmentsInFlight(t *testing.T) {
	a, b := newEP(t, Config{}), newEP(t, Config{})
	now := t0
	for i := range 2 * DefaultWindow {
		a.Send(now, 2, []byte("x"), uint64(i+1))
	}
	pkts := a.Ready().Packets
	if len(pkts) != DefaultWindow || len(a.send[2].segs) != 2*DefaultWindow {
		t.Fatalf("%d sent of %d queued, want a full window", len(pkts), len(a.send[2].segs))
	}
	for _, p := range pkts {
		b.Step(now, 1, p.B)
	}
	b.Ready()
	// b acknowledges one segment at a time (acks built by hand: b's
	// own would cover half a window at once).
	ack := func(next seqnum.Value) []byte {
		return Append(nil, Header{Flags: FlagACK, Window: DefaultWindow, Ack: uint32(next)}, nil)
	}
	una := a.send[2].una
	for i := range DefaultWindow {
		now = now.Add(time.Microsecond)
		v := a.visits
		a.Send(now, 2, []byte("y"), 0)
		if d := a.visits - v; d > 2 {
			t.Fatalf("Send %d with %d segments in flight looked at %d of them", i, DefaultWindow, d)
		}
		v = a.visits
		una++
		a.Step(now, 2, ack(una))
		r := a.Ready()
		if len(r.Packets) != 1 || len(r.Acked) != 1 {
			t.Fatalf("ack %d: %d packets, %d acked; want the next segment out and one message acked", i, len(r.Packets), len(r.Acked))
		}
		if d := a.visits - v; d > 2 {
			t.Fatalf("ack %d with %d segments in flight looked at %d of them", i, DefaultWindow, d)
		}
	}
}

// The retransmission deadline is the earliest over the segments in
// flight, not the oldest segment's: after a partial retransmission the
// oldest was sent last. Segment A goes at 0, B at 30 ms; A is
// retransmitted at 50 ms (due again at 100); B is due at 80 ms and goes
// then.
func TestRetransmitDeadlineAfterPartialRetransmission(t *testing.T) {
	a := newEP(t, Config{})
	a.Send(t0, 2, []byte("A"), 1)
	a.Send(t0.Add(30*time.Millisecond), 2, []byte("B"), 2) // window not full: sent at once
	if n := len(a.Ready().Packets); n != 2 {
		t.Fatalf("%d packets, want A and B", n)
	}
	a.Tick(t0.Add(DefaultRTO))
	r := a.Ready()
	if len(r.Packets) != 1 || string(r.Packets[0].B[HeaderLen:]) != "A" {
		t.Fatalf("at RTO retransmitted %d packets, want A alone", len(r.Packets))
	}
	wantB := t0.Add(30*time.Millisecond + DefaultRTO)
	if !r.NextTick.Equal(wantB) {
		t.Fatalf("next tick %v, want B's retransmission at %v", r.NextTick.Sub(t0), wantB.Sub(t0))
	}
	a.Tick(wantB)
	r = a.Ready()
	if len(r.Packets) != 1 || string(r.Packets[0].B[HeaderLen:]) != "B" {
		t.Fatalf("at %v retransmitted %d packets, want B", wantB.Sub(t0), len(r.Packets))
	}
}

// With Headroom, every packet has room in front of it for the link's
// header, in the same array; a retransmission is a fresh frame (the
// first one is the link's), with the same bytes.
func TestHeadroom(t *testing.T) {
	const hr = 16
	a := newEP(t, Config{Headroom: hr})
	a.Send(t0, 2, []byte("framed"), 1)
	p := a.Ready().Packets[0]
	if len(p.Frame) != hr+len(p.B) || &p.Frame[hr] != &p.B[0] {
		t.Fatalf("frame of %d bytes for a %d-byte packet, or not in front of it", len(p.Frame), len(p.B))
	}
	copy(p.Frame, bytes.Repeat([]byte{0xee}, hr)) // the link writes its header
	a.Tick(t0.Add(DefaultRTO))
	q := a.Ready().Packets[0]
	if &q.Frame[0] == &p.Frame[0] || !bytes.Equal(q.B, p.B) || len(q.Frame) != hr+len(q.B) {
		t.Fatal("retransmission reuses the link's frame or differs")
	}
	b := newEP(t, Config{Headroom: hr})
	b.Step(t0, 1, p.B)
	b.Tick(t0.Add(DefaultA))
	ack := b.Ready().Packets[0]
	if len(ack.Frame) != hr+HeaderLen || &ack.Frame[hr] != &ack.B[0] {
		t.Fatal("ack without headroom")
	}
	if _, err := New(Config{Headroom: -1}); !errors.Is(err, ErrConfig) {
		t.Errorf("New(Headroom -1) = %v, want ErrConfig", err)
	}
}

// A steady stream reuses the array its queue of segments lives in: acks
// free its front, and the queue moves back there rather than grow. Here
// 128 segments are queued (a window in flight), then one more is sent
// and one acknowledged, over and over: once the array has grown to more
// than twice the queue, it stays the same.
func TestQueueReusesArray(t *testing.T) {
	a := newEP(t, Config{})
	for i := range 2 * DefaultWindow {
		a.Send(t0, 2, []byte("x"), uint64(i+1))
	}
	a.Ready()
	s := a.send[2]
	cycle := func() {
		a.Send(t0, 2, []byte("y"), 0)
		a.Step(t0, 2, Append(nil, Header{Flags: FlagACK, Window: DefaultWindow, Ack: uint32(s.una + 1)}, nil))
		a.Ready()
	}
	for range 4 * DefaultWindow {
		cycle()
	}
	arr := &s.arr[0]
	for range 1000 {
		cycle()
	}
	if &s.arr[0] != arr || len(s.segs) != 2*DefaultWindow || len(s.arr) > 8*DefaultWindow {
		t.Fatalf("queue of %d segments in a new array of %d after a steady stream", len(s.segs), len(s.arr))
	}
}
