package bulktransport

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/radic-project/radic/bulktransport/bulk"
	"github.com/radic-project/radic/bulktransport/deltat"
	"github.com/radic-project/radic/internal/testenv"
	"github.com/radic-project/radic/netsim"
)

// machine runs one Endpoint per node of a simulated torus.
type machine struct {
	t       testing.TB
	sim     *netsim.Sim
	eps     []*Endpoint
	timer   []time.Time
	results [][]Result
	read    [][]Msg
}

func newMachine(t testing.TB, sh netsim.Shape, f netsim.Faults, seed uint64, cfg Config) *machine {
	t.Helper()
	sim, err := netsim.NewSim(netsim.SimConfig{Shape: sh, Faults: f, Seed: seed, HopLatency: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	m := &machine{t: t, sim: sim, eps: make([]*Endpoint, sh.Nodes()), timer: make([]time.Time, sh.Nodes()),
		results: make([][]Result, sh.Nodes()), read: make([][]Msg, sh.Nodes())}
	for i := range sh.Nodes() {
		c := cfg
		c.Shape, c.Self = sh, netsim.NodeID(i)
		if m.eps[i], err = New(c); err != nil {
			t.Fatal(err)
		}
		sim.Handle(netsim.NodeID(i), func(now time.Time, pkt []byte) {
			if err := m.eps[i].Step(now, pkt); err != nil {
				t.Errorf("node %d: %v", i, err)
			}
			m.drain(i)
		})
	}
	return m
}

func (m *machine) drain(i int) {
	e := m.eps[i]
	r := e.Ready()
	for _, p := range r.Packets {
		if err := m.sim.Send(p); err != nil {
			m.t.Fatal(err)
		}
	}
	m.results[i] = append(m.results[i], r.Results...)
	for {
		msg, ok := e.ReadMsg()
		if !ok {
			break
		}
		m.read[i] = append(m.read[i], msg)
		e.Release(msg)
	}
	if n := r.NextTick; !n.IsZero() && (m.timer[i].IsZero() || n.Before(m.timer[i])) {
		m.timer[i] = n
		m.sim.At(n, func(now time.Time) {
			if m.timer[i].Equal(n) {
				m.timer[i] = time.Time{}
			}
			e.Tick(now)
			m.drain(i)
		})
	}
}

func (m *machine) write(at time.Duration, msg Msg, from int) {
	m.sim.At(m.sim.Now().Add(at), func(now time.Time) {
		if _, err := m.eps[from].WriteMsg(now, msg); err != nil {
			m.t.Fatal(err)
		}
		m.drain(from)
	})
}

// Protocol selection by size, as UCX does: one packet while it fits,
// fragmented copy up to BulkMin, bulk remote get from there; metadata
// costs 24 bytes of the short packet.
func TestSelectBySize(t *testing.T) {
	c := Config{}
	c.SetDefaults()
	tests := []struct {
		n    int
		meta bool
		want Protocol
	}{
		{0, false, Short},
		{deltat.SegData - 1, false, Short},
		{deltat.SegData, false, Copy},
		{deltat.SegData - 1 - 24, true, Short},
		{deltat.SegData - 24, true, Copy},
		{DefaultBulkMin - 1, false, Copy},
		{DefaultBulkMin, false, Bulk},
		{1 << 20, true, Bulk},
	}
	for _, tc := range tests {
		if got := c.Select(tc.n, tc.meta); got != tc.want {
			t.Errorf("Select(%d, meta %v) = %v, want %v", tc.n, tc.meta, got, tc.want)
		}
	}
	c.BulkMin = 1000 // configurable
	if c.Select(1000, false) != Bulk {
		t.Error("BulkMin not honoured")
	}
}

// Exactly once under seeded loss, duplication and reordering, all three
// protocols mixed: every message arrives intact with its metadata; the
// Short and Copy messages of one sender in the order written; every
// write gets a successful Result; afterwards no node holds any state.
func TestEndToEndUnderFaults(t *testing.T) {
	rng := testenv.Rand(t)
	sh := netsim.Shape{X: 3, Y: 3, Z: 2}
	m := newMachine(t, sh, netsim.Faults{Drop: 0.1, Duplicate: 0.05, Reorder: 0.2, Delay: 2 * time.Millisecond}, rng.Uint64(),
		Config{DeltaT: deltat.Config{RTO: 10 * time.Millisecond, R: 10 * time.Second}})
	type key struct{ from, k int }
	sent := map[key][]byte{}
	sizes := []int{1, 100, 300, 2000, 7000, 9000, 70000, 300000}
	writes := 0
	for from := 1; from < sh.Nodes(); from += 3 {
		for k := range 30 {
			n := sizes[rng.IntN(len(sizes))]
			data := make([]byte, n)
			for i := range data {
				data[i] = byte(from*13 + k*7 + i)
			}
			var meta [24]byte
			meta[0], meta[1] = byte(from), byte(k)
			sent[key{from, k}] = data
			m.write(time.Duration(k)*time.Millisecond, Msg{Peer: 0, Meta: meta, Data: data}, from)
			writes++
		}
	}
	m.sim.RunFor(60 * time.Second)
	last := map[int]int{}
	for _, msg := range m.read[0] {
		k := key{int(msg.Meta[0]), int(msg.Meta[1])}
		want, ok := sent[k]
		if !ok {
			t.Fatalf("message %v delivered twice or never sent", k)
		}
		delete(sent, k)
		if !bytes.Equal(msg.Data, want) {
			t.Fatalf("message %v corrupt (%d bytes, want %d)", k, len(msg.Data), len(want))
		}
		if wantP := m.eps[k.from].cfg.Select(len(want), true); msg.Proto != wantP {
			t.Errorf("message %v of %d bytes came %v, want %v", k, len(want), msg.Proto, wantP)
		}
		if msg.Proto != Bulk {
			if l, ok := last[k.from]; ok && l > k.k {
				t.Fatalf("sender %d: message %d after %d", k.from, k.k, l)
			}
			last[k.from] = k.k
		}
	}
	if len(sent) != 0 {
		t.Fatalf("%d messages not delivered", len(sent))
	}
	ok := 0
	for _, rs := range m.results {
		for _, r := range rs {
			if r.Err != nil || r.Peer != 0 {
				t.Fatalf("result %+v, want success from node 0", r)
			}
			ok++
		}
	}
	if ok != writes {
		t.Errorf("%d results, want %d", ok, writes)
	}
	dt, bk, _ := m.eps[0].Stats()
	t.Logf("sim %+v", m.sim.Stats)
	t.Logf("receiver delta-t %+v", dt)
	t.Logf("receiver bulk %+v", bk)
	m.sim.RunFor(4 * m.eps[0].dt.Config().DeltaT())
	for i, e := range m.eps {
		if e.State() != 0 {
			t.Errorf("node %d holds %d records after the timers", i, e.State())
		}
	}
}

// readmsg hands a Short message up by reference: its Data points into
// the torus packet that carried it.
func TestReadMsgByReference(t *testing.T) {
	sh := netsim.Shape{X: 2, Y: 1, Z: 1}
	a, _ := New(Config{Shape: sh, Self: 0})
	b, _ := New(Config{Shape: sh, Self: 1})
	a.WriteMsg(time.Unix(1, 0), Msg{Peer: 1, Data: []byte("by reference")})
	pkt := a.Ready().Packets[0]
	b.Step(time.Unix(1, 0), pkt)
	msg, ok := b.ReadMsg()
	if !ok || string(msg.Data) != "by reference" || &msg.Data[0] != &pkt[len(pkt)-len(msg.Data)] {
		t.Fatal("short message not delivered by reference to its packet")
	}
}

// Datagrams up to 64 KiB are fragmented over torus packets and
// reassembled.
func TestDatagram(t *testing.T) {
	m := newMachine(t, netsim.Shape{X: 2, Y: 2, Z: 2}, netsim.Faults{}, 1, Config{})
	data := bytes.Repeat([]byte("heartbeat view "), 4000)[:60000]
	m.sim.At(m.sim.Now(), func(time.Time) {
		m.eps[3].SendDatagram(5, data)
		m.drain(3)
	})
	m.sim.RunFor(time.Second)
	d, ok := m.eps[5].ReadDatagram()
	if !ok || !bytes.Equal(d.Data, data) || d.Peer != 3 {
		t.Fatal("datagram not reassembled")
	}
	m.sim.RunFor(time.Second)
	if m.eps[3].State() != 0 {
		t.Fatalf("sender holds %d after a datagram", m.eps[3].State())
	}
}

// BenchmarkProtocols: messages through two endpoints wired back to back
// (no network), per protocol: ns per message (messages/s = 1e9/ns),
// bytes/s and allocations. The Copy/Bulk crossover sets DefaultBulkMin.
func BenchmarkProtocols(b *testing.B) {
	sh := netsim.Shape{X: 2, Y: 1, Z: 1}
	for _, size := range []int{8, 200, 1024, 4096, 8192, 16384, 65536} {
		for _, proto := range []Protocol{Short, Copy, Bulk} {
			cfg := Config{Shape: sh}
			switch proto {
			case Short:
				if size > deltat.SegData-1 {
					continue
				}
			case Copy:
				if size <= deltat.SegData-1 || size > deltat.MaxMessage-1 {
					continue
				}
				cfg.BulkMin = 1 << 30
			case Bulk:
				cfg.BulkMin = 1
			}
			b.Run(fmt.Sprintf("%s/%d", proto, size), func(b *testing.B) {
				c0, c1 := cfg, cfg
				c1.Self = 1
				a, r := mustNew(b, c0), mustNew(b, c1)
				data := make([]byte, size)
				now := time.Unix(1000, 0)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					a.WriteMsg(now, Msg{Peer: 1, Data: data})
					for moved := true; moved; {
						moved = false
						for _, pr := range [2][2]*Endpoint{{a, r}, {r, a}} {
							for _, p := range pr[0].Ready().Packets {
								pr[1].Step(now, p)
								moved = true
							}
						}
						if !moved {
							now = now.Add(deltat.DefaultA)
							a.Tick(now)
							r.Tick(now)
							moved = len(a.out.Packets)+len(r.out.Packets) > 0
						}
						for {
							msg, ok := r.ReadMsg()
							if !ok {
								break
							}
							r.Release(msg)
						}
					}
				}
			})
		}
	}
}

func mustNew(t testing.TB, c Config) *Endpoint {
	e, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// FuzzEndpointStep feeds arbitrary torus payloads, under every protocol,
// to an endpoint: it never panics, and all its state expires after the
// timers.
func FuzzEndpointStep(f *testing.F) {
	f.Add(uint8(netsim.ProtoDeltaT), deltat.Append(nil, deltat.Header{Flags: deltat.FlagData | deltat.FlagDRF | deltat.FlagBOM | deltat.FlagEOM, Seq: 1}, []byte{KindBulk, 0, 1, 0, 0, 1, 0, 0, 1}))
	f.Add(uint8(netsim.ProtoBulk), []byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0})
	f.Add(uint8(netsim.ProtoFrag), []byte{0, 1, 0, 0, 0, 0, 1, 0, 9})
	f.Fuzz(func(t *testing.T, proto uint8, payload []byte) {
		if len(payload) > netsim.TorusPayload {
			return
		}
		sh := netsim.Shape{X: 2, Y: 1, Z: 1}
		e := mustNew(t, Config{Shape: sh, Self: 0})
		now := time.Unix(1000, 0)
		pkt := netsim.AppendTorus(nil, netsim.TorusHeader{Proto: netsim.Proto(proto % 5), Src: sh.Coord(1), Dst: sh.Coord(0)}, payload)
		e.Step(now, pkt)
		e.Ready()
		for {
			if _, ok := e.ReadMsg(); !ok {
				break
			}
		}
		end := now.Add(time.Minute)
		for i := 0; i < 100 && e.State() > 0; i++ {
			now = now.Add(time.Second)
			e.Tick(now)
			e.Ready()
		}
		e.Tick(end)
		if e.State() != 0 {
			t.Fatalf("%d records a minute later", e.State())
		}
	})
}

// A node answering a remote get for a tag it does not hold (it restarted)
// sends RNak and keeps nothing for the asker.
func TestRNakLeavesNoState(t *testing.T) {
	sh := netsim.Shape{X: 2, Y: 1, Z: 1}
	e := mustNew(t, Config{Shape: sh, Self: 0})
	now := time.Unix(1000, 0)
	rget := netsim.AppendTorus(nil, netsim.TorusHeader{Proto: netsim.ProtoBulk, Src: sh.Coord(1), Dst: sh.Coord(0)}, bulk.AppendRGet(nil, 42, 0, 1000))
	if err := e.Step(now, rget); err != nil {
		t.Fatal(err)
	}
	r := e.Ready()
	if len(r.Packets) != 1 || e.State() != 0 || !r.NextTick.IsZero() {
		t.Fatalf("%d packets, state %d, next tick %v; want one RNak and nothing kept", len(r.Packets), e.State(), r.NextTick)
	}
}

// The sender copies a Short or Copy message once: delta-t writes each
// segment into a buffer with room for the torus header in front, and
// that buffer is the torus packet of its first transmission, the same
// one it keeps to retransmit from (so a link must not change a packet's
// payload). Here the packet's last byte, changed after it was handed
// out, shows in the retransmission.
func TestSegmentCopiedOnce(t *testing.T) {
	sh := netsim.Shape{X: 2, Y: 1, Z: 1}
	a := mustNew(t, Config{Shape: sh})
	now := time.Unix(1000, 0)
	a.WriteMsg(now, Msg{Peer: 1, Data: []byte("hello")})
	first := a.Ready().Packets[0]
	first[len(first)-1] = 'X'
	a.Tick(now.Add(deltat.DefaultRTO))
	re := a.Ready().Packets
	if len(re) != 1 || !bytes.HasSuffix(re[0], []byte("hellX")) {
		t.Fatalf("retransmitted %q: the first transmission was a copy of the segment kept", re)
	}
	if &re[0][0] == &first[0] {
		t.Fatal("the retransmission reuses the first transmission's packet, which the link owns")
	}
}

// A lone Short message and its ack cost a fixed number of allocations,
// at both ends together: no copy of a segment or an ack into a torus
// packet, no boxing of timer entries, no record per segment: 11 (the
// segment, the ack, the queue of segments, and the slices each Ready
// hands out; BenchmarkProtocols/short counted 20 with those). The write's
// Result comes back without a Tick: the message began a data run, so the
// receiver acks it at once.
func TestShortMessageAllocations(t *testing.T) {
	sh := netsim.Shape{X: 2, Y: 1, Z: 1}
	a, r := mustNew(t, Config{Shape: sh}), mustNew(t, Config{Shape: sh, Self: 1})
	now := time.Unix(1000, 0)
	data := make([]byte, 64)
	round := func() {
		a.WriteMsg(now, Msg{Peer: 1, Data: data})
		results := 0
		for moved := true; moved; {
			moved = false
			for _, pr := range [2][2]*Endpoint{{a, r}, {r, a}} {
				rd := pr[0].Ready()
				if pr[0] == a {
					results += len(rd.Results)
				}
				for _, p := range rd.Packets {
					pr[1].Step(now, p)
					moved = true
				}
			}
		}
		if m, ok := r.ReadMsg(); !ok || len(m.Data) != len(data) {
			t.Fatal("message not delivered")
		}
		if results != 1 {
			t.Fatal("no write result before the delayed-ack timer")
		}
		now = now.Add(deltat.DefaultA) // quiet: the next message starts a data run, acked at once
		a.Tick(now)
		r.Tick(now)
	}
	for range 10 {
		round()
	}
	const want = 11
	if got := testing.AllocsPerRun(200, round); got > want {
		t.Errorf("a Short message and its ack: %v allocations, want at most %d", got, want)
	}
}
