package msglog

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/radic-project/radic/msglog/record"
)

// Record is the unit of storage; see package record for its encoding.
type Record = record.Record

// Record kinds, re-exported for callers that do not import package record.
const (
	KindData        = record.KindData
	KindDeterminant = record.KindDeterminant
)

// Key names a stream: whose data it is (Owner, e.g. a logical process id)
// and which stream of it (Stream, e.g. connection id and direction, or its
// determinants). Both are opaque to the store.
type Key struct {
	Owner  uint64
	Stream uint64
}

// StreamInfo describes one stream: its bytes [Low, End) are stored.
type StreamInfo struct {
	Key
	Low uint64 // first stored offset (everything below was truncated)
	End uint64 // offset the next Append must start at (or overlap)
}

// Stats are the store's counters, safe to read at any time (for metrics).
// Gauges are Int64, monotonic counters Uint64.
type Stats struct {
	Bytes      atomic.Int64 // bytes of files on disk (segments + marks)
	Records    atomic.Int64 // records in segment files (truncated ones count until their segment is dropped)
	Segments   atomic.Int64 // segment files
	Streams    atomic.Int64 // streams known
	MemBytes   atomic.Int64 // CacheBytes + IndexBytes, kept ≤ Options.MemoryLimit unless the index alone exceeds it
	CacheBytes atomic.Int64 // cached recent records
	IndexBytes atomic.Int64 // sparse index

	Appends         atomic.Uint64 // successful Append calls (including duplicates)
	AppendedBytes   atomic.Uint64 // payload bytes newly stored
	Duplicates      atomic.Uint64 // Appends that stored nothing new
	Conflicts       atomic.Uint64 // Appends refused with ErrConflict
	FullErrors      atomic.Uint64 // Appends refused with ErrFull
	Syncs           atomic.Uint64 // fsyncs of segment files
	Truncations     atomic.Uint64 // Truncate calls that moved a low mark
	SegmentsDropped atomic.Uint64 // segment files deleted
	CacheReads      atomic.Uint64 // records served from memory
	DiskReads       atomic.Uint64 // records served from disk
	TornBytes       atomic.Uint64 // bytes of torn tails dropped by recovery
}

// Memory costs charged to Stats.MemBytes (estimates of Go object sizes).
const (
	costStream = 160
	costExtent = 96
	costPoint  = 16
	costCached = 64 // per cached record, plus its payload
	costQueued = 24 // per eviction-queue entry
	// A sparse index point is added every indexEveryBytes of a stream's
	// data or indexEveryRecords of its records, whichever comes first.
	indexEveryBytes   = 32 << 10
	indexEveryRecords = 64
)

type point struct {
	off uint64
	pos int64
}

// An extent is a stream's run of records inside one segment.
type extent struct {
	seg         *segment
	first, end  uint64
	points      []point
	sinceBytes  uint64
	sinceRecord int
}

type cached struct {
	off     uint64
	kind    record.Kind
	payload []byte
}

type stream struct {
	key      Key
	low, end uint64
	extents  []*extent     // contiguous, ascending
	tail     deque[cached] // a contiguous suffix of the stream, in memory
}

type queued struct {
	st  *stream
	off uint64
}

// Store is the critical-data store: a directory of append-only segment
// files holding records of many streams. All methods are safe for
// concurrent use.
type Store struct {
	dir   string
	opts  Options
	stats Stats
	lock  *os.File // flock'ed, so one process owns dir

	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	// Lock order: syncMu before mu.
	syncMu sync.Mutex
	synced uint64 // +checklocks:syncMu; write sequence known durable

	mu         sync.RWMutex
	closed     bool            // +checklocks:mu
	broken     error           // +checklocks:mu
	streams    map[Key]*stream // +checklocks:mu
	segs       []*segment      // +checklocks:mu; ascending id, last is active
	written    uint64          // +checklocks:mu; write sequence
	marks      *marks          // +checklocks:mu
	diskBytes  int64           // +checklocks:mu
	indexBytes int64           // +checklocks:mu
	cacheBytes int64           // +checklocks:mu
	queue      deque[queued]   // +checklocks:mu; cached records, oldest first
	encBuf     []byte          // +checklocks:mu
	cmpCursor  *Cursor         // +checklocks:mu; used for conflict checks
}

// Open opens the store in dir, creating it if needed, and recovers it: it
// reads every segment, drops a torn tail of the last one (a partial or
// damaged record after which nothing valid follows: a write that never
// completed, so never acknowledged under SyncAlways), and rebuilds the
// index.
//
// Corruption policy: damage anywhere else — a bad magic, length or checksum
// followed by valid records, a damaged non-last segment, a stream with a gap
// or overlap, a record of a stream the marks do not know — makes Open fail
// with a *CorruptError naming the file and byte position. Nothing is skipped
// silently; the operator moves the damaged segment aside (its data is on the
// other k replicas) and restarts.
//
// Only one process may have dir open (flock).
func Open(dir string, opts Options) (*Store, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("msglog: open: %w", err)
	}
	s := &Store{dir: dir, opts: opts, streams: make(map[Key]*stream), done: make(chan struct{})}
	if err := s.lockDir(); err != nil {
		return nil, err
	}
	if err := s.recover(); err != nil {
		s.closeFiles()
		return nil, err
	}
	s.cmpCursor = &Cursor{s: s}
	s.publishLocked()
	if opts.Sync == SyncInterval {
		s.wg.Add(1)
		go s.routineSync()
	}
	return s, nil
}

func (s *Store) lockDir() error {
	p := filepath.Join(s.dir, "LOCK")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("msglog: open: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("msglog: open: %s is in use by another process: %w", s.dir, err)
	}
	s.lock = f
	return nil
}

func (s *Store) recover() error {
	m, ents, err := openMarks(s.dir)
	if err != nil {
		return fmt.Errorf("msglog: open: %w", err)
	}
	s.marks = m
	if err := syncDir(s.dir); err != nil { // the marks files may be new
		return fmt.Errorf("msglog: open: %w", err)
	}
	for _, e := range ents {
		s.streams[e.key] = &stream{key: e.key, low: e.low, end: e.low}
		s.indexBytes += costStream
	}
	ids, err := listSegments(s.dir)
	if err != nil {
		return fmt.Errorf("msglog: open: %w", err)
	}
	var sc scanner
	for i, id := range ids {
		p := filepath.Join(s.dir, segName(id))
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("msglog: open: %w", err)
		}
		seg := &segment{id: id, path: p, f: f}
		s.segs = append(s.segs, seg)
		fi, err := f.Stat()
		if err != nil {
			return fmt.Errorf("msglog: open: %w", err)
		}
		size := fi.Size()
		sc.reset(seg, size)
		last := i == len(ids)-1
		var pos int64
		for pos < size {
			rec, n, err := sc.record(pos)
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF
				}
				if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, record.ErrCorrupt) {
					return fmt.Errorf("msglog: open: read %s: %w", p, err)
				}
				torn := false
				if last {
					after, rerr := validRecordAfter(f, pos+1, size)
					if rerr != nil {
						return fmt.Errorf("msglog: open: read %s: %w", p, rerr)
					}
					torn = !after
				}
				if !torn {
					return &CorruptError{Path: p, Pos: pos, Err: err}
				}
				if err := f.Truncate(pos); err != nil {
					return fmt.Errorf("msglog: open: drop torn tail of %s: %w", p, err)
				}
				if err := f.Sync(); err != nil {
					return fmt.Errorf("msglog: open: drop torn tail of %s: %w", p, err)
				}
				s.opts.Logf("msglog: %s: dropped torn tail of %d bytes at byte %d (%v)", p, size-pos, pos, err)
				s.stats.TornBytes.Add(uint64(size - pos))
				size = pos
				break
			}
			if err := s.recoverRecord(seg, pos, &rec); err != nil {
				return &CorruptError{Path: p, Pos: pos, Err: err}
			}
			seg.size += int64(n)
			seg.records++
			pos += int64(n)
		}
		s.diskBytes += seg.size
	}
	// Segments that became dead before a crash.
	for _, seg := range s.segs[:max(len(s.segs)-1, 0)] {
		if seg.extents == 0 {
			s.dropSegmentLocked(seg)
		}
	}
	s.segs = slices.DeleteFunc(s.segs, func(g *segment) bool { return g.f == nil })
	if len(s.segs) == 0 {
		seg, err := createSegment(s.dir, 1)
		if err != nil {
			return fmt.Errorf("msglog: open: %w", err)
		}
		s.segs = append(s.segs, seg)
		if err := syncDir(s.dir); err != nil {
			return fmt.Errorf("msglog: open: %w", err)
		}
	}
	s.diskBytes += s.marks.bytes()
	return nil
}

// recoverRecord indexes a record found on disk, checking that its stream
// stays contiguous.
func (s *Store) recoverRecord(seg *segment, pos int64, rec *record.Record) error {
	k := Key{rec.Owner, rec.Stream}
	st := s.streams[k]
	if st == nil {
		return fmt.Errorf("record of owner %d stream %d, which the marks file does not know", k.Owner, k.Stream)
	}
	end := rec.End()
	if end <= st.low && len(rec.Payload) > 0 {
		return nil // truncated; its segment will go
	}
	if rec.Offset > st.end || (rec.Offset < st.end && len(st.extents) > 0) {
		return fmt.Errorf("owner %d stream %d: record at offset %d, stream ends at %d (gap or overlap)",
			k.Owner, k.Stream, rec.Offset, st.end)
	}
	s.indexLocked(st, seg, pos, rec)
	return nil
}

// indexLocked adds a record written at pos of seg to st's index.
func (s *Store) indexLocked(st *stream, seg *segment, pos int64, rec *record.Record) {
	var ext *extent
	if n := len(st.extents); n > 0 && st.extents[n-1].seg == seg {
		ext = st.extents[n-1]
		if ext.sinceBytes >= indexEveryBytes || ext.sinceRecord >= indexEveryRecords {
			ext.points = append(ext.points, point{rec.Offset, pos})
			ext.sinceBytes, ext.sinceRecord = 0, 0
			s.indexBytes += costPoint
		}
	} else {
		ext = &extent{seg: seg, first: rec.Offset, end: rec.Offset, points: []point{{rec.Offset, pos}}}
		st.extents = append(st.extents, ext)
		seg.extents++
		s.indexBytes += costExtent + costPoint
	}
	ext.end = rec.End()
	ext.sinceBytes += uint64(len(rec.Payload))
	ext.sinceRecord++
	st.end = rec.End()
}

// Append stores r in the stream (r.Owner, r.Stream) and returns once it is
// as durable as the sync policy says (with SyncAlways: fsynced).
//
// A stream is a byte sequence: r covers offsets [r.Offset, r.End()). The
// first Append of a new stream may start anywhere; later ones must start at
// or before the stream's End. Append is idempotent, for replication and
// retransmission: bytes that overlap what is stored are compared, and
//   - identical overlap: only the part past End (if any) is stored; a full
//     duplicate stores nothing and returns nil;
//   - different overlap: ErrConflict, nothing stored;
//   - bytes below the low mark (truncated) cannot be compared and are
//     accepted as duplicates;
//   - r.Offset > End: ErrGap.
//
// On a full disk or quota, ErrFull (wrapping the cause) and nothing stored.
// Errors are *Error values. The payload is copied; the caller keeps it.
func (s *Store) Append(r Record) error {
	_, err := s.AppendBatch([]Record{r})
	return err
}

// AppendBatch appends rs in order, as Append does each, with one fsync for
// all of them (SyncAlways). It stops at the first record that fails and
// returns how many were stored (those are durable per the policy even when
// err != nil) and that record's error.
func (s *Store) AppendBatch(rs []Record) (int, error) {
	return s.appendBatch(rs, nil, s.opts.Sync == SyncAlways, false)
}

// AppendBatchNoSync is AppendBatch without the fsync that SyncAlways
// makes, for a caller that stores many batches and makes them durable
// at once with Sync.
func (s *Store) AppendBatchNoSync(rs []Record) (int, error) {
	return s.appendBatch(rs, nil, false, false)
}

// Write is AppendBatch for a caller that fsyncs itself (Sync) when it
// needs to, whatever the policy, and hands the payloads over: the store
// may keep them (in its cache of recent records) instead of a copy, so
// they must not change afterwards. The replication path's protector
// writes with it: it acknowledges what it received before the write, and
// what is stored after it (and after one Sync for every batch waiting).
//
// enc, if not nil, holds each record's encoding (record.AppendRecord's,
// as received: enc[i] encodes rs[i]); the store writes it as it is
// instead of encoding the record again (one copy and one CRC pass fewer
// per byte) unless it stores only part of the record.
func (s *Store) Write(rs []Record, enc [][]byte) (int, error) {
	if enc != nil && len(enc) != len(rs) {
		return 0, &Error{Op: "append", Err: fmt.Errorf("%w: %d encodings for %d records", ErrInvalid, len(enc), len(rs))}
	}
	return s.appendBatch(rs, enc, false, true)
}

func (s *Store) appendBatch(rs []Record, encs [][]byte, sync, owned bool) (int, error) {
	fail := func(r *Record, err error) error {
		switch {
		case errors.Is(err, ErrFull):
			s.stats.FullErrors.Add(1)
		case errors.Is(err, ErrConflict):
			s.stats.Conflicts.Add(1)
		}
		return &Error{Op: "append", Owner: r.Owner, Stream: r.Stream, Offset: r.Offset, Err: err}
	}
	var (
		n    int
		seq  uint64
		ferr error
	)
	s.mu.Lock()
	for i := range rs {
		r := &rs[i]
		err := r.Validate()
		if err != nil {
			err = fmt.Errorf("%w: %w", ErrInvalid, err)
		} else if len(r.Payload) == 0 {
			err = fmt.Errorf("%w: empty payload", ErrInvalid)
		} else {
			var q uint64
			var enc []byte
			if encs != nil {
				enc = encs[i]
			}
			if q, err = s.appendLocked(Key{r.Owner, r.Stream}, *r, owned, enc); err == nil {
				seq = q
			}
		}
		if err != nil {
			ferr = fail(r, err)
			break
		}
		n++
	}
	s.mu.Unlock()
	if n > 0 && sync {
		if err := s.syncTo(seq); err != nil {
			return 0, fail(&rs[0], err)
		}
	}
	s.stats.Appends.Add(uint64(n))
	return n, ferr
}

// appendLocked returns the write sequence that must be durable before r is
// acknowledged.
func (s *Store) appendLocked(k Key, r Record, owned bool, enc []byte) (uint64, error) {
	if s.closed {
		return 0, ErrClosed
	}
	if s.broken != nil {
		return 0, s.broken
	}
	st := s.streams[k]
	if st == nil {
		// Record the new stream's start in the marks before any of its
		// records, so that recovery can check it is contiguous.
		ents := s.markEntriesLocked()
		ents = append(ents, markEntry{k, r.Offset})
		if g := s.marks.growth(len(ents)); s.opts.MaxBytes > 0 && g > 0 && s.diskBytes+g > s.opts.MaxBytes {
			return 0, full(fmt.Errorf("%w: %d + %d bytes of marks > %d", ErrQuota, s.diskBytes, g, s.opts.MaxBytes))
		}
		before := s.marks.bytes()
		err := s.marks.write(ents)
		s.diskBytes += s.marks.bytes() - before
		if err != nil {
			if isSpace(err) {
				return 0, full(err)
			}
			return 0, err
		}
		st = &stream{key: k, low: r.Offset, end: r.Offset}
		s.streams[k] = st
		s.indexBytes += costStream
		s.publishLocked()
	}
	end := r.End()
	if r.Offset > st.end {
		return 0, fmt.Errorf("%w: record starts at %d, stream ends at %d", ErrGap, r.Offset, st.end)
	}
	if lo, hi := max(r.Offset, st.low), min(end, st.end); lo < hi {
		if err := s.compareLocked(st, lo, r.Payload[lo-r.Offset:hi-r.Offset]); err != nil {
			return 0, err
		}
	}
	if end <= st.end {
		s.stats.Duplicates.Add(1)
		return s.written, nil
	}
	if r.Offset < st.end {
		r.Payload = r.Payload[st.end-r.Offset:]
		r.Offset = st.end
		enc = nil
	}
	if err := s.writeLocked(st, &r, owned, enc); err != nil {
		return 0, err
	}
	return s.written, nil
}

// compareLocked checks that the stored bytes at [off, off+len(want)) equal want.
func (s *Store) compareLocked(st *stream, off uint64, want []byte) error {
	c := s.cmpCursor
	c.key, c.pos = st.key, off
	for len(want) > 0 {
		rec, err := c.nextLocked()
		if err != nil {
			return fmt.Errorf("compare with stored bytes: %w", err)
		}
		n := min(len(rec.Payload), len(want))
		if !bytes.Equal(rec.Payload[:n], want[:n]) {
			i := 0
			for rec.Payload[i] == want[i] {
				i++
			}
			return fmt.Errorf("%w: stored bytes differ at offset %d", ErrConflict, rec.Offset+uint64(i))
		}
		want = want[n:]
	}
	return nil
}

// writeLocked writes r; enc, if not nil, is its encoding.
func (s *Store) writeLocked(st *stream, r *record.Record, owned bool, enc []byte) error {
	need := int64(r.Len())
	if s.opts.MaxBytes > 0 && s.diskBytes+need > s.opts.MaxBytes {
		return full(fmt.Errorf("%w: %d + %d bytes > %d", ErrQuota, s.diskBytes, need, s.opts.MaxBytes))
	}
	act := s.segs[len(s.segs)-1]
	if act.size > 0 && act.size+need > s.opts.SegmentSize {
		if err := s.rotateLocked(); err != nil {
			return err
		}
		act = s.segs[len(s.segs)-1]
	}
	if len(enc) != r.Len() {
		s.encBuf = record.AppendRecord(s.encBuf[:0], r)
		enc = s.encBuf
	}
	if _, err := act.f.WriteAt(enc, act.size); err != nil {
		// Leave no partial record behind, or the next one would follow
		// garbage and recovery would call it corruption. Always cut: the
		// count WriteAt returns with an error leaves out the bytes of the
		// last pwrite (os.File.WriteAt in Go 1.26 drops them), so n == 0
		// does not mean nothing was written.
		if terr := act.f.Truncate(act.size); terr != nil {
			s.broken = fmt.Errorf("%w: write %s: %w; then truncate: %w", ErrBroken, act.path, err, terr)
			return s.broken
		}
		if isSpace(err) {
			return full(err)
		}
		s.broken = fmt.Errorf("%w: write %s: %w", ErrBroken, act.path, err)
		return s.broken
	}
	pos := act.size
	act.size += need
	act.records++
	s.diskBytes += need
	s.written++
	s.indexLocked(st, act, pos, r)
	s.cacheLocked(st, r, owned)
	s.stats.AppendedBytes.Add(uint64(len(r.Payload)))
	s.publishLocked()
	return nil
}

// rotateLocked fsyncs the active segment (whatever the policy, so that only
// the last segment can ever have a torn tail) and starts a new one.
func (s *Store) rotateLocked() error {
	old := s.segs[len(s.segs)-1]
	if err := old.f.Sync(); err != nil {
		s.broken = fmt.Errorf("%w: fsync %s: %w", ErrBroken, old.path, err)
		return s.broken
	}
	s.stats.Syncs.Add(1)
	if s.opts.DropSynced {
		dropCache(old.f)
	}
	seg, err := createSegment(s.dir, old.id+1)
	if err != nil {
		if isSpace(err) {
			return full(err)
		}
		return fmt.Errorf("new segment: %w", err)
	}
	if s.opts.Sync != SyncNever {
		if err := syncDir(s.dir); err != nil {
			seg.f.Close()
			os.Remove(seg.path)
			if isSpace(err) {
				return full(err)
			}
			return fmt.Errorf("new segment: %w", err)
		}
	}
	// A dead old segment is not deleted here but by the next Truncate,
	// which holds syncMu: syncTo may be fsyncing it right now.
	s.segs = append(s.segs, seg)
	return nil
}

// dropSegmentLocked closes and deletes a dead segment; the caller removes it
// from s.segs (entries with f == nil).
func (s *Store) dropSegmentLocked(seg *segment) {
	if err := seg.f.Close(); err != nil {
		s.opts.Logf("msglog: close %s: %v", seg.path, err)
	}
	seg.f = nil
	if err := os.Remove(seg.path); err != nil {
		s.opts.Logf("msglog: remove %s: %v", seg.path, err)
	}
	s.diskBytes -= seg.size
	s.stats.SegmentsDropped.Add(1)
}

func (s *Store) cacheLocked(st *stream, r *record.Record, owned bool) {
	cost := int64(costCached + len(r.Payload))
	if cost > s.opts.MemoryLimit-s.indexBytes {
		// Too big to cache: the tail must stay a contiguous suffix.
		for _, c := range st.tail.live() {
			s.cacheBytes -= int64(costCached + len(c.payload))
		}
		st.tail.reset()
		s.evictLocked()
		return
	}
	p := r.Payload
	if !owned {
		p = bytes.Clone(p)
	}
	st.tail.push(cached{r.Offset, r.Kind, p})
	s.queue.push(queued{st, r.Offset})
	s.cacheBytes += cost + costQueued
	s.evictLocked()
}

// evictLocked drops the oldest cached records until the cache and the
// index fit in the memory limit. Queue entries whose record already left
// the cache (Truncate) keep their own small charge until popped here, so
// the queue is bounded too.
func (s *Store) evictLocked() {
	for s.cacheBytes > s.opts.MemoryLimit-s.indexBytes && s.queue.len() > 0 {
		q := s.queue.live()[0]
		s.queue.popFront(1)
		s.cacheBytes -= costQueued
		if t := q.st.tail.live(); len(t) > 0 && t[0].off == q.off {
			s.cacheBytes -= int64(costCached + len(t[0].payload))
			q.st.tail.popFront(1)
		}
	}
}

func (s *Store) markEntriesLocked() []markEntry {
	ents := make([]markEntry, 0, len(s.streams)+1)
	for k, st := range s.streams {
		ents = append(ents, markEntry{k, st.low})
	}
	return ents
}

// publishLocked copies gauges into Stats.
func (s *Store) publishLocked() {
	var recs int64
	for _, g := range s.segs {
		recs += g.records
	}
	s.stats.Bytes.Store(s.diskBytes)
	s.stats.Records.Store(recs)
	s.stats.Segments.Store(int64(len(s.segs)))
	s.stats.Streams.Store(int64(len(s.streams)))
	s.stats.CacheBytes.Store(s.cacheBytes)
	s.stats.IndexBytes.Store(s.indexBytes)
	s.stats.MemBytes.Store(s.cacheBytes + s.indexBytes)
}

// syncTo makes the writes up to sequence seq durable. Concurrent callers
// share one fsync.
func (s *Store) syncTo(seq uint64) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if s.synced >= seq {
		return nil
	}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	if s.broken != nil {
		err := s.broken
		s.mu.RUnlock()
		return err
	}
	target := s.written
	act := s.segs[len(s.segs)-1]
	s.mu.RUnlock()
	// Older segments were fsynced when rotated; Truncate, which may close
	// files, holds syncMu, so act.f stays open.
	if err := act.f.Sync(); err != nil {
		s.mu.Lock()
		s.broken = fmt.Errorf("%w: fsync %s: %w", ErrBroken, act.path, err)
		err = s.broken
		s.mu.Unlock()
		return err
	}
	s.stats.Syncs.Add(1)
	s.synced = target
	if s.opts.DropSynced {
		dropCache(act.f)
	}
	return nil
}

// dropCache drops f's clean pages from the page cache (best effort).
func dropCache(f *os.File) {
	const fadvDontNeed = 4 // POSIX_FADV_DONTNEED
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			syscall.Syscall6(syscall.SYS_FADVISE64, fd, 0, 0, fadvDontNeed, 0, 0)
		})
	}
}

// Sync makes every record appended so far durable.
func (s *Store) Sync() error {
	s.mu.RLock()
	seq, closed := s.written, s.closed
	s.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	return s.syncTo(seq)
}

func (s *Store) routineSync() {
	defer s.wg.Done()
	s.opts.Logf("msglog: RoutineSync started, every %v", s.opts.SyncInterval)
	defer s.opts.Logf("msglog: RoutineSync stopped")
	t := time.NewTicker(s.opts.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			if err := s.Sync(); err != nil && !errors.Is(err, ErrClosed) {
				s.opts.Logf("msglog: background sync: %v", err)
			}
		}
	}
}

// Truncate drops the bytes of stream (owner, stream) below offset below
// (after a checkpoint made them unnecessary). The new low mark is durable
// when Truncate returns; whole segment files with nothing live are deleted.
// Truncating at or below the current low mark does nothing; truncating past
// the stream's end moves the end too (the next Append starts there).
// Truncate needs no new disk space, so it works on a full disk.
func (s *Store) Truncate(owner, stream, below uint64) error {
	fail := func(err error) error {
		return &Error{Op: "truncate", Owner: owner, Stream: stream, Offset: below, Err: err}
	}
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fail(ErrClosed)
	}
	st := s.streams[Key{owner, stream}]
	if st == nil || below <= st.low {
		return nil
	}
	oldLow, oldEnd := st.low, st.end
	st.low, st.end = below, max(st.end, below)
	before := s.marks.bytes()
	err := s.marks.write(s.markEntriesLocked())
	s.diskBytes += s.marks.bytes() - before
	if err != nil {
		st.low, st.end = oldLow, oldEnd
		if isSpace(err) {
			err = full(err)
		}
		return fail(err)
	}
	s.stats.Truncations.Add(1)
	// Index: drop extents wholly below the mark.
	i := 0
	for i < len(st.extents) && st.extents[i].end <= below {
		e := st.extents[i]
		e.seg.extents--
		s.indexBytes -= costExtent + int64(len(e.points))*costPoint
		st.extents[i] = nil
		i++
	}
	st.extents = st.extents[i:]
	if len(st.extents) == 0 {
		st.extents = nil
	}
	// Cache: drop records wholly below the mark.
	j, t := 0, st.tail.live()
	for j < len(t) && t[j].off+uint64(len(t[j].payload)) <= below {
		s.cacheBytes -= int64(costCached + len(t[j].payload))
		j++
	}
	st.tail.popFront(j)
	// Files: delete dead segments, except the active one.
	for _, seg := range s.segs[:len(s.segs)-1] {
		if seg.extents == 0 {
			s.dropSegmentLocked(seg)
		}
	}
	s.segs = slices.DeleteFunc(s.segs, func(g *segment) bool { return g.f == nil })
	s.publishLocked()
	return nil
}

// Stream returns the state of one stream, and whether it exists.
func (s *Store) Stream(owner, stream uint64) (StreamInfo, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st := s.streams[Key{owner, stream}]
	if st == nil {
		return StreamInfo{}, false
	}
	return StreamInfo{st.key, st.low, st.end}, true
}

// Streams lists the streams of owner, by stream id. With Read, it is what a
// new replica needs to catch up.
func (s *Store) Streams(owner uint64) []StreamInfo {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []StreamInfo
	for k, st := range s.streams {
		if k.Owner == owner {
			out = append(out, StreamInfo{k, st.low, st.end})
		}
	}
	slices.SortFunc(out, func(a, b StreamInfo) int { return cmp.Compare(a.Stream, b.Stream) })
	return out
}

// Owners lists the owners that have streams, ascending.
func (s *Store) Owners() []uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	seen := make(map[uint64]bool)
	var out []uint64
	for k := range s.streams {
		if !seen[k.Owner] {
			seen[k.Owner] = true
			out = append(out, k.Owner)
		}
	}
	slices.Sort(out)
	return out
}

// Stats returns the store's live counters.
func (s *Store) Stats() *Stats { return &s.stats }

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// Close syncs and closes the store. Cursors fail with ErrClosed afterwards.
func (s *Store) Close() error {
	var errs []error
	s.closeOnce.Do(func() {
		close(s.done)
		s.wg.Wait()
		if err := s.Sync(); err != nil && !errors.Is(err, ErrBroken) {
			errs = append(errs, err)
		}
		s.syncMu.Lock()
		defer s.syncMu.Unlock()
		s.mu.Lock()
		defer s.mu.Unlock()
		s.closed = true
		if err := s.closeFiles(); err != nil {
			errs = append(errs, err)
		}
	})
	return errors.Join(errs...)
}

func (s *Store) closeFiles() error {
	var errs []error
	for _, g := range s.segs {
		if g.f != nil {
			if err := g.f.Close(); err != nil {
				errs = append(errs, err)
			}
			g.f = nil
		}
	}
	if s.marks != nil {
		if err := s.marks.close(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.lock != nil {
		s.lock.Close() // releases the flock
		s.lock = nil
	}
	return errors.Join(errs...)
}

// Cursor reads one stream in offset order, from memory when the bytes are
// still cached and from the segment files otherwise (a replay cursor). It
// is not safe for concurrent use; many cursors may be used at once.
type Cursor struct {
	s   *Store
	key Key
	pos uint64

	sc      scanner
	hintSeg uint64 // segment id, file position and offset where the
	hintPos int64  // next record of the stream is known to be
	hintOff uint64
}

// Read returns a cursor over stream (owner, stream) starting at offset from.
func (s *Store) Read(owner, stream, from uint64) *Cursor {
	return &Cursor{s: s, key: Key{owner, stream}, pos: from}
}

// Offset is the offset the next record returned will start at.
func (c *Cursor) Offset() uint64 { return c.pos }

// Next returns the stored record holding offset c.Offset(), trimmed to start
// there, and advances past it. Records returned by successive calls are
// contiguous and their payloads belong to the caller. At the end of the
// stream (or for a stream that does not exist yet) it returns io.EOF; a
// later call returns records appended since. Below the low mark it returns
// ErrTruncated; on damaged data a *CorruptError, never the data.
func (c *Cursor) Next() (Record, error) {
	c.s.mu.RLock()
	defer c.s.mu.RUnlock()
	if c.s.closed {
		return Record{}, ErrClosed
	}
	rec, err := c.nextLocked()
	if err != nil {
		if err != io.EOF {
			err = &Error{Op: "read", Owner: c.key.Owner, Stream: c.key.Stream, Offset: c.pos, Err: err}
		}
		return Record{}, err
	}
	rec.Payload = bytes.Clone(rec.Payload)
	return rec, nil
}

// AppendNext is Next for a caller that wants the record's encoding
// (record.AppendRecord's) rather than the record: it appends it to dst,
// with no copy of the payload in between, and returns the extended
// buffer. The replica read path serves streams with it from one reused
// buffer.
func (c *Cursor) AppendNext(dst []byte) ([]byte, error) {
	c.s.mu.RLock()
	defer c.s.mu.RUnlock()
	if c.s.closed {
		return dst, ErrClosed
	}
	rec, err := c.nextLocked()
	if err != nil {
		if err != io.EOF {
			err = &Error{Op: "read", Owner: c.key.Owner, Stream: c.key.Stream, Offset: c.pos, Err: err}
		}
		return dst, err
	}
	return record.AppendRecord(dst, &rec), nil
}

// nextLocked is Next under s.mu (read or write); the payload may alias
// internal buffers.
func (c *Cursor) nextLocked() (Record, error) {
	s := c.s
	st := s.streams[c.key]
	if st == nil || c.pos >= st.end {
		return Record{}, io.EOF
	}
	if c.pos < st.low {
		return Record{}, fmt.Errorf("%w: offset %d is below the low mark %d", ErrTruncated, c.pos, st.low)
	}
	trim := func(kind record.Kind, off uint64, payload []byte) Record {
		r := Record{Kind: kind, Owner: c.key.Owner, Stream: c.key.Stream, Offset: c.pos, Payload: payload[c.pos-off:]}
		c.pos = off + uint64(len(payload))
		return r
	}
	if t := st.tail.live(); len(t) > 0 && c.pos >= t[0].off {
		i := sort.Search(len(t), func(i int) bool { return t[i].off > c.pos }) - 1
		s.stats.CacheReads.Add(1)
		return trim(t[i].kind, t[i].off, t[i].payload), nil
	}
	xi := sort.Search(len(st.extents), func(i int) bool { return st.extents[i].end > c.pos })
	if xi == len(st.extents) || st.extents[xi].first > c.pos {
		return Record{}, &CorruptError{Path: s.dir, Pos: -1, Err: fmt.Errorf("index of owner %d stream %d has no extent for offset %d", c.key.Owner, c.key.Stream, c.pos)}
	}
	ext := st.extents[xi]
	seg := ext.seg
	var start int64
	if c.hintSeg == seg.id && c.hintOff == c.pos {
		start = c.hintPos
	} else {
		pi := sort.Search(len(ext.points), func(i int) bool { return ext.points[i].off > c.pos }) - 1
		start = ext.points[max(pi, 0)].pos
	}
	c.sc.reset(seg, seg.size)
	for p := start; p < seg.size; {
		rec, n, err := c.sc.record(p)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return Record{}, &CorruptError{Path: seg.path, Pos: p, Err: err}
		}
		p += int64(n)
		if rec.Owner != c.key.Owner || rec.Stream != c.key.Stream || rec.End() <= c.pos {
			continue
		}
		if rec.Offset > c.pos {
			return Record{}, &CorruptError{Path: seg.path, Pos: p - int64(n), Err: fmt.Errorf("record at offset %d, wanted %d", rec.Offset, c.pos)}
		}
		s.stats.DiskReads.Add(1)
		c.hintSeg, c.hintPos, c.hintOff = seg.id, p, rec.End()
		return trim(rec.Kind, rec.Offset, rec.Payload), nil
	}
	return Record{}, &CorruptError{Path: seg.path, Pos: -1, Err: fmt.Errorf("no record of owner %d stream %d at offset %d", c.key.Owner, c.key.Stream, c.pos)}
}

// copyBatch is how many payload bytes CopyOwner moves per AppendBatch.
const copyBatch = 4 << 20

// CopyOwner appends to s every stream of owner that src holds, each from
// its low mark, as AppendBatch does (under SyncAlways, durable when it
// returns: one fsync at the end), and returns how many records it appended (a stream s does
// not hold yet starts at src's low mark). Payloads pass through one buffer, reused: cloned one by one (as
// Cursor.Next does), a log of hundreds of MB went through as many fresh
// pages, which some VMs charge a fault each for.
func (s *Store) CopyOwner(src *Store, owner uint64) (int, error) {
	if s == src {
		return 0, &Error{Op: "copy", Owner: owner, Err: fmt.Errorf("%w: a store copied onto itself", ErrInvalid)}
	}
	type span struct{ from, to int }
	var (
		n     int
		buf   []byte
		batch []Record
		spans []span
	)
	for _, si := range src.Streams(owner) {
		c := src.Read(owner, si.Stream, si.Low)
		for done := false; !done; {
			buf, batch, spans = buf[:0], batch[:0], spans[:0]
			src.mu.RLock()
			for len(buf) < copyBatch {
				if src.closed {
					src.mu.RUnlock()
					return n, ErrClosed
				}
				rec, err := c.nextLocked()
				if err == io.EOF {
					done = true
					break
				}
				if err != nil {
					src.mu.RUnlock()
					return n, &Error{Op: "copy", Owner: owner, Stream: si.Stream, Offset: c.pos, Err: err}
				}
				// The payload aliases src's buffers until the unlock;
				// buf may move as it grows, so slices are taken after.
				spans = append(spans, span{len(buf), len(buf) + len(rec.Payload)})
				buf = append(buf, rec.Payload...)
				batch = append(batch, rec)
			}
			src.mu.RUnlock()
			for i := range batch {
				batch[i].Payload = buf[spans[i].from:spans[i].to:spans[i].to]
			}
			k, err := s.AppendBatchNoSync(batch)
			n += k
			if err != nil {
				return n, err
			}
		}
	}
	if n > 0 && s.opts.Sync == SyncAlways {
		return n, s.Sync() // once, not per batch
	}
	return n, nil
}
