// Package record is the on-disk and on-wire format of one msglog record: a
// fixed 40-byte header followed by the payload, all covered by one CRC32C.
//
// Layout (all integers little-endian):
//
//	 0      4       5      6        8          12       20        28       36    40
//	+------+-------+------+--------+----------+--------+---------+--------+-----+---------+
//	|magic |version| kind | flags  |  length  | owner  | stream  | offset | crc | payload |
//	|"RDLG"|  =1   | !=0  |  =0    | ≤MaxPay. | uint64 | uint64  | uint64 | u32 | length  |
//	+------+-------+------+--------+----------+--------+---------+--------+-----+---------+
//
// crc is CRC32C (Castagnoli) over header bytes [0, 36) followed by the
// payload. offset is the stream position of the first payload byte;
// offset+length must not overflow.
//
// [Header] is a view over encoded bytes with accessors; [Record] is the
// decoded form; [AppendRecord] is the encoder and [Decode] the decoder. Decode
// reports io.EOF for empty input, io.ErrUnexpectedEOF for a prefix of a record
// whose fields seen so far are valid, and a *[CorruptError] (errors.Is
// [ErrCorrupt]) naming the field that is wrong. Header fields are checked as
// soon as they are present, so a torn record can be told from garbage.
package record

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// Specification constants.
const (
	// HeaderLen is the size of the fixed header.
	HeaderLen = 40
	// Version is the only format version this package reads and writes.
	Version = 1
	// MaxPayload bounds a record's payload, so that a corrupt length can be
	// recognised without reading it.
	MaxPayload = 16 << 20
)

// Magic opens every record.
var Magic = [4]byte{'R', 'D', 'L', 'G'}

const (
	offMagic   = 0
	offVersion = 4
	offKind    = 5
	offFlags   = 6
	offLength  = 8
	offOwner   = 12
	offStream  = 20
	offOffset  = 28
	offCRC     = 36
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Kind says what a record's payload is. Zero is invalid, so that zeroed disk
// blocks never decode.
type Kind uint8

// Record kinds. The store does not interpret them.
const (
	KindData        Kind = 1 // received application bytes
	KindDeterminant Kind = 2 // encoded determinants
	KindLaunch      Kind = 3 // a process's launch record (package internal/launch)
)

func (k Kind) String() string {
	switch k {
	case KindData:
		return "data"
	case KindDeterminant:
		return "determinant"
	case KindLaunch:
		return "launch"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Record is a decoded record. Owner and Stream are opaque to this package
// (typically a logical process id, and a connection id with direction).
type Record struct {
	Kind    Kind
	Owner   uint64
	Stream  uint64
	Offset  uint64
	Payload []byte
}

// Len is the encoded length of r.
func (r *Record) Len() int { return HeaderLen + len(r.Payload) }

// End is the stream position just past r's payload.
func (r *Record) End() uint64 { return r.Offset + uint64(len(r.Payload)) }

// Validate reports why r cannot be encoded, or nil.
func (r *Record) Validate() error {
	switch {
	case r.Kind == 0:
		return &CorruptError{Field: "kind"}
	case len(r.Payload) > MaxPayload:
		return &CorruptError{Field: "length", Got: uint64(len(r.Payload)), Want: MaxPayload}
	case r.Offset+uint64(len(r.Payload)) < r.Offset:
		return &CorruptError{Field: "offset", Got: r.Offset}
	}
	return nil
}

// AppendRecord appends the encoding of r to b and returns the extended
// slice. r must be valid (see [Record.Validate]); it panics otherwise.
func AppendRecord(b []byte, r *Record) []byte {
	if err := r.Validate(); err != nil {
		panic("record: AppendRecord: " + err.Error())
	}
	start := len(b)
	b = append(b, make([]byte, HeaderLen)...)
	h := Header(b[start:])
	h.Encode(&Fields{Kind: r.Kind, Length: uint32(len(r.Payload)), Owner: r.Owner, Stream: r.Stream, Offset: r.Offset})
	b = append(b, r.Payload...)
	h = Header(b[start:])
	h.setCRC(checksum(h[:offCRC], r.Payload))
	return b
}

// Seal encodes, in place, the record whose payload already sits at
// b[HeaderLen:] (an encoder that writes payloads straight into the
// frame, a copy fewer than AppendRecord): the header from f and the
// checksum. len(b) must be HeaderLen + f.Length, and the record valid
// (see [Record.Validate]); it panics otherwise.
func Seal(b []byte, f *Fields) {
	r := Record{Kind: f.Kind, Owner: f.Owner, Stream: f.Stream, Offset: f.Offset}
	if len(b) < HeaderLen || uint64(len(b)-HeaderLen) != uint64(f.Length) {
		panic("record: Seal: the buffer does not hold the header and f.Length bytes")
	}
	r.Payload = b[HeaderLen:]
	if err := r.Validate(); err != nil {
		panic("record: Seal: " + err.Error())
	}
	h := Header(b)
	h.Encode(f)
	h.setCRC(checksum(h[:offCRC], r.Payload))
}

func checksum(hdr, payload []byte) uint32 {
	c := crc32.Update(0, castagnoli, hdr)
	return crc32.Update(c, castagnoli, payload)
}

// Fields are the header fields an encoder sets (magic, version and checksum
// are implied).
type Fields struct {
	Kind   Kind
	Length uint32
	Owner  uint64
	Stream uint64
	Offset uint64
}

// Header is a view over the first HeaderLen bytes of an encoded record.
// Accessors panic if the view is shorter than HeaderLen.
type Header []byte

// Encode writes magic, version and f into h; the checksum is left zero.
func (h Header) Encode(f *Fields) {
	copy(h[offMagic:], Magic[:])
	h[offVersion] = Version
	h[offKind] = byte(f.Kind)
	binary.LittleEndian.PutUint16(h[offFlags:], 0)
	binary.LittleEndian.PutUint32(h[offLength:], f.Length)
	binary.LittleEndian.PutUint64(h[offOwner:], f.Owner)
	binary.LittleEndian.PutUint64(h[offStream:], f.Stream)
	binary.LittleEndian.PutUint64(h[offOffset:], f.Offset)
	binary.LittleEndian.PutUint32(h[offCRC:], 0)
}

func (h Header) setCRC(c uint32) { binary.LittleEndian.PutUint32(h[offCRC:], c) }

// Version returns the format version byte.
func (h Header) Version() uint8 { return h[offVersion] }

// Kind returns the record kind.
func (h Header) Kind() Kind { return Kind(h[offKind]) }

// Flags returns the flags (always zero in version 1).
func (h Header) Flags() uint16 { return binary.LittleEndian.Uint16(h[offFlags:]) }

// Length returns the payload length.
func (h Header) Length() uint32 { return binary.LittleEndian.Uint32(h[offLength:]) }

// Owner returns the owner id.
func (h Header) Owner() uint64 { return binary.LittleEndian.Uint64(h[offOwner:]) }

// Stream returns the stream id.
func (h Header) Stream() uint64 { return binary.LittleEndian.Uint64(h[offStream:]) }

// Offset returns the stream position of the first payload byte.
func (h Header) Offset() uint64 { return binary.LittleEndian.Uint64(h[offOffset:]) }

// CRC returns the stored checksum.
func (h Header) CRC() uint32 { return binary.LittleEndian.Uint32(h[offCRC:]) }

// ErrCorrupt is matched (errors.Is) by every *CorruptError.
var ErrCorrupt = errors.New("record: corrupt")

// CorruptError says which field of an encoded record is wrong.
type CorruptError struct {
	Field string // "magic", "version", "kind", "flags", "length", "offset" or "checksum"
	Got   uint64 // the value found, where it is a number
	Want  uint64 // the value expected (for "length": the maximum)
}

func (e *CorruptError) Error() string {
	switch e.Field {
	case "magic", "kind", "offset":
		return fmt.Sprintf("record: bad %s %#x", e.Field, e.Got)
	case "length":
		return fmt.Sprintf("record: bad length %d (max %d)", e.Got, e.Want)
	}
	return fmt.Sprintf("record: bad %s %#x (want %#x)", e.Field, e.Got, e.Want)
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// CheckHeader validates the header fields present in b (a possibly short
// prefix of a record). It returns the payload length when the whole header is
// present; io.EOF for empty b; io.ErrUnexpectedEOF when b is a valid but short
// prefix; a *CorruptError otherwise.
func CheckHeader(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, io.EOF
	}
	n := min(len(b), 4)
	for i := 0; i < n; i++ {
		if b[i] != Magic[i] {
			var got [4]byte
			copy(got[:], b[:n])
			return 0, &CorruptError{Field: "magic", Got: uint64(binary.BigEndian.Uint32(got[:]))}
		}
	}
	if len(b) > offVersion && b[offVersion] != Version {
		return 0, &CorruptError{Field: "version", Got: uint64(b[offVersion]), Want: Version}
	}
	if len(b) > offKind && b[offKind] == 0 {
		return 0, &CorruptError{Field: "kind", Got: 0}
	}
	if len(b) >= offFlags+2 {
		if f := binary.LittleEndian.Uint16(b[offFlags:]); f != 0 {
			return 0, &CorruptError{Field: "flags", Got: uint64(f), Want: 0}
		}
	}
	if len(b) < offLength+4 {
		return 0, io.ErrUnexpectedEOF
	}
	length := binary.LittleEndian.Uint32(b[offLength:])
	if length > MaxPayload {
		return 0, &CorruptError{Field: "length", Got: uint64(length), Want: MaxPayload}
	}
	if len(b) >= offOffset+8 {
		off := binary.LittleEndian.Uint64(b[offOffset:])
		if off+uint64(length) < off {
			return 0, &CorruptError{Field: "offset", Got: off}
		}
	}
	if len(b) < HeaderLen {
		return 0, io.ErrUnexpectedEOF
	}
	return int(length), nil
}

// Decode decodes the record at the start of b and returns it with the number
// of bytes consumed. The returned Payload aliases b. Errors are as for
// CheckHeader, plus io.ErrUnexpectedEOF for a short payload and a
// *CorruptError{Field: "checksum"} for a checksum mismatch.
func Decode(b []byte) (Record, int, error) {
	length, err := CheckHeader(b)
	if err != nil {
		return Record{}, 0, err
	}
	n := HeaderLen + length
	if len(b) < n {
		return Record{}, 0, io.ErrUnexpectedEOF
	}
	h := Header(b[:HeaderLen])
	payload := b[HeaderLen:n:n]
	if got, want := checksum(h[:offCRC], payload), h.CRC(); got != want {
		return Record{}, 0, &CorruptError{Field: "checksum", Got: uint64(want), Want: uint64(got)}
	}
	return Record{
		Kind:    h.Kind(),
		Owner:   h.Owner(),
		Stream:  h.Stream(),
		Offset:  h.Offset(),
		Payload: payload,
	}, n, nil
}
