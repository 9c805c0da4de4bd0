package bulk

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

var t0 = time.Unix(1_000_000, 0)

// pair runs two bulk nodes with a reliable control channel and a lossy
// data path, in virtual time.
type pair struct {
	t     *testing.T
	now   time.Time
	nodes [2]*Node
	loss  float64
	rng   *rand.Rand
	got   [2][]Message
	res   [2][]Result
	sent  [2][]PacketOut // every data-path packet, for inspection
}

func newPair(t *testing.T, cfg Config) *pair {
	p := &pair{t: t, now: t0, rng: rand.New(rand.NewPCG(1, 2))}
	for i := range 2 {
		c := cfg
		c.Self = uint16(i)
		p.nodes[i] = New(c)
	}
	return p
}

// run moves packets until nothing is left to do, ticking the clock when
// both nodes are quiet.
func (p *pair) run(limit time.Duration) {
	end := p.now.Add(limit)
	for p.now.Before(end) {
		moved := false
		for i, n := range p.nodes {
			r := n.Ready()
			p.got[i] = append(p.got[i], r.Messages...)
			p.res[i] = append(p.res[i], r.Results...)
			for _, c := range r.Control {
				moved = true
				if err := p.nodes[c.To].StepControl(p.now, uint16(i), bytes.Clone(c.B)); err != nil {
					p.t.Fatal(err)
				}
			}
			for _, d := range r.Packets {
				moved = true
				p.sent[i] = append(p.sent[i], d)
				if p.rng.Float64() < p.loss {
					continue
				}
				if err := p.nodes[d.To].StepData(p.now, uint16(i), append(bytes.Clone(d.Head), d.Body...)); err != nil {
					p.t.Fatal(err)
				}
			}
		}
		for _, n := range p.nodes {
			for from, s := range n.senders {
				if s.inflight > n.cfg.Window || s.inflight < 0 {
					p.t.Fatalf("node %d has %d chunks in flight from %d, window %d", n.cfg.Self, s.inflight, from, n.cfg.Window)
				}
			}
		}
		if !moved {
			p.now = p.now.Add(5 * time.Millisecond)
			for _, n := range p.nodes {
				n.Tick(p.now)
			}
			if p.nodes[0].Active()+p.nodes[1].Active() == 0 {
				return
			}
		}
	}
}

// Bulk messaging: the receiver pulls the data with remote gets, re-asks
// for what the lossy data path lost, delivers the message intact with its
// 24 bytes of metadata, and acknowledges; the sender's Data packets refer
// to its buffer (no copy), and both sides hold nothing afterwards.
func TestRemoteGetUnderLoss(t *testing.T) {
	rng := testenv.Rand(t)
	p := newPair(t, Config{})
	p.rng = rng
	p.loss = 0.3
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 31)
	}
	meta := [MetaLen]byte{1, 2, 3}
	tag, err := p.nodes[0].Write(p.now, 1, meta, data)
	if err != nil {
		t.Fatal(err)
	}
	p.run(time.Minute)
	if len(p.got[1]) != 1 || !bytes.Equal(p.got[1][0].Data, data) || p.got[1][0].Meta != meta {
		t.Fatalf("receiver got %d messages", len(p.got[1]))
	}
	if len(p.res[0]) != 1 || p.res[0][0].Tag != tag || p.res[0][0].Err != nil {
		t.Fatalf("sender results %+v, want an ack for tag %d", p.res[0], tag)
	}
	for _, d := range p.sent[0] {
		if len(d.Body) > 0 && !aliases(d.Body, data) {
			t.Fatal("a Data packet copied the sender's buffer")
		}
	}
	if p.nodes[0].Active() != 0 || p.nodes[1].Active() != 0 {
		t.Fatal("state left after the ack")
	}
	if p.nodes[1].Stats.Rerequests == 0 {
		t.Error("30% loss and no re-request: the loss did not happen?")
	}
	t.Logf("1 MiB under 30%% loss in %v of virtual time; receiver %+v", p.now.Sub(t0), p.nodes[1].Stats)
}

func aliases(sub, buf []byte) bool {
	for i := 0; i < len(buf); i += ChunkData {
		if &buf[i] == &sub[0] {
			return true
		}
	}
	return false
}

// Bulk messaging: a receiver that cannot take a message answers Nak; the
// sender reports it and forgets the region.
func TestNakWhenNoBuffer(t *testing.T) {
	p := newPair(t, Config{MaxBuffered: 1000})
	p.nodes[0].Write(p.now, 1, [MetaLen]byte{}, make([]byte, 600))
	p.nodes[0].Write(p.now, 1, [MetaLen]byte{}, make([]byte, 600))
	p.run(time.Second)
	var naks int
	for _, r := range p.res[0] {
		if errors.Is(r.Err, ErrNak) && r.Reason == ReasonNoBuffer {
			naks++
		}
	}
	if len(p.got[1]) != 1 || naks != 1 || p.nodes[0].Active() != 0 {
		t.Fatalf("delivered %d, naks %d, results %+v", len(p.got[1]), naks, p.res[0])
	}
	if p.nodes[1].Buffered() != 600 {
		t.Fatalf("buffered %d, want 600 until the reader releases", p.nodes[1].Buffered())
	}
	p.nodes[1].Release(600)
	p.nodes[0].Write(p.now, 1, [MetaLen]byte{}, make([]byte, 600))
	p.run(time.Second)
	if len(p.got[1]) != 2 {
		t.Fatal("released budget not reused")
	}
}

// Bulk messaging: Cancel makes the receiver forget the transfer, and a
// remote get for a tag the sender does not hold is answered RNak (the
// sender restarted), which ends the transfer at the receiver.
func TestCancelAndRNak(t *testing.T) {
	p := newPair(t, Config{})
	p.loss = 1 // the data path is down: the transfer stays open
	tag, _ := p.nodes[0].Write(p.now, 1, [MetaLen]byte{}, make([]byte, 5000))
	p.run(10 * time.Millisecond)
	if p.nodes[1].Active() != 1 {
		t.Fatal("no transfer at the receiver")
	}
	p.nodes[0].Cancel(tag)
	p.run(10 * time.Millisecond)
	if p.nodes[0].Active()+p.nodes[1].Active() != 0 {
		t.Fatal("cancel left state")
	}

	p.nodes[0].Write(p.now, 1, [MetaLen]byte{}, make([]byte, 5000))
	p.run(10 * time.Millisecond)
	p.nodes[0] = New(Config{Self: 0}) // the sender restarts and forgets the region
	p.loss = 0
	p.run(time.Second)
	if p.nodes[1].Active() != 0 || p.nodes[1].Stats.RNaks != 1 || len(p.got[1]) != 0 {
		t.Fatalf("receiver active %d, rnaks %d, delivered %d", p.nodes[1].Active(), p.nodes[1].Stats.RNaks, len(p.got[1]))
	}
}

func TestDecodeTruncation(t *testing.T) {
	c := AppendControl(nil, Control{Header: Header{Src: 1, Dst: 2, Op: OpGet, Param: MaxTag}, Word: 9})
	if len(c) != ControlLen || HeaderLen != 32 {
		t.Fatalf("control is %d bytes", len(c))
	}
	got, err := DecodeControl(c)
	if err != nil || got.Param != MaxTag || got.Word != 9 {
		t.Fatalf("DecodeControl = %+v, %v", got, err)
	}
	for n := range len(c) {
		if _, err := DecodeControl(c[:n]); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("DecodeControl(%d bytes) = %v", n, err)
		}
	}
	r := AppendRGet(nil, 5, 464, 232)
	for n := range len(r) {
		if _, err := DecodeDataPath(r[:n]); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("DecodeDataPath(%d bytes) = %v", n, err)
		}
	}
}

func FuzzDecodeControl(f *testing.F) {
	f.Add(AppendControl(nil, Control{Header: Header{Op: OpNak, Param: 3}, Word: ReasonNoBuffer}))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeControl(b)
		if err == nil && !bytes.Equal(AppendControl(nil, c), b) {
			t.Fatal("re-encoding differs")
		}
	})
}

// FuzzReceiver feeds arbitrary data-path packets, from two peers with
// two open transfers each, to a receiver: no panic, what it delivers has
// the announced length, each peer's window stays between 0 and Window,
// and after TransferTimeout nothing is left, timers included.
func FuzzReceiver(f *testing.F) {
	f.Add([]byte{8, byte(OpData), 0, 0, 1, 0, 0, 0, 0})
	f.Add(append([]byte{108}, append(AppendDataHeader(nil, OpData, 1, ChunkData), make([]byte, 100)...)...))
	f.Add(append([]byte{12}, AppendRGet(nil, 1, 0, 1000)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		n := New(Config{Self: 1, Window: 8})
		for from := range uint16(2) {
			for tag := range uint32(2) {
				n.StepControl(t0, from*2, AppendControl(nil, Control{Header: Header{Src: from * 2, Dst: 1, Op: OpGet, Param: tag + 1}, Word: ChunkData*(20+tag) + 100}))
			}
		}
		n.Ready()
		now := t0
		for len(b) > 1 {
			k := min(int(b[0]), len(b)-1)
			n.StepData(now, uint16(b[0]&2), bytes.Clone(b[1:1+k]))
			b = b[1+k:]
			now = now.Add(3 * time.Millisecond)
			n.Tick(now)
			for _, m := range n.Ready().Messages {
				if len(m.Data) != ChunkData*20+100 && len(m.Data) != ChunkData*21+100 {
					t.Fatalf("delivered %d bytes", len(m.Data))
				}
			}
			for from, s := range n.senders {
				if s.inflight < 0 || s.inflight > n.cfg.Window {
					t.Fatalf("%d chunks in flight from %d, window %d", s.inflight, from, n.cfg.Window)
				}
			}
		}
		n.Tick(now.Add(n.cfg.TransferTimeout))
		if n.Active() != 0 || n.senders != nil || n.timers.Len() != 0 {
			t.Fatalf("after the timeout: %d active, %d windows, %d timers", n.Active(), len(n.senders), n.timers.Len())
		}
	})
}

func BenchmarkTransfer64K(b *testing.B) {
	s, r := New(Config{Self: 0}), New(Config{Self: 1})
	data := make([]byte, 64<<10)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	buf := make([]byte, 0, 240)
	for b.Loop() {
		s.Write(t0, 1, [MetaLen]byte{}, data)
		for s.Active() > 0 || r.Active() > 0 {
			for _, pr := range [][2]*Node{{s, r}, {r, s}} {
				out := pr[0].Ready()
				for _, c := range out.Control {
					pr[1].StepControl(t0, pr[0].cfg.Self, c.B)
				}
				for _, d := range out.Packets {
					buf = append(append(buf[:0], d.Head...), d.Body...)
					pr[1].StepData(t0, pr[0].cfg.Self, buf)
				}
				for _, m := range out.Messages {
					pr[0].Release(len(m.Data))
				}
			}
		}
	}
}

func FuzzDecodeDataPath(f *testing.F) {
	f.Add(AppendRGet(nil, 7, 0, 4096))
	f.Add(append(AppendDataHeader(nil, OpData, 7, ChunkData), 1, 2, 3))
	f.Add(AppendDataHeader(nil, OpRNak, 7, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodeDataPath(b)
		if err != nil {
			return
		}
		var again []byte
		if p.Op == OpRGet {
			again = AppendRGet(nil, p.Tag, p.Offset, p.Length)
		} else {
			again = append(AppendDataHeader(nil, p.Op, p.Tag, p.Offset), p.Data...)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoded %x, want %x", again, b)
		}
	})
}

// Bulk messaging: when the last chunk asked for arrives and one before it
// has not, the receiver asks for the missing one at once (the sender
// answers in order and the route keeps it), not after RGetTimeout.
func TestGapReRequestedAtOnce(t *testing.T) {
	s, r := New(Config{Self: 0}), New(Config{Self: 1})
	s.Write(t0, 1, [MetaLen]byte{}, make([]byte, 10*ChunkData))
	r.StepControl(t0, 0, s.Ready().Control[0].B)
	rgets := r.Ready().Packets
	if len(rgets) != 1 {
		t.Fatalf("%d remote gets, want 1 for all 10 chunks", len(rgets))
	}
	s.StepData(t0, 1, rgets[0].Head)
	data := s.Ready().Packets
	for i, d := range data {
		if i == 3 {
			continue // lost
		}
		r.StepData(t0, 0, append(bytes.Clone(d.Head), d.Body...))
	}
	again := r.Ready().Packets
	if len(again) != 1 {
		t.Fatalf("%d packets after the gap, want one remote get", len(again))
	}
	p, _ := DecodeDataPath(again[0].Head)
	if p.Op != OpRGet || p.Offset != 3*ChunkData || p.Length != ChunkData {
		t.Fatalf("re-request %+v, want chunk 3", p)
	}
}

// stepAll passes every data-path packet in out to n as coming from from.
func stepAll(t *testing.T, now time.Time, from uint16, out []PacketOut, n *Node) {
	t.Helper()
	for _, d := range out {
		if err := n.StepData(now, from, append(bytes.Clone(d.Head), d.Body...)); err != nil {
			t.Fatal(err)
		}
	}
}

// requested is the chunks the remote gets in out ask for.
func requested(t *testing.T, out []PacketOut) (chunks int) {
	t.Helper()
	for _, d := range out {
		p, err := DecodeDataPath(d.Head)
		if err != nil || p.Op != OpRGet {
			t.Fatalf("%x: not a remote get (%v)", d.Head, err)
		}
		chunks += (int(p.Length) + ChunkData - 1) / ChunkData
	}
	return chunks
}

// Bulk messaging: the receive window is per sending peer, across its
// transfers. Four 64-chunk messages from one peer get 64 chunks asked
// for at first, not 4 x 64 (which would overflow a socket buffer); a
// message from another peer gets a window of its own. All four arrive,
// in turn, and under loss the window is never exceeded (pair.run checks).
func TestWindowPerPeer(t *testing.T) {
	a, r, c := New(Config{Self: 0}), New(Config{Self: 1}), New(Config{Self: 2})
	for range 4 {
		a.Write(t0, 1, [MetaLen]byte{}, make([]byte, DefaultWindow*ChunkData))
	}
	c.Write(t0, 1, [MetaLen]byte{}, make([]byte, DefaultWindow*ChunkData))
	for _, ctl := range a.Ready().Control {
		r.StepControl(t0, 0, ctl.B)
	}
	if got := requested(t, r.Ready().Packets); got != DefaultWindow {
		t.Errorf("four transfers from one peer: %d chunks asked for, want the window (%d)", got, DefaultWindow)
	}
	r.StepControl(t0, 2, c.Ready().Control[0].B)
	if got := requested(t, r.Ready().Packets); got != DefaultWindow {
		t.Errorf("a transfer from another peer: %d chunks asked for, want a window of its own (%d)", got, DefaultWindow)
	}

	p := newPair(t, Config{})
	p.rng = testenv.Rand(t)
	p.loss = 0.2
	var want [][]byte
	for k := range 4 {
		data := bytes.Repeat([]byte{byte(k + 1)}, 100_000)
		want = append(want, data)
		p.nodes[0].Write(p.now, 1, [MetaLen]byte{byte(k)}, data)
	}
	p.run(time.Minute)
	if len(p.got[1]) != 4 {
		t.Fatalf("%d of 4 messages delivered", len(p.got[1]))
	}
	for _, m := range p.got[1] {
		if !bytes.Equal(m.Data, want[m.Meta[0]]) {
			t.Fatalf("message %d corrupt", m.Meta[0])
		}
	}
	if p.nodes[1].senders != nil || p.nodes[1].Active() != 0 {
		t.Fatal("receiver keeps a window for a peer with no transfers")
	}
	for i, n := range p.nodes {
		if n.timers.Len() != 0 || !n.NextTick().IsZero() {
			t.Fatalf("node %d idle with %d timer entries", i, n.timers.Len())
		}
	}
}

// A transfer waiting for the window behind the peer's other transfers
// gets no data of its own, but its peer is not silent: it is not
// abandoned after TransferTimeout. Here the data path delivers one chunk
// a millisecond and the window is 8 chunks, so the second message is
// first asked for about 56 ms after it arrived, with a 50 ms
// TransferTimeout.
func TestWaitingTransferNotAbandoned(t *testing.T) {
	cfg := Config{Window: 8, TransferTimeout: 50 * time.Millisecond}
	s, r := New(cfg), New(cfg)
	s.cfg.Self, r.cfg.Self = 0, 1
	for range 2 {
		s.Write(t0, 1, [MetaLen]byte{}, make([]byte, 64*ChunkData))
	}
	now := t0
	var pipe []PacketOut
	var got []Message
	for len(got) < 2 && now.Before(t0.Add(2*time.Second)) {
		now = now.Add(time.Millisecond)
		s.Tick(now)
		r.Tick(now)
		for moved := true; moved; {
			so, ro := s.Ready(), r.Ready()
			got = append(got, ro.Messages...)
			for _, c := range so.Control {
				r.StepControl(now, 0, c.B)
			}
			for _, c := range ro.Control {
				s.StepControl(now, 1, c.B)
			}
			stepAll(t, now, 1, ro.Packets, s) // remote gets, at once
			pipe = append(pipe, so.Packets...)
			moved = len(so.Control)+len(ro.Control)+len(ro.Packets) > 0
		}
		if len(pipe) > 0 {
			stepAll(t, now, 0, pipe[:1], r)
			pipe = pipe[1:]
		}
	}
	if len(got) != 2 || r.Stats.TimedOut != 0 {
		t.Fatalf("%d of 2 messages delivered in %v, %d transfers abandoned", len(got), now.Sub(t0), r.Stats.TimedOut)
	}
}

// Bulk messaging: a chunk that arrives beyond the first missing one
// shows that one lost (chunks are asked for in order and come in order),
// and the receiver asks for it again at once, without waiting for the
// last chunk asked for, and once: the later chunks do not ask again.
func TestGapReRequestedWhenSkipped(t *testing.T) {
	s, r := New(Config{Self: 0}), New(Config{Self: 1})
	s.Write(t0, 1, [MetaLen]byte{}, make([]byte, 10*ChunkData))
	r.StepControl(t0, 0, s.Ready().Control[0].B)
	stepAll(t, t0, 1, r.Ready().Packets, s)
	data := s.Ready().Packets
	stepAll(t, t0, 0, data[:3], r)
	if out := r.Ready().Packets; len(out) != 0 {
		t.Fatalf("%d packets after chunks 0-2 in order, want none", len(out))
	}
	stepAll(t, t0, 0, data[4:5], r) // chunk 3 lost
	again := r.Ready().Packets
	if len(again) != 1 {
		t.Fatalf("%d packets when chunk 4 skipped chunk 3, want one remote get", len(again))
	}
	if p, _ := DecodeDataPath(again[0].Head); p.Op != OpRGet || p.Offset != 3*ChunkData || p.Length != ChunkData {
		t.Fatalf("re-request %+v, want chunk 3", p)
	}
	stepAll(t, t0, 0, data[5:], r)
	if out := r.Ready().Packets; len(out) != 0 {
		t.Fatalf("%d packets after chunks 5-9: chunk 3 asked for again twice", len(out))
	}
	stepAll(t, t0, 1, again, s)
	stepAll(t, t0, 0, s.Ready().Packets, r)
	if out := r.Ready(); len(out.Messages) != 1 || r.Stats.FastRerequests != 1 {
		t.Fatalf("%d messages, %d fast re-requests; want the message after one", len(out.Messages), r.Stats.FastRerequests)
	}
}

// Ready and the data path find the next deadline without looking at the
// transfers and regions (a heap holds their timers), and Tick looks only
// at those due: with 50 transfers and 50 regions open, started 1 ms
// apart, moving a transfer's data and calling Ready looks at none of
// them, and a Tick when one region and one transfer are due looks at
// those two.
func TestTimersVisitOnlyDue(t *testing.T) {
	const k = 50
	senders := make([]*Node, k)
	r := New(Config{Self: 1})
	s := New(Config{Self: 0}) // regions, to nobody listening
	for i := range k {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		senders[i] = New(Config{Self: uint16(2 + i)})
		senders[i].Write(now, 1, [MetaLen]byte{}, make([]byte, 100*ChunkData))
		r.StepControl(now, uint16(2+i), senders[i].Ready().Control[0].B)
		s.Write(now, 9, [MetaLen]byte{}, make([]byte, 10))
	}
	s.Ready()
	rgets := r.Ready().Packets
	if r.visits != 0 || s.visits != 0 {
		t.Fatalf("opening transfers and regions looked at %d and %d of them", r.visits, s.visits)
	}
	// The last transfer's data, chunk by chunk, with a Ready after each.
	last := senders[k-1]
	now := t0.Add(k * time.Millisecond)
	stepAll(t, now, 1, rgets[k-1:], last)
	for _, d := range last.Ready().Packets {
		stepAll(t, now, uint16(k+1), []PacketOut{d}, r)
		r.Ready()
		r.NextTick()
	}
	if r.visits != 0 {
		t.Fatalf("moving one transfer's data with %d open looked at %d transfers", k, r.visits)
	}
	// The first transfer's re-request timer is due first (nothing came
	// for it in RGetTimeout), then the next one's 1 ms later.
	r.Tick(t0.Add(DefaultRGetTimeout))
	if r.visits != 1 || len(r.Ready().Packets) != 1 {
		t.Fatalf("Tick with one transfer due looked at %d transfers", r.visits)
	}
	s.Tick(t0.Add(DefaultRegionTimeout))
	if res := s.Ready().Results; s.visits != 1 || len(res) != 1 || !errors.Is(res[0].Err, ErrTimeout) {
		t.Fatalf("Tick with one region due looked at %d regions, results %+v", s.visits, res)
	}
}
