package replayfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/radic-project/radic/msglog/record"
	"github.com/radic-project/radic/observer"
)

// file builds a whole file for h: the header, the rest zeros.
func file(h *Header) []byte {
	f := make([]byte, h.Size)
	copy(f, h.Encode())
	return f
}

func TestPlanDecode(t *testing.T) {
	if PageSize%(64<<10) != 0 {
		t.Fatalf("PageSize %d: a region must start on a page of every kernel the shim runs on, 64 KiB pages included", PageSize)
	}
	h := Plan(10, map[uint64]uint64{7: PageSize + 904, 3: 0, 1<<32 | 2: 1})
	want := &Header{
		Size: 5 * PageSize,
		Dets: Region{Conn: observer.DeterminantStream, Off: PageSize, Len: 10},
		Conns: []Region{
			{Conn: 3, Off: 2 * PageSize, Len: 0},              // nothing received: no page of its own
			{Conn: 7, Off: 2 * PageSize, Len: PageSize + 904}, // two pages
			{Conn: 1<<32 | 2, Off: 4 * PageSize, Len: 1},
		},
	}
	if d := cmp.Diff(want, h); d != "" {
		t.Fatalf("Plan (-want +got):\n%s", d)
	}
	got, err := Decode(file(h))
	if err != nil {
		t.Fatalf("Decode = %v", err)
	}
	if d := cmp.Diff(h, got); d != "" {
		t.Errorf("Decode(Encode) (-want +got):\n%s", d)
	}
}

func TestDecodeRefuses(t *testing.T) {
	good := file(Plan(100, map[uint64]uint64{1: 10, 2: 20}))
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	// reseal rewrites the header's checksum after a change, so that the
	// check under test is the one that refuses it.
	reseal := func(b []byte) []byte {
		end := fixed + perConn*2
		binary.LittleEndian.PutUint32(b[end:], crc32.Checksum(b[:end], castagnoli))
		return b
	}
	for _, tc := range []struct {
		name string
		file []byte
	}{
		{"empty", nil},
		{"magic", mutate(func(b []byte) []byte { b[0] = 'X'; return b })},
		{"version", mutate(func(b []byte) []byte { b[8] = 9; return reseal(b) })},
		{"checksum", mutate(func(b []byte) []byte { b[fixed+8]++; return b })},
		{"size differs from the file", good[:len(good)-PageSize]},
		{"region not aligned", mutate(func(b []byte) []byte { b[fixed+8]++; return reseal(b) })},
		{"region past the end", mutate(func(b []byte) []byte { b[fixed+perConn+19] = 0xff; return reseal(b) })},
		{"regions overlap", mutate(func(b []byte) []byte {
			copy(b[fixed+perConn+8:fixed+perConn+16], b[fixed+8:fixed+16])
			return reseal(b)
		})},
		{"connections out of order", mutate(func(b []byte) []byte { b[fixed] = 5; return reseal(b) })},
		{"too many connections", mutate(func(b []byte) []byte { b[15] = 0x7f; return b })},
	} {
		if _, err := Decode(tc.file); !errors.Is(err, ErrFile) {
			t.Errorf("%s: Decode = %v, want ErrFile", tc.name, err)
		}
	}
}

func rec(stream, off uint64, p string) record.Record {
	k := record.KindData
	if stream == observer.DeterminantStream {
		k = record.KindDeterminant
	}
	return record.Record{Kind: k, Stream: stream, Offset: off, Payload: []byte(p)}
}

// Records placed in a file rebuild each stream exactly, overlaps trimmed.
func TestPlacer(t *testing.T) {
	h := Plan(3, map[uint64]uint64{1: 6, 2: 2})
	f := file(h)
	p := h.NewPlacer()
	for _, r := range []record.Record{
		rec(1, 0, "abc"),
		rec(observer.DeterminantStream, 0, "xyz"),
		rec(1, 2, "cdef"), // overlaps: "c" again
		rec(1, 0, "ab"),   // all seen already
		rec(2, 0, "ghi"),  // "i" came after the listing
	} {
		off, b, err := p.Place(r)
		if err != nil {
			t.Fatalf("Place(%d@%d) = %v", r.Stream, r.Offset, err)
		}
		copy(f[off:], b)
	}
	if err := p.Done(); err != nil {
		t.Fatalf("Done = %v", err)
	}
	got, err := Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		r    Region
		want string
	}{{got.Dets, "xyz"}, {got.Conns[0], "abcdef"}, {got.Conns[1], "gh"}} {
		if s := string(c.r.Bytes(f)); s != c.want {
			t.Errorf("stream %d = %q, want %q", c.r.Conn, s, c.want)
		}
	}
}

func TestPlacerRefuses(t *testing.T) {
	h := Plan(0, map[uint64]uint64{1: 4})
	for _, tc := range []struct {
		name string
		recs []record.Record
	}{
		{"gap", []record.Record{rec(1, 1, "b")}},
		{"not planned", []record.Record{rec(9, 0, "a")}},
		{"determinant kind on a data stream", []record.Record{{Kind: record.KindDeterminant, Stream: 1, Payload: []byte("a")}}},
	} {
		p := h.NewPlacer()
		var err error
		for _, r := range tc.recs {
			if _, _, err = p.Place(r); err != nil {
				break
			}
		}
		if !errors.Is(err, ErrFile) {
			t.Errorf("%s: Place = %v, want ErrFile", tc.name, err)
		}
	}
	p := h.NewPlacer()
	if _, _, err := p.Place(rec(1, 0, "abc")); err != nil {
		t.Fatal(err)
	}
	if err := p.Done(); !errors.Is(err, ErrFile) {
		t.Errorf("Done with a stream short of its plan = %v, want ErrFile", err)
	}
}

// FuzzDecode: any bytes give a header whose regions lie apart inside the
// file, or ErrFile; never a panic.
func FuzzDecode(f *testing.F) {
	f.Add(file(Plan(10, map[uint64]uint64{1: 100, 2: 5000})))
	f.Add(file(Plan(0, nil)))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrFile) {
				t.Fatalf("Decode = %v, not ErrFile", err)
			}
			return
		}
		prev := uint64(0)
		for _, r := range append([]Region{h.Dets}, h.Conns...) {
			if r.Off < prev || r.End() > uint64(len(b)) {
				t.Fatalf("region %+v: overlaps or passes the end %d", r, len(b))
			}
			_ = r.Bytes(b)
			prev = r.End()
		}
	})
}
