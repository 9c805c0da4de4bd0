package udplink

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/radic-project/radic/netsim"
)

type cluster struct {
	nodes []*Node
	mu    sync.Mutex
	got   map[netsim.NodeID][][]byte
}

// newCluster starts one UDP node per torus node on loopback.
func newCluster(t *testing.T, sh netsim.Shape) *cluster {
	c := &cluster{got: map[netsim.NodeID][][]byte{}}
	addrs := map[netsim.NodeID]netip.AddrPort{}
	for i := range sh.Nodes() {
		id := netsim.NodeID(i)
		n, err := Listen(Config{Shape: sh, Self: id, Listen: "127.0.0.1:0", Logf: t.Logf,
			Handler: func(_ time.Time, pkt []byte) {
				c.mu.Lock()
				c.got[id] = append(c.got[id], pkt)
				c.mu.Unlock()
			}})
		if err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, n)
		addrs[id] = n.Addr()
	}
	for _, n := range c.nodes {
		n.SetPeers(addrs)
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.Close()
		}
	})
	return c
}

func (c *cluster) wait(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		ok := cond()
		c.mu.Unlock()
		if ok {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("timed out")
}

// Over UDP on loopback, a packet is forwarded hop by hop by the nodes on
// its dimension-order route and arrives once with the hop count in its
// header.
func TestForwardHopByHop(t *testing.T) {
	sh := netsim.Shape{X: 4, Y: 4, Z: 1}
	c := newCluster(t, sh)
	dst := sh.ID(netsim.Coord{X: 2, Y: 2})
	if err := c.nodes[0].SendTorus(dst, netsim.ProtoRaw, []byte("over udp")); err != nil {
		t.Fatal(err)
	}
	c.wait(t, func() bool { return len(c.got[dst]) == 1 })
	h, p, err := netsim.DecodeTorus(c.got[dst][0])
	if err != nil || string(p) != "over udp" || h.Hops != 4 {
		t.Fatalf("got %+v %q %v, want 4 hops", h, p, err)
	}
	// The route is x+ x+ y+ y+: nodes (1,0), (2,0), (2,1) forwarded it.
	var fwd uint64
	for _, n := range c.nodes {
		fwd += n.Stats.Forwarded.Load()
	}
	if fwd != 3 || c.nodes[sh.ID(netsim.Coord{X: 2, Y: 1})].Stats.Forwarded.Load() != 1 {
		t.Fatalf("%d forwards, want 3 along x then y", fwd)
	}
}

// A link taken down drops the packets routed over it.
func TestLinkDown(t *testing.T) {
	sh := netsim.Shape{X: 4, Y: 1, Z: 1}
	c := newCluster(t, sh)
	c.nodes[1].SetLink(netsim.XPlus, false)
	c.nodes[0].SendTorus(2, netsim.ProtoRaw, nil)
	c.wait(t, func() bool { return c.nodes[1].Stats.LinkDownDrops.Load() == 1 })
	c.nodes[1].SetLink(netsim.XPlus, true)
	c.nodes[0].SendTorus(2, netsim.ProtoRaw, nil)
	c.wait(t, func() bool { return len(c.got[2]) == 1 })
}

// The collective network over UDP: a broadcast reaches every node once; a
// reduce is combined in the nodes' switches.
func TestTreeOverUDP(t *testing.T) {
	sh := netsim.Shape{X: 3, Y: 3, Z: 1}
	c := newCluster(t, sh)
	c.nodes[4].SendTree(netsim.AppendTree(nil, netsim.TreeHeader{Class: netsim.TreeBroadcast, Src: 4, Seq: 1}, []byte("view")))
	for i := range sh.Nodes() {
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], uint64(i+1))
		c.nodes[i].SendTree(netsim.AppendTree(nil, netsim.TreeHeader{Class: netsim.TreeReduce, Op: netsim.OpMax, Src: netsim.NodeID(i), Seq: 2}, v[:]))
	}
	c.wait(t, func() bool {
		for i := range sh.Nodes() {
			if len(c.got[netsim.NodeID(i)]) != 2 {
				return false
			}
		}
		return true
	})
	for i := range sh.Nodes() {
		for _, pkt := range c.got[netsim.NodeID(i)] {
			h, p, _ := netsim.DecodeTree(pkt)
			if h.Class == netsim.TreeResult && (binary.BigEndian.Uint64(p) != 9 || h.Count != 9) {
				t.Errorf("node %d: max %d over %d contributions, want 9 over 9", i, binary.BigEndian.Uint64(p), h.Count)
			}
		}
	}
}

// A batch of packets for one next hop leaves in link frames, not one
// datagram each; the node between forwards them in frames too, and they
// arrive whole and in order.
func TestBatchesTravelInFrames(t *testing.T) {
	sh := netsim.Shape{X: 3, Y: 1, Z: 1}
	c := newCluster(t, sh)
	const count = 1000 // 256 bytes each: 5 frames of MaxFrame
	var pkts [][]byte
	for i := range count {
		payload := make([]byte, netsim.TorusPayload)
		binary.BigEndian.PutUint32(payload, uint32(i))
		pkts = append(pkts, netsim.AppendTorus(nil, netsim.TorusHeader{Proto: netsim.ProtoRaw, Src: sh.Coord(0), Dst: sh.Coord(1)}, payload))
	}
	if err := c.nodes[0].SendBatch(pkts); err != nil {
		t.Fatal(err)
	}
	c.wait(t, func() bool { return len(c.got[1]) == count })
	c.mu.Lock()
	got := c.got[1]
	c.mu.Unlock()
	for i, p := range got {
		_, payload, err := netsim.DecodeTorus(p)
		if err != nil || binary.BigEndian.Uint32(payload) != uint32(i) {
			t.Fatalf("packet %d: %v, number %d", i, err, binary.BigEndian.Uint32(payload))
		}
	}
	want := uint64((count*netsim.MaxTorusPacket + MaxFrame - 1) / MaxFrame)
	if f := c.nodes[0].Stats.Frames.Load(); f != want {
		t.Fatalf("%d packets left in %d frames, want %d", count, f, want)
	}
	// A 3-ring has no two-hop shortest route: node 0's batch to node 2
	// takes the alternate one (x+, through node 1).
	for i := range pkts {
		h := netsim.TorusHeader{Proto: netsim.ProtoRaw, Src: sh.Coord(0), Dst: sh.Coord(2), Route: sh.AltRoute(sh.Coord(0), sh.Coord(2))}
		pkts[i] = netsim.AppendTorus(nil, h, make([]byte, netsim.TorusPayload))
	}
	if err := c.nodes[0].SendBatch(pkts); err != nil {
		t.Fatal(err)
	}
	c.wait(t, func() bool { return len(c.got[2]) == count })
	if f, fw := c.nodes[1].Stats.Frames.Load(), c.nodes[1].Stats.Forwarded.Load(); fw != count || f > 2*want {
		t.Fatalf("node 1 forwarded %d packets in %d frames, want %d in at most %d", fw, f, count, 2*want)
	}
}
