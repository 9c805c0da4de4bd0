package msglog

import (
	"errors"
	"fmt"
	"syscall"
)

// Sentinel errors; callers branch on them with errors.Is.
var (
	// ErrFull: the disk is full (ENOSPC, EDQUOT) or the quota
	// (Options.MaxBytes) would be exceeded. The error also wraps the cause
	// (a *os.PathError with syscall.ENOSPC, or ErrQuota). Nothing was stored
	// and the store is still consistent; retry after Truncate frees space.
	ErrFull = errors.New("msglog: store full")
	// ErrQuota is the cause inside ErrFull when Options.MaxBytes is reached.
	ErrQuota = errors.New("msglog: quota exceeded")
	// ErrConflict: an Append overlaps stored bytes of its stream and differs
	// from them.
	ErrConflict = errors.New("msglog: conflicting record")
	// ErrGap: an Append starts after the end of its stream.
	ErrGap = errors.New("msglog: gap in stream")
	// ErrTruncated: a read asked for bytes below the stream's low mark
	// (removed by Truncate).
	ErrTruncated = errors.New("msglog: offset truncated")
	// ErrInvalid: the record cannot be stored (kind 0, empty or oversized
	// payload, offset overflow).
	ErrInvalid = errors.New("msglog: invalid record")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("msglog: store closed")
	// ErrBroken: an fsync or write failed in a way that leaves durability
	// unknown; the store refuses further appends. Close and reopen it
	// (recovery re-reads what is really on disk).
	ErrBroken = errors.New("msglog: store failed")
	// ErrCorrupt is matched by every *CorruptError.
	ErrCorrupt = errors.New("msglog: corrupt store")
)

// Error is the error returned by Store methods for one stream.
type Error struct {
	Op     string // "append", "read", "truncate"
	Owner  uint64
	Stream uint64
	Offset uint64
	Err    error
}

func (e *Error) Error() string {
	return fmt.Sprintf("msglog: %s owner %d stream %d offset %d: %v", e.Op, e.Owner, e.Stream, e.Offset, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// CorruptError reports data on disk that fails its checks: a record with a
// bad magic, length or checksum that is not a torn tail, a stream whose
// records are not contiguous, or an index that does not match the file. The
// store never serves such data.
type CorruptError struct {
	Path string // the file
	Pos  int64  // byte position in the file, -1 if none
	Err  error  // what is wrong (often a *record.CorruptError)
}

func (e *CorruptError) Error() string {
	if e.Pos < 0 {
		return fmt.Sprintf("msglog: corrupt store: %s: %v", e.Path, e.Err)
	}
	return fmt.Sprintf("msglog: corrupt store: %s at byte %d: %v", e.Path, e.Pos, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// isSpace reports whether err means "no space left".
func isSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// full wraps cause as ErrFull.
func full(cause error) error { return fmt.Errorf("%w: %w", ErrFull, cause) }
