package hbudp

import (
	"net/netip"
	"testing"

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
