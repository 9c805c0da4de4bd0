// Package msglog is radic's critical-data store: the receiver-based
// pessimistic message log of DESIGN.md contracts 4-7. A protector keeps here
// the bytes its observers received and their determinants, until a
// checkpoint lets them go; after a failure, replay cursors feed them back.
//
// # Model
//
// The store holds streams. A stream is named by a [Key] — an opaque Owner
// (a logical process id) and Stream (a connection id and direction, or the
// owner's determinant stream) — and is a byte sequence: each record carries
// the bytes [Offset, Offset+len(Payload)) of its stream. A stream holds the
// contiguous bytes [Low, End); Low moves up with [Store.Truncate], End with
// [Store.Append].
//
//	Append(r)      r.Offset ≤ End: overlap compared, new suffix stored;
//	               r.Offset > End: ErrGap; overlap differs: ErrConflict
//	AppendBatch    several Appends, one fsync
//	Read(k, from)  a Cursor; Next returns contiguous records from `from`
//	Truncate(k, o) Low = o (persisted), whole dead segment files deleted
//	Streams(owner) what an owner has: for replica catch-up
//
// Append is idempotent, so a replica can be fed the same record twice and a
// new replica can catch up by reading [Store.Streams] and cursors of
// another store, appending everything (radicd does the networking; this
// package has none).
//
// To drop an owner (its process finished, or moved to another protector),
// truncate each of its streams to its End: its files go, its marks entries
// (24 bytes a stream) stay.
//
// # Files
//
// A store is a directory:
//
//	LOCK                     flock'ed: one process per store
//	marks.0, marks.1         the Low of every stream, two slots written in turn
//	0000000000000001.seg     append-only records (package record), rotated
//	0000000000000002.seg     at Options.SegmentSize; the last one is active
//
// Each record is a 40-byte header (magic, version, kind, length, owner,
// stream, offset) and the payload, covered by one CRC32C. A stream's Low is
// written to the marks (fsynced) when the stream is created and at every
// Truncate, before any segment is deleted, so recovery knows exactly which
// bytes must be present.
//
// # Durability
//
// Options.Sync: [SyncAlways] (Append returns after fsync; concurrent
// appends share one fsync), [SyncInterval] (a background fsync every
// Options.SyncInterval), [SyncNever] (only at rotation, Sync and Close). A
// segment is always fsynced before the next one is started, so only the last
// segment can have a torn tail.
//
// A failed write is cut back (ftruncate) to the last whole record. A failed
// fsync makes the store refuse appends (ErrBroken): after fsync failed, what
// is on disk is unknown, and only reopening (recovery) tells.
//
// # Recovery and corruption policy
//
// [Open] scans every segment. A damaged record at the end of the last
// segment with nothing valid after it is a torn tail (a write that never
// completed, never acknowledged under SyncAlways): the file is cut there and
// the event logged (Stats.TornBytes). Any other damage — a bad magic, length
// or checksum followed by valid records, damage in an older segment, a
// stream with a gap or overlap, a record of a stream the marks do not know —
// fails Open with a *[CorruptError] naming the file and byte. A record that
// fails its checksum when read later is returned as a *CorruptError too.
// Corrupt data is never served and never skipped silently: the operator
// moves the segment aside and the data comes back from another replica.
// The rule errs on the safe side: a torn tail whose garbage happens to hold a
// whole valid record is reported as corruption, not cut (cutting could drop
// acknowledged records that follow a damaged length field).
//
// # Space
//
// When the disk is full (ENOSPC, EDQUOT) or Options.MaxBytes would be
// passed, Append fails with an error matching [ErrFull] (and the cause:
// syscall.ENOSPC or [ErrQuota]); nothing is stored, the store stays
// consistent and usable, and appends succeed again once Truncate has freed
// space. Truncate needs no new space: the marks slots are grown (with real
// zeros) only when a stream is created.
//
// # Memory
//
// Options.MemoryLimit bounds the index and a cache of the most recent
// records of each stream (Stats.MemBytes). The index is sparse: one entry
// per stream per segment plus one per 32 KiB or 64 records. Cursors read
// older records from the segment files through a 64 KiB buffer each.
//
// # Metrics
//
// [Store.Stats] returns atomic counters for radicd to export, e.g.
// radic_store_bytes = Stats.Bytes, radic_store_records = Stats.Records,
// radic_store_records_total = Stats.Appends, and the memory, sync, full,
// conflict and recovery counters. This package imports no metrics library.
//
// # Concurrency
//
// All Store methods are safe for concurrent use. Lock order: syncMu, then
// mu. Appends write under mu (exclusive) and fsync under syncMu only; reads
// share mu.
package msglog
