package observer

import (
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/radic-project/radic/msglog"
)

// DeterminantStream is the msglog Stream id of an owner's determinant
// stream. Every other Stream id of an owner is a logical connection id:
// the bytes the owner received on that connection. See the package doc.
const DeterminantStream = math.MaxUint64

// ErrReservedConn: a connection id equal to DeterminantStream, which
// cannot name a data stream.
var ErrReservedConn = errors.New("observer: connection id 2^64-1 is reserved for the determinant stream")

// DataKey is the msglog key of the bytes owner received on conn.
func DataKey(owner, conn uint64) (msglog.Key, error) {
	if conn == DeterminantStream {
		return msglog.Key{}, ErrReservedConn
	}
	return msglog.Key{Owner: owner, Stream: conn}, nil
}

// DeterminantKey is the msglog key of owner's determinant stream.
func DeterminantKey(owner uint64) msglog.Key {
	return msglog.Key{Owner: owner, Stream: DeterminantStream}
}

// Source yields one stream's records in offset order and io.EOF at its
// end. *msglog.Cursor satisfies it.
type Source interface {
	Next() (msglog.Record, error)
}

var _ Source = (*msglog.Cursor)(nil)

// Opener opens the data stream of conn at offset from. It returns nil when
// conn's received bytes are not logged (a connection inside the process's
// checkpoint group, whose peer restarts and regenerates them).
//
// Over a store: func(conn, from uint64) Source { return s.Read(owner, conn, from) }.
type Opener func(conn, from uint64) Source

// byteReader turns a Source into a byte stream, checking that its records
// are contiguous.
type byteReader struct {
	src  Source
	off  uint64 // stream offset of buf[0]
	buf  []byte
	done bool // src returned io.EOF
}

// fill reads one more record into buf. It returns io.EOF at the end of
// the stream.
func (r *byteReader) fill() error {
	if r.done {
		return io.EOF
	}
	rec, err := r.src.Next()
	if err == io.EOF {
		r.done = true
		return io.EOF
	}
	if err != nil {
		return err
	}
	if want := r.off + uint64(len(r.buf)); rec.Offset != want {
		return fmt.Errorf("record at offset %d, want %d (not contiguous)", rec.Offset, want)
	}
	r.buf = append(r.buf, rec.Payload...)
	return nil
}

// consume drops the first n buffered bytes.
func (r *byteReader) consume(n int) {
	r.buf = r.buf[n:]
	r.off += uint64(n)
	if len(r.buf) == 0 {
		r.buf = r.buf[:0:0] // let a large record go
	}
}

// read returns the next n bytes of the stream (a copy), or an error if
// the stream ends before them.
func (r *byteReader) read(n int) ([]byte, error) {
	for len(r.buf) < n {
		if err := r.fill(); err == io.EOF {
			return nil, fmt.Errorf("stream ends at offset %d, %d bytes short", r.off+uint64(len(r.buf)), n-len(r.buf))
		} else if err != nil {
			return nil, err
		}
	}
	out := append([]byte(nil), r.buf[:n]...)
	r.consume(n)
	return out, nil
}

// end reads to the end of the stream and returns its end offset; buffered
// bytes are dropped.
func (r *byteReader) end() (uint64, error) {
	for {
		r.consume(len(r.buf))
		if err := r.fill(); err == io.EOF {
			return r.off, nil
		} else if err != nil {
			return 0, err
		}
	}
}
