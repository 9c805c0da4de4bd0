package heartbeat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// NodeID names a radicd node; the ring is ordered by it.
type NodeID uint32

// None is the zero NodeID used where no node is meant. Real nodes may be 0,
// so fields that can be empty use None = ^NodeID(0).
const None = ^NodeID(0)

// MsgType is the kind of a heartbeat-protocol datagram.
type MsgType uint8

// Datagram kinds.
const (
	// MsgHeartbeat is the periodic "I am alive" to a ring neighbour (and,
	// for discovery, to members not yet heard from).
	MsgHeartbeat MsgType = iota + 1
	// MsgProbe asks the receiver to answer at once with MsgProbeAck. A
	// monitor sends it directly to a suspect; a prober sends it on behalf
	// of Origin.
	MsgProbe
	// MsgProbeAck answers a MsgProbe.
	MsgProbeAck
	// MsgProbeReq asks the receiver to probe Target for the sender.
	MsgProbeReq
	// MsgProbeResp tells Origin that Target (at incarnation TargetInc)
	// answered a probe.
	MsgProbeResp
	// MsgNotice carries only the membership view: sent to every member on a
	// declaration, and in reply to a datagram from a dead incarnation.
	MsgNotice
)

func (t MsgType) String() string {
	switch t {
	case MsgHeartbeat:
		return "heartbeat"
	case MsgProbe:
		return "probe"
	case MsgProbeAck:
		return "probe-ack"
	case MsgProbeReq:
		return "probe-req"
	case MsgProbeResp:
		return "probe-resp"
	case MsgNotice:
		return "notice"
	}
	return fmt.Sprintf("MsgType(%d)", uint8(t))
}

// State is a member's state in a membership view.
type State uint8

// Member states, in merge order: a larger state wins at equal incarnation.
const (
	Unknown State = iota // never heard from (not in the ring)
	Alive                // in the ring
	Dead                 // declared dead at this incarnation
)

func (s State) String() string {
	switch s {
	case Unknown:
		return "unknown"
	case Alive:
		return "alive"
	case Dead:
		return "dead"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Role says whether a member protects and runs processes (active) or waits
// to replace a failed node (spare). A spare is promoted once; promotion
// wins over spare at equal incarnation and state.
type Role uint8

// Roles, in merge order.
const (
	RoleSpare Role = iota
	RoleActive
)

func (r Role) String() string {
	if r == RoleActive {
		return "active"
	}
	return "spare"
}

// Entry is one member in a gossiped membership view.
type Entry struct {
	ID    NodeID
	Inc   uint64
	State State
	Role  Role
}

// newer reports whether e should replace old in a merge: the lexicographic
// order of (Inc, State, Role) is the merge lattice.
func (e Entry) newer(old Entry) bool {
	if e.Inc != old.Inc {
		return e.Inc > old.Inc
	}
	if e.State != old.State {
		return e.State > old.State
	}
	return e.Role > old.Role
}

// Message is one decoded datagram.
type Message struct {
	Type    MsgType
	From    NodeID
	To      NodeID
	FromInc uint64 // sender's incarnation
	Seq     uint64 // heartbeat sequence number (per sender incarnation)
	// Target and TargetInc name the probed node in MsgProbeReq/MsgProbeResp.
	Target    NodeID
	TargetInc uint64
	// Origin is the node that wants a probe answered (MsgProbe,
	// MsgProbeAck, MsgProbeResp); Nonce matches answers to questions.
	Origin NodeID
	Nonce  uint64
	Fenced bool // the sender has fenced itself
	Spare  bool // the sender's own role is spare
	View   []Entry
}

// Wire format (big endian), version 1:
//
//	 0  magic "RH"      2
//	 2  version         1
//	 3  type            1
//	 4  from            4
//	 8  to              4
//	12  from inc        8
//	20  seq             8
//	28  target          4
//	32  target inc      8
//	40  origin          4
//	44  nonce           8
//	52  flags           1   bit0 fenced, bit1 spare
//	53  view count      2
//	55  entries         14 each: id 4, inc 8, state 1, role 1
const (
	wireVersion = 1
	headerLen   = 55
	entryLen    = 14
	flagFenced  = 1 << 0
	flagSpare   = 1 << 1
	// MaxViewEntries bounds a view so that a datagram fits in 1400 bytes.
	MaxViewEntries = (1400 - headerLen) / entryLen
	// MaxDatagram is the largest encoded message.
	MaxDatagram = headerLen + MaxViewEntries*entryLen
)

// Decoding errors.
var (
	ErrBadMagic   = errors.New("heartbeat: bad magic")
	ErrBadVersion = errors.New("heartbeat: unsupported version")
	ErrBadMessage = errors.New("heartbeat: malformed message")
)

// TypeOf is the kind of an encoded datagram, read without decoding it
// (a transport that treats heartbeats and probes differently); ok is
// false for bytes that are not one.
func TypeOf(b []byte) (t MsgType, ok bool) {
	if len(b) < 4 || b[0] != 'R' || b[1] != 'H' {
		return 0, false
	}
	return MsgType(b[3]), true
}

// Length is the encoded size of m.
func (m *Message) Length() int { return headerLen + len(m.View)*entryLen }

// Append encodes m onto b.
func (m *Message) Append(b []byte) []byte {
	b = append(b, 'R', 'H', wireVersion, byte(m.Type))
	b = binary.BigEndian.AppendUint32(b, uint32(m.From))
	b = binary.BigEndian.AppendUint32(b, uint32(m.To))
	b = binary.BigEndian.AppendUint64(b, m.FromInc)
	b = binary.BigEndian.AppendUint64(b, m.Seq)
	b = binary.BigEndian.AppendUint32(b, uint32(m.Target))
	b = binary.BigEndian.AppendUint64(b, m.TargetInc)
	b = binary.BigEndian.AppendUint32(b, uint32(m.Origin))
	b = binary.BigEndian.AppendUint64(b, m.Nonce)
	var f byte
	if m.Fenced {
		f |= flagFenced
	}
	if m.Spare {
		f |= flagSpare
	}
	b = append(b, f)
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.View)))
	for _, e := range m.View {
		b = binary.BigEndian.AppendUint32(b, uint32(e.ID))
		b = binary.BigEndian.AppendUint64(b, e.Inc)
		b = append(b, byte(e.State), byte(e.Role))
	}
	return b
}

// Decode parses one datagram. A datagram shorter than its header or its
// declared view returns io.ErrUnexpectedEOF (io.EOF when empty); trailing
// bytes, unknown types, states or roles return ErrBadMessage.
func Decode(b []byte) (Message, error) {
	var m Message
	if len(b) == 0 {
		return m, io.EOF
	}
	if len(b) < headerLen {
		return m, io.ErrUnexpectedEOF
	}
	if b[0] != 'R' || b[1] != 'H' {
		return m, ErrBadMagic
	}
	if b[2] != wireVersion {
		return m, ErrBadVersion
	}
	m.Type = MsgType(b[3])
	if m.Type < MsgHeartbeat || m.Type > MsgNotice {
		return m, fmt.Errorf("%w: type %d", ErrBadMessage, b[3])
	}
	m.From = NodeID(binary.BigEndian.Uint32(b[4:]))
	m.To = NodeID(binary.BigEndian.Uint32(b[8:]))
	m.FromInc = binary.BigEndian.Uint64(b[12:])
	m.Seq = binary.BigEndian.Uint64(b[20:])
	m.Target = NodeID(binary.BigEndian.Uint32(b[28:]))
	m.TargetInc = binary.BigEndian.Uint64(b[32:])
	m.Origin = NodeID(binary.BigEndian.Uint32(b[40:]))
	m.Nonce = binary.BigEndian.Uint64(b[44:])
	f := b[52]
	if f&^(flagFenced|flagSpare) != 0 {
		return m, fmt.Errorf("%w: flags %#x", ErrBadMessage, f)
	}
	m.Fenced = f&flagFenced != 0
	m.Spare = f&flagSpare != 0
	n := int(binary.BigEndian.Uint16(b[53:]))
	if n > MaxViewEntries {
		return m, fmt.Errorf("%w: %d view entries", ErrBadMessage, n)
	}
	rest := b[headerLen:]
	if len(rest) < n*entryLen {
		return m, io.ErrUnexpectedEOF
	}
	if len(rest) > n*entryLen {
		return m, fmt.Errorf("%w: %d trailing bytes", ErrBadMessage, len(rest)-n*entryLen)
	}
	if n > 0 {
		m.View = make([]Entry, n)
	}
	for i := range n {
		e := rest[i*entryLen:]
		m.View[i] = Entry{
			ID:    NodeID(binary.BigEndian.Uint32(e)),
			Inc:   binary.BigEndian.Uint64(e[4:]),
			State: State(e[12]),
			Role:  Role(e[13]),
		}
		if m.View[i].State > Dead || m.View[i].Role > RoleActive {
			return m, fmt.Errorf("%w: view entry %d", ErrBadMessage, i)
		}
	}
	return m, nil
}
