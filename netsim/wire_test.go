package netsim

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestTorusRoundTrip(t *testing.T) {
	h := TorusHeader{Proto: ProtoDeltaT, Hops: 3, Src: Coord{1, 2, 3}, Dst: Coord{400, 5, 65535}}
	payload := bytes.Repeat([]byte{0xab}, TorusPayload)
	b := AppendTorus(nil, h, payload)
	if len(b) != MaxTorusPacket {
		t.Fatalf("len = %d, want %d", len(b), MaxTorusPacket)
	}
	got, p, err := DecodeTorus(b)
	h.Length = TorusPayload
	if err != nil || got != h || !bytes.Equal(p, payload) {
		t.Fatalf("DecodeTorus = %+v, %d bytes, %v; want %+v", got, len(p), err, h)
	}
}

// Every truncation of a valid packet is detected as io.EOF or
// io.ErrUnexpectedEOF, never decoded.
func TestTorusTruncation(t *testing.T) {
	b := AppendTorus(nil, TorusHeader{Src: Coord{1, 1, 1}}, []byte("hello"))
	for n := range len(b) {
		_, _, err := DecodeTorus(b[:n])
		want := io.ErrUnexpectedEOF
		if n == 0 {
			want = io.EOF
		}
		if !errors.Is(err, want) {
			t.Errorf("DecodeTorus(%d of %d bytes) = %v, want %v", n, len(b), err, want)
		}
	}
	if _, _, err := DecodeTorus(append(b, 0)); !errors.Is(err, ErrBadPacket) {
		t.Errorf("trailing byte: %v", err)
	}
}

func TestTreeRoundTripAndTruncation(t *testing.T) {
	h := TreeHeader{Proto: ProtoRaw, Class: TreeReduce, Op: OpAdd, Src: 7, Seq: 9, Count: 1}
	payload := make([]byte, TreePayload)
	b := AppendTree(nil, h, payload)
	h.Length = TreePayload
	got, p, err := DecodeTree(b)
	if err != nil || got != h || len(p) != TreePayload {
		t.Fatalf("DecodeTree = %+v, %d, %v", got, len(p), err)
	}
	for n := range len(b) {
		if _, _, err := DecodeTree(b[:n]); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("DecodeTree(%d bytes) = %v", n, err)
		}
	}
	bad := AppendTree(nil, TreeHeader{Class: TreeReduce}, []byte{1, 2, 3})
	if _, _, err := DecodeTree(bad); !errors.Is(err, ErrBadPacket) {
		t.Errorf("reduce payload of 3 bytes: %v", err)
	}
}

func FuzzDecodeTorus(f *testing.F) {
	f.Add(AppendTorus(nil, TorusHeader{Proto: ProtoFrag, Src: Coord{1, 2, 3}}, []byte("x")))
	f.Add([]byte{})
	f.Add([]byte("T\x00\x00\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, p, err := DecodeTorus(b)
		if err != nil {
			return
		}
		// A packet that decodes re-encodes to the same bytes.
		if again := AppendTorus(nil, h, p); !bytes.Equal(again, b) {
			t.Fatalf("re-encoded %x, want %x", again, b)
		}
	})
}

func FuzzDecodeTree(f *testing.F) {
	f.Add(AppendTree(nil, TreeHeader{Class: TreeBroadcast, Src: 3}, []byte("hi")))
	f.Add(AppendTree(nil, TreeHeader{Class: TreeResult, Op: OpMax, Count: 4}, make([]byte, 16)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, p, err := DecodeTree(b)
		if err != nil {
			return
		}
		if again := AppendTree(nil, h, p); !bytes.Equal(again, b) {
			t.Fatalf("re-encoded %x, want %x", again, b)
		}
	})
}

// A link frame of torus and collective packets splits back into them.
func TestNextPacket(t *testing.T) {
	pkts := [][]byte{
		AppendTorus(nil, TorusHeader{Proto: ProtoDeltaT, Dst: Coord{X: 1}}, make([]byte, TorusPayload)),
		AppendTree(nil, TreeHeader{Class: TreeBroadcast, Src: 3}, []byte("tree")),
		AppendTorus(nil, TorusHeader{Proto: ProtoHeartbeat}, nil),
	}
	var frame []byte
	for _, p := range pkts {
		frame = append(frame, p...)
	}
	for i, want := range pkts {
		var err error
		var got []byte
		got, frame, err = NextPacket(frame)
		if err != nil || string(got) != string(want) {
			t.Fatalf("packet %d: %x, %v; want %x", i, got, err, want)
		}
	}
	if _, _, err := NextPacket(frame); err != io.EOF {
		t.Fatalf("after the last packet: %v, want EOF", err)
	}
	if _, _, err := NextPacket(pkts[0][:20]); err != io.ErrUnexpectedEOF {
		t.Fatalf("a cut packet: %v, want ErrUnexpectedEOF", err)
	}
}

func FuzzNextPacket(f *testing.F) {
	f.Add(append(AppendTorus(nil, TorusHeader{}, []byte("x")), AppendTree(nil, TreeHeader{Class: TreeBroadcast}, nil)...))
	f.Fuzz(func(t *testing.T, frame []byte) {
		for {
			pkt, rest, err := NextPacket(frame)
			if err != nil {
				return
			}
			if len(pkt)+len(rest) != len(frame) || len(pkt) < TorusHeaderLen {
				t.Fatalf("split %d into %d + %d", len(frame), len(pkt), len(rest))
			}
			frame = rest
		}
	})
}
