package observer

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math/bits"
)

// Specification constants of the stream hash and its summary.
const (
	// DefaultBlock is the default distance between kept hash values: 8
	// bytes of memory per 64 KiB received, and a divergence is located
	// to within 64 KiB.
	DefaultBlock = 64 << 10
	// MinBlock and MaxBlock bound a block size (a power of two).
	MinBlock = 4 << 10
	MaxBlock = 1 << 30
	// SummaryVersion is the version byte of an encoded Summary.
	SummaryVersion = 1
	// SummaryHeaderLen is the fixed part of an encoded Summary.
	SummaryHeaderLen = 40
)

// SummaryMagic opens every encoded Summary.
var SummaryMagic = [4]byte{'R', 'D', 'H', 'S'}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Hash is the value of a stream hash at an offset x: CRC-32C of the
// stream's bytes [0, x) in the high half, CRC-32 (IEEE) of the same bytes
// in the low half. Both CRCs are their own running state, so the value at
// any offset continues to the value at any later one, and both run at
// memory speed (hardware CRC32C and PCLMULQDQ on amd64). Hash(0) is 0.
type Hash uint64

// update returns the hash of a stream extended by p.
func (h Hash) update(p []byte) Hash {
	c := crc32.Update(uint32(h>>32), castagnoli, p)
	i := crc32.Update(uint32(h), crc32.IEEETable, p)
	return Hash(uint64(c)<<32 | uint64(i))
}

// HashOf returns the hash of the stream p (from its offset 0).
func HashOf(p []byte) Hash { return Hash(0).update(p) }

func checkBlock(block uint64) error {
	if block < MinBlock || block > MaxBlock || bits.OnesCount64(block) != 1 {
		return fmt.Errorf("observer: block size %d is not a power of two in [%d, %d]", block, MinBlock, MaxBlock)
	}
	return nil
}

// StreamHash is the running hash of one direction of a connection, kept
// by its receiver: the hash at the current offset, and at every multiple
// of the block size passed (its points). It is what a receiver tells a
// restarted sender (Summary) so that the sender can check its regenerated
// bytes without the receiver keeping them. Not safe for concurrent use.
type StreamHash struct {
	block  uint64
	off    uint64
	sum    Hash
	first  uint64 // block index of points[0]
	points []Hash // hash at (first+i)·block
}

// NewStreamHash returns a stream hash with the given block size that
// starts at offset from, where the stream's hash is seed (0 and 0 for a
// stream followed from its start).
func NewStreamHash(block, from uint64, seed Hash) (*StreamHash, error) {
	if err := checkBlock(block); err != nil {
		return nil, err
	}
	return &StreamHash{block: block, off: from, sum: seed, first: from/block + 1}, nil
}

// Write hashes the next bytes of the stream.
func (h *StreamHash) Write(p []byte) {
	for len(p) > 0 {
		next := (h.off/h.block + 1) * h.block
		n := min(uint64(len(p)), next-h.off)
		h.sum = h.sum.update(p[:n])
		h.off += n
		p = p[n:]
		if h.off == next {
			if len(h.points) == 0 {
				h.first = h.off / h.block
			}
			h.points = append(h.points, h.sum)
		}
	}
}

// Offset is the number of bytes of the stream hashed (its end offset).
func (h *StreamHash) Offset() uint64 { return h.off }

// Sum is the hash at Offset.
func (h *StreamHash) Sum() Hash { return h.sum }

// Forget drops the points below offset off (once the sender has a
// checkpoint there and will never regenerate the bytes before it).
func (h *StreamHash) Forget(off uint64) {
	k := off / h.block
	if k <= h.first {
		return
	}
	drop := min(k-h.first, uint64(len(h.points)))
	h.points = append(h.points[:0], h.points[drop:]...)
	h.first += drop
}

// Summary is what the receiver tells the restarted sender.
func (h *StreamHash) Summary() Summary {
	return Summary{Block: h.block, End: h.off, Sum: h.sum, First: h.first, Points: append([]Hash(nil), h.points...)}
}

// Summary is a receiver's account of one direction of a connection: it
// has the bytes [0, End), whose hash is Sum, and Points[i] is the hash at
// offset (First+i)·Block. Points may be empty or start late (Forget).
type Summary struct {
	Block  uint64
	End    uint64
	Sum    Hash
	First  uint64
	Points []Hash
}

// point returns the hash at offset off if the summary has it.
func (s *Summary) point(off uint64) (Hash, bool) {
	if off == s.End {
		return s.Sum, true
	}
	if off%s.Block != 0 || off/s.Block < s.First || off/s.Block-s.First >= uint64(len(s.Points)) {
		return 0, false
	}
	return s.Points[off/s.Block-s.First], true
}

// Validate reports why s cannot be encoded (or makes no sense), or nil.
func (s *Summary) Validate() error {
	bad := func(field string, v, max uint64) error {
		return &FormatError{What: "summary", Field: field, Value: v, Max: max, Err: ErrFormat}
	}
	if err := checkBlock(s.Block); err != nil {
		return bad("block", s.Block, MaxBlock)
	}
	if len(s.Points) == 0 {
		return nil
	}
	if s.First == 0 {
		return bad("first", 0, 0)
	}
	last, carry := bits.Add64(s.First, uint64(len(s.Points)-1), 0)
	hi, lo := bits.Mul64(last, s.Block)
	if carry != 0 || hi != 0 || lo > s.End {
		return bad("count (points past end)", uint64(len(s.Points)), s.End/s.Block-s.First+1)
	}
	return nil
}

// AppendSummary appends the encoding of s to b (see the package doc for
// the layout), or returns b and the error of Validate.
func AppendSummary(b []byte, s *Summary) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return b, err
	}
	le := binary.LittleEndian
	b = append(b, SummaryMagic[:]...)
	b = append(b, SummaryVersion, byte(bits.TrailingZeros64(s.Block)), 0, 0)
	b = le.AppendUint64(b, s.End)
	b = le.AppendUint64(b, uint64(s.Sum))
	b = le.AppendUint64(b, s.First)
	b = le.AppendUint32(b, uint32(len(s.Points)))
	b = le.AppendUint32(b, 0)
	for _, p := range s.Points {
		b = le.AppendUint64(b, uint64(p))
	}
	return b, nil
}

// DecodeSummary decodes the summary at the start of b and returns it with
// the number of bytes consumed. Errors are as for DecodeDeterminant:
// io.EOF, a *FormatError wrapping io.ErrUnexpectedEOF, or one wrapping
// ErrFormat naming the field.
func DecodeSummary(b []byte) (Summary, int, error) {
	if len(b) == 0 {
		return Summary{}, 0, io.EOF
	}
	short := func(field string) error {
		return &FormatError{What: "summary", Field: field, Err: io.ErrUnexpectedEOF}
	}
	bad := func(field string, v, max uint64) error {
		return &FormatError{What: "summary", Field: field, Value: v, Max: max, Err: ErrFormat}
	}
	n := min(len(b), 4)
	if string(b[:n]) != string(SummaryMagic[:n]) {
		return Summary{}, 0, bad("magic", 0, 0)
	}
	switch {
	case n < 4:
		return Summary{}, 0, short("magic")
	case len(b) < 5:
		return Summary{}, 0, short("version")
	case b[4] != SummaryVersion:
		return Summary{}, 0, bad("version", uint64(b[4]), SummaryVersion)
	case len(b) < 6:
		return Summary{}, 0, short("block")
	case b[5] >= 64 || checkBlock(1<<b[5]) != nil:
		return Summary{}, 0, bad("block (log2)", uint64(b[5]), 30)
	case len(b) < 8:
		return Summary{}, 0, short("reserved")
	case b[6] != 0 || b[7] != 0:
		return Summary{}, 0, bad("reserved", uint64(b[6])<<8|uint64(b[7]), 0)
	case len(b) < SummaryHeaderLen:
		return Summary{}, 0, short([]string{"end", "end", "sum", "sum", "first", "first", "count", "reserved"}[(len(b)-8)/4])
	}
	le := binary.LittleEndian
	s := Summary{Block: 1 << b[5], End: le.Uint64(b[8:]), Sum: Hash(le.Uint64(b[16:])), First: le.Uint64(b[24:])}
	count := uint64(le.Uint32(b[32:]))
	if r := le.Uint32(b[36:]); r != 0 {
		return Summary{}, 0, bad("reserved", uint64(r), 0)
	}
	if count > 0 {
		if uint64(len(b)-SummaryHeaderLen) < count*8 { // before allocating: count is not trusted
			return Summary{}, 0, short("points")
		}
		s.Points = make([]Hash, 0, count)
		for i := range count {
			s.Points = append(s.Points, Hash(le.Uint64(b[SummaryHeaderLen+8*i:])))
		}
	}
	if err := s.Validate(); err != nil {
		return Summary{}, 0, err
	}
	return s, SummaryHeaderLen + int(count)*8, nil
}

// OutputError says that a restarted process's regenerated bytes on a
// connection differ from what the peer already received.
type OutputError struct {
	Owner   uint64 // the restarted process
	Conn    uint64
	From    uint64 // the first differing byte is in [From, To)
	To      uint64
	PeerEnd uint64 // bytes the peer had received
	// Short: the process ended its output at To (Close), before
	// regenerating all the bytes the peer had.
	Short bool
}

func (e *OutputError) Error() string {
	if e.Short {
		return fmt.Sprintf("observer: process %d diverged on connection %s: it ended its output at offset %d, but the peer had received %d bytes",
			e.Owner, ConnString(e.Conn), e.To, e.PeerEnd)
	}
	return fmt.Sprintf("observer: process %d diverged on connection %s at offset %d: its regenerated bytes [%d, %d) differ from those the peer received (hash mismatch; the peer has %d bytes)",
		e.Owner, ConnString(e.Conn), e.From, e.From, e.To, e.PeerEnd)
}

// Is makes errors.Is(err, ErrDiverged) true.
func (e *OutputError) Is(target error) bool { return target == ErrDiverged }

// OutputCheck checks a restarted process's regenerated output on one
// connection against the peer's Summary: the bytes the peer already has
// are hashed, compared at every point of the summary and at its end, and
// dropped; the bytes past the peer's end are returned to be sent. Send
// boundaries do not matter: only the byte stream is hashed. Not safe for
// concurrent use.
type OutputCheck struct {
	owner, conn uint64
	peer        Summary
	off         uint64 // regenerated bytes so far
	sum         Hash   // hash at off
	good        uint64 // the last offset where the hashes were seen equal
	err         error
}

// NewOutputCheck returns the check of owner's output on conn. The process
// regenerates from offset from, where its hash is seed (0, 0 for a
// re-executed process; a checkpoint image records both). peer is the
// receiver's Summary, at or past from.
func NewOutputCheck(owner, conn uint64, from uint64, seed Hash, peer Summary) (*OutputCheck, error) {
	if err := peer.Validate(); err != nil {
		return nil, fmt.Errorf("observer: output check of process %d, connection %s: %w", owner, ConnString(conn), err)
	}
	if from > peer.End {
		return nil, fmt.Errorf("observer: output check of process %d, connection %s: it restarts at offset %d, past the %d bytes its peer has (the bytes between are lost)",
			owner, ConnString(conn), from, peer.End)
	}
	return &OutputCheck{owner: owner, conn: conn, peer: peer, off: from, sum: seed, good: from}, nil
}

// Write takes the next regenerated bytes p and returns the suffix of p
// that the peer does not have yet (to be sent), or an *OutputError
// (ErrDiverged). After an error every call returns it.
func (c *OutputCheck) Write(p []byte) (fresh []byte, err error) {
	if c.err != nil {
		return nil, c.err
	}
	for len(p) > 0 && c.off < c.peer.End {
		next := min((c.off/c.peer.Block+1)*c.peer.Block, c.peer.End)
		n := min(uint64(len(p)), next-c.off)
		c.sum = c.sum.update(p[:n])
		c.off += n
		p = p[n:]
		if want, ok := c.peer.point(c.off); ok {
			if want != c.sum {
				c.err = &OutputError{Owner: c.owner, Conn: c.conn, From: c.good, To: c.off, PeerEnd: c.peer.End}
				return nil, c.err
			}
			c.good = c.off
		}
	}
	c.off += uint64(len(p))
	return p, nil
}

// Offset is the number of bytes regenerated (including those dropped).
func (c *OutputCheck) Offset() uint64 { return c.off }

// Caught reports whether the regenerated output has reached the peer's
// end: from now on every byte is fresh.
func (c *OutputCheck) Caught() bool { return c.off >= c.peer.End }

// Close is called when the process ends its output on the connection
// (shutdown, close, exit). Ending it before the peer's end is a
// divergence.
func (c *OutputCheck) Close() error {
	if c.err != nil {
		return c.err
	}
	if c.off < c.peer.End {
		c.err = &OutputError{Owner: c.owner, Conn: c.conn, From: c.good, To: c.off, PeerEnd: c.peer.End, Short: true}
		return c.err
	}
	return nil
}
