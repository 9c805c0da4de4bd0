package msglog

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"testing"

	"github.com/radic-project/radic/internal/testenv"
	"github.com/radic-project/radic/msglog/record"
)

// mountTmpfs mounts a tmpfs of the given size on a fresh directory,
// unmounted at cleanup even if the test fails.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	testenv.RequireRoot(t)
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs (needed to fill a disk): %v", err)
	}
	t.Cleanup(func() { // runs before TempDir's removal
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
			syscall.Unmount(dir, syscall.MNT_DETACH)
		}
	})
	return dir
}

// fill appends to the streams in turn until Append fails, and returns the
// error and the ends reached.
func fill(t *testing.T, s *Store, keys []Key, ends map[Key]uint64, rng func(int) int) error {
	t.Helper()
	for i := 0; ; i++ {
		k := keys[i%len(keys)]
		n := 1 + rng(3000)
		if err := s.Append(rec(k, ends[k], n)); err != nil {
			return err
		}
		ends[k] += uint64(n)
	}
}

// A full disk gives ErrFull wrapping ENOSPC and back-pressure, never
// corruption; Truncate frees space and appends resume.
func TestFullDisk(t *testing.T) {
	dir := mountTmpfs(t, "512k")
	rng := testenv.Rand(t)
	o := Options{SegmentSize: 64 << 10, Logf: t.Logf}
	s := open(t, dir, o)
	defer func() { s.Close() }()
	keys := []Key{{1, 1}, {1, 2}, {2, 1}}
	ends := map[Key]uint64{}
	err := fill(t, s, keys, ends, rng.IntN)
	if !errors.Is(err, ErrFull) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Append on a full disk = %v, want ErrFull wrapping ENOSPC", err)
	}
	var e *Error
	if !errors.As(err, &e) || e.Op != "append" {
		t.Errorf("error %v is not an *Error{Op: append}", err)
	}
	t.Logf("full at %d bytes, %d records: %v", s.Stats().Bytes.Load(), s.Stats().Records.Load(), err)
	// Back-pressure: the store keeps refusing, consistently.
	for i := range 5 {
		k := keys[i%len(keys)]
		if err := s.Append(rec(k, ends[k], 4000)); !errors.Is(err, ErrFull) {
			t.Fatalf("Append %d on a full disk = %v, want ErrFull", i, err)
		}
	}
	if got := s.Stats().FullErrors.Load(); got < 6 {
		t.Errorf("Stats.FullErrors = %d, want ≥ 6", got)
	}
	// A new stream needs marks space: refused cleanly or stored.
	if err := s.Append(rec(Key{9, 9}, 0, 10)); err != nil && !errors.Is(err, ErrFull) {
		t.Fatalf("Append of a new stream on a full disk = %v", err)
	}
	for _, k := range keys {
		if got := readAll(t, s, k, 0); got != ends[k] {
			t.Fatalf("%v reads to %d, want %d", k, got, ends[k])
		}
	}

	// Reopen: nothing torn, nothing corrupt.
	s.Close()
	s = open(t, dir, o)
	if got := s.Stats().TornBytes.Load(); got != 0 {
		t.Errorf("recovery after ENOSPC dropped %d torn bytes; failed writes must be cut back", got)
	}
	for _, k := range keys {
		if got := readAll(t, s, k, 0); got != ends[k] {
			t.Fatalf("after reopen %v reads to %d, want %d", k, got, ends[k])
		}
	}

	// Truncate (no new space needed) frees whole segments; appends resume.
	before := s.Stats().Bytes.Load()
	for _, k := range keys {
		if err := s.Truncate(k.Owner, k.Stream, ends[k]-ends[k]/4); err != nil {
			t.Fatalf("Truncate on a full disk: %v", err)
		}
	}
	after := s.Stats().Bytes.Load()
	if after >= before {
		t.Fatalf("Truncate freed nothing: %d -> %d bytes", before, after)
	}
	t.Logf("truncate freed %d bytes (%d segments dropped)", before-after, s.Stats().SegmentsDropped.Load())
	lows := map[Key]uint64{}
	for _, k := range keys {
		lows[k] = ends[k] - ends[k]/4
	}
	err = fill(t, s, keys, ends, rng.IntN)
	if !errors.Is(err, ErrFull) {
		t.Fatalf("refill = %v, want ErrFull", err)
	}
	if got := s.Stats().Bytes.Load(); got <= after {
		t.Errorf("no appends resumed after truncation (%d bytes)", got)
	}
	s.Close()
	s = open(t, dir, o)
	for _, k := range keys {
		if got := readAll(t, s, k, lows[k]); got != ends[k] {
			t.Fatalf("after refill and reopen %v reads to %d, want %d", k, got, ends[k])
		}
	}
}

// With a small memory limit, a large store keeps its memory under the limit
// and serves every record (from disk).
func TestBoundedMemory(t *testing.T) {
	const limit = 256 << 10
	const total = 32 << 20
	dir := t.TempDir()
	o := Options{MemoryLimit: limit, SegmentSize: 1 << 20, Sync: SyncNever}
	s := open(t, dir, o)
	rng := testenv.Rand(t)
	var keys []Key
	for i := range 16 {
		keys = append(keys, Key{uint64(i / 4), uint64(i)})
	}
	ends := map[Key]uint64{}
	var heap0 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&heap0)
	var written, maxMem int64
	for written < total {
		k := keys[rng.IntN(len(keys))]
		n := 1 + rng.IntN(8<<10)
		mustAppend(t, s, rec(k, ends[k], n))
		ends[k] += uint64(n)
		written += int64(n)
		maxMem = max(maxMem, s.Stats().MemBytes.Load())
	}
	if maxMem > limit {
		t.Errorf("MemBytes reached %d, limit %d", maxMem, limit)
	}
	var heap1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&heap1)
	grown := int64(heap1.HeapAlloc) - int64(heap0.HeapAlloc)
	t.Logf("wrote %d MiB in %d records; max MemBytes %d (index %d); Go heap grew %d KiB",
		written>>20, s.Stats().Records.Load(), maxMem, s.Stats().IndexBytes.Load(), grown>>10)
	if grown > 4*limit {
		t.Errorf("Go heap grew by %d bytes for a %d-byte limit", grown, limit)
	}
	for _, k := range keys {
		if got := readAll(t, s, k, 0); got != ends[k] {
			t.Fatalf("%v reads to %d, want %d", k, got, ends[k])
		}
	}
	if s.Stats().DiskReads.Load() == 0 || s.Stats().CacheReads.Load() == 0 {
		t.Errorf("reads: %d from disk, %d from memory; want both", s.Stats().DiskReads.Load(), s.Stats().CacheReads.Load())
	}
	s.Close()
	s = open(t, dir, o)
	defer s.Close()
	if got := s.Stats().MemBytes.Load(); got > limit {
		t.Errorf("after reopen MemBytes = %d, limit %d", got, limit)
	}
	k := keys[3]
	if got := readAll(t, s, k, 0); got != ends[k] {
		t.Fatalf("%v reads to %d after reopen, want %d", k, got, ends[k])
	}
}

func BenchmarkAppend(b *testing.B) {
	for _, p := range []SyncPolicy{SyncAlways, SyncInterval, SyncNever} {
		for _, size := range []int{64, 4096, 65536} {
			b.Run(fmt.Sprintf("%v/%d", p, size), func(b *testing.B) {
				s, err := Open(b.TempDir(), Options{Sync: p})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				r := rec(Key{1, 1}, 0, size)
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := s.Append(r); err != nil {
						b.Fatal(err)
					}
					r.Offset += uint64(size)
				}
			})
		}
	}
}

// Concurrent appenders on separate streams share fsyncs (group commit).
func BenchmarkAppendParallel(b *testing.B) {
	for _, size := range []int{64, 4096} {
		b.Run(fmt.Sprintf("always/%d", size), func(b *testing.B) {
			s, err := Open(b.TempDir(), Options{Sync: SyncAlways})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			var next = make(chan uint64, 1024)
			for i := range uint64(1024) {
				next <- i
			}
			b.SetBytes(int64(size))
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				id := <-next
				r := rec(Key{1, id}, 0, size)
				for pb.Next() {
					if err := s.Append(r); err != nil {
						b.Error(err)
						return
					}
					r.Offset += uint64(size)
				}
			})
			b.ReportMetric(float64(s.Stats().Syncs.Load())/float64(b.N), "fsyncs/op")
		})
	}
}

// Replay from disk (nothing cached) of a stream interleaved with others.
func BenchmarkReplay(b *testing.B) {
	s, err := Open(b.TempDir(), Options{Sync: SyncNever, MemoryLimit: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const size = 1024
	for i := range 16 << 10 {
		k := Key{1, uint64(i % 4)}
		if err := s.Append(rec(k, uint64(i/4*size), size)); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(4 << 20) // one stream
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c := s.Read(1, 0, 0)
		for {
			if _, err := c.Next(); err != nil {
				break
			}
		}
	}
}

// One fsync per batch of 64 records.
func BenchmarkAppendBatch(b *testing.B) {
	for _, size := range []int{64, 4096} {
		b.Run(fmt.Sprintf("always/%dx64", size), func(b *testing.B) {
			s, err := Open(b.TempDir(), Options{Sync: SyncAlways})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			batch := make([]Record, 64)
			for j := range batch {
				batch[j] = rec(Key{1, 1}, 0, size)
			}
			var off uint64
			b.SetBytes(int64(size * len(batch)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range batch {
					batch[j].Offset = off
					off += uint64(size)
				}
				if _, err := s.AppendBatch(batch); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// The pessimistic log's path on a protector: a shipment of encoded records
// (as radicd's drain sends them) stored without fsync (the ack does not
// wait for it): a 1 MiB record, and a shipment of two 8 B records.
func BenchmarkAppendShipment(b *testing.B) {
	for _, tc := range []struct {
		name       string
		size, recs int
	}{{"1MiB", 1 << 20, 1}, {"8Bx2", 8, 2}} {
		var (
			enc []byte
			off uint64
		)
		payload := rec(Key{1, 1}, 0, tc.size).Payload
		encode := func() []byte {
			enc = enc[:0]
			for range tc.recs {
				r := Record{Kind: record.KindData, Owner: 1, Stream: 1, Offset: off, Payload: payload}
				enc = record.AppendRecord(enc, &r)
				off += uint64(tc.size)
			}
			return enc
		}
		b.Run("decode+AppendBatch/"+tc.name, func(b *testing.B) {
			s, err := Open(b.TempDir(), Options{Sync: SyncNever})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			off = 0
			b.SetBytes(int64(tc.size * tc.recs))
			var rs []Record
			for b.Loop() {
				body := encode()
				rs = rs[:0]
				for len(body) > 0 {
					r, n, err := record.Decode(body)
					if err != nil {
						b.Fatal(err)
					}
					r.Payload = bytes.Clone(r.Payload)
					rs = append(rs, r)
					body = body[n:]
				}
				if _, err := s.AppendBatch(rs); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("decode+Write-encoded/"+tc.name, func(b *testing.B) {
			s, err := Open(b.TempDir(), Options{Sync: SyncNever})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			off = 0
			b.SetBytes(int64(tc.size * tc.recs))
			var rs []Record
			var encs [][]byte
			for b.Loop() {
				body := bytes.Clone(encode())
				rs, encs = rs[:0], encs[:0]
				for len(body) > 0 {
					r, n, err := record.Decode(body)
					if err != nil {
						b.Fatal(err)
					}
					rs = append(rs, r)
					encs = append(encs, body[:n])
					body = body[n:]
				}
				if _, err := s.Write(rs, encs); err != nil {
					b.Fatal(err)
				}
			}
		})
		// Write: the payloads alias a fresh
		// buffer per shipment, handed to the store (Write: no copy for
		// the cache, no fsync in the call).
		b.Run("decode+Write/"+tc.name, func(b *testing.B) {
			s, err := Open(b.TempDir(), Options{Sync: SyncNever})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			off = 0
			b.SetBytes(int64(tc.size * tc.recs))
			var rs []Record
			for b.Loop() {
				body := bytes.Clone(encode())
				rs = rs[:0]
				for len(body) > 0 {
					r, n, err := record.Decode(body)
					if err != nil {
						b.Fatal(err)
					}
					rs = append(rs, r)
					body = body[n:]
				}
				if _, err := s.Write(rs, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
