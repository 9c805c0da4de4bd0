package radicd_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/pcapgo"

	"github.com/radic-project/radic/bulktransport/bglayers"
	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/internal/testenv"
	"github.com/radic-project/radic/netsim"
)

// TestFabricTrace runs a ring of four radicds on the Blue Gene torus
// (--fabric bg) with --pcap, kills node 1 and reads node 2's trace back
// twice, with tshark and deploy/radic-bg.lua and with the gopacket
// layers: both decode every packet alike, and the trace shows the ring
// on the torus. Node 2 heard node 1's heartbeats; as node 1's monitor it
// probed it both ways round (the dimension-order and the alternate
// route); and after node 1 was declared, node 0's heartbeats reached
// node 2 round the other side, forwarded by node 3 (two hops), where
// dimension order would have sent them through the dead node.
func TestFabricTrace(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark is not installed (scripts/deps.sh installs it): the radicd trace is not checked")
	}
	const n = 4
	dir := t.TempDir()
	pcap := func(i int) string { return filepath.Join(dir, fmt.Sprintf("n%d.pcap", i)) }
	r := startRing(t, 101, n, func(i int) []string { return []string{"--fabric", "bg", "--pcap", pcap(i)} })
	time.Sleep(300 * time.Millisecond)
	r.kill(1)
	if _, ok := r.waitDeclared(2, 1, 3*time.Second); !ok {
		t.Fatal("node 1 not declared dead by its monitor 2 within 3s")
	}
	declared := time.Now()
	time.Sleep(500 * time.Millisecond)
	// Stop node 2 cleanly: its trace is flushed and closed.
	if err := r.procs[2].Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.waits[2]:
		if err != nil {
			t.Fatalf("radicd 2 after SIGTERM: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("radicd 2 did not exit 10s after SIGTERM")
	}
	r.procs[2] = nil

	type rec struct {
		at                 time.Time
		proto, route, hops uint8
		typ                heartbeat.MsgType
		from, to           heartbeat.NodeID
		src                netsim.Coord
	}
	var recs []rec
	f, err := os.Open(pcap(2))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pr, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	for {
		data, ci, err := pr.ReadPacketData()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("packet %d: %v", len(recs)+1, err)
		}
		p := gopacket.NewPacket(data, bglayers.LayerTypeBG, gopacket.Default)
		if el := p.ErrorLayer(); el != nil {
			t.Fatalf("packet %d: %v", len(recs)+1, el.Error())
		}
		var x rec
		x.at = ci.Timestamp
		if l, ok := p.Layer(bglayers.LayerTypeTorus).(*bglayers.Torus); ok {
			x.proto, x.route, x.hops, x.src = uint8(l.Proto), uint8(l.Route), l.Hops, l.Src
		}
		if l, ok := p.Layer(bglayers.LayerTypeHeartbeat).(*bglayers.Heartbeat); ok {
			x.typ, x.from, x.to = l.Type, l.From, l.To
		}
		recs = append(recs, x)
	}

	fields := []string{"radic_torus.proto", "radic_torus.route", "radic_torus.hops", "radic_hb.type", "radic_hb.from", "radic_hb.to"}
	args := []string{"-X", "lua_script:" + filepath.Join(testenv.Root(t), "deploy", "radic-bg.lua"), "-r", pcap(2), "-T", "fields", "-E", "separator=|", "-E", "occurrence=f"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	cmd := exec.Command(tshark, args...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir()) // no user profile
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != len(recs) {
		t.Fatalf("tshark printed %d lines for the trace's %d packets\n%s", len(lines), len(recs), stderr.String())
	}
	for i, line := range lines {
		got := strings.Split(line, "|")
		x := recs[i]
		want := []uint64{uint64(x.proto), uint64(x.route), uint64(x.hops), uint64(x.typ), uint64(x.from), uint64(x.to)}
		for j, w := range want {
			v, err := uint64(0), error(nil)
			if got[j] != "" { // a field the packet does not have: tshark prints nothing
				v, err = strconv.ParseUint(got[j], 0, 64)
			}
			if err != nil || v != w {
				t.Fatalf("packet %d: tshark %q, gopacket %v (field %s)", i+1, line, want, fields[j])
			}
		}
	}

	sh := netsim.Shape{X: n, Y: 1, Z: 1}
	var fromOne, probesPlain, probesAlt, detoured int
	for _, x := range recs {
		switch {
		case x.typ == heartbeat.MsgHeartbeat && x.from == 1 && x.to == 2:
			fromOne++
		case x.typ == heartbeat.MsgProbe && x.from == 2 && x.to == 1 && x.route == 0:
			probesPlain++
		case x.typ == heartbeat.MsgProbe && x.from == 2 && x.to == 1 && x.route&uint8(netsim.RouteAlt) != 0:
			probesAlt++
		case x.typ == heartbeat.MsgHeartbeat && x.from == 0 && x.to == 2 && x.at.After(declared) && x.hops == 2 && x.src == sh.Coord(0):
			detoured++
		}
	}
	t.Logf("tshark and gopacket agree on %d packets; heartbeats from node 1: %d; probes to node 1: %d dimension order, %d alternate route; node 0's heartbeats round the dead node: %d",
		len(recs), fromOne, probesPlain, probesAlt, detoured)
	if fromOne == 0 || probesPlain == 0 || probesAlt == 0 || detoured == 0 {
		t.Error("the trace lacks one of: node 1's heartbeats, probes to it on both routes, node 0's heartbeats detoured through node 3")
	}
}
