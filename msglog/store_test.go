package msglog

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/radic-project/radic/msglog/record"
)

// pattern is the content of byte off of stream k in every test: any byte
// served can be checked without remembering what was written.
func pattern(k Key, off uint64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		x := (off + uint64(i)) * 0x9e3779b97f4a7c15
		b[i] = byte(x>>56) ^ byte(k.Owner*3) ^ byte(k.Stream*7)
	}
	return b
}

func rec(k Key, off uint64, n int) Record {
	return Record{Kind: KindData, Owner: k.Owner, Stream: k.Stream, Offset: off, Payload: pattern(k, off, n)}
}

func open(t testing.TB, dir string, o Options) *Store {
	t.Helper()
	if o.Logf == nil {
		o.Logf = t.Logf
	}
	s, err := Open(dir, o)
	if err != nil {
		t.Fatalf("Open(%s) = %v", dir, err)
	}
	return s
}

func mustAppend(t testing.TB, s *Store, r Record) {
	t.Helper()
	if err := s.Append(r); err != nil {
		t.Fatalf("Append(off %d, len %d) = %v", r.Offset, len(r.Payload), err)
	}
}

// readAll reads stream k from `from` to its end and checks every byte
// against pattern and that records are contiguous. It returns the end.
func readAll(t testing.TB, s *Store, k Key, from uint64) uint64 {
	t.Helper()
	c := s.Read(k.Owner, k.Stream, from)
	pos := from
	for {
		r, err := c.Next()
		if err == io.EOF {
			return pos
		}
		if err != nil {
			t.Fatalf("Next at %d: %v", pos, err)
		}
		if r.Offset != pos || r.Owner != k.Owner || r.Stream != k.Stream || len(r.Payload) == 0 {
			t.Fatalf("Next = {%d/%d off %d len %d}, want offset %d of %v", r.Owner, r.Stream, r.Offset, len(r.Payload), pos, k)
		}
		if !bytes.Equal(r.Payload, pattern(k, r.Offset, len(r.Payload))) {
			t.Fatalf("Next at %d: payload differs from what was written", pos)
		}
		pos = r.End()
	}
}

func TestAppendRead(t *testing.T) {
	s := open(t, t.TempDir(), Options{})
	defer s.Close()
	a, b := Key{1, 10}, Key{1, 11}
	var off uint64 = 1000 // a stream may start anywhere
	for i := range 50 {
		mustAppend(t, s, rec(a, off, 10+i))
		off += uint64(10 + i)
		mustAppend(t, s, rec(b, uint64(i*7), 7))
	}
	if got := readAll(t, s, a, 1000); got != off {
		t.Errorf("stream a ends at %d, want %d", got, off)
	}
	if got := readAll(t, s, b, 0); got != 350 {
		t.Errorf("stream b ends at %d, want 350", got)
	}
	// From the middle of a record: trimmed to start there.
	c := s.Read(a.Owner, a.Stream, 1005)
	r, err := c.Next()
	if err != nil || r.Offset != 1005 || len(r.Payload) != 5 {
		t.Fatalf("Next from 1005 = off %d len %d, %v; want off 1005 len 5", r.Offset, len(r.Payload), err)
	}
	if info, ok := s.Stream(1, 10); !ok || info.Low != 1000 || info.End != off {
		t.Errorf("Stream(1, 10) = %+v, %v; want Low 1000 End %d", info, ok, off)
	}
	want := []StreamInfo{{a, 1000, off}, {b, 0, 350}}
	if d := cmp.Diff(want, s.Streams(1)); d != "" {
		t.Errorf("Streams(1) (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]uint64{1}, s.Owners()); d != "" {
		t.Errorf("Owners() (-want +got):\n%s", d)
	}
	if st := s.Stats(); st.Appends.Load() != 100 || st.Streams.Load() != 2 || st.Records.Load() != 100 {
		t.Errorf("Stats appends, streams, records = %d, %d, %d; want 100, 2, 100", st.Appends.Load(), st.Streams.Load(), st.Records.Load())
	}
}

func TestCursorFollowsAppends(t *testing.T) {
	s := open(t, t.TempDir(), Options{Sync: SyncNever})
	defer s.Close()
	k := Key{2, 2}
	c := s.Read(2, 2, 0)
	if _, err := c.Next(); err != io.EOF {
		t.Fatalf("Next on a missing stream = %v, want io.EOF", err)
	}
	mustAppend(t, s, rec(k, 0, 100))
	if r, err := c.Next(); err != nil || r.End() != 100 {
		t.Fatalf("Next = %v, %v", r.End(), err)
	}
	if _, err := c.Next(); err != io.EOF {
		t.Fatalf("Next at end = %v, want io.EOF", err)
	}
	mustAppend(t, s, rec(k, 100, 50))
	if r, err := c.Next(); err != nil || r.Offset != 100 || r.End() != 150 {
		t.Fatalf("Next after append = %d..%d, %v", r.Offset, r.End(), err)
	}
}

func TestAppendIdempotent(t *testing.T) {
	k := Key{3, 1}
	tests := []struct {
		name    string
		r       Record
		wantErr error
		wantEnd uint64
	}{
		{"exact duplicate", rec(k, 100, 100), nil, 300},
		{"duplicate across records", rec(k, 50, 200), nil, 300},
		{"overlap plus new suffix", rec(k, 250, 100), nil, 350},
		{"contiguous", rec(k, 300, 10), nil, 310},
		{"gap", rec(k, 301, 10), ErrGap, 300},
		{"conflicting byte", func() Record { r := rec(k, 120, 10); r.Payload[3] ^= 1; return r }(), ErrConflict, 300},
		{"conflict in overlap, new suffix", func() Record { r := rec(k, 290, 20); r.Payload[0] ^= 1; return r }(), ErrConflict, 300},
		{"below start of stream", rec(k, 0, 10), nil, 300},
		{"kind 0", Record{Owner: 3, Stream: 1, Offset: 300, Payload: []byte{1}}, ErrInvalid, 300},
		{"empty", Record{Kind: KindData, Owner: 3, Stream: 1, Offset: 300}, ErrInvalid, 300},
		{"too large", Record{Kind: KindData, Owner: 3, Stream: 1, Offset: 300, Payload: make([]byte, record.MaxPayload+1)}, ErrInvalid, 300},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := open(t, t.TempDir(), Options{})
			defer s.Close()
			mustAppend(t, s, rec(k, 0, 100)) // the stream starts at 0
			mustAppend(t, s, rec(k, 100, 100))
			mustAppend(t, s, rec(k, 200, 100))
			err := s.Append(tt.r)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("Append = %v, want %v", err, tt.wantErr)
			}
			var e *Error
			if err != nil && (!errors.As(err, &e) || e.Op != "append") {
				t.Errorf("Append error %T %v is not an *Error with Op append", err, err)
			}
			info, _ := s.Stream(k.Owner, k.Stream)
			if info.End != tt.wantEnd {
				t.Errorf("End = %d, want %d", info.End, tt.wantEnd)
			}
			readAll(t, s, k, 0)
		})
	}
}

func TestTruncate(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{SegmentSize: MinSegmentSize})
	a, b := Key{1, 1}, Key{1, 2}
	// Interleave two streams across many segments.
	for i := range 200 {
		mustAppend(t, s, rec(a, uint64(i*100), 100))
		if i < 20 {
			mustAppend(t, s, rec(b, uint64(i*100), 100))
		}
	}
	segsBefore := s.Stats().Segments.Load()
	if segsBefore < 5 {
		t.Fatalf("only %d segments; the test needs several", segsBefore)
	}
	if err := s.Truncate(1, 1, 15050); err != nil {
		t.Fatal(err)
	}
	// b still holds the first segment.
	if _, err := os.Stat(filepath.Join(dir, segName(1))); err != nil {
		t.Errorf("first segment dropped while b lives in it: %v", err)
	}
	if err := s.Truncate(1, 2, 2000); err != nil { // all of b
		t.Fatal(err)
	}
	if got := s.Stats().Segments.Load(); got >= segsBefore {
		t.Errorf("segments after truncating = %d, before %d; want fewer", got, segsBefore)
	}
	check := func(s *Store) {
		t.Helper()
		if _, err := s.Read(1, 1, 15049).Next(); !errors.Is(err, ErrTruncated) {
			t.Errorf("Read below low mark = %v, want ErrTruncated", err)
		}
		if got := readAll(t, s, a, 15050); got != 20000 {
			t.Errorf("a ends at %d, want 20000", got)
		}
		if info, _ := s.Stream(1, 2); info.Low != 2000 || info.End != 2000 {
			t.Errorf("b = %+v, want Low = End = 2000", info)
		}
		// Below the mark: accepted as already stored.
		if err := s.Append(rec(b, 1900, 100)); err != nil {
			t.Errorf("Append below low mark = %v, want nil", err)
		}
	}
	check(s)
	s.Close()
	// The marks survive a reopen; truncated bytes stay gone.
	s = open(t, dir, Options{SegmentSize: MinSegmentSize})
	defer s.Close()
	check(s)
	// Truncating past the end moves the end.
	if err := s.Truncate(1, 2, 5000); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(rec(b, 4000, 100)); err != nil {
		t.Errorf("Append below moved end = %v", err)
	}
	if err := s.Append(rec(b, 5100, 100)); !errors.Is(err, ErrGap) {
		t.Errorf("Append past moved end = %v, want ErrGap", err)
	}
	mustAppend(t, s, rec(b, 5000, 100))
	if got := readAll(t, s, b, 5000); got != 5100 {
		t.Errorf("b ends at %d, want 5100", got)
	}
}

func TestReopenRecoversIndex(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 8 << 10, Sync: SyncNever}
	s := open(t, dir, o)
	ends := map[Key]uint64{}
	for i := range 600 {
		k := Key{uint64(i % 3), uint64(i % 5)}
		n := 1 + (i*37)%500
		mustAppend(t, s, rec(k, ends[k], n))
		ends[k] += uint64(n)
	}
	stats := s.Stats()
	bytesBefore, recsBefore := stats.Bytes.Load(), stats.Records.Load()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir, o)
	defer s.Close()
	for k, end := range ends {
		if got := readAll(t, s, k, 0); got != end {
			t.Errorf("%v ends at %d after reopen, want %d", k, got, end)
		}
	}
	if b, r := s.Stats().Bytes.Load(), s.Stats().Records.Load(); b != bytesBefore || r != recsBefore {
		t.Errorf("after reopen bytes, records = %d, %d; want %d, %d", b, r, bytesBefore, recsBefore)
	}
	// Appends continue where they stopped.
	k := Key{0, 0}
	mustAppend(t, s, rec(k, ends[k], 10))
}

func segFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil || len(m) == 0 {
		t.Fatalf("no segments in %s: %v", dir, err)
	}
	return m
}

func flipByte(t *testing.T, path string, pos int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, pos); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, pos); err != nil {
		t.Fatal(err)
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// The recovery policy: a damaged tail is cut, damage followed by valid
// records fails Open with a CorruptError, in any segment.
func TestRecoveryPolicy(t *testing.T) {
	k := Key{7, 7}
	const n, size = 40, 100 // records of 140 bytes
	recLen := int64(record.HeaderLen + size)
	setup := func(t *testing.T, segSize int64) string {
		dir := t.TempDir()
		s := open(t, dir, Options{SegmentSize: segSize})
		for i := range n {
			mustAppend(t, s, rec(k, uint64(i*size), size))
		}
		s.Close()
		return dir
	}
	tests := []struct {
		name     string
		segSize  int64
		damage   func(t *testing.T, segs []string)
		wantErr  bool
		wantEnd  uint64
		wantTorn uint64
	}{
		{"clean", 1 << 20, func(*testing.T, []string) {}, false, n * size, 0},
		{"partial last record", 1 << 20, func(t *testing.T, segs []string) {
			os.Truncate(segs[0], n*recLen-7)
		}, false, (n - 1) * size, uint64(recLen - 7)},
		{"partial header", 1 << 20, func(t *testing.T, segs []string) {
			os.Truncate(segs[0], (n-1)*recLen+3)
		}, false, (n - 1) * size, 3},
		{"bad checksum in last record", 1 << 20, func(t *testing.T, segs []string) {
			flipByte(t, segs[0], (n-1)*recLen+60)
		}, false, (n - 1) * size, uint64(recLen)},
		{"zeros after last record", 1 << 20, func(t *testing.T, segs []string) {
			f, _ := os.OpenFile(segs[0], os.O_WRONLY|os.O_APPEND, 0)
			f.Write(make([]byte, 4096))
			f.Close()
		}, false, n * size, 4096},
		{"bad checksum mid segment", 1 << 20, func(t *testing.T, segs []string) {
			flipByte(t, segs[0], 5*recLen+60)
		}, true, 0, 0},
		{"bad magic mid segment", 1 << 20, func(t *testing.T, segs []string) {
			flipByte(t, segs[0], 5*recLen)
		}, true, 0, 0},
		{"bad length mid segment", 1 << 20, func(t *testing.T, segs []string) {
			flipByte(t, segs[0], 5*recLen+11)
		}, true, 0, 0},
		{"torn tail of an older segment", MinSegmentSize, func(t *testing.T, segs []string) {
			os.Truncate(segs[0], fileSize(t, segs[0])-5)
		}, true, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := setup(t, tt.segSize)
			tt.damage(t, segFiles(t, dir))
			s, err := Open(dir, Options{SegmentSize: tt.segSize, Logf: t.Logf})
			if tt.wantErr {
				var ce *CorruptError
				if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.Path == "" {
					t.Fatalf("Open = %v, want *CorruptError", err)
				}
				t.Logf("Open: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("Open = %v", err)
			}
			defer s.Close()
			if got := readAll(t, s, k, 0); got != tt.wantEnd {
				t.Errorf("stream ends at %d after recovery, want %d", got, tt.wantEnd)
			}
			if got := s.Stats().TornBytes.Load(); got != tt.wantTorn {
				t.Errorf("TornBytes = %d, want %d", got, tt.wantTorn)
			}
			// The store is usable: the next append lands right after.
			mustAppend(t, s, rec(k, tt.wantEnd, size))
			s.Close()
			s2 := open(t, dir, Options{SegmentSize: tt.segSize})
			defer s2.Close()
			if got := readAll(t, s2, k, 0); got != tt.wantEnd+size {
				t.Errorf("after append and reopen, ends at %d, want %d", got, tt.wantEnd+size)
			}
		})
	}
}

// Damage after Open is reported by the reader, never served.
func TestReadDetectsCorruption(t *testing.T) {
	dir := t.TempDir()
	k := Key{1, 1}
	s := open(t, dir, Options{MemoryLimit: 1}) // nothing cached: reads hit the disk
	defer s.Close()
	for i := range 10 {
		mustAppend(t, s, rec(k, uint64(i*100), 100))
	}
	flipByte(t, segFiles(t, dir)[0], 3*140+50)
	c := s.Read(1, 1, 0)
	for i := 0; ; i++ {
		r, err := c.Next()
		if err == nil {
			if i >= 3 {
				t.Fatalf("served record %d (offset %d) over damaged bytes", i, r.Offset)
			}
			continue
		}
		if !errors.Is(err, ErrCorrupt) || !errors.Is(err, record.ErrCorrupt) {
			t.Fatalf("Next over damage = %v, want corruption", err)
		}
		t.Logf("Next: %v", err)
		break
	}
}

func TestMarksUnknownStreamIsCorrupt(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{})
	mustAppend(t, s, rec(Key{1, 1}, 0, 10))
	s.Close()
	for i := range 2 {
		os.Remove(marksPath(dir, i))
	}
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open without marks = %v, want ErrCorrupt", err)
	}
}

// A torn marks write spoils one slot; the other still serves.
func TestMarksTornSlot(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{})
	k := Key{1, 1}
	for i := range 10 {
		mustAppend(t, s, rec(k, uint64(i*10), 10))
	}
	if err := s.Truncate(1, 1, 50); err != nil {
		t.Fatal(err)
	}
	cur := s.marks.cur
	s.Close()
	flipByte(t, marksPath(dir, cur), 30) // the newest slot: fall back to the previous one
	s = open(t, dir, Options{})
	defer s.Close()
	if info, _ := s.Stream(1, 1); info.Low != 0 || info.End != 100 {
		t.Errorf("after losing the newest marks slot: %+v, want Low 0 End 100", info)
	}
	readAll(t, s, k, 0)
}

func TestQuota(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: MinSegmentSize, MaxBytes: 64 << 10}
	s := open(t, dir, o)
	k := Key{1, 1}
	var off uint64
	var err error
	for {
		if err = s.Append(rec(k, off, 1000)); err != nil {
			break
		}
		off += 1000
	}
	if !errors.Is(err, ErrFull) || !errors.Is(err, ErrQuota) {
		t.Fatalf("Append past quota = %v, want ErrFull wrapping ErrQuota", err)
	}
	t.Logf("at %d bytes: %v", s.Stats().Bytes.Load(), err)
	if got := s.Stats().Bytes.Load(); got > o.MaxBytes {
		t.Errorf("Bytes = %d > quota %d", got, o.MaxBytes)
	}
	if err := s.Append(rec(k, off, 1000)); !errors.Is(err, ErrFull) {
		t.Fatalf("second Append past quota = %v, want ErrFull", err)
	}
	if err := s.Truncate(1, 1, off/2); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, s, rec(k, off, 1000))
	s.Close()
	s = open(t, dir, o)
	defer s.Close()
	if got := readAll(t, s, k, off/2); got != off+1000 {
		t.Errorf("ends at %d, want %d", got, off+1000)
	}
}

func TestLockedDir(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{})
	defer s.Close()
	if s2, err := Open(dir, Options{}); err == nil {
		s2.Close()
		t.Fatal("second Open of the same dir succeeded")
	} else {
		t.Logf("second Open: %v", err)
	}
}

func TestClosed(t *testing.T) {
	s := open(t, t.TempDir(), Options{Sync: SyncInterval, SyncInterval: 1e6})
	mustAppend(t, s, rec(Key{1, 1}, 0, 10))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if err := s.Append(rec(Key{1, 1}, 10, 10)); !errors.Is(err, ErrClosed) {
		t.Errorf("Append after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Read(1, 1, 0).Next(); !errors.Is(err, ErrClosed) {
		t.Errorf("Next after Close = %v, want ErrClosed", err)
	}
}

func TestSyncPolicies(t *testing.T) {
	for _, p := range []SyncPolicy{SyncAlways, SyncInterval, SyncNever} {
		t.Run(p.String(), func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, Options{Sync: p, SyncInterval: 1e6})
			for i := range 20 {
				mustAppend(t, s, rec(Key{1, 1}, uint64(i*10), 10))
			}
			syncs := s.Stats().Syncs.Load()
			switch p {
			case SyncAlways:
				if syncs < 20 {
					t.Errorf("Syncs = %d with SyncAlways, want ≥ 20", syncs)
				}
			case SyncNever:
				if syncs != 0 {
					t.Errorf("Syncs = %d with SyncNever, want 0", syncs)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = open(t, dir, Options{Sync: p})
			defer s.Close()
			readAll(t, s, Key{1, 1}, 0)
		})
	}
}

func TestParseSyncPolicy(t *testing.T) {
	for _, s := range []string{"always", "interval", "never"} {
		p, err := ParseSyncPolicy(s)
		if err != nil || p.String() != s {
			t.Errorf("ParseSyncPolicy(%q) = %v, %v", s, p, err)
		}
	}
	var p SyncPolicy
	if err := p.UnmarshalText([]byte("sometimes")); err == nil {
		t.Error(`UnmarshalText("sometimes") succeeded`)
	}
}

func TestOptionsValidated(t *testing.T) {
	for _, o := range []Options{{SegmentSize: 100}, {MaxBytes: -1}, {Sync: 7}, {MemoryLimit: -1}} {
		if s, err := Open(t.TempDir(), o); err == nil {
			s.Close()
			t.Errorf("Open(%+v) succeeded", o)
		}
	}
}

// A new replica catches up from another store with Streams and cursors;
// feeding it everything twice changes nothing.
func TestReplicaCatchUp(t *testing.T) {
	src := open(t, t.TempDir(), Options{SegmentSize: MinSegmentSize, MemoryLimit: 4 << 10})
	defer src.Close()
	dst := open(t, t.TempDir(), Options{})
	defer dst.Close()
	for i := range 300 {
		k := Key{5, uint64(i % 4)}
		info, _ := src.Stream(k.Owner, k.Stream)
		mustAppend(t, src, rec(k, info.End, 50+i))
	}
	src.Truncate(5, 0, 3000)
	for range 2 {
		for _, info := range src.Streams(5) {
			c := src.Read(info.Owner, info.Stream, info.Low)
			for {
				r, err := c.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				mustAppend(t, dst, r)
			}
		}
	}
	if d := cmp.Diff(src.Streams(5), dst.Streams(5)); d != "" {
		t.Errorf("replica streams (-src +dst):\n%s", d)
	}
	for _, info := range dst.Streams(5) {
		readAll(t, dst, info.Key, info.Low)
	}
}

// Writers, followers and a truncater at once (run with -race); Close stops
// every goroutine the store started.
func TestConcurrent(t *testing.T) {
	for _, p := range []SyncPolicy{SyncAlways, SyncInterval} {
		t.Run(p.String(), func(t *testing.T) {
			goroutines := runtime.NumGoroutine()
			dir := t.TempDir()
			s := open(t, dir, Options{Sync: p, SyncInterval: time.Millisecond, SegmentSize: 16 << 10, MemoryLimit: 8 << 10})
			const writers, perWriter = 6, 150
			var wg sync.WaitGroup
			done := make(chan struct{})
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					k := Key{uint64(w % 2), uint64(w)}
					var off uint64
					for i := range perWriter {
						n := 1 + (i*131+w)%700
						if err := s.Append(rec(k, off, n)); err != nil {
							t.Errorf("Append: %v", err)
							return
						}
						off += uint64(n)
					}
				}()
			}
			var followers sync.WaitGroup
			for f := range 2 {
				followers.Add(1)
				go func() {
					defer followers.Done()
					k := Key{uint64(f % 2), uint64(f)}
					c := s.Read(k.Owner, k.Stream, 0)
					for {
						r, err := c.Next()
						switch {
						case err == io.EOF:
							select {
							case <-done:
								return
							default:
								runtime.Gosched()
								continue
							}
						case errors.Is(err, ErrTruncated):
							info, _ := s.Stream(k.Owner, k.Stream)
							c = s.Read(k.Owner, k.Stream, info.Low)
							continue
						case err != nil:
							t.Errorf("Next: %v", err)
							return
						}
						if !bytes.Equal(r.Payload, pattern(k, r.Offset, len(r.Payload))) {
							t.Errorf("follower read wrong bytes at %d", r.Offset)
							return
						}
					}
				}()
			}
			followers.Add(1)
			go func() {
				defer followers.Done()
				for i := 0; ; i++ {
					select {
					case <-done:
						return
					default:
					}
					k := Key{uint64(i % 2), uint64(i % writers)}
					if info, ok := s.Stream(k.Owner, k.Stream); ok && info.End > info.Low {
						if err := s.Truncate(k.Owner, k.Stream, info.Low+(info.End-info.Low)/3); err != nil {
							t.Errorf("Truncate: %v", err)
						}
					}
					time.Sleep(time.Millisecond)
				}
			}()
			wg.Wait()
			close(done)
			followers.Wait()
			ends := map[Key]uint64{}
			for w := range writers {
				k := Key{uint64(w % 2), uint64(w)}
				info, _ := s.Stream(k.Owner, k.Stream)
				ends[k] = readAll(t, s, k, info.Low)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = open(t, dir, Options{})
			for k, end := range ends {
				info, _ := s.Stream(k.Owner, k.Stream)
				if got := readAll(t, s, k, info.Low); got != end {
					t.Errorf("%v after reopen ends at %d, want %d", k, got, end)
				}
			}
			s.Close()
			for i := 0; runtime.NumGoroutine() > goroutines; i++ {
				if i == 100 {
					t.Fatalf("%d goroutines after Close, %d before", runtime.NumGoroutine(), goroutines)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

func TestAppendBatch(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{})
	k := Key{4, 4}
	rs := []Record{rec(k, 0, 10), rec(k, 10, 10), rec(k, 5, 10), rec(k, 40, 10), rec(k, 20, 10)}
	n, err := s.AppendBatch(rs)
	if n != 3 || !errors.Is(err, ErrGap) {
		t.Fatalf("AppendBatch = %d, %v; want 3, ErrGap (record 3)", n, err)
	}
	var e *Error
	if !errors.As(err, &e) || e.Offset != 40 {
		t.Errorf("error %v does not name the failing record (offset 40)", err)
	}
	if syncs := s.Stats().Syncs.Load(); syncs != 1 {
		t.Errorf("Syncs = %d for one batch, want 1", syncs)
	}
	if n, err := s.AppendBatch(nil); n != 0 || err != nil {
		t.Errorf("AppendBatch(nil) = %d, %v", n, err)
	}
	s.Close()
	s = open(t, dir, Options{})
	defer s.Close()
	if got := readAll(t, s, k, 0); got != 20 {
		t.Errorf("after reopen ends at %d, want 20", got)
	}
}

// CopyOwner copies one owner's streams whole, across batches (a record
// bigger than a batch's buffer included), from disk and from the cache,
// leaves other owners alone and is idempotent; a truncated stream is
// copied from its low mark.
func TestCopyOwner(t *testing.T) {
	src := open(t, t.TempDir(), Options{SegmentSize: 8 << 20, MemoryLimit: 1 << 20})
	defer src.Close()
	dst := open(t, t.TempDir(), Options{})
	defer dst.Close()
	for i := range 400 {
		k := Key{7, uint64(i % 3)}
		n := 20000 + 97*i
		if i == 200 {
			n = copyBatch + copyBatch/2 // grows the buffer mid-batch
		}
		info, _ := src.Stream(k.Owner, k.Stream)
		mustAppend(t, src, rec(k, info.End, n))
		mustAppend(t, src, rec(Key{8, 0}, uint64(i*10), 10))
	}
	for range 2 {
		if _, err := dst.CopyOwner(src, 7); err != nil {
			t.Fatalf("CopyOwner = %v", err)
		}
	}
	if d := cmp.Diff(src.Streams(7), dst.Streams(7)); d != "" {
		t.Errorf("copied streams (-src +dst):\n%s", d)
	}
	for _, info := range dst.Streams(7) {
		readAll(t, dst, info.Key, 0)
	}
	if got := dst.Streams(8); len(got) != 0 {
		t.Errorf("owner 8 was copied too: %+v", got)
	}
	if _, err := dst.CopyOwner(dst, 7); !errors.Is(err, ErrInvalid) {
		t.Errorf("CopyOwner onto itself = %v, want ErrInvalid", err)
	}
	src.Truncate(8, 0, 500)
	if _, err := dst.CopyOwner(src, 8); err != nil {
		t.Fatalf("CopyOwner of a truncated stream = %v", err)
	}
	if d := cmp.Diff(src.Streams(8), dst.Streams(8)); d != "" {
		t.Errorf("copied truncated stream (-src +dst):\n%s", d)
	}
}

// AppendNext gives, record for record, the encodings of what Next gives,
// from the cache and from disk, trimmed where the cursor starts.
func TestAppendNext(t *testing.T) {
	s := open(t, t.TempDir(), Options{MemoryLimit: 4 << 10})
	defer s.Close()
	k := Key{3, 4}
	var off uint64
	for i := range 40 {
		mustAppend(t, s, rec(k, off, 100+i))
		off += uint64(100 + i)
	}
	next, appendNext := s.Read(k.Owner, k.Stream, 150), s.Read(k.Owner, k.Stream, 150)
	var buf []byte
	for {
		want, err := next.Next()
		var err2 error
		start := len(buf)
		buf, err2 = appendNext.AppendNext(buf)
		if err == io.EOF || err2 == io.EOF {
			if err != err2 {
				t.Fatalf("Next = %v, AppendNext = %v at the end", err, err2)
			}
			break
		}
		if err != nil || err2 != nil {
			t.Fatalf("Next = %v, AppendNext = %v", err, err2)
		}
		got, n, err := record.Decode(buf[start:])
		if err != nil || n != len(buf)-start {
			t.Fatalf("AppendNext's encoding: %d of %d bytes, %v", n, len(buf)-start, err)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Fatalf("AppendNext at %d (-Next +AppendNext):\n%s", want.Offset, d)
		}
	}
	if appendNext.Offset() != off {
		t.Errorf("AppendNext stopped at %d, want %d", appendNext.Offset(), off)
	}
}
