package netsim

import (
	"encoding/binary"
	"testing"
	"time"
)

func newTestSim(t *testing.T, sh Shape, f Faults) *Sim {
	t.Helper()
	s, err := NewSim(SimConfig{Shape: sh, Faults: f, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A packet crosses Hops(src, dst) links and arrives once, with the hop
// count in its header.
func TestSimDeliversHopByHop(t *testing.T) {
	sh := Shape{4, 4, 4}
	s := newTestSim(t, sh, Faults{})
	var got []TorusHeader
	var at time.Time
	s.Handle(sh.ID(Coord{3, 2, 1}), func(now time.Time, pkt []byte) {
		h, _, err := DecodeTorus(pkt)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, h)
		at = now
	})
	start := s.Now()
	if err := s.SendTorus(0, sh.ID(Coord{3, 2, 1}), ProtoRaw, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	s.RunFor(time.Second)
	want := sh.Hops(Coord{}, Coord{3, 2, 1}) // 1 (x wraps) + 2 + 1
	if len(got) != 1 || int(got[0].Hops) != want || want != 4 {
		t.Fatalf("delivered %+v, want one packet after %d hops", got, want)
	}
	if d := at.Sub(start); d != time.Duration(want)*100*time.Nanosecond {
		t.Errorf("latency %v, want %d hops x 100ns", d, want)
	}
}

// Link down: a packet whose dimension-order route crosses a down link is
// lost; routes around it still work.
func TestSimLinkDown(t *testing.T) {
	sh := Shape{4, 1, 1}
	s := newTestSim(t, sh, Faults{})
	n := 0
	for i := range sh.Nodes() {
		s.Handle(NodeID(i), func(time.Time, []byte) { n++ })
	}
	s.SetLink(1, XPlus, false)
	s.SendTorus(0, 2, ProtoRaw, nil) // 0 -> 1 -> 2 crosses the down link
	s.SendTorus(2, 1, ProtoRaw, nil) // reverse direction of the same cable
	s.SendTorus(0, 3, ProtoRaw, nil) // 0 -> 3 goes x- round the ring
	s.RunFor(time.Millisecond)
	if n != 1 || s.Stats.LinkDownDrops != 2 {
		t.Fatalf("delivered %d, link-down drops %d; want 1 and 2", n, s.Stats.LinkDownDrops)
	}
	s.SetLink(1, XPlus, true)
	s.SendTorus(0, 2, ProtoRaw, nil)
	s.RunFor(time.Millisecond)
	if n != 2 {
		t.Fatalf("after repair delivered %d, want 2", n)
	}
}

// A crashed node neither receives nor forwards.
func TestSimCrash(t *testing.T) {
	sh := Shape{4, 1, 1}
	s := newTestSim(t, sh, Faults{})
	n := 0
	s.Handle(2, func(time.Time, []byte) { n++ })
	s.Crash(1)
	s.SendTorus(0, 2, ProtoRaw, nil)
	s.RunFor(time.Millisecond)
	if n != 0 || s.Stats.CrashedDrops != 1 {
		t.Fatalf("delivered %d through a crashed node", n)
	}
}

// Seeded faults: the same seed gives the same run, and the rates are near
// the configured probabilities.
func TestSimFaultsSeeded(t *testing.T) {
	run := func() SimStats {
		sh := Shape{4, 4, 1}
		s := newTestSim(t, sh, Faults{Drop: 0.1, Duplicate: 0.1, Reorder: 0.2, Delay: time.Microsecond})
		for i := range 10000 {
			s.SendTorus(NodeID(i%16), NodeID((i*7)%16), ProtoRaw, nil)
		}
		s.RunFor(time.Second)
		return s.Stats
	}
	a, b := run(), run()
	if a != b {
		t.Fatalf("same seed, different runs: %+v vs %+v", a, b)
	}
	if a.Dropped < 800 || a.Dropped > 1200 || a.Duplicated < 700 || a.Delivered != 10000-a.Dropped+a.Duplicated {
		t.Fatalf("stats %+v", a)
	}
}

// The collective network: a broadcast reaches every node once, including
// the sender; a reduce is combined by the switches and every node receives
// one result carrying all N contributions.
func TestTreeBroadcastAndReduce(t *testing.T) {
	sh := Shape{5, 3, 2} // 30 nodes: an unbalanced tree
	s := newTestSim(t, sh, Faults{})
	got := make([][]TreeHeader, sh.Nodes())
	sums := make([]uint64, sh.Nodes())
	for i := range sh.Nodes() {
		s.Handle(NodeID(i), func(_ time.Time, pkt []byte) {
			h, p, err := DecodeTree(pkt)
			if err != nil {
				t.Fatal(err)
			}
			got[i] = append(got[i], h)
			if h.Class == TreeResult {
				sums[i] = binary.BigEndian.Uint64(p)
			}
		})
	}
	if err := s.SendTree(17, AppendTree(nil, TreeHeader{Class: TreeBroadcast, Src: 17, Seq: 1}, []byte("membership"))); err != nil {
		t.Fatal(err)
	}
	s.RunFor(time.Millisecond)
	for i := range sh.Nodes() {
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], uint64(i))
		if err := s.SendTree(NodeID(i), AppendTree(nil, TreeHeader{Class: TreeReduce, Op: OpAdd, Src: NodeID(i), Seq: 2}, v[:])); err != nil {
			t.Fatal(err)
		}
	}
	s.RunFor(time.Millisecond)
	sum := uint64(sh.Nodes() * (sh.Nodes() - 1) / 2)
	for i := range sh.Nodes() {
		if len(got[i]) != 2 || got[i][0].Class != TreeBroadcast || got[i][1].Class != TreeResult ||
			got[i][1].Count != uint16(sh.Nodes()) || sums[i] != sum {
			t.Fatalf("node %d got %+v sum %d, want broadcast then result of %d contributions summing to %d", i, got[i], sums[i], sh.Nodes(), sum)
		}
	}
	// The broadcast climbs depth(17) links and descends N-1; a switch
	// sends one packet up per reduction, so the reduce costs N-1 up and
	// N-1 down, not N^2.
	want := uint64(Tree{sh.Nodes()}.Depth(17) + 3*(sh.Nodes()-1))
	if got := s.Stats.TreeSent; got != want {
		t.Errorf("tree packets %d, want %d", got, want)
	}
	for i := range sh.Nodes() {
		if s.switches[i].Pending() != 0 {
			t.Errorf("switch %d still holds a reduction", i)
		}
	}
}

// FuzzSwitch feeds arbitrary collective packets from arbitrary
// neighbours to a switch: it never panics, and everything it sends or
// delivers decodes.
func FuzzSwitch(f *testing.F) {
	f.Add(uint32(1), AppendTree(nil, TreeHeader{Class: TreeReduce, Op: OpAdd, Seq: 1}, make([]byte, 8)))
	f.Add(uint32(0), AppendTree(nil, TreeHeader{Class: TreeBroadcast}, []byte("x")))
	f.Fuzz(func(t *testing.T, from uint32, pkt []byte) {
		sw := NewSwitch(Tree{N: 7}, 0)
		sw.Step(NodeID(from%7), pkt)
		sw.Inject(pkt)
		sends, deliver := sw.Ready()
		for _, s := range sends {
			if _, _, err := DecodeTree(s.Pkt); err != nil {
				t.Fatalf("switch sent an undecodable packet: %v", err)
			}
		}
		for _, d := range deliver {
			if _, _, err := DecodeTree(d); err != nil {
				t.Fatalf("switch delivered an undecodable packet: %v", err)
			}
		}
	})
}

// BenchmarkSimPacket: one torus packet from every node in turn to the
// centre of the 16x16x16 machine (12 hops on average, 24 at most), per
// packet: how many packets/s a simulation moves.
func BenchmarkSimPacket(b *testing.B) {
	sh := Shape{16, 16, 16}
	s, err := NewSim(SimConfig{Shape: sh})
	if err != nil {
		b.Fatal(err)
	}
	var hops uint64
	s.Handle(sh.ID(Coord{8, 8, 8}), func(_ time.Time, pkt []byte) { hops += uint64(pkt[2]) })
	payload := make([]byte, 64)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.SendTorus(NodeID(i%sh.Nodes()), sh.ID(Coord{8, 8, 8}), ProtoRaw, payload)
		s.RunFor(time.Microsecond * 10)
		i++
	}
	b.ReportMetric(float64(s.Stats.Hops)/float64(i), "hops/pkt")
}

func BenchmarkNextHop(b *testing.B) {
	sh := Shape{64, 32, 32}
	for b.Loop() {
		sh.NextHop(Coord{1, 2, 3}, Coord{40, 20, 30})
	}
}
