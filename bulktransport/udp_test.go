package bulktransport_test

import (
	"bytes"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/radic-project/radic/bulktransport"
	"github.com/radic-project/radic/netsim"
	"github.com/radic-project/radic/netsim/udplink"
)

// udpNode drives one Endpoint over a udplink.Node with real time: the
// link's receive goroutine and a ticker share the endpoint under mu.
type udpNode struct {
	mu   sync.Mutex
	ep   *bulktransport.Endpoint
	link *udplink.Node
	got  []bulktransport.Msg
	res  []bulktransport.Result
}

func (n *udpNode) flushLocked(t *testing.T) {
	r := n.ep.Ready()
	for _, p := range r.Packets {
		if err := n.link.Send(p); err != nil {
			t.Errorf("send: %v", err)
		}
	}
	n.res = append(n.res, r.Results...)
	for {
		m, ok := n.ep.ReadMsg()
		if !ok {
			break
		}
		m.Data = bytes.Clone(m.Data)
		n.got = append(n.got, m)
	}
}

// The same Endpoint runs over UDP on loopback: Short, Copy and Bulk
// messages cross a 2x2x1 torus of real sockets, forwarded hop by hop.
func TestEndpointOverUDP(t *testing.T) {
	sh := netsim.Shape{X: 2, Y: 2, Z: 1}
	nodes := make([]*udpNode, sh.Nodes())
	addrs := map[netsim.NodeID]netip.AddrPort{}
	for i := range nodes {
		n := &udpNode{}
		ep, err := bulktransport.New(bulktransport.Config{Shape: sh, Self: netsim.NodeID(i), BulkMin: 4096})
		if err != nil {
			t.Fatal(err)
		}
		n.ep = ep
		n.link, err = udplink.Listen(udplink.Config{Shape: sh, Self: netsim.NodeID(i), Listen: "127.0.0.1:0",
			Handler: func(now time.Time, pkt []byte) {
				n.mu.Lock()
				defer n.mu.Unlock()
				if pkt[0] == 'T' {
					n.ep.Step(now, pkt)
				}
				n.flushLocked(t)
			}})
		if err != nil {
			t.Fatal(err)
		}
		nodes[i], addrs[netsim.NodeID(i)] = n, n.link.Addr()
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the timers
		defer wg.Done()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				for _, n := range nodes {
					n.mu.Lock()
					n.ep.Tick(now)
					n.flushLocked(t)
					n.mu.Unlock()
				}
			}
		}
	}()
	defer func() {
		close(done)
		wg.Wait()
		for _, n := range nodes {
			n.link.Close()
		}
	}()
	for _, n := range nodes {
		n.link.SetPeers(addrs)
	}
	msgs := [][]byte{[]byte("short"), bytes.Repeat([]byte("c"), 3000), bytes.Repeat([]byte("b"), 200_000)}
	src, dst := nodes[0], nodes[3] // (0,0) -> (1,1): two hops
	src.mu.Lock()
	for _, m := range msgs {
		if _, err := src.ep.WriteMsg(time.Now(), bulktransport.Msg{Peer: 3, Data: m}); err != nil {
			t.Fatal(err)
		}
	}
	src.flushLocked(t)
	src.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		dst.mu.Lock()
		src.mu.Lock()
		n, r := len(dst.got), len(src.res)
		src.mu.Unlock()
		dst.mu.Unlock()
		if n == len(msgs) && r == len(msgs) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %d of %d messages, %d results", n, len(msgs), r)
		}
		time.Sleep(5 * time.Millisecond)
	}
	protos := map[bulktransport.Protocol]bool{}
	for _, m := range dst.got {
		protos[m.Proto] = true
		found := false
		for _, w := range msgs {
			found = found || bytes.Equal(m.Data, w)
		}
		if !found {
			t.Fatalf("corrupt %d-byte message", len(m.Data))
		}
	}
	if len(protos) != 3 {
		t.Fatalf("protocols used %v, want short, copy and bulk", protos)
	}
	if f := nodes[1].link.Stats.Forwarded.Load() + nodes[2].link.Stats.Forwarded.Load(); f == 0 {
		t.Error("nothing forwarded between (0,0) and (1,1)")
	}
}
