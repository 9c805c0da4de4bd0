// Package wire is the safe sockets' on-the-wire formats: the hello an
// initiator sends first on a managed connection's data stream, and the
// frames of its control channel (ARCHITECTURE.md, "Control channel").
//
// It is pure (no sockets, no cgo) so that its decoders can be fuzzed: the
// shim reads these bytes from any peer that connects to a radic listener,
// and a peer that is not under radic, or is broken, must get a clear
// error, never a panic or a misread connection.
package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Frame types.
const (
	Open    = 1 // a control channel for ID (Attempt: which resume)
	Ack     = 2 // V1: bytes I delivered (MaxUint64: I read no more), V2: my close marker
	Resume  = 3 // on a new data stream: ID, Attempt, V1: my recvd, V2: my close marker
	Resumed = 4 // V1: my recvd, V2: my close marker
	Go      = 5 // the initiator has the answer: both sides swap
	Refuse  = 6 // the acceptor does not know the connection (any more)
	// Digest follows a Resume (initiator) and a Resumed (acceptor): V1 is
	// the sender's recvd (as in the frame before it), V2 the CRC-32C of
	// the bytes [0, V1) it received. A restarted process replaying its
	// log checks its regenerated sends against its peer's digest.
	Digest = 7
)

// FrameLen is the size of every control frame.
const FrameLen = 40

// Flags of an ack.
const (
	// HeardDone: I have heard that you read no more (your ack said V1 =
	// MaxUint64), so I need nothing more from you. The initiator of a
	// connection it has closed keeps it until it hears this: the acceptor
	// cannot reconnect, so it must never be left waiting for an ack that
	// was lost while the initiator went away.
	HeardDone = 1
)

// A Frame is a control-channel message. On the wire: type, a zero byte,
// Port, Attempt, ID, V1, V2, Listener, Flags, five zero bytes; big endian.
type Frame struct {
	Type    byte
	Port    uint16 // in a resume: the initiator's own port, which names the data stream it replaces
	Attempt uint32
	ID      uint64
	V1, V2  uint64
	// In an open and a resume: the port the initiator connected to, which
	// tells the acceptor where the app will accept the connection.
	Listener uint16
	Flags    byte // in an ack
}

// Bytes encodes f.
func (f Frame) Bytes() []byte {
	b := make([]byte, FrameLen)
	b[0] = f.Type
	binary.BigEndian.PutUint16(b[2:], f.Port)
	binary.BigEndian.PutUint32(b[4:], f.Attempt)
	binary.BigEndian.PutUint64(b[8:], f.ID)
	binary.BigEndian.PutUint64(b[16:], f.V1)
	binary.BigEndian.PutUint64(b[24:], f.V2)
	binary.BigEndian.PutUint16(b[32:], f.Listener)
	b[34] = f.Flags
	return b
}

// ParseFrame decodes one frame; the error says what was wrong with it.
func ParseFrame(b []byte) (Frame, error) {
	switch {
	case len(b) != FrameLen:
		return Frame{}, fmt.Errorf("control frame of %d bytes, want %d", len(b), FrameLen)
	case b[0] < Open || b[0] > Digest:
		return Frame{}, fmt.Errorf("control frame of unknown type %d: % x", b[0], b)
	case b[1] != 0 || !allZero(b[35:]):
		return Frame{}, fmt.Errorf("control frame with nonzero reserved bytes: % x", b)
	}
	return Frame{Type: b[0], Port: binary.BigEndian.Uint16(b[2:]), Attempt: binary.BigEndian.Uint32(b[4:]),
		ID: binary.BigEndian.Uint64(b[8:]), V1: binary.BigEndian.Uint64(b[16:]), V2: binary.BigEndian.Uint64(b[24:]),
		Listener: binary.BigEndian.Uint16(b[32:]), Flags: b[34]}, nil
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// HelloLen is the size of a hello.
const HelloLen = 32

// helloMagic starts every hello: "RADIC", a zero, the format's version.
var helloMagic = [8]byte{'R', 'A', 'D', 'I', 'C', 0, 1, 0}

// A Hello is the first thing on a managed connection's data stream, from
// its initiator. On the wire: the magic, Job, ID, the initiator's logical
// IPv4 address and port, its control listener's port; big endian.
type Hello struct {
	Job     uint64 // a hash of the job's id: only a peer of the same job is managed
	ID      uint64 // the connection's logical id
	From    netip.AddrPort
	CtlPort uint16
}

// Bytes encodes h (From must be IPv4).
func (h Hello) Bytes() []byte {
	b := make([]byte, HelloLen)
	copy(b, helloMagic[:])
	binary.BigEndian.PutUint64(b[8:], h.Job)
	binary.BigEndian.PutUint64(b[16:], h.ID)
	a := h.From.Addr().As4()
	copy(b[24:28], a[:])
	binary.BigEndian.PutUint16(b[28:], h.From.Port())
	binary.BigEndian.PutUint16(b[30:], h.CtlPort)
	return b
}

// MayBeHello reports whether b, the first bytes of a stream (any number),
// can be the start of a hello: if not, the stream is someone else's
// protocol and is left alone.
func MayBeHello(b []byte) bool {
	k := min(len(b), len(helloMagic))
	return bytes.Equal(b[:k], helloMagic[:k])
}

// ParseHello decodes a whole hello.
func ParseHello(b []byte) (Hello, error) {
	if len(b) != HelloLen {
		return Hello{}, fmt.Errorf("hello of %d bytes, want %d", len(b), HelloLen)
	}
	if !MayBeHello(b) {
		return Hello{}, fmt.Errorf("not a radic hello: % x", b[:8])
	}
	return Hello{Job: binary.BigEndian.Uint64(b[8:]), ID: binary.BigEndian.Uint64(b[16:]),
		From:    netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[24:28])), binary.BigEndian.Uint16(b[28:])),
		CtlPort: binary.BigEndian.Uint16(b[30:])}, nil
}
