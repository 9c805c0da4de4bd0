package netsim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Specification constants: the payload sizes of the Blue Gene networks
// (seed 001, "Data network basics") and our software headers in front of
// them.
const (
	// TorusPayload is the user data one torus packet carries.
	TorusPayload = 240
	// TorusHeaderLen is the torus packet header.
	TorusHeaderLen = 16
	// MaxTorusPacket is a whole torus packet.
	MaxTorusPacket = TorusHeaderLen + TorusPayload

	// TreePayload is the user data one collective-network packet carries.
	TreePayload = 256
	// TreeHeaderLen is the collective packet header.
	TreeHeaderLen = 16
	// MaxTreePacket is a whole collective packet.
	MaxTreePacket = TreeHeaderLen + TreePayload

	torusMagic = 'T'
	treeMagic  = 'C'
)

// Proto names the layer a packet's payload belongs to.
type Proto uint8

// Payload protocols.
const (
	ProtoRaw       Proto = iota // uninterpreted (tests, probes)
	ProtoFrag                   // bulktransport/frag: unreliable datagrams up to 64 KiB
	ProtoDeltaT                 // bulktransport/deltat: reliable in-order messages
	ProtoBulk                   // bulktransport/bulk: remote-get requests and data
	ProtoHeartbeat              // heartbeat ring datagrams
)

func (p Proto) String() string {
	switch p {
	case ProtoRaw:
		return "raw"
	case ProtoFrag:
		return "frag"
	case ProtoDeltaT:
		return "deltat"
	case ProtoBulk:
		return "bulk"
	case ProtoHeartbeat:
		return "heartbeat"
	}
	return fmt.Sprintf("Proto(%d)", uint8(p))
}

// Decoding errors. Truncation is io.EOF (empty) or io.ErrUnexpectedEOF.
var (
	ErrBadMagic  = errors.New("netsim: bad magic")
	ErrBadPacket = errors.New("netsim: malformed packet")
)

// TorusHeader is a torus packet header. Wire format (big endian):
//
//	 0  magic 'T'   1
//	 1  route:4 proto:4   the route (high nibble, Route) and the proto
//	 2  hops        1   links crossed so far
//	 3  length      1   payload bytes, 0..240
//	 4  src x,y,z   2 each
//	10  dst x,y,z   2 each
//	16  payload
type TorusHeader struct {
	Proto  Proto // 0..15
	Route  Route // 0: dimension order
	Hops   uint8
	Length uint8
	Src    Coord
	Dst    Coord
}

// AppendTorus encodes h and payload onto b. It panics when payload is
// larger than TorusPayload: that is a bug in the layer above, which must
// fragment.
func AppendTorus(b []byte, h TorusHeader, payload []byte) []byte {
	if len(payload) > TorusPayload {
		panic(fmt.Sprintf("netsim: %d-byte torus payload", len(payload)))
	}
	b = append(b, torusMagic, byte(h.Route)<<4|byte(h.Proto)&0x0f, h.Hops, byte(len(payload)))
	for _, v := range []uint16{h.Src.X, h.Src.Y, h.Src.Z, h.Dst.X, h.Dst.Y, h.Dst.Z} {
		b = binary.BigEndian.AppendUint16(b, v)
	}
	return append(b, payload...)
}

// DecodeTorus parses a torus packet; payload aliases b.
func DecodeTorus(b []byte) (h TorusHeader, payload []byte, err error) {
	if len(b) == 0 {
		return h, nil, io.EOF
	}
	if len(b) < TorusHeaderLen {
		return h, nil, io.ErrUnexpectedEOF
	}
	if b[0] != torusMagic {
		return h, nil, ErrBadMagic
	}
	h.Proto, h.Route, h.Hops, h.Length = Proto(b[1]&0x0f), Route(b[1]>>4), b[2], b[3]
	h.Src = Coord{binary.BigEndian.Uint16(b[4:]), binary.BigEndian.Uint16(b[6:]), binary.BigEndian.Uint16(b[8:])}
	h.Dst = Coord{binary.BigEndian.Uint16(b[10:]), binary.BigEndian.Uint16(b[12:]), binary.BigEndian.Uint16(b[14:])}
	if int(h.Length) > TorusPayload {
		return h, nil, fmt.Errorf("%w: length %d", ErrBadPacket, h.Length)
	}
	rest := b[TorusHeaderLen:]
	if len(rest) < int(h.Length) {
		return h, nil, io.ErrUnexpectedEOF
	}
	if len(rest) > int(h.Length) {
		return h, nil, fmt.Errorf("%w: %d trailing bytes", ErrBadPacket, len(rest)-int(h.Length))
	}
	return h, rest, nil
}

// TreeClass says how the collective network treats a packet.
type TreeClass uint8

// Collective packet classes.
const (
	// TreeBroadcast travels up to the root and from there down to every
	// node; every node, the sender included, delivers it once.
	TreeBroadcast TreeClass = iota + 1
	// TreeReduce is a contribution travelling up: each switch combines
	// its children's and its own contribution with Op before sending one
	// packet to its parent.
	TreeReduce
	// TreeResult is the combined value the root sends down to every node.
	TreeResult
)

func (c TreeClass) String() string {
	switch c {
	case TreeBroadcast:
		return "broadcast"
	case TreeReduce:
		return "reduce"
	case TreeResult:
		return "result"
	}
	return fmt.Sprintf("TreeClass(%d)", uint8(c))
}

// ReduceOp combines reduce contributions, lane by lane; a lane is a
// big-endian uint64, so a reduce payload is a multiple of 8 bytes.
type ReduceOp uint8

// Reduce operators.
const (
	OpNone ReduceOp = iota
	OpAdd
	OpMax
	OpMin
	OpOr
	OpXor
)

func (o ReduceOp) String() string {
	if o <= OpXor {
		return [...]string{"none", "add", "max", "min", "or", "xor"}[o]
	}
	return fmt.Sprintf("ReduceOp(%d)", uint8(o))
}

// TreeHeader is a collective packet header. Wire format (big endian):
//
//	 0  magic 'C'   1
//	 1  proto       1
//	 2  class       1   broadcast, reduce, result
//	 3  op          1   reduce operator
//	 4  length      2   payload bytes, 0..256
//	 6  src         4   broadcaster; for reduce/result the lowest contributor
//	10  seq         4   broadcast or reduction number
//	14  count       2   contributions combined into the payload
//	16  payload
type TreeHeader struct {
	Proto  Proto
	Class  TreeClass
	Op     ReduceOp
	Length uint16
	Src    NodeID
	Seq    uint32
	Count  uint16
}

// AppendTree encodes h and payload onto b; it panics when payload is
// larger than TreePayload.
func AppendTree(b []byte, h TreeHeader, payload []byte) []byte {
	if len(payload) > TreePayload {
		panic(fmt.Sprintf("netsim: %d-byte tree payload", len(payload)))
	}
	b = append(b, treeMagic, byte(h.Proto), byte(h.Class), byte(h.Op))
	b = binary.BigEndian.AppendUint16(b, uint16(len(payload)))
	b = binary.BigEndian.AppendUint32(b, uint32(h.Src))
	b = binary.BigEndian.AppendUint32(b, h.Seq)
	b = binary.BigEndian.AppendUint16(b, h.Count)
	return append(b, payload...)
}

// DecodeTree parses a collective packet; payload aliases b.
func DecodeTree(b []byte) (h TreeHeader, payload []byte, err error) {
	if len(b) == 0 {
		return h, nil, io.EOF
	}
	if len(b) < TreeHeaderLen {
		return h, nil, io.ErrUnexpectedEOF
	}
	if b[0] != treeMagic {
		return h, nil, ErrBadMagic
	}
	h.Proto, h.Class, h.Op = Proto(b[1]), TreeClass(b[2]), ReduceOp(b[3])
	h.Length = binary.BigEndian.Uint16(b[4:])
	h.Src = NodeID(binary.BigEndian.Uint32(b[6:]))
	h.Seq = binary.BigEndian.Uint32(b[10:])
	h.Count = binary.BigEndian.Uint16(b[14:])
	if h.Class < TreeBroadcast || h.Class > TreeResult {
		return h, nil, fmt.Errorf("%w: class %d", ErrBadPacket, b[2])
	}
	if h.Op > OpXor {
		return h, nil, fmt.Errorf("%w: op %d", ErrBadPacket, b[3])
	}
	if h.Length > TreePayload {
		return h, nil, fmt.Errorf("%w: length %d", ErrBadPacket, h.Length)
	}
	if h.Class != TreeBroadcast && h.Length%8 != 0 {
		return h, nil, fmt.Errorf("%w: reduce payload %d not a multiple of 8", ErrBadPacket, h.Length)
	}
	rest := b[TreeHeaderLen:]
	if len(rest) < int(h.Length) {
		return h, nil, io.ErrUnexpectedEOF
	}
	if len(rest) > int(h.Length) {
		return h, nil, fmt.Errorf("%w: %d trailing bytes", ErrBadPacket, len(rest)-int(h.Length))
	}
	return h, rest, nil
}

// Combine folds src into dst lane by lane with op; both are reduce
// payloads of equal length.
func Combine(op ReduceOp, dst, src []byte) {
	for i := 0; i+8 <= len(dst) && i+8 <= len(src); i += 8 {
		a, b := binary.BigEndian.Uint64(dst[i:]), binary.BigEndian.Uint64(src[i:])
		switch op {
		case OpAdd:
			a += b
		case OpMax:
			a = max(a, b)
		case OpMin:
			a = min(a, b)
		case OpOr:
			a |= b
		case OpXor:
			a ^= b
		}
		binary.BigEndian.PutUint64(dst[i:], a)
	}
}

// NextPacket splits the first whole packet off a link frame: one UDP
// datagram of netsim/udplink carrying torus and collective packets back
// to back (each says its own length). It checks only the magic and the
// length; the packet's own decoder checks the rest. A frame whose tail
// is not a whole packet is malformed from there on.
func NextPacket(frame []byte) (pkt, rest []byte, err error) {
	if len(frame) == 0 {
		return nil, nil, io.EOF
	}
	var n int
	switch frame[0] {
	case torusMagic:
		if len(frame) < TorusHeaderLen {
			return nil, nil, io.ErrUnexpectedEOF
		}
		n = TorusHeaderLen + int(frame[3])
	case treeMagic:
		if len(frame) < TreeHeaderLen {
			return nil, nil, io.ErrUnexpectedEOF
		}
		n = TreeHeaderLen + int(binary.BigEndian.Uint16(frame[4:]))
	default:
		return nil, nil, ErrBadMagic
	}
	if len(frame) < n {
		return nil, nil, io.ErrUnexpectedEOF
	}
	return frame[:n:n], frame[n:], nil
}
