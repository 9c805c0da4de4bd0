// Package udplink carries netsim torus and collective packets over UDP
// between real processes: every Node is one torus node with one UDP
// socket, and a packet for a distant node is forwarded hop by hop along
// its dimension-order route by the daemons in between, as on the machine.
// One datagram is a link frame: the torus packets for one next hop that
// were ready together, back to back (MaxFrame); a collective packet goes
// alone. The collective network's switches run in the nodes too
// (netsim.Switch), so broadcast and reduce cost one packet per tree link.
package udplink

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/radic-project/radic/netsim"
)

// Config configures a Node.
type Config struct {
	Shape netsim.Shape
	Self  netsim.NodeID
	// Listen is the UDP address to bind, e.g. "127.0.0.1:0".
	Listen string
	// Handler receives the packets addressed to this node (torus packets
	// and collective deliveries), on the node's receive goroutine; it owns
	// pkt.
	Handler netsim.Handler
	// Trace, if set, sees every datagram this node reads or writes
	// (packets it sends, receives and forwards, as on its wire: a
	// forwarded packet twice), on the goroutine moving it; it must not
	// keep pkt. radicd --pcap writes them to a trace.
	Trace func(at time.Time, pkt []byte)
	// OnNewSource, if set, is told when a torus neighbour's own packet
	// (one link crossed) comes from an address other than the one the
	// node sends to: the neighbour moved. It must not block.
	OnNewSource func(id netsim.NodeID, from netip.AddrPort)
	Logf        func(format string, args ...any)
}

// Stats count the node's traffic; read them from any goroutine.
type Stats struct {
	Sent, Received, Forwarded, Delivered atomic.Uint64
	LinkDownDrops, NoRoute, Malformed    atomic.Uint64
	TreeSent, TreeDelivered              atomic.Uint64
	Beacons                              atomic.Uint64 // beacon copies heard
	Frames                               atomic.Uint64 // link frames written
}

// limitedBroadcast is 255.255.255.255: it needs no route and no broadcast
// address on the interface, only the interface to leave by.
var limitedBroadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// Node is one torus node on UDP.
type Node struct {
	cfg   Config
	conn  *net.UDPConn
	here  netsim.Coord
	Stats Stats

	mu sync.Mutex
	// +checklocks:mu
	addrs map[netsim.NodeID]netip.AddrPort
	// +checklocks:mu
	byAddr map[netip.AddrPort]netsim.NodeID
	// +checklocks:mu
	down [netsim.NumDirs]bool
	// +checklocks:mu
	sw *netsim.Switch
	// +checklocks:mu
	router *netsim.Detour
	// +checklocks:mu
	beaconOOB []byte // IP_PKTINFO naming the beacon's interface
	// +checklocks:mu
	beaconUntil time.Time

	done chan struct{}
}

var _ netsim.Link = (*Node)(nil)

// Listen binds the node's socket and starts its receive goroutine. Peers
// must be set before packets can leave.
func Listen(cfg Config) (*Node, error) {
	if err := cfg.Shape.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	ua, err := net.ResolveUDPAddr("udp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", cfg.Listen, err)
	}
	conn, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("listen udp %s: %w", cfg.Listen, err)
	}
	growBuffers(conn)
	n := &Node{cfg: cfg, conn: conn, here: cfg.Shape.Coord(cfg.Self), done: make(chan struct{}),
		sw: netsim.NewSwitch(netsim.Tree{N: cfg.Shape.Nodes()}, cfg.Self), router: netsim.NewDetour(cfg.Shape)}
	go n.routineReceive()
	return n, nil
}

// growBuffers asks for socketBuffer-sized socket buffers: past the
// kernel's limit (net.core.rmem_max) with CAP_NET_ADMIN, else up to it.
func growBuffers(c *net.UDPConn) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		for _, o := range [][2]int{{syscall.SO_RCVBUFFORCE, syscall.SO_RCVBUF}, {syscall.SO_SNDBUFFORCE, syscall.SO_SNDBUF}} {
			if syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, o[0], socketBuffer) != nil {
				_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, o[1], socketBuffer)
			}
		}
	})
}

// Addr is the bound address.
func (n *Node) Addr() netip.AddrPort { return n.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// SetPeers sets the addresses of other nodes. A node needs only its six
// torus neighbours and its tree parent and children.
func (n *Node) SetPeers(addrs map[netsim.NodeID]netip.AddrPort) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.addrs = make(map[netsim.NodeID]netip.AddrPort, len(addrs))
	n.byAddr = make(map[netip.AddrPort]netsim.NodeID, len(addrs))
	for id, a := range addrs {
		n.addrs[id] = a
		n.byAddr[a] = id
	}
}

// SetPeer sets (or changes) the address of one node: it moved.
func (n *Node) SetPeer(id netsim.NodeID, addr netip.AddrPort) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.addrs == nil {
		n.addrs, n.byAddr = map[netsim.NodeID]netip.AddrPort{}, map[netip.AddrPort]netsim.NodeID{}
	}
	if old, ok := n.addrs[id]; ok && n.byAddr[old] == id {
		delete(n.byAddr, old)
	}
	n.addrs[id] = addr
	n.byAddr[addr] = id
}

// SetNodeDown tells the router that node id is down (routes go round it:
// netsim.Detour) or up again.
func (n *Node) SetNodeDown(id netsim.NodeID, down bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.router.SetDown(id, down)
}

// Beacon makes every torus packet this node sends before until also go
// out of the interface that oob (an IP_PKTINFO control message) names, to
// the limited broadcast address at the next hop's port, with hops 0. A
// node whose address changed while its neighbours' changed too cannot
// reach them at any address it knows, nor they it; the beacon needs no
// address. Receivers take a packet with hops 0 only as news of where its
// source is (Config.OnNewSource), never deliver or forward it. A later
// call replaces an earlier one; until in the past ends the beacon.
func (n *Node) Beacon(oob []byte, until time.Time) error {
	rc, err := n.conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("udplink beacon: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_BROADCAST, 1)
	}); err != nil {
		return fmt.Errorf("udplink beacon: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("udplink beacon: SO_BROADCAST: %w", serr)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.beaconOOB, n.beaconUntil = oob, until
	return nil
}

// SetLink takes this node's link d down (packets routed over it are
// dropped) or up.
func (n *Node) SetLink(d netsim.Dir, up bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.down[d] = !up
}

// Close stops the node.
func (n *Node) Close() error {
	err := n.conn.Close()
	<-n.done
	return err
}

// MaxFrame bounds a link frame: one UDP datagram carrying whole torus
// packets back to back, all for the same next hop. The packets stay 240
// bytes of payload, as on the machine; the frame only spares the host a
// system call per packet (one datagram per packet moved 15-25 MB/s
// between two namespaces here, against 1.6-2.1 GB/s for TCP). A frame
// larger than the path's MTU is fragmented by IP and whole or lost.
const MaxFrame = 60 << 10

// socketBuffer is the size asked for the socket's receive and send
// buffers: a burst of frames from several neighbours must not overflow
// the kernel's default (about 200 KiB) while the receive goroutine works.
const socketBuffer = 4 << 20

// Send puts a torus packet from this node on the torus; the node owns
// pkt from now on (it counts hops in it).
func (n *Node) Send(pkt []byte) error { return n.SendBatch([][]byte{pkt}) }

// SendBatch puts torus packets from this node on the torus, those for
// one next hop together in link frames (MaxFrame); the node owns them.
// Packets to one destination keep their order.
func (n *Node) SendBatch(pkts [][]byte) error {
	var o outbox
	var errs []error
	for _, pkt := range pkts {
		h, _, err := netsim.DecodeTorus(pkt)
		if err == nil && (h.Src != n.here || !n.cfg.Shape.Contains(h.Dst)) {
			err = fmt.Errorf("%w: %v -> %v sent from %v", netsim.ErrBadPacket, h.Src, h.Dst, n.here)
		}
		if err == nil {
			n.Stats.Sent.Add(1)
			err = n.route(&o, h, pkt)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(append(errs, o.flush(n))...)
}

// SendTorus builds and sends a packet to dst.
func (n *Node) SendTorus(dst netsim.NodeID, proto netsim.Proto, payload []byte) error {
	return n.Send(netsim.AppendTorus(nil, netsim.TorusHeader{Proto: proto, Src: n.here, Dst: n.cfg.Shape.Coord(dst)}, payload))
}

// SendTorusBothWays sends the packet on the dimension-order route and a
// copy on the alternate one (netsim.Route): one cut link or dead node on
// either path does not stop it. The receiver may get it twice.
func (n *Node) SendTorusBothWays(dst netsim.NodeID, proto netsim.Proto, payload []byte) error {
	to := n.cfg.Shape.Coord(dst)
	h := netsim.TorusHeader{Proto: proto, Src: n.here, Dst: to}
	first := netsim.AppendTorus(nil, h, payload)
	h.Route = n.cfg.Shape.AltRoute(n.here, to)
	return n.SendBatch([][]byte{first, netsim.AppendTorus(nil, h, payload)})
}

// outbox gathers the packets of one batch into link frames, one per next
// hop (a node has at most six).
type outbox struct{ frames []frame }

type frame struct {
	to  netip.AddrPort
	buf []byte
}

// put adds pkt to the frame for to, first sending that frame if pkt
// would not fit.
func (o *outbox) put(n *Node, to netip.AddrPort, pkt []byte) error {
	for i := range o.frames {
		f := &o.frames[i]
		if f.to != to {
			continue
		}
		var err error
		if len(f.buf)+len(pkt) > MaxFrame {
			err = n.write(f.buf, to)
			f.buf = f.buf[:0]
		}
		f.buf = append(f.buf, pkt...)
		return err
	}
	o.frames = append(o.frames, frame{to: to, buf: append(make([]byte, 0, len(pkt)), pkt...)})
	return nil
}

// flush sends every frame that holds packets.
func (o *outbox) flush(n *Node) error {
	var err error
	for i := range o.frames {
		if f := &o.frames[i]; len(f.buf) > 0 {
			err = errors.Join(err, n.write(f.buf, f.to))
			f.buf = f.buf[:0]
		}
	}
	return err
}

func (n *Node) write(frame []byte, to netip.AddrPort) error {
	n.Stats.Frames.Add(1)
	_, err := n.conn.WriteToUDPAddrPort(frame, to)
	return err
}

// route takes pkt one hop towards its destination, into the outbox, or
// delivers it here.
func (n *Node) route(o *outbox, h netsim.TorusHeader, pkt []byte) error {
	n.mu.Lock()
	d, ok := n.router.NextHopRoute(n.here, h.Dst, h.Route)
	var down, known bool
	var addr netip.AddrPort
	next := netsim.NodeID(0)
	if ok {
		next = n.cfg.Shape.ID(n.cfg.Shape.Neighbour(n.here, d))
		down = n.down[d]
		addr, known = n.addrs[next]
	}
	oob, beacon := n.beaconOOB, time.Now().Before(n.beaconUntil)
	n.mu.Unlock()
	switch {
	case !ok:
		n.Stats.Delivered.Add(1)
		if n.cfg.Handler != nil {
			n.cfg.Handler(time.Now(), pkt)
		}
		return nil
	case down:
		n.Stats.LinkDownDrops.Add(1)
		return nil
	case !known:
		n.Stats.NoRoute.Add(1)
		return fmt.Errorf("udplink: no address for neighbour %d", next)
	}
	pkt[2]++ // hops: one more link crossed, as netsim.Sim counts
	n.trace(pkt)
	err := o.put(n, addr, pkt)
	if beacon && pkt[2] == 1 { // this node's own packets, not those it forwards
		b := append([]byte(nil), pkt...)
		b[2] = 0
		_, _, _ = n.conn.WriteMsgUDPAddrPort(b, oob, netip.AddrPortFrom(limitedBroadcast, addr.Port()))
	}
	return err
}

// SendTree puts a collective packet (a broadcast, or this node's reduce
// contribution) on the collective network.
func (n *Node) SendTree(pkt []byte) error {
	n.mu.Lock()
	err := n.sw.Inject(pkt)
	n.mu.Unlock()
	if err != nil {
		return err
	}
	n.flushTree()
	return nil
}

func (n *Node) flushTree() {
	n.mu.Lock()
	sends, deliver := n.sw.Ready()
	addrs := make([]netip.AddrPort, len(sends))
	for i, s := range sends {
		addrs[i] = n.addrs[s.To]
	}
	n.mu.Unlock()
	for _, d := range deliver {
		n.Stats.TreeDelivered.Add(1)
		if n.cfg.Handler != nil {
			n.cfg.Handler(time.Now(), d)
		}
	}
	for i, s := range sends {
		if !addrs[i].IsValid() {
			n.Stats.NoRoute.Add(1)
			continue
		}
		n.Stats.TreeSent.Add(1)
		n.trace(s.Pkt)
		n.conn.WriteToUDPAddrPort(s.Pkt, addrs[i])
	}
}

func (n *Node) trace(pkt []byte) {
	if n.cfg.Trace != nil {
		n.cfg.Trace(time.Now(), pkt)
	}
}

// checkSource reports a neighbour whose packets come from a new address.
func (n *Node) checkSource(src netsim.Coord, from netip.AddrPort) {
	if !n.cfg.Shape.Contains(src) {
		return
	}
	id := n.cfg.Shape.ID(src)
	n.mu.Lock()
	want := n.addrs[id]
	n.mu.Unlock()
	if from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port()); want != from {
		n.cfg.OnNewSource(id, from)
	}
}

// routineReceive reads link frames until Close: delivers, forwards or
// feeds the collective switch each packet in them; what it forwards
// leaves in frames too.
func (n *Node) routineReceive() {
	defer close(n.done)
	n.cfg.Logf("udplink: node %d %v receiving on %v", n.cfg.Self, n.here, n.Addr())
	defer n.cfg.Logf("udplink: node %d stopped", n.cfg.Self)
	buf := make([]byte, 64<<10)
	var fwd outbox
	for {
		m, from, err := n.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		for rest := buf[:m]; len(rest) > 0; {
			var pkt []byte
			if pkt, rest, err = netsim.NextPacket(rest); err != nil {
				n.Stats.Malformed.Add(1) // the rest of the frame cannot be split
				break
			}
			n.Stats.Received.Add(1)
			n.receive(&fwd, from, append([]byte(nil), pkt...))
		}
		fwd.flush(n)
	}
}

// receive handles one packet that came from the link.
func (n *Node) receive(fwd *outbox, from netip.AddrPort, pkt []byte) {
	n.trace(pkt)
	if pkt[0] == 'C' {
		n.mu.Lock()
		id, ok := n.byAddr[from]
		var err error
		if ok {
			err = n.sw.Step(id, pkt)
		}
		n.mu.Unlock()
		if !ok || err != nil {
			n.Stats.Malformed.Add(1)
			return
		}
		n.flushTree()
		return
	}
	h, _, err := netsim.DecodeTorus(pkt)
	if err != nil || !n.cfg.Shape.Contains(h.Dst) {
		n.Stats.Malformed.Add(1)
		return
	}
	if h.Hops <= 1 && n.cfg.OnNewSource != nil {
		n.checkSource(h.Src, from)
	}
	if h.Hops == 0 {
		n.Stats.Beacons.Add(1)
		return // a beacon copy: news of its source only
	}
	if h.Dst != n.here {
		if h.Hops == 255 {
			n.Stats.Malformed.Add(1) // a packet going round: routers that disagree on the dead
			return
		}
		n.Stats.Forwarded.Add(1)
	}
	n.route(fwd, h, pkt)
}
