package hbudp

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/radic-project/radic/heartbeat"
)

func TestUDPRoundTrip(t *testing.T) {
	a, err := Listen(netip.MustParseAddrPort("127.78.0.200:0"), nil)
	if err != nil {
		t.Skipf("cannot bind 127.78.0.200: %v", err)
	}
	defer a.Close()
	b, err := Listen(netip.MustParseAddrPort("127.78.0.201:0"), map[heartbeat.NodeID]netip.AddrPort{0: a.LocalAddr()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	m := heartbeat.Message{Type: heartbeat.MsgHeartbeat, From: 1, To: 0, FromInc: 3, Seq: 1}
	if err := b.Send(0, m.Append(nil)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, heartbeat.MaxDatagram)
	n, err := a.Recv(buf)
	if err != nil {
		t.Fatal(err)
	}
	got, err := heartbeat.Decode(buf[:n])
	if err != nil || got.From != 1 || got.Seq != 1 {
		t.Fatalf("received %+v, %v", got, err)
	}
	if err := b.Send(7, buf[:n]); err == nil {
		t.Errorf("Send to an unknown node = nil, want an error")
	}
	a.Close()
	if _, err := a.Recv(buf); err == nil {
		t.Errorf("Recv after Close = nil, want net.ErrClosed")
	}
}

// A peer that moved: SetPeer redirects the datagrams, and datagrams from
// an unexpected source are reported (once per source and second) until the
// peer's address is set to it.
func TestMovedPeer(t *testing.T) {
	// The receiver binds the wildcard, as radicd does in netns mode.
	a, err := Listen(netip.MustParseAddrPort("0.0.0.0:0"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	port := a.LocalAddr().Port()
	b, err := Listen(netip.MustParseAddrPort("127.78.0.211:0"), map[heartbeat.NodeID]netip.AddrPort{
		0: netip.AddrPortFrom(netip.MustParseAddr("127.78.0.210"), port)})
	if err != nil {
		t.Skipf("cannot bind 127.78.0.211: %v", err)
	}
	defer b.Close()
	a.SetPeer(1, netip.MustParseAddrPort("127.78.0.99:1")) // stale: 1 moved to b
	type note struct {
		id  heartbeat.NodeID
		src netip.AddrPort
	}
	notes := make(chan note, 10)
	a.OnNewSource(func(id heartbeat.NodeID, src netip.AddrPort) { notes <- note{id, src} })

	m := heartbeat.Message{Type: heartbeat.MsgHeartbeat, From: 1, To: 0, FromInc: 3}
	buf := make([]byte, heartbeat.MaxDatagram)
	send := func() {
		t.Helper()
		m.Seq++
		if err := b.Send(0, m.Append(nil)); err != nil {
			t.Fatal(err)
		}
		a.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := a.Recv(buf); err != nil {
			t.Fatal(err)
		}
	}
	send()
	select {
	case n := <-notes:
		if n.id != 1 || n.src != b.LocalAddr() {
			t.Errorf("noted %+v, want node 1 from %v", n, b.LocalAddr())
		}
	default:
		t.Fatal("a datagram from a new source was not reported")
	}
	send()
	if len(notes) != 0 {
		t.Errorf("the same source was reported twice within a second")
	}
	a.SetPeer(1, b.LocalAddr())
	if p, _ := a.Peer(1); p != b.LocalAddr() {
		t.Errorf("Peer(1) = %v after SetPeer", p)
	}
	send()
	if len(notes) != 0 {
		t.Errorf("a datagram from the peer's address was reported")
	}
	// Garbage and unknown senders are not reported.
	m.From = 5
	send()
	if len(notes) != 0 {
		t.Errorf("an unknown sender was reported")
	}
	if a.LocalAddr().Addr() != netip.IPv4Unspecified() {
		t.Errorf("wildcard bind gave %v, want an IPv4 socket", a.LocalAddr())
	}
}

// Beacon: while it is on, every datagram also goes to the limited
// broadcast address out of the named interface (here the loopback), so a
// receiver bound to the wildcard address gets it twice; once it has run
// out, once.
func TestBeacon(t *testing.T) {
	a, err := Listen(netip.MustParseAddrPort("0.0.0.0:0"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	port := a.LocalAddr().Port()
	b, err := Listen(netip.MustParseAddrPort("127.78.0.231:0"), map[heartbeat.NodeID]netip.AddrPort{
		0: netip.AddrPortFrom(netip.MustParseAddr("127.78.0.230"), port)})
	if err != nil {
		t.Skipf("cannot bind 127.78.0.231: %v", err)
	}
	defer b.Close()
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Skipf("no loopback interface: %v", err)
	}
	count := func(seq uint64) int {
		m := heartbeat.Message{Type: heartbeat.MsgHeartbeat, From: 1, To: 0, FromInc: 3, Seq: seq}
		if err := b.Send(0, m.Append(nil)); err != nil {
			t.Fatal(err)
		}
		n := 0
		buf := make([]byte, heartbeat.MaxDatagram)
		a.conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		for {
			k, _, err := a.conn.ReadFromUDPAddrPort(buf) // Recv retries timeouts
			if err != nil {
				return n
			}
			if got, err := heartbeat.Decode(buf[:k]); err == nil && got.Seq == seq {
				n++
			}
		}
	}
	if err := b.Beacon(lo.Index, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n := count(1); n != 2 {
		t.Errorf("with the beacon on, the datagram arrived %d times, want 2 (unicast and broadcast)", n)
	}
	if err := b.Beacon(lo.Index, time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := count(2); n != 1 {
		t.Errorf("with the beacon off, the datagram arrived %d times, want 1", n)
	}
}
