package observer

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

const conn31 = 3<<32 | 1 // connection 3:1

// samples has one determinant of every kind and shape.
var samples = []Determinant{
	{Kind: KindRecv, Conn: conn31, N: 1500},
	{Kind: KindRecv, Conn: conn31, N: 0}, // end of stream
	{Kind: KindRecv, Conn: conn31, Errno: syscall.EAGAIN},
	{Kind: KindRecv, Conn: DeterminantStream - 1, N: MaxCount},
	{Kind: KindSend, Conn: 0, N: 8},
	{Kind: KindSend, Conn: conn31, Errno: syscall.EPIPE},
	{Kind: KindConnect, Conn: 2<<32 | 7, Peer: netip.MustParseAddrPort("10.77.0.3:5000")},
	{Kind: KindConnect, Errno: syscall.ECONNREFUSED, Peer: netip.MustParseAddrPort("[fd00::3]:5000")},
	{Kind: KindConnect, Errno: syscall.EINPROGRESS, Peer: netip.MustParseAddrPort("[::ffff:10.0.0.1]:1")},
	{Kind: KindConnect, Errno: syscall.EBADF},
	{Kind: KindAccept, Port: 5000, Conn: 1<<32 | 2},
	{Kind: KindAccept, Port: 65535, Errno: syscall.EAGAIN},
	{Kind: KindReady, ReadyCall: ReadyPoll, Ready: []ReadyFd{{Fd: 3, Events: 1}, {Fd: 7, Events: 0x19}}},
	{Kind: KindReady, ReadyCall: ReadySelect}, // a timeout
	{Kind: KindReady, ReadyCall: ReadyEpoll, Errno: syscall.EINTR},
	{Kind: KindValue, ValueCall: ValueGetpid, Value: []byte{0x39, 0x30, 0, 0}},
	{Kind: KindValue, ValueCall: ValueGethostname, Value: []byte("node2")},
	{Kind: KindValue, ValueCall: ValueGetsockname, Ref: conn31, Value: []byte{2, 0, 0x13, 0x88, 10, 77, 0, 3}},
	{Kind: KindValue, ValueCall: ValueSockError, Ref: conn31},
}

var equateEmpty = cmp.Options{cmpopts.EquateEmpty(), cmpopts.EquateComparable(netip.AddrPort{})}

func TestDeterminantRoundTrip(t *testing.T) {
	var stream []byte
	for _, d := range samples {
		b, err := AppendDeterminant([]byte("prefix"), &d)
		if err != nil {
			t.Fatalf("AppendDeterminant(%v) error: %v", &d, err)
		}
		got, n, err := DecodeDeterminant(b[len("prefix"):])
		if err != nil || n != len(b)-len("prefix") {
			t.Fatalf("DecodeDeterminant(AppendDeterminant(%v)) = %d, %v; want %d, nil", &d, n, err, len(b)-len("prefix"))
		}
		if diff := cmp.Diff(d, got, equateEmpty); diff != "" {
			t.Errorf("round trip of %v (-want +got):\n%s", &d, diff)
		}
		stream = append(stream, b[len("prefix"):]...)
	}
	// A stream of them decodes one by one.
	for i, want := range samples {
		got, n, err := DecodeDeterminant(stream)
		if err != nil {
			t.Fatalf("determinant %d of the stream: %v", i, err)
		}
		if diff := cmp.Diff(want, got, equateEmpty); diff != "" {
			t.Errorf("determinant %d of the stream (-want +got):\n%s", i, diff)
		}
		stream = stream[n:]
	}
	if _, _, err := DecodeDeterminant(stream); err != io.EOF {
		t.Errorf("DecodeDeterminant(end of stream) error = %v, want io.EOF", err)
	}
}

// The byte layouts of the package doc.
func TestDeterminantLayout(t *testing.T) {
	for _, tt := range []struct {
		d    Determinant
		want []byte
	}{
		{Determinant{Kind: KindRecv, Conn: 5, N: 300}, []byte{0x11, 5, 0, 0xac, 0x02}},
		{Determinant{Kind: KindRecv, Conn: 5, Errno: syscall.EAGAIN}, []byte{0x11, 5, 11, 0}},
		{Determinant{Kind: KindSend, Conn: 1, N: 2}, []byte{0x12, 1, 0, 2}},
		{Determinant{Kind: KindConnect, Conn: 9, Peer: netip.MustParseAddrPort("10.0.0.2:80")}, []byte{0x13, 9, 0, 4, 10, 0, 0, 2, 0, 80}},
		{Determinant{Kind: KindConnect, Errno: syscall.ECONNREFUSED}, []byte{0x13, 0, 111, 0}},
		{Determinant{Kind: KindAccept, Port: 80, Conn: 9}, []byte{0x14, 80, 9, 0}},
		{Determinant{Kind: KindReady, ReadyCall: ReadyEpoll, Ready: []ReadyFd{{Fd: 4, Events: 1}}}, []byte{0x15, 3, 0, 1, 4, 1, 0}},
		{Determinant{Kind: KindReady, ReadyCall: ReadyPoll, Ready: []ReadyFd{{Fd: 6, Events: 4, Conn: 1<<32 + 1}}}, []byte{0x15, 1, 0, 1, 6, 4, 0x81, 0x80, 0x80, 0x80, 0x10}},
		{Determinant{Kind: KindValue, ValueCall: ValueGethostname, Value: []byte("n1")}, []byte{0x16, 2, 0, 2, 'n', '1'}},
	} {
		got, err := AppendDeterminant(nil, &tt.d)
		if err != nil || !bytes.Equal(got, tt.want) {
			t.Errorf("AppendDeterminant(%v) = % x, %v; want % x, nil", &tt.d, got, err, tt.want)
		}
	}
}

// Every proper prefix of a determinant is a truncation naming a field,
// never a format error.
func TestDecodeDeterminantEveryTruncation(t *testing.T) {
	for _, d := range samples {
		b, _ := AppendDeterminant(nil, &d)
		for n := 1; n < len(b); n++ {
			_, _, err := DecodeDeterminant(b[:n])
			var fe *FormatError
			if !errors.Is(err, io.ErrUnexpectedEOF) || !errors.As(err, &fe) || fe.Field == "" {
				t.Errorf("DecodeDeterminant(%d of %d bytes of %v) error = %v, want a truncation naming a field", n, len(b), &d, err)
			}
		}
	}
}

func TestDecodeDeterminantBad(t *testing.T) {
	for _, tt := range []struct {
		name  string
		b     []byte
		field string // FormatError.Field
		msg   string // in Error()
	}{
		{"zero byte", []byte{0}, "version", "bad version 0 (max 1)"},
		{"version 2", []byte{0x21, 1, 0, 1}, "version", "bad version 2"},
		{"kind 0", []byte{0x10}, "kind", "bad kind 0 (max 6)"},
		{"unknown kind", []byte{0x1f, 1, 2}, "kind", "bad kind 15 (max 6)"},
		{"errno too big", []byte{0x11, 1, 0x80, 0x20, 0}, "errno", "determinant recv: bad errno 4096 (max 4095)"},
		{"count too big", []byte{0x11, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x07}, "n", "bad n 2147483647 (max 2147479552)"},
		{"count with errno", []byte{0x11, 1, 11, 5}, "n (with an errno)", "bad n (with an errno) 5"},
		{"reserved conn", append(append([]byte{0x12}, bytes.Repeat([]byte{0xff}, 9)...), 1, 0, 0), "conn", "bad conn 18446744073709551615"},
		{"varint overflow", append([]byte{0x11}, bytes.Repeat([]byte{0xff}, 11)...), "conn (varint overflow)", "conn (varint overflow)"},
		{"varint not minimal", []byte{0x11, 0x81, 0x00, 0, 0}, "conn (varint not minimal)", "not minimal"},
		{"bad family", []byte{0x13, 1, 0, 5, 1, 2, 3, 4}, "peer family", "bad peer family 5"},
		{"port too big", []byte{0x14, 0x80, 0x80, 0x04, 1, 0}, "port", "bad port 65536 (max 65535)"},
		{"ready call 0", []byte{0x15, 0, 0, 0}, "call", "determinant ready: bad call 0 (max 3)"},
		{"ready too many", []byte{0x15, 1, 0, 0x81, 0x80, 0x04}, "length", "bad length 65537 (max 65536)"},
		{"ready set with errno", []byte{0x15, 1, 4, 1, 3, 1}, "length", "bad length 1"},
		{"fd too big", []byte{0x15, 1, 0, 1, 0x80, 0x80, 0x80, 0x80, 0x10, 1}, "fd", "bad fd 4294967296 (max 4294967295)"},
		{"value call 9", []byte{0x16, 9, 0, 0}, "call", "bad call 9 (max 5)"},
		{"value too long", []byte{0x16, 2, 0, 0x81, 0x20}, "length", "determinant value: bad length 4097 (max 4096)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := DecodeDeterminant(tt.b)
			var fe *FormatError
			if !errors.As(err, &fe) || !errors.Is(err, ErrFormat) || errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("DecodeDeterminant(% x) error = %v, want a *FormatError matching ErrFormat", tt.b, err)
			}
			if fe.Field != tt.field || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("DecodeDeterminant(% x) = field %q, %q; want field %q, message with %q", tt.b, fe.Field, err, tt.field, tt.msg)
			}
		})
	}
}

func TestValidateDeterminant(t *testing.T) {
	for _, tt := range []struct {
		d     Determinant
		field string
	}{
		{Determinant{}, "kind"},
		{Determinant{Kind: 7}, "kind"},
		{Determinant{Kind: KindRecv, N: MaxCount + 1}, "n"},
		{Determinant{Kind: KindRecv, N: 1, Errno: syscall.EAGAIN}, "n"},
		{Determinant{Kind: KindRecv, Errno: MaxErrno + 1}, "errno"},
		{Determinant{Kind: KindSend, Conn: DeterminantStream}, "conn"},
		{Determinant{Kind: KindRecv, Port: 1}, "unused field (not zero)"},
		{Determinant{Kind: KindAccept, Value: []byte{}}, "unused field (not zero)"},
		{Determinant{Kind: KindConnect, Peer: netip.MustParseAddrPort("[fe80::1%eth0]:1")}, "peer (zone)"},
		{Determinant{Kind: KindReady}, "call"},
		{Determinant{Kind: KindReady, ReadyCall: ReadyPoll, Errno: syscall.EINTR, Ready: []ReadyFd{{}}}, "length"},
		{Determinant{Kind: KindReady, ReadyCall: ReadyPoll, Ready: make([]ReadyFd, MaxReady+1)}, "length"},
		{Determinant{Kind: KindValue, ValueCall: 6}, "call"},
		{Determinant{Kind: KindValue, ValueCall: ValueGetpid, Value: make([]byte, MaxValue+1)}, "length"},
	} {
		b, err := AppendDeterminant([]byte("x"), &tt.d)
		var fe *FormatError
		if !errors.As(err, &fe) || fe.Field != tt.field || string(b) != "x" {
			t.Errorf("AppendDeterminant(%+v) = %q, %v; want b unchanged and a bad %q", tt.d, b, err, tt.field)
		}
	}
}

// The largest determinant fits MaxDeterminantLen.
func TestMaxDeterminantLen(t *testing.T) {
	ready := make([]ReadyFd, MaxReady)
	for i := range ready {
		ready[i] = ReadyFd{Fd: 1<<32 - 1, Events: 1<<32 - 1}
	}
	for _, d := range []Determinant{
		{Kind: KindReady, ReadyCall: ReadyEpoll, Ready: ready},
		{Kind: KindValue, ValueCall: ValueGetsockname, Ref: DeterminantStream, Value: make([]byte, MaxValue)},
		{Kind: KindConnect, Conn: DeterminantStream - 1, Errno: MaxErrno, Peer: netip.MustParseAddrPort("[fd00::1]:65535")},
	} {
		b, err := AppendDeterminant(nil, &d)
		if err != nil || len(b) > MaxDeterminantLen {
			t.Errorf("AppendDeterminant(largest %v) = %d bytes, %v; want ≤ %d", d.Kind, len(b), err, MaxDeterminantLen)
		}
	}
}

func FuzzDecodeDeterminant(f *testing.F) {
	for _, d := range samples {
		b, _ := AppendDeterminant(nil, &d)
		f.Add(b)
	}
	f.Add([]byte{0x15, 1, 0, 0xff, 0xff, 0x03})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, n, err := DecodeDeterminant(b)
		if err != nil {
			var fe *FormatError
			if err != io.EOF && !errors.As(err, &fe) {
				t.Fatalf("DecodeDeterminant(% x) error %v is neither io.EOF nor a *FormatError", b, err)
			}
			return
		}
		if n <= 0 || n > len(b) || n > MaxDeterminantLen {
			t.Fatalf("DecodeDeterminant consumed %d of %d bytes", n, len(b))
		}
		// The encoding is canonical: what decodes encodes to the same bytes.
		again, err := AppendDeterminant(nil, &d)
		if err != nil {
			t.Fatalf("AppendDeterminant(decoded %v) error: %v", &d, err)
		}
		if !bytes.Equal(again, b[:n]) {
			t.Fatalf("re-encoding of %v = % x, decoded from % x", &d, again, b[:n])
		}
		_ = d.String()
	})
}
