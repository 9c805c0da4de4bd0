package bulktransport

import (
	"runtime"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
	"github.com/radic-project/radic/netsim"
)

// direct wires endpoints back to back: a packet goes straight to its
// destination's Step, with no network in between. Scale tests use it to
// move millions of exchanges in seconds.
type direct struct {
	sh  netsim.Shape
	eps []*Endpoint
	buf [][]byte
}

func (d *direct) run(now time.Time, pkts [][]byte) {
	d.buf = append(d.buf[:0], pkts...)
	for len(d.buf) > 0 {
		p := d.buf[len(d.buf)-1]
		d.buf = d.buf[:len(d.buf)-1]
		h, _, err := netsim.DecodeTorus(p)
		if err != nil {
			panic(err)
		}
		e := d.eps[d.sh.ID(h.Dst)]
		e.Step(now, p)
		d.buf = append(d.buf, e.Ready().Packets...)
		for {
			m, ok := e.ReadMsg()
			if !ok {
				break
			}
			e.Release(m)
		}
	}
}

func heapBytes() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// talk has every node send a short message to each of its peers(i) (one
// wave per peer index), delivers it and the delayed acks, and returns the
// number of pairs that talked.
func talk(d *direct, now time.Time, peers func(i, k int) int, k int) (time.Time, int) {
	n := len(d.eps)
	pairs := 0
	msg := []byte("hello, peer")
	for w := range k {
		for i := range n {
			j := peers(i, w)
			if j == i {
				continue
			}
			if _, err := d.eps[i].WriteMsg(now, Msg{Peer: netsim.NodeID(j), Data: msg}); err != nil {
				panic(err)
			}
			d.run(now, d.eps[i].Ready().Packets)
			pairs++
		}
		// The receivers' delayed acks.
		now = now.Add(d.eps[0].dt.Config().A)
		for _, e := range d.eps {
			e.Tick(now)
			d.run(now, e.Ready().Packets)
		}
	}
	return now, pairs
}

// delta-t at scale: on a 65,536-node machine (64x32x32) where every node
// has talked to peers, the per-pair state disappears after the timers
// (sender 3 delta-t): every endpoint holds zero records and the heap is
// back to what the idle endpoints took, so idle pairs cost zero bytes.
// The memory per node is reported idle and while the pairs are live.
//
// Every pair of 65,536 nodes (4.3e9 exchanges) would take hours even on
// the pure cores; the test runs every pair of a 256-node machine (128
// with -short, 1,024 with RADIC_SOAK) and, on the 65,536-node one, 4
// peers per node (16 with RADIC_SOAK: about 500 MB of live records at
// once). The state of a pair does not depend
// on which other pairs talked, so the zero-bytes result carries over.
func TestIdlePairsCostNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		shape netsim.Shape
		peers int // per node; -1: all pairs
	}{
		{"all-pairs", netsim.Shape{X: 4, Y: 8, Z: 8}, -1},
		{"65536-nodes", netsim.Shape{X: 64, Y: 32, Z: 32}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if testing.Short() && tc.shape.Nodes() > 4096 {
				t.Skip("65,536 endpoints: skipped in -short")
			}
			if tc.peers < 0 && testing.Short() {
				tc.shape.X = 2 // 128 nodes: -short -race stays in seconds
			} else if tc.peers < 0 && testenv.Long() {
				tc.shape.X = 16 // 1,024 nodes, a million pairs
			}
			k := tc.peers
			if k < 0 {
				k = tc.shape.Nodes()
			} else if testenv.Long() {
				k = 16
			}
			base := heapBytes()
			n := tc.shape.Nodes()
			d := &direct{sh: tc.shape, eps: make([]*Endpoint, n)}
			for i := range n {
				d.eps[i] = mustNew(t, Config{Shape: tc.shape, Self: netsim.NodeID(i)})
			}
			idle := heapBytes()
			start := time.Now()
			now := time.Unix(1_000_000, 0)
			// Peer w of node i: i+w+1 for all pairs; otherwise spread
			// over the machine so routes cross it.
			stride := max(1, n/(k+1))
			now, pairs := talk(d, now, func(i, w int) int {
				if tc.peers < 0 {
					return (i + w + 1) % n
				}
				return (i + (w+1)*stride + w) % n
			}, k)
			elapsed := time.Since(start)
			records := 0
			for _, e := range d.eps {
				records += e.State()
			}
			live := heapBytes()
			dt := d.eps[0].dt.Config().DeltaT()
			now = now.Add(3 * dt)
			for _, e := range d.eps {
				e.Tick(now)
				if len(e.Ready().Packets) != 0 {
					t.Fatal("an idle endpoint sent packets")
				}
			}
			for i, e := range d.eps {
				if e.State() != 0 {
					t.Fatalf("node %d holds %d records 3 delta-t after its last packet", i, e.State())
				}
			}
			after := heapBytes()
			perNode := float64(idle-base) / float64(n)
			perPairLive := float64(live-idle) / float64(pairs)
			t.Logf("%d nodes, %d pairs talked (%v, %.0f exchanges/s): idle endpoint %.0f B/node; live %d records, %.0f B/pair; after 3 delta-t (%v): 0 records, heap %+d B vs idle (%.2f B/node)",
				n, pairs, elapsed.Round(time.Millisecond), float64(pairs)/elapsed.Seconds(), perNode, records, perPairLive, 3*dt,
				int64(after)-int64(idle), float64(int64(after)-int64(idle))/float64(n))
			// Any state left per pair costs at least 8 bytes a pair (a map
			// slot); allow 1 byte a pair of heap noise (the runtime's own
			// allocations, the race detector's).
			if after > idle && after-idle > uint64(pairs) {
				t.Errorf("heap after the timers is %d B above the idle endpoints (%.2f B/pair talked): per-pair state left behind",
					after-idle, float64(after-idle)/float64(pairs))
			}
			runtime.KeepAlive(d)
		})
	}
}
