package bulk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Op is a bulk operation code. The opcode and its parameter are reserved
// to the protocol (seed 001); the 24 bytes of application data are not
// interpreted.
type Op uint8

// Control operations travel as delta-t messages (reliable); data-path
// operations travel as raw torus packets (unreliable: the receiver
// re-requests what is missing).
const (
	OpGet    Op = iota + 1 // control, sender -> receiver: "take Length bytes, tag Param"
	OpNak                  // control, receiver -> sender: cannot take it (Word = reason)
	OpAck                  // control, receiver -> sender: all data received; release it
	OpCancel               // control, sender -> receiver: forget the transfer
	OpRGet                 // data path, receiver -> sender: remote get of [Offset, Offset+Length)
	OpData                 // data path, sender -> receiver: bytes at Offset
	OpRNak                 // data path, sender -> receiver: no such tag (cancelled, or the sender restarted)
)

func (o Op) String() string {
	switch o {
	case OpGet:
		return "get"
	case OpNak:
		return "nak"
	case OpAck:
		return "ack"
	case OpCancel:
		return "cancel"
	case OpRGet:
		return "rget"
	case OpData:
		return "data"
	case OpRNak:
		return "rnak"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Specification constants.
const (
	// HeaderLen is the bulk message header of seed 001: source,
	// destination, operation, parameter and 24 bytes of application data.
	HeaderLen = 32
	// MetaLen is the application data in the header.
	MetaLen = 24
	// ControlLen is a control message: the header and one 32-bit word
	// (the length for Get, the reason for Nak).
	ControlLen = HeaderLen + 4
	// RGetLen is a remote-get request: op, tag, offset, length.
	RGetLen = 12
	// DataHeaderLen is the header of a data packet: op, tag, offset.
	DataHeaderLen = 8
	// ChunkData is the bytes per data packet: a torus payload minus the
	// data header.
	ChunkData = 240 - DataHeaderLen
	// MaxTag is the largest tag (24 bits).
	MaxTag = 1<<24 - 1
	// MaxNode is the largest node id a bulk header can name (16 bits: the
	// 65,536-node machine).
	MaxNode = 1<<16 - 1
)

// Nak reasons.
const (
	ReasonNoBuffer  = 1 // the receiver's bulk buffer is full
	ReasonTooLarge  = 2 // larger than the receiver's limit
	ReasonDuplicate = 3 // the tag is already being received
)

// Errors.
var ErrBadPacket = errors.New("bulk: malformed packet")

// Header is the 32-byte bulk header. Wire format (big endian):
//
//	0  src     2   node id
//	2  dst     2   node id
//	4  op      1
//	5  param   3   the tag for every operation
//	8  meta   24   application data, not interpreted
type Header struct {
	Src, Dst uint16
	Op       Op
	Param    uint32 // 24 bits
	Meta     [MetaLen]byte
}

// Control is a control message: the header plus one word.
type Control struct {
	Header
	Word uint32 // Get: length; Nak: reason
}

// AppendControl encodes c onto b.
func AppendControl(b []byte, c Control) []byte {
	b = binary.BigEndian.AppendUint16(b, c.Src)
	b = binary.BigEndian.AppendUint16(b, c.Dst)
	b = append(b, byte(c.Op), byte(c.Param>>16), byte(c.Param>>8), byte(c.Param))
	b = append(b, c.Meta[:]...)
	return binary.BigEndian.AppendUint32(b, c.Word)
}

// DecodeControl parses a control message.
func DecodeControl(b []byte) (c Control, err error) {
	if len(b) == 0 {
		return c, io.EOF
	}
	if len(b) < ControlLen {
		return c, io.ErrUnexpectedEOF
	}
	if len(b) > ControlLen {
		return c, fmt.Errorf("%w: %d trailing bytes", ErrBadPacket, len(b)-ControlLen)
	}
	c.Src, c.Dst = binary.BigEndian.Uint16(b), binary.BigEndian.Uint16(b[2:])
	c.Op = Op(b[4])
	c.Param = uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7])
	copy(c.Meta[:], b[8:32])
	c.Word = binary.BigEndian.Uint32(b[32:])
	if c.Op < OpGet || c.Op > OpCancel {
		return c, fmt.Errorf("%w: control op %d", ErrBadPacket, b[4])
	}
	return c, nil
}

// DataPath is a decoded data-path packet (RGet, Data or RNak).
type DataPath struct {
	Op     Op
	Tag    uint32
	Offset uint32
	Length uint32 // RGet only
	Data   []byte // Data only; aliases the packet
}

// AppendRGet encodes a remote-get request.
func AppendRGet(b []byte, tag, off, n uint32) []byte {
	b = append(b, byte(OpRGet), byte(tag>>16), byte(tag>>8), byte(tag))
	b = binary.BigEndian.AppendUint32(b, off)
	return binary.BigEndian.AppendUint32(b, n)
}

// AppendDataHeader encodes the header of a Data (or, with no data, RNak)
// packet; the data follows it.
func AppendDataHeader(b []byte, op Op, tag, off uint32) []byte {
	b = append(b, byte(op), byte(tag>>16), byte(tag>>8), byte(tag))
	return binary.BigEndian.AppendUint32(b, off)
}

// DecodeDataPath parses a data-path packet.
func DecodeDataPath(b []byte) (p DataPath, err error) {
	if len(b) == 0 {
		return p, io.EOF
	}
	if len(b) < DataHeaderLen {
		return p, io.ErrUnexpectedEOF
	}
	p.Op = Op(b[0])
	p.Tag = uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	p.Offset = binary.BigEndian.Uint32(b[4:])
	rest := b[DataHeaderLen:]
	switch p.Op {
	case OpRGet:
		if len(rest) < 4 {
			return p, io.ErrUnexpectedEOF
		}
		if len(rest) > 4 {
			return p, fmt.Errorf("%w: rget with %d trailing bytes", ErrBadPacket, len(rest)-4)
		}
		p.Length = binary.BigEndian.Uint32(rest)
	case OpData:
		if len(rest) > ChunkData {
			return p, fmt.Errorf("%w: %d data bytes", ErrBadPacket, len(rest))
		}
		p.Data = rest
	case OpRNak:
		if len(rest) != 0 {
			return p, fmt.Errorf("%w: rnak with data", ErrBadPacket)
		}
	default:
		return p, fmt.Errorf("%w: data-path op %d", ErrBadPacket, b[0])
	}
	return p, nil
}
