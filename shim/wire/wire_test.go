package wire

import (
	"bytes"
	"math"
	"net/netip"
	"strings"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	for _, f := range []Frame{
		{Type: Open, Attempt: 3, ID: 1<<32 | 7, Listener: 20001},
		{Type: Ack, ID: 9, V1: math.MaxUint64, V2: 12345, Flags: HeardDone},
		{Type: Resume, Port: 40000, Attempt: math.MaxUint32, ID: math.MaxUint64, V1: 1, V2: 2, Listener: 65535},
		{Type: Refuse, ID: 1},
		{Type: Digest, ID: 1<<32 | 3, V1: 1 << 40, V2: 0xdeadbeef},
	} {
		b := f.Bytes()
		if len(b) != FrameLen {
			t.Fatalf("%+v: %d bytes, want %d", f, len(b), FrameLen)
		}
		g, err := ParseFrame(b)
		if err != nil || g != f {
			t.Errorf("ParseFrame(%+v.Bytes()) = %+v, %v", f, g, err)
		}
	}
}

func TestParseFrameErrors(t *testing.T) {
	good := Frame{Type: Ack, ID: 5}.Bytes()
	mut := func(i int, v byte) []byte { b := bytes.Clone(good); b[i] = v; return b }
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"short", good[:32], "32 bytes, want 40"},
		{"long", append(bytes.Clone(good), 0), "41 bytes"},
		{"type 0", mut(0, 0), "unknown type 0"},
		{"type 8", mut(0, 8), "unknown type 8"},
		{"reserved byte 1", mut(1, 1), "nonzero reserved"},
		{"reserved tail", mut(39, 1), "nonzero reserved"},
		{"reserved after the flags", mut(35, 1), "nonzero reserved"},
	} {
		if _, err := ParseFrame(tc.b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.want)
		}
	}
}

func TestHelloRoundTrip(t *testing.T) {
	h := Hello{Job: 0xdeadbeef, ID: 2<<32 | 3, From: netip.MustParseAddrPort("10.7.0.2:20002"), CtlPort: 41000}
	b := h.Bytes()
	if !MayBeHello(b[:3]) || !MayBeHello(b) {
		t.Error("a hello's own prefix is not taken for one")
	}
	g, err := ParseHello(b)
	if err != nil || g != h {
		t.Fatalf("ParseHello(%+v.Bytes()) = %+v, %v", h, g, err)
	}
	for _, other := range [][]byte{[]byte("GET / HTTP/1.1\r\n"), {'R', 'A', 'D', 'I', 'C', 0, 2}, {0}} {
		if MayBeHello(other) {
			t.Errorf("MayBeHello(%q) = true", other)
		}
	}
	if _, err := ParseHello(append([]byte("SSH-2.0-"), b[8:]...)); err == nil || !strings.Contains(err.Error(), "not a radic hello") {
		t.Errorf("an ssh banner: error %v", err)
	}
	if _, err := ParseHello(b[:31]); err == nil {
		t.Error("a short hello parsed")
	}
}

// FuzzParseFrame: any bytes either fail with an error or decode to a frame
// that encodes back to exactly those bytes.
func FuzzParseFrame(f *testing.F) {
	f.Add(Frame{Type: Resume, Port: 1, Attempt: 2, ID: 3, V1: 4, V2: 5, Listener: 6}.Bytes())
	f.Add(make([]byte, FrameLen))
	f.Add([]byte{2})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := ParseFrame(b)
		if err != nil {
			return
		}
		if !bytes.Equal(fr.Bytes(), b) {
			t.Fatalf("% x decoded to %+v, which encodes to % x", b, fr, fr.Bytes())
		}
	})
}

// FuzzParseHello: the same for hellos, and MayBeHello agrees with
// ParseHello on whole ones.
func FuzzParseHello(f *testing.F) {
	f.Add(Hello{Job: 1, ID: 2, From: netip.MustParseAddrPort("10.0.0.1:5"), CtlPort: 6}.Bytes())
	f.Add([]byte("RADIC"))
	f.Add(make([]byte, HelloLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHello(b)
		if len(b) == HelloLen && (err == nil) != MayBeHello(b) {
			t.Fatalf("% x: ParseHello error %v, MayBeHello %v", b, err, MayBeHello(b))
		}
		if err == nil && !bytes.Equal(h.Bytes(), b) {
			t.Fatalf("% x decoded to %+v, which encodes to % x", b, h, h.Bytes())
		}
	})
}
