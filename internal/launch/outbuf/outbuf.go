// Package outbuf keeps one output stream of a rank (its stdout or its
// stderr) between the rank and the launcher that forwards it: a window of
// the stream's bytes, addressed by offset from the stream's start.
//
// The reader says which bytes it already has: a Read from offset F tells
// the buffer that everything before F has been delivered, and those bytes
// are released. Until then they are kept, so a reader whose connection
// broke asks again from the last offset it wrote out and gets exactly the
// rest. The window is bounded: a writer that would take it past Max bytes
// not yet released waits (the rank blocks on its pipe, as it would on a
// terminal that does not read), so nothing is dropped, ever, unless the
// buffer is told to Discard because nobody will read again.
//
//	      released        kept (≤ Max)             free
//	|================|======================|- - - - - - -
//	0               Low                    End
//
// Concurrency: any number of writers and readers; Write blocks for room,
// Read blocks for data (both end with Close/Discard or the context).
package outbuf

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Errors a Read returns (besides the context's).
var (
	// ErrReleased: the bytes asked for were released by a Read from a
	// later offset; someone else read them, or the reader went back.
	ErrReleased = errors.New("outbuf: offset already released")
	// ErrBeyond: the offset is past what the stream has ever held.
	ErrBeyond = errors.New("outbuf: offset beyond the end of the stream")
)

// OffsetError is an ErrReleased or ErrBeyond with the stream's window.
type OffsetError struct {
	Err      error
	From     uint64
	Low, End uint64
}

func (e *OffsetError) Error() string {
	return fmt.Sprintf("%v: from=%d, the stream holds [%d, %d)", e.Err, e.From, e.Low, e.End)
}

func (e *OffsetError) Unwrap() error { return e.Err }

// Buffer is one stream's window. The zero value is not usable: use New.
type Buffer struct {
	max int

	mu sync.Mutex
	// +checklocks:mu
	low uint64 // offset of buf[0]
	// +checklocks:mu
	buf []byte
	// +checklocks:mu
	closed bool // the writer's end: End is final
	// +checklocks:mu
	discard bool // nobody reads: writes are dropped
	// +checklocks:mu
	changed chan struct{} // closed (and replaced) on every change
}

// New returns an empty buffer that keeps at most max unreleased bytes.
func New(max int) *Buffer {
	if max < 1 {
		max = 1
	}
	return &Buffer{max: max, changed: make(chan struct{})}
}

// broadcastLocked wakes every waiter.
func (b *Buffer) broadcastLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// Write appends p to the stream, waiting for room while the window is
// full. It returns early with an error only after Close or when ctx ends
// (the bytes written by then are counted in n); after Discard it drops p
// and reports success, so the rank never blocks on an abandoned stream.
func (b *Buffer) Write(ctx context.Context, p []byte) (n int, err error) {
	for len(p) > 0 {
		b.mu.Lock()
		switch {
		case b.discard:
			b.low += uint64(len(b.buf) + len(p))
			b.buf = b.buf[:0]
			b.mu.Unlock()
			return n + len(p), nil
		case b.closed:
			b.mu.Unlock()
			return n, errors.New("outbuf: write after close")
		}
		room := b.max - len(b.buf)
		if room > 0 {
			k := min(room, len(p))
			b.buf = append(b.buf, p[:k]...)
			p = p[k:]
			n += k
			b.broadcastLocked()
			b.mu.Unlock()
			continue
		}
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return n, ctx.Err()
		}
	}
	return n, nil
}

// Close ends the stream: End is final, and a Read at End reports eof.
func (b *Buffer) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.broadcastLocked()
}

// Discard drops what is kept and every later write: nobody will read the
// stream again.
func (b *Buffer) Discard() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.discard = true
	b.low += uint64(len(b.buf))
	b.buf = nil
	b.broadcastLocked()
}

// Window is the stream's current state: released up to Low, bytes up to
// End, and whether End is final.
func (b *Buffer) Window() (low, end uint64, closed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.low, b.low + uint64(len(b.buf)), b.closed
}

// Read releases everything before from and returns a copy of at most max
// bytes from there. With no byte at from yet it waits, until one comes,
// the stream is closed or ctx ends (then data is empty and err nil: the
// caller answers "nothing yet"). eof is true when data reaches the end of
// a closed stream: nothing will follow it.
func (b *Buffer) Read(ctx context.Context, from uint64, max int) (data []byte, eof bool, err error) {
	for {
		b.mu.Lock()
		end := b.low + uint64(len(b.buf))
		if from < b.low || from > end {
			e := ErrReleased
			if from > end {
				e = ErrBeyond
			}
			err := &OffsetError{Err: e, From: from, Low: b.low, End: end}
			b.mu.Unlock()
			return nil, false, err
		}
		if from > b.low {
			// The reader has everything before from: let it go, and
			// let a waiting writer in.
			k := int(from - b.low)
			b.buf = append(b.buf[:0], b.buf[k:]...)
			b.low = from
			b.broadcastLocked()
		}
		if len(b.buf) > 0 || b.closed {
			k := min(len(b.buf), max)
			data = append([]byte(nil), b.buf[:k]...)
			eof = b.closed && k == len(b.buf)
			b.mu.Unlock()
			return data, eof, nil
		}
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, false, nil
		}
	}
}
