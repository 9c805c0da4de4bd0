// Command fabricpeer is one side of the fabric benchmarks of
// test/fabricbench: a Blue Gene transport peer (a udplink.Node and a
// bulktransport.Endpoint), a TCP client or server, or an in-memory run of
// the protocol cores for callgrind. The benchmark starts the network
// peers in two network namespaces and drives them with one command per
// line on standard input; they answer one line per event on standard
// output, times in Unix nanoseconds (both namespaces share the clock).
//
//	fabricpeer fabric -self 0|1 -addr0 IP:PORT -addr1 IP:PORT
//	  reset                    a fresh Endpoint (no state for the peer)      -> ok
//	  expect N                 count the next N messages read                -> ready, later: got N FIRST LAST BYTES ID
//	  send N SIZE INFLIGHT ID  write N messages of SIZE bytes to the other
//	                           node, at most INFLIGHT unacknowledged; the
//	                           first 8 bytes of each carry ID               -> start T (after the first WriteMsg's
//	                                                                           packets left), later: done T (all acked)
//	  stats                    the endpoint's and the link's counters       -> stats ...
//
//	fabricpeer tcp -listen IP:PORT (server) | -connect IP:PORT (client)
//	  expect BYTES             (server) read BYTES from the next connection   -> ready, later: got 1 FIRST LAST BYTES ID
//	  send N SIZE INFLIGHT ID  (client) dial, N writes of SIZE bytes (TCP_NODELAY), close
//	                                                                      -> sent DIALED CONNECTED DONE
//
//	fabricpeer cores -proto short|copy|bulk|datagram -size N -n COUNT -inflight INFLIGHT
//	  N messages between two Endpoints over netsim.Sim, in memory, no
//	  sockets and no wall clock; prints "cores PROTO SIZE N mallocs M bytes B packets P":
//	  the heap allocations, bytes allocated and torus packets (both ways)
//	  of the N messages
//
// FIRST and LAST are when the first and the last byte counted were read;
// ID is the one the first message carried. A failure prints "fail ..."
// and exits 1. Standard input at EOF ends the peer.
package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/radic-project/radic/bulktransport"
	"github.com/radic-project/radic/internal/fabric"
	"github.com/radic-project/radic/netsim"
	"github.com/radic-project/radic/netsim/udplink"
)

// shape is the machine of the network runs: two nodes, one link.
var shape = netsim.Shape{X: 2, Y: 1, Z: 1}

// out writes whole lines to standard output from any goroutine.
var out struct {
	sync.Mutex
	w io.Writer
}

func say(format string, args ...any) {
	out.Lock()
	defer out.Unlock()
	fmt.Fprintf(out.w, format+"\n", args...)
}

func fail(format string, args ...any) {
	say("fail "+format, args...)
	os.Exit(1)
}

func main() {
	out.w = os.Stdout
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: fabricpeer fabric|tcp|cores [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	profile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to `file`")
	switch os.Args[1] {
	case "fabric":
		self := fs.Int("self", 0, "this node (0 or 1)")
		a0 := fs.String("addr0", "", "node 0's UDP address")
		a1 := fs.String("addr1", "", "node 1's UDP address")
		fs.Parse(os.Args[2:])
		defer startProfile(*profile)()
		runFabric(netsim.NodeID(*self), *a0, *a1)
	case "tcp":
		listen := fs.String("listen", "", "serve on this address")
		connect := fs.String("connect", "", "dial this address")
		fs.Parse(os.Args[2:])
		defer startProfile(*profile)()
		if *listen != "" {
			runTCPServer(*listen)
		} else {
			runTCPClient(*connect)
		}
	case "cores":
		proto := fs.String("proto", "short", "short, copy, bulk or datagram")
		size := fs.Int("size", 64, "message size")
		n := fs.Int("n", 1000, "messages")
		inflight := fs.Int("inflight", 1, "unacknowledged reliable writes at most")
		fs.Parse(os.Args[2:])
		defer startProfile(*profile)()
		runCores(*proto, *size, *n, *inflight)
	default:
		fmt.Fprintf(os.Stderr, "fabricpeer: unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
}

func startProfile(path string) (stop func()) {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		fail("cpuprofile: %v", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fail("cpuprofile: %v", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }
}

// commands calls fn with the fields of each line of standard input.
func commands(fn func(cmd string, args []int)) {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		args := make([]int, len(f)-1)
		for i, s := range f[1:] {
			v, err := strconv.Atoi(s)
			if err != nil {
				fail("command %q: %v", sc.Text(), err)
			}
			args[i] = v
		}
		fn(f[0], args)
	}
}

func need(cmd string, args []int, n int) {
	if len(args) != n {
		fail("%s takes %d numbers, got %d", cmd, n, len(args))
	}
}

// ---- the Blue Gene transport over UDP ----

// fabricPeer drives one Endpoint over a udplink.Node in real time, as
// bulktransport's udp_test does: the link's receive goroutine, the timer
// and the command loop share the endpoint under mu. The timer is armed
// for the endpoint's NextTick, not polled.
type fabricPeer struct {
	self, other netsim.NodeID
	link        *udplink.Node

	mu    sync.Mutex
	ep    *bulktransport.Endpoint
	timer *time.Timer
	armed time.Time // when timer fires; zero: not armed

	// receiving: counting the messages of an expect
	expect, got, bytes int
	first              time.Time
	firstID            uint64

	// sending: a send in progress
	sending                       bool
	toSend, written, acked, limit int
	data                          []byte
}

func runFabric(self netsim.NodeID, addr0, addr1 string) {
	p := &fabricPeer{self: self, other: 1 - self}
	p.timer = time.AfterFunc(time.Hour, p.onTimer)
	p.timer.Stop()
	p.ep = p.newEndpoint()
	addrs := map[netsim.NodeID]netip.AddrPort{}
	for id, s := range []string{addr0, addr1} {
		a, err := netip.ParseAddrPort(s)
		if err != nil {
			fail("address %q: %v", s, err)
		}
		addrs[netsim.NodeID(id)] = a
	}
	var err error
	p.link, err = udplink.Listen(udplink.Config{Shape: shape, Self: self, Listen: addrs[self].String(), Handler: p.onPacket})
	if err != nil {
		fail("%v", err)
	}
	p.link.SetPeers(addrs)
	commands(func(cmd string, args []int) {
		switch cmd {
		case "reset":
			need(cmd, args, 0)
			p.mu.Lock()
			p.ep = p.newEndpoint()
			p.sending, p.expect = false, 0
			p.mu.Unlock()
			say("ok")
		case "expect":
			need(cmd, args, 1)
			p.mu.Lock()
			p.expect, p.got, p.bytes = args[0], 0, 0
			p.mu.Unlock()
			say("ready")
		case "send":
			need(cmd, args, 4)
			p.send(args[0], args[1], args[2], uint64(args[3]))
		case "stats":
			p.mu.Lock()
			dt, bk, _ := p.ep.Stats()
			p.mu.Unlock()
			st := &p.link.Stats
			say("stats deltat %+v bulk %+v link sent=%d received=%d", dt, bk, st.Sent.Load(), st.Received.Load())
		default:
			fail("unknown command %q", cmd)
		}
	})
	p.link.Close()
}

func (p *fabricPeer) newEndpoint() *bulktransport.Endpoint {
	// radicd's configuration (wider windows than the cores' defaults).
	ep, err := bulktransport.New(fabric.EndpointConfig(shape, p.self))
	if err != nil {
		fail("%v", err)
	}
	return ep
}

func (p *fabricPeer) onPacket(now time.Time, pkt []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(pkt) > 0 && pkt[0] == 'T' {
		if err := p.ep.Step(now, pkt); err != nil && !errors.Is(err, bulktransport.ErrNotForMe) {
			fail("step: %v", err)
		}
	}
	p.flushLocked()
}

func (p *fabricPeer) onTimer() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = time.Time{}
	p.ep.Tick(time.Now())
	p.flushLocked()
}

func (p *fabricPeer) send(n, size, inflight int, id uint64) {
	if size < 8 {
		fail("send: messages of %d bytes cannot carry the id", size)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.data = make([]byte, size)
	binary.BigEndian.PutUint64(p.data, id)
	p.sending, p.toSend, p.written, p.acked, p.limit = true, n, 0, 0, max(1, inflight)
	start := time.Now()
	p.writeMoreLocked(start)
	p.flushLocked()
	say("start %d", start.UnixNano())
}

// writeMoreLocked writes while the send has messages left and room
// under its in-flight limit; it reports whether it wrote any.
func (p *fabricPeer) writeMoreLocked(now time.Time) bool {
	wrote := false
	for p.sending && p.written < p.toSend && p.written-p.acked < p.limit {
		if _, err := p.ep.WriteMsg(now, bulktransport.Msg{Peer: p.other, Data: p.data}); err != nil {
			fail("write: %v", err)
		}
		p.written++
		wrote = true
	}
	return wrote
}

// flushLocked puts the endpoint's packets on the link, takes its results
// and messages, arms the timer, and writes more while results make room.
func (p *fabricPeer) flushLocked() {
	for {
		r := p.ep.Ready()
		if err := p.link.SendBatch(r.Packets); err != nil {
			fail("link send: %v", err)
		}
		for _, res := range r.Results {
			if res.Err != nil {
				fail("write %d to node %d: %v", res.ID, res.Peer, res.Err)
			}
			p.acked++
		}
		for {
			m, ok := p.ep.ReadMsg()
			if !ok {
				break
			}
			p.count(time.Now(), m.Data)
			p.ep.Release(m)
		}
		if t := r.NextTick; !t.IsZero() && (p.armed.IsZero() || t.Before(p.armed)) {
			p.armed = t
			p.timer.Reset(time.Until(t))
		}
		if !p.writeMoreLocked(time.Now()) {
			break
		}
	}
	if p.sending && p.acked >= p.toSend {
		p.sending = false
		say("done %d", time.Now().UnixNano())
	}
}

// count counts a message read at now against the expect in progress.
func (p *fabricPeer) count(now time.Time, data []byte) {
	if p.expect == 0 {
		return // a stray: nothing is expected
	}
	if p.got == 0 {
		p.first = now
		if len(data) >= 8 {
			p.firstID = binary.BigEndian.Uint64(data)
		}
	}
	p.got++
	p.bytes += len(data)
	if p.got == p.expect {
		say("got %d %d %d %d %d", p.got, p.first.UnixNano(), now.UnixNano(), p.bytes, p.firstID)
		p.expect = 0
	}
}

// ---- TCP ----

func runTCPServer(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fail("%v", err)
	}
	defer ln.Close()
	commands(func(cmd string, args []int) {
		if cmd != "expect" {
			fail("unknown command %q", cmd)
		}
		need(cmd, args, 1)
		want := args[0]
		say("ready")
		go serveOne(ln, want)
	})
}

// serveOne reads want bytes from the next connection.
func serveOne(ln net.Listener, want int) {
	c, err := ln.Accept()
	if err != nil {
		fail("accept: %v", err)
	}
	defer c.Close()
	buf := make([]byte, 256<<10)
	var first time.Time
	var id uint64
	var head []byte
	got := 0
	for got < want {
		n, err := c.Read(buf)
		now := time.Now()
		if n > 0 {
			if got == 0 {
				first = now
			}
			if len(head) < 8 {
				head = append(head, buf[:min(n, 8-len(head))]...)
			}
			got += n
			if got >= want {
				if len(head) == 8 {
					id = binary.BigEndian.Uint64(head)
				}
				say("got 1 %d %d %d %d", first.UnixNano(), now.UnixNano(), got, id)
				return
			}
		}
		if err != nil {
			fail("read after %d of %d bytes: %v", got, want, err)
		}
	}
}

func runTCPClient(addr string) {
	commands(func(cmd string, args []int) {
		if cmd != "send" {
			fail("unknown command %q", cmd)
		}
		need(cmd, args, 4)
		n, size, id := args[0], args[1], uint64(args[3])
		if size < 8 {
			fail("send: messages of %d bytes cannot carry the id", size)
		}
		data := make([]byte, size)
		binary.BigEndian.PutUint64(data, id)
		dialed := time.Now()
		c, err := net.Dial("tcp", addr) // Go sets TCP_NODELAY on every TCP connection
		if err != nil {
			fail("dial: %v", err)
		}
		connected := time.Now()
		for range n {
			if _, err := c.Write(data); err != nil {
				fail("write: %v", err)
			}
		}
		done := time.Now()
		c.Close()
		say("sent %d %d %d", dialed.UnixNano(), connected.UnixNano(), done.UnixNano())
	})
}

// ---- the cores in memory, for callgrind ----

// runCores moves n messages from node 0 to node 1 of an in-memory
// netsim.Sim through two Endpoints, in virtual time: the protocol work
// alone, nothing of sockets or the wall clock. Reliable writes keep at
// most inflight unacknowledged; datagrams are sent one at a time.
func runCores(proto string, size, n, inflight int) {
	growStack(256)
	cfg := bulktransport.Config{Shape: shape}
	switch proto {
	case "short", "datagram":
	case "copy":
		cfg.BulkMin = 1 << 30
	case "bulk":
		cfg.BulkMin = 1
	default:
		fail("unknown protocol %q", proto)
	}
	sim, err := netsim.NewSim(netsim.SimConfig{Shape: shape})
	if err != nil {
		fail("%v", err)
	}
	var eps [2]*bulktransport.Endpoint
	var timer [2]time.Time
	for i := range eps {
		c := cfg
		c.Self = netsim.NodeID(i)
		if eps[i], err = bulktransport.New(c); err != nil {
			fail("%v", err)
		}
	}
	want := bulktransport.Short
	switch proto {
	case "copy":
		want = bulktransport.Copy
	case "bulk":
		want = bulktransport.Bulk
	}
	data := make([]byte, size)
	written, acked, delivered := 0, 0, 0
	inflight = max(1, inflight)
	var drain func(i int)
	write := func(now time.Time) {
		for proto != "datagram" && written < n && written-acked < inflight {
			if _, err := eps[0].WriteMsg(now, bulktransport.Msg{Peer: 1, Data: data}); err != nil {
				fail("write: %v", err)
			}
			written++
		}
	}
	drain = func(i int) {
		e := eps[i]
		r := e.Ready()
		for _, p := range r.Packets {
			if err := sim.Send(p); err != nil {
				fail("sim send: %v", err)
			}
		}
		for _, res := range r.Results {
			if res.Err != nil {
				fail("result: %v", res.Err)
			}
			acked++
		}
		for {
			m, ok := e.ReadMsg()
			if !ok {
				break
			}
			if len(m.Data) != size || m.Proto != want {
				fail("read %d bytes by %v, want %d by %v", len(m.Data), m.Proto, size, want)
			}
			delivered++
			e.Release(m)
		}
		for {
			m, ok := e.ReadDatagram()
			if !ok {
				break
			}
			if len(m.Data) != size {
				fail("datagram of %d bytes, want %d", len(m.Data), size)
			}
			delivered++
		}
		if t := r.NextTick; !t.IsZero() && (timer[i].IsZero() || t.Before(timer[i])) {
			timer[i] = t
			sim.At(t, func(now time.Time) {
				if timer[i].Equal(t) {
					timer[i] = time.Time{}
				}
				e.Tick(now)
				drain(i)
			})
		}
		if i == 0 && len(r.Results) > 0 {
			write(sim.Now())
			drain(0)
		}
	}
	for i := range eps {
		sim.Handle(netsim.NodeID(i), func(now time.Time, pkt []byte) {
			if err := eps[i].Step(now, pkt); err != nil {
				fail("node %d step: %v", i, err)
			}
			drain(i)
		})
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	packets := sim.Stats.Delivered
	if proto == "datagram" {
		for k := range n {
			if err := eps[0].SendDatagram(1, data); err != nil {
				fail("datagram: %v", err)
			}
			drain(0)
			sim.RunFor(time.Millisecond)
			if delivered != k+1 {
				fail("datagram %d not delivered", k)
			}
		}
	} else {
		write(sim.Now())
		drain(0)
		for deadline := sim.Now().Add(time.Hour); delivered < n || acked < n; {
			if sim.Now().After(deadline) {
				fail("after an hour of virtual time: %d of %d delivered, %d acked", delivered, n, acked)
			}
			sim.RunFor(time.Millisecond)
		}
	}
	runtime.ReadMemStats(&after)
	say("cores %s %d %d mallocs %d bytes %d packets %d", proto, size, delivered,
		after.Mallocs-before.Mallocs, after.TotalAlloc-before.TotalAlloc, sim.Stats.Delivered-packets)
}

// growStack grows the goroutine's stack by depth KiB or more. Callgrind
// keeps its own call stack by the stack pointer, and a goroutine stack
// that grows (runtime.morestack copies it elsewhere) throws its
// inclusive costs off from there on; grown first, and never shrunk (no
// garbage collector runs under GOGC=off), the stack stays put while the
// messages are counted.
//
//go:noinline
func growStack(depth int) byte {
	var pad [1024]byte
	pad[depth%len(pad)] = byte(depth)
	if depth > 0 {
		pad[0] += growStack(depth - 1)
	}
	return pad[0] + pad[depth%len(pad)]
}
