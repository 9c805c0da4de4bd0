package deltat

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

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
// and delivers at once.
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
	// The ack is delayed by at most A.
	if len(rb.Packets) != 0 || !rb.NextTick.Equal(t0.Add(DefaultA)) {
		t.Fatalf("ack sent at once or not scheduled at A (next %v)", rb.NextTick)
	}
	b.Tick(t0.Add(DefaultA))
	ra = deliver(t, t0.Add(DefaultA), 2, b.Ready(), a)
	if len(ra.Acked) != 1 || ra.Acked[0] != (Acked{2, 7}) {
		t.Fatalf("acked %v, want message 7 by peer 2", ra.Acked)
	}
}

// delta-t: the receiver's record expires 2 delta-t after the last packet
// it accepted, the sender's 3 delta-t after its last transmission; after
// both, neither side holds anything for the pair.
func TestRecordsExpire(t *testing.T) {
	a, b := newEP(t, Config{}), newEP(t, Config{})
	dt := a.Config().DeltaT()
	a.Send(t0, 2, []byte("x"), 1)
	deliver(t, t0, 1, a.Ready(), b)
	b.Tick(t0.Add(DefaultA))
	deliver(t, t0.Add(DefaultA), 2, b.Ready(), a)

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
	if a.Records() != 0 || a.send != nil || len(a.timers) != 0 {
		t.Fatalf("sender holds %d records, %d timers after 3 delta-t", a.Records(), len(a.timers))
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
	deliver(t, t0, 1, a.Ready(), b) // b has a record now
	b.Tick(t0.Add(DefaultA))
	deliver(t, t0.Add(DefaultA), 2, b.Ready(), a)
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
				r.Ready()
				now = now.Add(DefaultA)
				r.Tick(now)
				for _, p := range r.Ready().Packets {
					a.Step(now, 2, p.B)
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
