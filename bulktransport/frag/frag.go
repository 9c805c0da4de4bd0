// Package frag is the fragmentation protocol of seed 001: unreliable
// datagrams of up to 64 KiB carried in 240-byte torus packets, with a
// header that lets one receiver reassemble correctly while many senders
// talk to it at once. Loss of any fragment loses the datagram; reliability
// is delta-t's job.
//
// Wire format of one fragment (big endian), the payload of one torus
// packet:
//
//	0  msgid   2   per sender, wraps
//	2  index   2   fragment number, 0-based
//	4  total   4   datagram length, 0..65536
//	8  data        FragData bytes, fewer in the last fragment
//
// A fragment's offset is index*FragData, and its length follows from
// total, so a fragment whose length disagrees is rejected rather than
// written out of place. Reassembly is keyed by (source node, msgid): the
// source comes from the torus header, so two senders using the same msgid
// never mix.
package frag

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/radic-project/radic/bulktransport/internal/timerq"
)

// Specification constants.
const (
	HeaderLen = 8
	// FragData is the datagram bytes per fragment: a torus payload minus
	// the fragment header.
	FragData = 240 - HeaderLen
	// MaxDatagram is the largest datagram (seed 001: "messages of up to
	// 64 kbytes").
	MaxDatagram = 64 << 10
	// MaxFragments is the fragment count of the largest datagram.
	MaxFragments = (MaxDatagram + FragData - 1) / FragData
	// DefaultTimeout is how long a partial datagram waits for its missing
	// fragments: longer than the time the fragments of one datagram take
	// to cross the machine, shorter than a msgid takes to wrap.
	DefaultTimeout = 100 * time.Millisecond
	// DefaultMaxPending bounds the bytes held in partial datagrams.
	DefaultMaxPending = 4 << 20
)

// Errors.
var (
	ErrBadFragment = errors.New("frag: malformed fragment")
	ErrTooLarge    = errors.New("frag: datagram larger than 64 KiB")
)

// Header is a decoded fragment header.
type Header struct {
	MsgID uint16
	Index uint16
	Total uint32
}

// Count is the number of fragments of an n-byte datagram (1 for n = 0).
func Count(n int) int { return max(1, (n+FragData-1)/FragData) }

// span is the offset and length of fragment i of a total-byte datagram.
func span(i, total int) (off, n int) {
	off = i * FragData
	return off, min(FragData, total-off)
}

// AppendFragment appends fragment index of datagram msg to b.
func AppendFragment(b []byte, msgid uint16, msg []byte, index int) []byte {
	off, n := span(index, len(msg))
	b = binary.BigEndian.AppendUint16(b, msgid)
	b = binary.BigEndian.AppendUint16(b, uint16(index))
	b = binary.BigEndian.AppendUint32(b, uint32(len(msg)))
	return append(b, msg[off:off+n]...)
}

// Decode parses one fragment; data aliases b.
func Decode(b []byte) (h Header, data []byte, err error) {
	if len(b) == 0 {
		return h, nil, io.EOF
	}
	if len(b) < HeaderLen {
		return h, nil, io.ErrUnexpectedEOF
	}
	h = Header{binary.BigEndian.Uint16(b), binary.BigEndian.Uint16(b[2:]), binary.BigEndian.Uint32(b[4:])}
	if h.Total > MaxDatagram {
		return h, nil, fmt.Errorf("%w: total %d", ErrBadFragment, h.Total)
	}
	if int(h.Index) >= Count(int(h.Total)) {
		return h, nil, fmt.Errorf("%w: fragment %d of a %d-byte datagram", ErrBadFragment, h.Index, h.Total)
	}
	_, n := span(int(h.Index), int(h.Total))
	data = b[HeaderLen:]
	if len(data) < n {
		return h, nil, io.ErrUnexpectedEOF
	}
	if len(data) > n {
		return h, nil, fmt.Errorf("%w: %d bytes, want %d", ErrBadFragment, len(data), n)
	}
	return h, data, nil
}

// Sender numbers datagrams. One counter per node, not per peer: the
// receiver keys on (source, msgid), so a sender needs no state for the
// peers it talks to.
type Sender struct{ next uint16 }

// Split cuts msg into fragments and passes each to emit (which must not
// keep the slice: it is reused).
func (s *Sender) Split(msg []byte, emit func(frag []byte)) error {
	if len(msg) > MaxDatagram {
		return ErrTooLarge
	}
	id := s.next
	s.next++
	var buf [240]byte
	for i := range Count(len(msg)) {
		emit(AppendFragment(buf[:0], id, msg, i))
	}
	return nil
}

// Key names a datagram being reassembled.
type Key struct {
	Src   uint32
	MsgID uint16
}

type partial struct {
	buf   []byte
	have  []uint64 // bitmap of fragments received
	left  int      // fragments still missing
	start time.Time
	timer time.Time // its timer entry
}

// Stats count the reassembler's decisions.
type Stats struct {
	Delivered, Fragments, Duplicates, Malformed, Expired, Refused uint64
}

// Reassembler rebuilds datagrams from fragments of any number of senders.
// It is a pure core: time is passed in, and it holds state only for
// datagrams with fragments missing.
type Reassembler struct {
	Timeout    time.Duration
	MaxPending int // bytes
	pending    map[Key]*partial
	timers     timerq.Queue[Key]
	held       int
	Stats      Stats
	visits     uint64 // partials looked at to find or run timers (a test counts them)
}

// NewReassembler makes a reassembler with the default limits.
func NewReassembler() *Reassembler {
	return &Reassembler{Timeout: DefaultTimeout, MaxPending: DefaultMaxPending}
}

// Pending is the number of partial datagrams held.
func (r *Reassembler) Pending() int { return len(r.pending) }

// Step takes one fragment from src. When it completes a datagram, msg is
// the datagram; a one-fragment datagram aliases frag (no copy), a longer
// one is a buffer the caller now owns.
func (r *Reassembler) Step(now time.Time, src uint32, frag []byte) (msg []byte, done bool, err error) {
	h, data, err := Decode(frag)
	if err != nil {
		r.Stats.Malformed++
		return nil, false, err
	}
	r.Stats.Fragments++
	n := Count(int(h.Total))
	if n == 1 {
		r.Stats.Delivered++
		return data, true, nil
	}
	k := Key{src, h.MsgID}
	p := r.pending[k]
	if p != nil && len(p.buf) != int(h.Total) {
		// The msgid wrapped onto a datagram that never completed.
		r.drop(k, p)
		p = nil
	}
	if p == nil {
		if r.held+int(h.Total) > r.MaxPending {
			r.Stats.Refused++
			return nil, false, nil
		}
		if r.pending == nil {
			r.pending = map[Key]*partial{}
		}
		p = &partial{buf: make([]byte, h.Total), have: make([]uint64, (n+63)/64), left: n, start: now}
		r.pending[k] = p
		r.held += int(h.Total)
		r.timers.Schedule(now.Add(r.Timeout), k, &p.timer)
	}
	w, bit := h.Index/64, uint64(1)<<(h.Index%64)
	if p.have[w]&bit != 0 {
		r.Stats.Duplicates++
		return nil, false, nil
	}
	p.have[w] |= bit
	off, _ := span(int(h.Index), int(h.Total))
	copy(p.buf[off:], data)
	p.left--
	if p.left > 0 {
		return nil, false, nil
	}
	r.drop(k, p)
	r.Stats.Delivered++
	return p.buf, true, nil
}

func (r *Reassembler) drop(k Key, p *partial) {
	delete(r.pending, k)
	r.held -= len(p.buf)
	if len(r.pending) == 0 {
		r.pending = nil  // Go maps never shrink; an idle receiver holds none
		r.timers.Clear() // and every timer entry left is stale
	}
}

// NextTick is when Tick has work next, no later than the earliest expiry
// of a partial datagram (zero: none pending).
func (r *Reassembler) NextTick() time.Time { return r.timers.Next() }

// Tick discards partial datagrams older than Timeout and returns the
// earliest time Tick has more to do (zero when nothing is pending).
// Timers are in a heap: it visits only the partials that are due.
func (r *Reassembler) Tick(now time.Time) (next time.Time) {
	for {
		k, at, ok := r.timers.PopDue(now)
		if !ok {
			break
		}
		p := r.pending[k]
		if p == nil || !p.timer.Equal(at) {
			continue // completed, or replaced after the msgid wrapped
		}
		r.visits++
		p.timer = time.Time{}
		if exp := p.start.Add(r.Timeout); now.Before(exp) {
			r.timers.Schedule(exp, k, &p.timer) // Timeout grew
			continue
		}
		r.Stats.Expired++
		r.drop(k, p)
	}
	return r.timers.Next()
}
