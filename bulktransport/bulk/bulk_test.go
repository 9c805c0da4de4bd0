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

// FuzzReceiver feeds arbitrary data-path packets to a receiver with an
// open transfer: no panic, and what it delivers has the announced length.
func FuzzReceiver(f *testing.F) {
	f.Add(AppendDataHeader(nil, OpData, 1, 0))
	f.Add(append(AppendDataHeader(nil, OpData, 1, ChunkData), make([]byte, 100)...))
	f.Add(AppendRGet(nil, 1, 0, 1000))
	f.Fuzz(func(t *testing.T, b []byte) {
		n := New(Config{Self: 1})
		n.StepControl(t0, 0, AppendControl(nil, Control{Header: Header{Src: 0, Dst: 1, Op: OpGet, Param: 1}, Word: ChunkData + 100}))
		n.Ready()
		n.StepData(t0, 0, b)
		for _, m := range n.Ready().Messages {
			if len(m.Data) != ChunkData+100 {
				t.Fatalf("delivered %d bytes", len(m.Data))
			}
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
