// Package hbudp carries heartbeat datagrams over UDP: one socket per node,
// bound to the node's listen address, sending to the peers' addresses.
package hbudp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/radic-project/radic/heartbeat"
)

var _ heartbeat.Transport = (*Transport)(nil)

// Transport is a heartbeat.Transport over one UDP socket.
type Transport struct {
	conn  *net.UDPConn
	peers map[heartbeat.NodeID]netip.AddrPort
}

// Listen binds addr and sends to peers (node id -> UDP address).
func Listen(addr netip.AddrPort, peers map[heartbeat.NodeID]netip.AddrPort) (*Transport, error) {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, fmt.Errorf("listen heartbeat udp %v: %w", addr, err)
	}
	return &Transport{conn: c, peers: peers}, nil
}

// LocalAddr is the bound address.
func (t *Transport) LocalAddr() netip.AddrPort {
	return t.conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

// Send implements heartbeat.Transport.
func (t *Transport) Send(to heartbeat.NodeID, b []byte) error {
	a, ok := t.peers[to]
	if !ok {
		return fmt.Errorf("hbudp: no address for node %d", to)
	}
	if _, err := t.conn.WriteToUDPAddrPort(b, a); err != nil {
		// ECONNREFUSED from an earlier ICMP and the like: a lost datagram.
		return nil
	}
	return nil
}

// Recv implements heartbeat.Transport.
func (t *Transport) Recv(b []byte) (int, error) {
	for {
		n, _, err := t.conn.ReadFromUDPAddrPort(b)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return 0, err
			}
			// ICMP errors on a connectionless socket: ignore, without
			// spinning if the error persists.
			time.Sleep(time.Millisecond)
			continue
		}
		return n, nil
	}
}

// Close implements heartbeat.Transport.
func (t *Transport) Close() error { return t.conn.Close() }
