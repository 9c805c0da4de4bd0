package bglayers

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"

	"github.com/radic-project/radic/bulktransport"
	"github.com/radic-project/radic/bulktransport/bulk"
	"github.com/radic-project/radic/bulktransport/deltat"
	"github.com/radic-project/radic/internal/testenv"
	"github.com/radic-project/radic/netsim"
)

// trace runs a small exchange on a simulated 2x2x2 machine and records
// every packet: a short message, a message with metadata, a bulk message
// (Get, RGets, Data, Ack), a fragmented datagram and a broadcast on the
// collective network.
func trace(t *testing.T) []Record {
	t.Helper()
	var recs []Record
	sh := netsim.Shape{X: 2, Y: 2, Z: 2}
	sim, err := netsim.NewSim(netsim.SimConfig{Shape: sh, HopLatency: time.Microsecond,
		Tap: func(now time.Time, pkt []byte) { recs = append(recs, Record{now, bytes.Clone(pkt)}) }})
	if err != nil {
		t.Fatal(err)
	}
	eps := make([]*bulktransport.Endpoint, sh.Nodes())
	var drain func(i int)
	drain = func(i int) {
		r := eps[i].Ready()
		for _, p := range r.Packets {
			sim.Send(p)
		}
		for {
			m, ok := eps[i].ReadMsg()
			if !ok {
				break
			}
			eps[i].Release(m)
		}
		if !r.NextTick.IsZero() {
			sim.At(r.NextTick, func(now time.Time) { eps[i].Tick(now); drain(i) })
		}
	}
	for i := range eps {
		eps[i], err = bulktransport.New(bulktransport.Config{Shape: sh, Self: netsim.NodeID(i), BulkMin: 1000})
		if err != nil {
			t.Fatal(err)
		}
		sim.Handle(netsim.NodeID(i), func(now time.Time, pkt []byte) {
			if pkt[0] == 'T' {
				eps[i].Step(now, pkt)
				drain(i)
			}
		})
	}
	sim.At(sim.Now(), func(now time.Time) {
		eps[0].WriteMsg(now, bulktransport.Msg{Peer: 7, Data: []byte("hello")})
		eps[0].WriteMsg(now, bulktransport.Msg{Peer: 7, Meta: [24]byte{'m'}, Data: []byte("with meta")})
		eps[0].WriteMsg(now, bulktransport.Msg{Peer: 7, Data: make([]byte, 1500)})
		eps[0].SendDatagram(3, make([]byte, 300))
		drain(0)
		sim.SendTree(5, netsim.AppendTree(nil, netsim.TreeHeader{Class: netsim.TreeBroadcast, Src: 5, Seq: 1}, []byte("view")))
	})
	sim.RunFor(100 * time.Millisecond)
	return recs
}

// Every recorded packet decodes with gopacket into the layers of its
// protocol, without errors, and the bulk exchange shows all its steps.
func TestDecodeTrace(t *testing.T) {
	seen := map[string]int{}
	for _, r := range trace(t) {
		p := gopacket.NewPacket(r.Pkt, LayerTypeBG, gopacket.Default)
		if el := p.ErrorLayer(); el != nil {
			t.Fatalf("decode %x: %v", r.Pkt, el.Error())
		}
		if l, ok := p.Layer(LayerTypeBulkControl).(*BulkControl); ok {
			seen["bulk "+l.Op.String()]++
			if l.Op == bulk.OpGet && l.Word != 1500 {
				t.Errorf("Get announces %d bytes, want 1500", l.Word)
			}
		}
		if l, ok := p.Layer(LayerTypeBulkData).(*BulkData); ok {
			seen["bulk "+l.Op.String()]++
		}
		if l, ok := p.Layer(LayerTypeTransportMsg).(*TransportMsg); ok {
			seen[fmt.Sprintf("kind %d", l.Kind)]++
		}
		if l, ok := p.Layer(LayerTypeFrag).(*Frag); ok && l.Total == 300 {
			seen["frag"]++
		}
		if l, ok := p.Layer(LayerTypeTree).(*Tree); ok && l.Class == netsim.TreeBroadcast {
			seen["tree"]++
		}
	}
	for _, want := range []string{"bulk get", "bulk rget", "bulk data", "bulk ack", "kind 1", "kind 2", "kind 3", "frag", "tree"} {
		if seen[want] == 0 {
			t.Errorf("no %q in the trace (saw %v)", want, seen)
		}
	}
	// The broadcast from node 5 climbs 2 links to the root and descends
	// the 7 links of the tree.
	if seen["frag"] != 2 || seen["tree"] != 9 {
		t.Errorf("frag %d (want 2 fragments), tree %d (want 2+7 links)", seen["frag"], seen["tree"])
	}
}

// Serializing the layers gives the bytes the protocol encoders give.
func TestSerialize(t *testing.T) {
	h := netsim.TorusHeader{Proto: netsim.ProtoDeltaT, Src: netsim.Coord{X: 1}, Dst: netsim.Coord{Y: 1}}
	dh := deltat.Header{Flags: deltat.FlagData | deltat.FlagBOM | deltat.FlagEOM, Seq: 42}
	ctl := bulk.Control{Header: bulk.Header{Src: 1, Dst: 2, Op: bulk.OpGet, Param: 9}, Word: 5000}
	want := netsim.AppendTorus(nil, h, deltat.Append(nil, dh, append([]byte{bulktransport.KindBulk}, bulk.AppendControl(nil, ctl)...)))
	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{},
		&Torus{TorusHeader: h}, &DeltaT{Header: dh}, &TransportMsg{Kind: bulktransport.KindBulk}, &BulkControl{Control: ctl})
	if err != nil || !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("serialized %x, %v\nwant       %x", buf.Bytes(), err, want)
	}
	buf.Clear()
	fh := netsim.TreeHeader{Class: netsim.TreeResult, Op: netsim.OpAdd, Src: 3, Seq: 2, Count: 8}
	gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, &Tree{TreeHeader: fh}, gopacket.Payload(make([]byte, 8)))
	if want := netsim.AppendTree(nil, fh, make([]byte, 8)); !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("tree serialized %x, want %x", buf.Bytes(), want)
	}
}

// tshark, with deploy/radic-bg.lua, decodes a trace written by WritePcap
// into the same fields as the Go decoders.
func TestTsharkDecodesTrace(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark is not installed (scripts/deps.sh installs it): the Lua dissector is not checked")
	}
	recs := trace(t)
	file := filepath.Join(t.TempDir(), "radic.pcap")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := WritePcap(f, recs); err != nil {
		t.Fatal(err)
	}
	f.Close()
	lua := filepath.Join(testenv.Root(t), "deploy", "radic-bg.lua")
	fields := []string{"radic_torus.proto", "radic_torus.dst", "radic_deltat.seq", "radic_msg.kind", "radic_bulk.op", "radic_bulk.tag", "radic_frag.total", "radic_tree.class", "radic_bulk.word"}
	args := []string{"-X", "lua_script:" + lua, "-r", file, "-T", "fields", "-E", "separator=|", "-E", "occurrence=f"}
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
		t.Fatalf("tshark printed %d lines for %d packets:\n%s\n%s", len(lines), len(recs), out, stderr.String())
	}
	for i, line := range lines {
		got := strings.Split(line, "|")
		p := gopacket.NewPacket(recs[i].Pkt, LayerTypeBG, gopacket.Default)
		want := make([]string, len(fields))
		if l, ok := p.Layer(LayerTypeTorus).(*Torus); ok {
			want[0], want[1] = fmt.Sprint(uint8(l.Proto)), l.Dst.String()
		}
		if l, ok := p.Layer(LayerTypeDeltaT).(*DeltaT); ok && l.Flags&deltat.FlagData != 0 {
			want[2] = fmt.Sprint(l.Seq)
		}
		if l, ok := p.Layer(LayerTypeTransportMsg).(*TransportMsg); ok {
			want[3] = fmt.Sprint(l.Kind)
		}
		if l, ok := p.Layer(LayerTypeBulkControl).(*BulkControl); ok {
			want[4], want[5], want[8] = fmt.Sprint(uint8(l.Op)), fmt.Sprint(l.Param), fmt.Sprint(l.Word)
		}
		if l, ok := p.Layer(LayerTypeBulkData).(*BulkData); ok {
			want[4], want[5] = fmt.Sprint(uint8(l.Op)), fmt.Sprint(l.Tag)
		}
		if l, ok := p.Layer(LayerTypeFrag).(*Frag); ok {
			want[6] = fmt.Sprint(l.Total)
		}
		if l, ok := p.Layer(LayerTypeTree).(*Tree); ok {
			want[7] = fmt.Sprint(uint8(l.Class))
		}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("packet %d: tshark %q, gopacket %q", i+1, line, strings.Join(want, "|"))
		}
	}
	t.Logf("tshark decoded %d packets with fields %v", len(lines), fields)
}

func BenchmarkDecodeLayers(b *testing.B) {
	pkt := netsim.AppendTorus(nil, netsim.TorusHeader{Proto: netsim.ProtoDeltaT}, deltat.Append(nil, deltat.Header{Flags: deltat.FlagData | deltat.FlagBOM}, []byte{bulktransport.KindApp, 1, 2, 3}))
	var tor Torus
	var dt DeltaT
	var tm TransportMsg
	parser := gopacket.NewDecodingLayerParser(LayerTypeTorus, &tor, &dt, &tm)
	parser.IgnoreUnsupported = true
	decoded := make([]gopacket.LayerType, 0, 4)
	b.ReportAllocs()
	for b.Loop() {
		parser.DecodeLayers(pkt, &decoded)
	}
}

// FuzzDecodeBG decodes arbitrary records as a trace reader would: no
// panic, and a record that decodes without error re-serializes to itself.
func FuzzDecodeBG(f *testing.F) {
	f.Add(netsim.AppendTorus(nil, netsim.TorusHeader{Proto: netsim.ProtoDeltaT}, deltat.Append(nil, deltat.Header{Flags: deltat.FlagData | deltat.FlagBOM}, []byte{bulktransport.KindAppMeta})))
	f.Add(netsim.AppendTree(nil, netsim.TreeHeader{Class: netsim.TreeBroadcast}, []byte("x")))
	f.Fuzz(func(t *testing.T, b []byte) {
		p := gopacket.NewPacket(b, LayerTypeBG, gopacket.Default)
		if p.ErrorLayer() != nil {
			return
		}
		var ls []gopacket.SerializableLayer
		for _, l := range p.Layers() {
			s, ok := l.(gopacket.SerializableLayer)
			if !ok {
				return // a payload layer of unknown structure
			}
			ls = append(ls, s)
		}
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, ls...); err != nil {
			t.Fatalf("serialize: %v", err)
		}
		if !bytes.Equal(buf.Bytes(), b) {
			t.Fatalf("re-serialized %x, want %x", buf.Bytes(), b)
		}
	})
}
