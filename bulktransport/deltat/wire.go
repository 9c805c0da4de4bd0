package deltat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Wire format of one delta-t packet (big endian), the payload of one torus
// packet:
//
//	0  flags    1   DRF, EOM, ACK, DATA, BOM
//	1  reserved 1   zero
//	2  window   2   segments the sender of this packet will buffer (with ACK)
//	4  seq      4   sequence number of the data segment (with DATA)
//	8  ack      4   next sequence number expected from the peer (with ACK)
//	12 data         up to SegData bytes (with DATA)
const (
	HeaderLen = 12
	// SegData is the message bytes per segment: a torus payload minus the
	// delta-t header.
	SegData = 240 - HeaderLen
)

// Flags of a delta-t packet.
const (
	// FlagDRF (data run flag, Watson) marks a segment sent when nothing
	// before it was outstanding: a receiver without state may start a
	// connection record from it. A receiver without state drops any other
	// segment.
	FlagDRF = 1 << 0
	// FlagEOM marks the last segment of a message.
	FlagEOM = 1 << 1
	// FlagACK says the ack and window fields are valid.
	FlagACK = 1 << 2
	// FlagData says the packet carries a segment (seq and data valid).
	FlagData = 1 << 3
	// FlagBOM marks the first segment of a message. The receiver does not
	// need it (it reassembles in sequence order); it lets a trace decoder
	// find message boundaries in a single packet.
	FlagBOM = 1 << 4

	knownFlags = FlagDRF | FlagEOM | FlagACK | FlagData | FlagBOM
)

// Errors.
var ErrBadPacket = errors.New("deltat: malformed packet")

// Header is a decoded delta-t header.
type Header struct {
	Flags  uint8
	Window uint16
	Seq    uint32
	Ack    uint32
}

// Append encodes h and data onto b.
func Append(b []byte, h Header, data []byte) []byte {
	b = append(b, h.Flags, 0)
	b = binary.BigEndian.AppendUint16(b, h.Window)
	b = binary.BigEndian.AppendUint32(b, h.Seq)
	b = binary.BigEndian.AppendUint32(b, h.Ack)
	return append(b, data...)
}

// Decode parses a delta-t packet; data aliases b.
func Decode(b []byte) (h Header, data []byte, err error) {
	if len(b) == 0 {
		return h, nil, io.EOF
	}
	if len(b) < HeaderLen {
		return h, nil, io.ErrUnexpectedEOF
	}
	h = Header{Flags: b[0], Window: binary.BigEndian.Uint16(b[2:]), Seq: binary.BigEndian.Uint32(b[4:]), Ack: binary.BigEndian.Uint32(b[8:])}
	data = b[HeaderLen:]
	switch {
	case h.Flags&^knownFlags != 0 || b[1] != 0:
		return h, nil, fmt.Errorf("%w: flags %#x", ErrBadPacket, h.Flags)
	case h.Flags&(FlagACK|FlagData) == 0:
		return h, nil, fmt.Errorf("%w: neither data nor ack", ErrBadPacket)
	case h.Flags&FlagData == 0 && (len(data) > 0 || h.Flags&(FlagDRF|FlagEOM|FlagBOM) != 0):
		return h, nil, fmt.Errorf("%w: segment fields on a pure ack", ErrBadPacket)
	case len(data) > SegData:
		return h, nil, fmt.Errorf("%w: %d data bytes", ErrBadPacket, len(data))
	}
	return h, data, nil
}
