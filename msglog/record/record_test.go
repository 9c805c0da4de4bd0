package record

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func sample() Record {
	return Record{Kind: KindData, Owner: 0x0102030405060708, Stream: 7, Offset: 1 << 40, Payload: []byte("hello, radic")}
}

func TestEncodeLayout(t *testing.T) {
	r := sample()
	b := AppendRecord(nil, &r)
	if got, want := len(b), HeaderLen+len(r.Payload); got != want {
		t.Fatalf("len(AppendRecord) = %d, want %d", got, want)
	}
	if !bytes.Equal(b[:4], []byte("RDLG")) {
		t.Errorf("magic = %q, want RDLG", b[:4])
	}
	h := Header(b)
	got := Fields{Kind: h.Kind(), Length: h.Length(), Owner: h.Owner(), Stream: h.Stream(), Offset: h.Offset()}
	want := Fields{Kind: KindData, Length: uint32(len(r.Payload)), Owner: r.Owner, Stream: 7, Offset: 1 << 40}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("header fields (-want +got):\n%s", d)
	}
	if h.Version() != Version || h.Flags() != 0 {
		t.Errorf("version, flags = %d, %d; want %d, 0", h.Version(), h.Flags(), Version)
	}
	if got, want := h.CRC(), checksum(b[:offCRC], r.Payload); got != want {
		t.Errorf("CRC = %#x, want %#x", got, want)
	}
}

func TestRoundTrip(t *testing.T) {
	for _, r := range []Record{
		sample(),
		{Kind: KindDeterminant, Owner: 0, Stream: 0, Offset: 0, Payload: nil},
		{Kind: 255, Owner: ^uint64(0), Stream: ^uint64(0), Offset: ^uint64(0), Payload: nil},
		{Kind: KindData, Offset: ^uint64(0) - 3, Payload: []byte{1, 2, 3}},
		{Kind: KindData, Payload: bytes.Repeat([]byte{0xab}, 70000)},
	} {
		b := AppendRecord([]byte("prefix"), &r)
		got, n, err := Decode(b[len("prefix"):])
		if err != nil {
			t.Fatalf("Decode(AppendRecord(%v)) error: %v", r.Kind, err)
		}
		if n != r.Len() {
			t.Errorf("Decode consumed %d, want %d", n, r.Len())
		}
		if r.Payload == nil {
			r.Payload = []byte{}
		}
		if d := cmp.Diff(r, got); d != "" {
			t.Errorf("round trip (-want +got):\n%s", d)
		}
	}
}

func TestDecodeConsumesOneRecord(t *testing.T) {
	a, b := sample(), sample()
	b.Offset = a.End()
	buf := AppendRecord(AppendRecord(nil, &a), &b)
	_, n, err := Decode(buf)
	if err != nil || n != a.Len() {
		t.Fatalf("Decode(two records) = %d, %v; want %d, nil", n, err, a.Len())
	}
	got, n2, err := Decode(buf[n:])
	if err != nil || n2 != b.Len() || got.Offset != b.Offset {
		t.Fatalf("Decode(second) = %+v, %d, %v", got, n2, err)
	}
}

// Every proper prefix of a valid record is a truncation, never corruption.
func TestDecodeEveryTruncation(t *testing.T) {
	r := sample()
	b := AppendRecord(nil, &r)
	for i := 0; i < len(b); i++ {
		_, n, err := Decode(b[:i])
		want := io.ErrUnexpectedEOF
		if i == 0 {
			want = io.EOF
		}
		if err != want || n != 0 {
			t.Errorf("Decode(b[:%d]) = %d, %v; want 0, %v", i, n, err, want)
		}
	}
}

func TestDecodeCorrupt(t *testing.T) {
	r := sample()
	good := AppendRecord(nil, &r)
	le := binary.LittleEndian
	tests := []struct {
		name  string
		edit  func(b []byte) []byte
		field string
	}{
		{"bad magic", func(b []byte) []byte { b[0] = 'X'; return b }, "magic"},
		{"bad magic in 2 bytes", func(b []byte) []byte { return []byte{'R', 'X'} }, "magic"},
		{"zeros", func(b []byte) []byte { return make([]byte, 64) }, "magic"},
		{"bad version", func(b []byte) []byte { b[offVersion] = 2; return b }, "version"},
		{"zero kind", func(b []byte) []byte { b[offKind] = 0; return b }, "kind"},
		{"zero kind short", func(b []byte) []byte { b[offKind] = 0; return b[:6] }, "kind"},
		{"flags set", func(b []byte) []byte { b[offFlags] = 1; return b }, "flags"},
		{"length too big", func(b []byte) []byte { le.PutUint32(b[offLength:], MaxPayload+1); return b }, "length"},
		{"length too big, truncated", func(b []byte) []byte { le.PutUint32(b[offLength:], ^uint32(0)); return b[:12] }, "length"},
		{"offset overflows", func(b []byte) []byte { le.PutUint64(b[offOffset:], ^uint64(0)-2); return b }, "offset"},
		{"payload bit flip", func(b []byte) []byte { b[HeaderLen+3] ^= 0x10; return b }, "checksum"},
		{"owner bit flip", func(b []byte) []byte { b[offOwner] ^= 1; return b }, "checksum"},
		{"crc bit flip", func(b []byte) []byte { b[offCRC] ^= 1; return b }, "checksum"},
		{"length shortened", func(b []byte) []byte { le.PutUint32(b[offLength:], 3); return b }, "checksum"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.edit(bytes.Clone(good))
			_, n, err := Decode(b)
			var ce *CorruptError
			if !errors.As(err, &ce) || n != 0 {
				t.Fatalf("Decode = %d, %v; want 0, *CorruptError", n, err)
			}
			if ce.Field != tt.field {
				t.Errorf("CorruptError.Field = %q, want %q (%v)", ce.Field, tt.field, err)
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("errors.Is(%v, ErrCorrupt) = false", err)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		r     Record
		field string
	}{
		{Record{Kind: 0}, "kind"},
		{Record{Kind: 1, Payload: make([]byte, MaxPayload+1)}, "length"},
		{Record{Kind: 1, Offset: ^uint64(0), Payload: []byte{1}}, "offset"},
		{Record{Kind: 1, Offset: ^uint64(0)}, ""},
	}
	for _, tt := range tests {
		err := tt.r.Validate()
		var ce *CorruptError
		switch {
		case tt.field == "" && err != nil:
			t.Errorf("Validate(%+v) = %v, want nil", tt.r.Kind, err)
		case tt.field != "" && (!errors.As(err, &ce) || ce.Field != tt.field):
			t.Errorf("Validate() = %v, want bad %s", err, tt.field)
		}
	}
}

func TestAppendRecordPanicsOnInvalid(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("AppendRecord(kind 0) did not panic")
		}
	}()
	AppendRecord(nil, &Record{})
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{KindData: "data", KindDeterminant: "determinant", 9: "kind(9)"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", k, got, want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	r := sample()
	good := AppendRecord(nil, &r)
	f.Add(good)
	f.Add(good[:HeaderLen])
	f.Add(good[:HeaderLen-1])
	f.Add(good[:7])
	f.Add([]byte{})
	f.Add(make([]byte, HeaderLen))
	e := Record{Kind: KindDeterminant, Offset: 9}
	f.Add(AppendRecord(AppendRecord(nil, &e), &r))
	bad := bytes.Clone(good)
	bad[HeaderLen] ^= 1
	f.Add(bad)
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, n, err := Decode(b)
		if err != nil {
			if n != 0 {
				t.Fatalf("Decode error %v with n = %d", err, n)
			}
			if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Decode error of unexpected type: %T %v", err, err)
			}
			if _, herr := CheckHeader(b); herr != nil && herr.Error() != err.Error() {
				t.Fatalf("CheckHeader = %v, Decode = %v", herr, err)
			}
			return
		}
		if n != rec.Len() || n > len(b) {
			t.Fatalf("Decode consumed %d, record len %d, input %d", n, rec.Len(), len(b))
		}
		// A decoded record re-encodes to exactly the bytes consumed.
		if enc := AppendRecord(nil, &rec); !bytes.Equal(enc, b[:n]) {
			t.Fatalf("re-encoding differs:\n got %x\nwant %x", enc, b[:n])
		}
		// And every prefix of it is a truncation.
		for i := 0; i < n; i++ {
			if _, _, err := Decode(b[:i]); err != io.EOF && err != io.ErrUnexpectedEOF {
				t.Fatalf("Decode(prefix %d of valid record) = %v", i, err)
			}
		}
	})
}
