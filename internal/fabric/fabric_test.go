package fabric

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/pcapgo"

	"github.com/radic-project/radic/bulktransport/bglayers"
	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/netsim"
)

// ring starts n fabrics on loopback, radicd ids 10, 20, ... (not torus
// ids: the fabric maps them), and tells each the others' ports.
func ring(t testing.TB, n int, pcap *bytes.Buffer) []*Fabric {
	t.Helper()
	peers := map[heartbeat.NodeID]netip.AddrPort{}
	for i := range n {
		peers[heartbeat.NodeID(10*(i+1))] = netip.MustParseAddrPort("127.0.0.1:1") // set below
	}
	fs := make([]*Fabric, n)
	for i := range n {
		cfg := Config{Self: heartbeat.NodeID(10 * (i + 1)), Bind: netip.MustParseAddrPort("127.0.0.1:0"), Peers: peers}
		if i == 0 && pcap != nil {
			cfg.Pcap = pcap
		}
		f, err := Listen(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		fs[i] = f
	}
	for _, f := range fs {
		for j, g := range fs {
			f.SetPeer(heartbeat.NodeID(10*(j+1)), g.LocalAddr())
		}
	}
	return fs
}

func recvWithin(t *testing.T, f *Fabric, d time.Duration) []byte {
	t.Helper()
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, heartbeat.MaxDatagram)
		n, err := f.Recv(b)
		if err == nil {
			got <- b[:n]
		}
	}()
	select {
	case b := <-got:
		return b
	case <-time.After(d):
		t.Fatalf("nothing received within %v", d)
		return nil
	}
}

// A heartbeat datagram to a node two hops away is forwarded by the node
// between; once that node is declared down, it goes the other way round
// the ring.
func TestHeartbeatsRouteRoundADeadNode(t *testing.T) {
	fs := ring(t, 4, nil)
	if sh := fs[0].Shape(); sh != (netsim.Shape{X: 4, Y: 1, Z: 1}) {
		t.Fatalf("default shape %+v, want a ring of 4", sh)
	}
	msg := encode(heartbeat.MsgHeartbeat, 1)
	if err := fs[0].Send(30, msg); err != nil { // torus 0 -> 2: a tie, plus: through 20
		t.Fatal(err)
	}
	if got := recvWithin(t, fs[2], 2*time.Second); !bytes.Equal(got, msg) {
		t.Fatalf("got %q, want %q", got, msg)
	}
	if fs[1].Stats().Forwarded.Load() != 1 || fs[3].Stats().Forwarded.Load() != 0 {
		t.Fatalf("forwarded by 20: %d, by 40: %d; want 1 and 0", fs[1].Stats().Forwarded.Load(), fs[3].Stats().Forwarded.Load())
	}
	fs[1].Close() // node 20 dies and is declared
	for _, f := range fs {
		f.SetDown(20, true)
	}
	if err := fs[0].Send(30, msg); err != nil {
		t.Fatal(err)
	}
	if got := recvWithin(t, fs[2], 2*time.Second); !bytes.Equal(got, msg) {
		t.Fatalf("got %q, want %q", got, msg)
	}
	if fs[3].Stats().Forwarded.Load() != 1 {
		t.Fatalf("node 40 forwarded %d packets, want 1 (the way round node 20)", fs[3].Stats().Forwarded.Load())
	}
}

func encode(typ heartbeat.MsgType, seq uint64) []byte {
	m := heartbeat.Message{Type: typ, From: 10, To: 30, FromInc: 1, Seq: seq, Nonce: seq}
	return m.Append(nil)
}

// A probe goes both ways round and is delivered once; with one way cut
// (node 20 silent, not yet declared), it still arrives.
func TestProbesGoBothWays(t *testing.T) {
	fs := ring(t, 4, nil)
	probe := encode(heartbeat.MsgProbe, 7)
	if err := fs[0].Send(30, probe); err != nil {
		t.Fatal(err)
	}
	if got := recvWithin(t, fs[2], 2*time.Second); !bytes.Equal(got, probe) {
		t.Fatalf("got %x, want the probe", got)
	}
	time.Sleep(50 * time.Millisecond)
	if n := len(fs[2].heartbeats); n != 0 {
		t.Fatalf("%d more copies delivered", n)
	}
	if fs[1].Stats().Forwarded.Load() != 1 || fs[3].Stats().Forwarded.Load() != 1 {
		t.Fatalf("forwarded by 20: %d, by 40: %d; want one copy each way", fs[1].Stats().Forwarded.Load(), fs[3].Stats().Forwarded.Load())
	}
	fs[1].Close()
	probe = encode(heartbeat.MsgProbe, 8)
	if err := fs[0].Send(30, probe); err != nil {
		t.Fatal(err)
	}
	if got := recvWithin(t, fs[2], 2*time.Second); !bytes.Equal(got, probe) {
		t.Fatalf("got %x, want the second probe", got)
	}
}

// A datagram larger than one packet (a big ring's membership view) is
// fragmented and reassembled; the pcap trace decodes with gopacket.
func TestLargeHeartbeatAndTrace(t *testing.T) {
	var trace bytes.Buffer
	fs := ring(t, 3, &trace)
	big := bytes.Repeat([]byte("0123456789abcdef"), 40) // 640 bytes: 3 fragments
	small := encode(heartbeat.MsgHeartbeat, 2)
	if err := fs[0].Send(20, big); err != nil {
		t.Fatal(err)
	}
	if got := recvWithin(t, fs[1], 2*time.Second); !bytes.Equal(got, big) {
		t.Fatalf("got %d bytes, want the %d sent", len(got), len(big))
	}
	if err := fs[1].Send(10, small); err != nil {
		t.Fatal(err)
	}
	recvWithin(t, fs[0], 2*time.Second)
	fs[0].Close()
	frags, hbs := 0, 0
	n, err := readPcap(&trace, func(p gopacket.Packet) {
		if p.Layer(bglayers.LayerTypeFrag) != nil {
			frags++
		}
		if l, ok := p.Layer(bglayers.LayerTypeTorus).(*bglayers.Torus); ok && l.Proto == netsim.ProtoHeartbeat {
			hbs++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if frags != 3 || hbs != 1 {
		t.Fatalf("trace of %d packets: %d fragments (want 3 sent), %d heartbeat packets (want 1 received)", n, frags, hbs)
	}
}

// A neighbour whose packets come from a new address is reported, once.
func TestNewSourceReported(t *testing.T) {
	fs := ring(t, 3, nil)
	moved := make(chan netip.AddrPort, 4)
	fs[0].OnNewSource(func(id heartbeat.NodeID, a netip.AddrPort) {
		if id == 20 {
			moved <- a
		}
	})
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sh := fs[0].Shape()
	// Torus node 1 (radicd 20), one link crossed, from a new port.
	pkt := netsim.AppendTorus(nil, netsim.TorusHeader{Proto: netsim.ProtoHeartbeat, Hops: 1, Src: sh.Coord(1), Dst: sh.Coord(0)}, []byte("RH"))
	for range 3 {
		c.WriteToUDPAddrPort(pkt, fs[0].LocalAddr())
	}
	select {
	case a := <-moved:
		if a != c.LocalAddr().(*net.UDPAddr).AddrPort() {
			t.Fatalf("reported %v, want %v", a, c.LocalAddr())
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the move was not reported")
	}
	time.Sleep(50 * time.Millisecond)
	if len(moved) != 0 {
		t.Fatalf("reported %d more times within a second", len(moved))
	}
}

func TestParseShape(t *testing.T) {
	if sh, err := ParseShape("4x2x1"); err != nil || sh != (netsim.Shape{X: 4, Y: 2, Z: 1}) {
		t.Fatalf("4x2x1: %+v, %v", sh, err)
	}
	for _, bad := range []string{"4x2", "4x0x1", "ax1x1", ""} {
		if _, err := ParseShape(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	_, err := Listen(Config{Shape: netsim.Shape{X: 2, Y: 2, Z: 1}, Self: 1, Bind: netip.MustParseAddrPort("127.0.0.1:0"),
		Peers: map[heartbeat.NodeID]netip.AddrPort{1: netip.MustParseAddrPort("127.0.0.1:1")}})
	if err == nil {
		t.Fatal("a 2x2x1 torus for one node was accepted")
	}
}

// readPcap decodes every packet of a trace with the bglayers decoders.
func readPcap(r io.Reader, each func(gopacket.Packet)) (int, error) {
	pr, err := pcapgo.NewReader(r)
	if err != nil {
		return 0, err
	}
	n := 0
	for {
		data, _, err := pr.ReadPacketData()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		p := gopacket.NewPacket(data, bglayers.LayerTypeBG, gopacket.Default)
		if el := p.ErrorLayer(); el != nil {
			return n, fmt.Errorf("packet %d: %v", n+1, el.Error())
		}
		each(p)
		n++
	}
}
