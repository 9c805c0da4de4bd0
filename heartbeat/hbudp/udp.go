// Package hbudp carries heartbeat datagrams over UDP: one socket per node,
// bound to the node's listen address (or the wildcard address, so that the
// socket survives a change of the node's address), sending to the peers'
// current addresses.
//
// Addresses live here, at the edge, not in the protocol core: the daemon
// changes a peer's address with SetPeer when the peer moves, and learns of a
// move it missed through OnNewSource, which reports a peer whose datagrams
// come from an address other than the one it is sent to.
//
// That only works while at least one side of a pair knows where the other
// is. Two nodes that move within one announcement's latency of each other
// both send to addresses that are gone, and neither ever hears from the
// other again. So after a move the daemon turns on a beacon (Beacon): for
// a while every datagram also goes out of the node's interface to the
// limited broadcast address, which reaches every node on the segment
// whatever addresses they have; the receivers see the sender's datagrams
// come from its new address and ask it where it is (OnNewSource).
package hbudp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/radic-project/radic/heartbeat"
)

var _ heartbeat.Transport = (*Transport)(nil)

// sourceNoteEvery is how often one (peer, source) mismatch is reported.
const sourceNoteEvery = time.Second

// Transport is a heartbeat.Transport over one UDP socket. Its methods are
// safe for concurrent use.
type Transport struct {
	conn *net.UDPConn

	mu sync.RWMutex
	// +checklocks:mu
	peers map[heartbeat.NodeID]netip.AddrPort
	// +checklocks:mu
	onSource func(heartbeat.NodeID, netip.AddrPort)
	// +checklocks:mu
	noted map[heartbeat.NodeID]sourceNote
	// +checklocks:mu
	beacon beacon
}

// beacon is where and until when every datagram is also broadcast.
type beacon struct {
	pktinfo []byte // IP_PKTINFO naming the interface (nil: no beacon)
	until   time.Time
}

// limitedBroadcast is 255.255.255.255: it needs no route and no broadcast
// address on the interface, only the interface to leave by.
var limitedBroadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

type sourceNote struct {
	src netip.AddrPort
	at  time.Time
}

// Listen binds addr and sends to peers (node id -> UDP address). An IPv4
// addr gets an IPv4 socket, so that sources are plain IPv4 addresses even
// for the wildcard 0.0.0.0.
func Listen(addr netip.AddrPort, peers map[heartbeat.NodeID]netip.AddrPort) (*Transport, error) {
	network := "udp"
	if addr.Addr().Is4() {
		network = "udp4"
	}
	c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, fmt.Errorf("listen heartbeat udp %v: %w", addr, err)
	}
	t := &Transport{conn: c, peers: map[heartbeat.NodeID]netip.AddrPort{}, noted: map[heartbeat.NodeID]sourceNote{}}
	for id, a := range peers {
		t.peers[id] = unmap(a)
	}
	return t, nil
}

func unmap(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }

// LocalAddr is the bound address.
func (t *Transport) LocalAddr() netip.AddrPort {
	return t.conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

// SetPeer sets (or adds) the address datagrams to node id go to.
func (t *Transport) SetPeer(id heartbeat.NodeID, addr netip.AddrPort) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.peers[id] = unmap(addr)
	delete(t.noted, id)
}

// Peer returns the address datagrams to node id go to.
func (t *Transport) Peer(id heartbeat.NodeID) (netip.AddrPort, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	a, ok := t.peers[id]
	return a, ok
}

// OnNewSource sets f to be called, from the receiving goroutine, when a
// well-formed datagram from a known peer comes from an address other than
// the one the peer is sent to (at most once a second per peer and source).
// f must not block; it is how the daemon learns that a peer moved.
func (t *Transport) OnNewSource(f func(from heartbeat.NodeID, src netip.AddrPort)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.onSource = f
}

// Beacon makes every datagram sent before until also go out of the
// interface with index ifindex to the limited broadcast address, at the
// port of the peer it is for (see the package doc). A later call replaces
// an earlier one; until in the past turns the beacon off.
func (t *Transport) Beacon(ifindex int, until time.Time) error {
	rc, err := t.conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("hbudp beacon: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_BROADCAST, 1)
	}); err != nil {
		return fmt.Errorf("hbudp beacon: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("hbudp beacon: SO_BROADCAST: %w", serr)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.beacon = beacon{pktinfo: PktinfoOOB(ifindex), until: until}
	return nil
}

// PktinfoOOB is an IP_PKTINFO control message that sends by interface
// ifindex (the torus fabric's beacon uses it too).
func PktinfoOOB(ifindex int) []byte {
	b := make([]byte, syscall.CmsgSpace(syscall.SizeofInet4Pktinfo))
	h := (*syscall.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level = syscall.IPPROTO_IP
	h.Type = syscall.IP_PKTINFO
	h.SetLen(syscall.CmsgLen(syscall.SizeofInet4Pktinfo))
	// struct in_pktinfo { int ipi_ifindex; struct in_addr ipi_spec_dst, ipi_addr; }
	binary.NativeEndian.PutUint32(b[syscall.CmsgLen(0):], uint32(ifindex))
	return b
}

// Send implements heartbeat.Transport.
func (t *Transport) Send(to heartbeat.NodeID, b []byte) error {
	t.mu.RLock()
	a, ok := t.peers[to]
	bc := t.beacon
	t.mu.RUnlock()
	if !ok {
		return fmt.Errorf("hbudp: no address for node %d", to)
	}
	// Errors are lost datagrams: ECONNREFUSED from an earlier ICMP, no
	// route while the node's address changes, and the like.
	_, _ = t.conn.WriteToUDPAddrPort(b, a)
	if bc.pktinfo != nil && time.Now().Before(bc.until) {
		_, _, _ = t.conn.WriteMsgUDPAddrPort(b, bc.pktinfo, netip.AddrPortFrom(limitedBroadcast, a.Port()))
	}
	return nil
}

// Recv implements heartbeat.Transport.
func (t *Transport) Recv(b []byte) (int, error) {
	for {
		n, src, err := t.conn.ReadFromUDPAddrPort(b)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return 0, err
			}
			// ICMP errors on a connectionless socket: ignore, without
			// spinning if the error persists.
			time.Sleep(time.Millisecond)
			continue
		}
		t.checkSource(b[:n], unmap(src))
		return n, nil
	}
}

// checkSource reports a known peer's datagram from an unexpected address.
func (t *Transport) checkSource(b []byte, src netip.AddrPort) {
	t.mu.RLock()
	f := t.onSource
	t.mu.RUnlock()
	if f == nil {
		return
	}
	m, err := heartbeat.Decode(b)
	if err != nil {
		return
	}
	now := time.Now()
	t.mu.Lock()
	want, known := t.peers[m.From]
	prev := t.noted[m.From]
	report := known && want != src && (prev.src != src || now.Sub(prev.at) >= sourceNoteEvery)
	if report {
		t.noted[m.From] = sourceNote{src: src, at: now}
	}
	t.mu.Unlock()
	if report {
		f(m.From, src)
	}
}

// Close implements heartbeat.Transport.
func (t *Transport) Close() error { return t.conn.Close() }
