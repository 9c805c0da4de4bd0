// Package logring is the format of the log ring that a managed process's
// shim shares with its node's radicd, and the pure converter from the
// ring's records to msglog records (received bytes and determinants).
//
// The ring is one shared mapping (a file under /dev/shm, handed to radicd
// by name and unlinked once both have mapped it): a 4 KiB header, then
// DataSize bytes of records. The shim (C, shim/c/logring.c) is the only
// producer, radicd the only consumer. Offsets are absolute byte counts
// since the ring was made; a record at offset x starts at byte
// HeaderSize + x mod DataSize and may wrap around the end.
//
// Header (little-endian; each group on its own cache line, since the shim
// writes Head and the doorbell and radicd writes Stable and its sequence):
//
//	  0  magic "RLRG"     4  version (1)     8  header size (4096)
//	 16  data size (power of two)           24  owner (logical process id)
//	 32  pid of the process                 40  job hash
//	 64  head: bytes committed by the shim (release store after the copy)
//	128  stable: bytes stored on every protector (written by radicd)
//	136  stable_seq: futex word, bumped by radicd after each Stable store
//	140  producer_waiting: shim threads asleep on stable_seq
//	192  doorbell: futex word, bumped by the shim to ask for a drain
//	196  consumer_waiting: 1 while radicd is asleep on the doorbell
//	256  last error: NUL-terminated text radicd leaves for the shim's log
//
// Record (8-byte aligned; Len excludes the padding):
//
//	0 len u32   4 type u8   5 version u8 (1)   6 reserved u16 (0)
//	8 result i32   12 reserved u32 (0)   16 conn u64   24 offset u64
//	32 payload (len - 32 bytes)
//
//	type 1 DATA       bytes received on conn at stream offset, more of the
//	                  same receive call follows (result 0)
//	type 2 RECV       the receive call's determinant, no payload: result is
//	                  the count returned (the DATA records before it on conn
//	                  add up to it), 0 end of stream, or -errno; offset is
//	                  the connection's delivered count after the call
//	type 3 RECV_DATA  one receive and its bytes: result == payload length
//	type 4 CONNECT    the process made managed connection conn (offset: peer)
//	type 5 ACCEPT     the process accepted conn (offset: the logical port)
//	type 6 READY      a poll or select over managed fds: result 0 or -errno,
//	                  conn 0, offset the number of fds it reported, payload
//	                  16 bytes for each: fd i32, revents u16, 0 u16, and
//	                  1 + the id of the managed connection the fd is (0:
//	                  none) u64
//
// The wake protocol: the shim never wakes radicd on a receive. Before a
// send on any managed connection (and a close) it waits until Stable >=
// Head; only then, if Stable < Head, it rings the doorbell (FUTEX_WAKE
// only when consumer_waiting says radicd sleeps) and sleeps on stable_seq.
// The same when the ring is full. radicd drains [Stable, Head), ships the
// records to the protectors, stores Stable, bumps stable_seq and wakes the
// sleepers if producer_waiting is set.
package logring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"

	"github.com/radic-project/radic/observer"
)

// Specification constants: the layout shared with shim/c/logring.h.
const (
	Magic      = 0x47524c52 // "RLRG" little-endian
	Version    = 1
	HeaderSize = 4096

	OffMagic           = 0
	OffVersion         = 4
	OffHeaderSize      = 8
	OffDataSize        = 16
	OffOwner           = 24
	OffPid             = 32
	OffJob             = 40
	OffHead            = 64
	OffStable          = 128
	OffStableSeq       = 136
	OffProducerWaiting = 140
	OffDoorbell        = 192
	OffConsumerWaiting = 196
	OffLastError       = 256
	LastErrorLen       = 256

	RecHeaderLen = 32
	// MinDataSize and MaxDataSize bound the data area a consumer accepts.
	MinDataSize = 64 << 10
	MaxDataSize = 1 << 30
)

// Type is a record's type.
type Type uint8

// Record types.
const (
	TypeData     Type = 1
	TypeRecv     Type = 2
	TypeRecvData Type = 3
	// TypeConnect: the process made managed connection Conn, to the
	// logical peer Offset = IPv4 << 16 | port ([PackPeer]), or (Result
	// -errno, Conn 0) its connect to that peer failed.
	TypeConnect Type = 4
	// TypeAccept: the process accepted connection Conn on logical port
	// Offset.
	TypeAccept Type = 5
	// TypeReady: a readiness call (Conn: its observer.ReadyCall, 0 for
	// poll) over a set with managed fds reported the Offset fds in the
	// payload ([ReadyFds]), or failed with -Result.
	TypeReady Type = 6
	// TypeValue: a call (Conn: its observer.ValueCall, getpid or
	// gethostname) answered the payload, the process's identity as the
	// program sees it.
	TypeValue Type = 7
)

// ReadyFdLen is the size of one reported fd in a TypeReady payload.
const ReadyFdLen = 16

// ReadyFds are the fds a TypeReady record's poll reported, in set order.
func ReadyFds(r Record) []observer.ReadyFd {
	var out []observer.ReadyFd
	le := binary.LittleEndian
	for p := r.Payload; len(p) >= ReadyFdLen; p = p[ReadyFdLen:] {
		out = append(out, observer.ReadyFd{Fd: le.Uint32(p), Events: uint32(le.Uint16(p[4:])), Conn: le.Uint64(p[8:])})
	}
	return out
}

// PackPeer is a TypeConnect record's Offset for peer; 0 (none) unless
// it is IPv4, as the cluster's logical addresses are.
func PackPeer(peer netip.AddrPort) uint64 {
	if !peer.Addr().Is4() {
		return 0
	}
	a := peer.Addr().As4()
	return uint64(binary.BigEndian.Uint32(a[:]))<<16 | uint64(peer.Port())
}

// UnpackPeer inverts PackPeer.
func UnpackPeer(v uint64) netip.AddrPort {
	if v == 0 {
		return netip.AddrPort{}
	}
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], uint32(v>>16))
	return netip.AddrPortFrom(netip.AddrFrom4(a), uint16(v))
}

func (t Type) String() string {
	switch t {
	case TypeData:
		return "data"
	case TypeRecv:
		return "recv"
	case TypeRecvData:
		return "recv+data"
	case TypeConnect:
		return "connect"
	case TypeAccept:
		return "accept"
	case TypeReady:
		return "ready"
	case TypeValue:
		return "value"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Record is one decoded ring record. Payload aliases the decoded bytes.
type Record struct {
	Type    Type
	Result  int32
	Conn    uint64
	Offset  uint64
	Payload []byte
}

// Stride is the ring space a record of payload length n takes.
func Stride(n int) int { return (RecHeaderLen + n + 7) &^ 7 }

// ErrFormat is matched by every *FormatError.
var ErrFormat = errors.New("logring: bad record")

// FormatError names the field of a record that is wrong.
type FormatError struct {
	Field string
	Got   int64
	Err   error // ErrFormat or io.ErrUnexpectedEOF
}

func (e *FormatError) Error() string {
	if e.Err == io.ErrUnexpectedEOF {
		return fmt.Sprintf("logring: record truncated in %s", e.Field)
	}
	return fmt.Sprintf("logring: bad record %s %d", e.Field, e.Got)
}

func (e *FormatError) Unwrap() error { return e.Err }

// MaxErrno is Linux's MAX_ERRNO.
const MaxErrno = 4095

// Decode decodes the record at the start of b (already unwrapped from the
// ring) and returns it with the ring space it takes (its stride). It
// returns io.EOF on empty input, a *FormatError wrapping
// io.ErrUnexpectedEOF for a prefix, and one wrapping ErrFormat naming the
// bad field otherwise.
func Decode(b []byte) (Record, int, error) {
	if len(b) == 0 {
		return Record{}, 0, io.EOF
	}
	if len(b) < RecHeaderLen {
		return Record{}, 0, &FormatError{Field: "header", Err: io.ErrUnexpectedEOF}
	}
	le := binary.LittleEndian
	n := le.Uint32(b[0:])
	r := Record{Type: Type(b[4]), Result: int32(le.Uint32(b[8:])), Conn: le.Uint64(b[16:]), Offset: le.Uint64(b[24:])}
	bad := func(f string, v int64) (Record, int, error) {
		return Record{}, 0, &FormatError{Field: f, Got: v, Err: ErrFormat}
	}
	switch {
	case b[5] != Version:
		return bad("version", int64(b[5]))
	case le.Uint16(b[6:]) != 0:
		return bad("reserved", int64(le.Uint16(b[6:])))
	case le.Uint32(b[12:]) != 0:
		return bad("reserved", int64(le.Uint32(b[12:])))
	case n < RecHeaderLen || n > MaxDataSize:
		return bad("len", int64(n))
	}
	plen := int(n) - RecHeaderLen
	switch r.Type {
	case TypeData:
		if r.Result != 0 {
			return bad("result", int64(r.Result))
		}
		if plen == 0 {
			return bad("len", int64(n))
		}
	case TypeRecv:
		if plen != 0 {
			return bad("len", int64(n))
		}
		if r.Result < -MaxErrno {
			return bad("result", int64(r.Result))
		}
	case TypeRecvData:
		if plen == 0 || int64(r.Result) != int64(plen) {
			return bad("result", int64(r.Result))
		}
	case TypeConnect, TypeAccept:
		switch {
		case plen != 0:
			return bad("len", int64(n))
		case r.Result > 0 || r.Result < -MaxErrno || (r.Result != 0 && (r.Type != TypeConnect || r.Conn != 0)):
			return bad("result", int64(r.Result))
		case r.Type == TypeConnect && r.Offset>>48 != 0, r.Type == TypeAccept && r.Offset>>16 != 0:
			return bad("offset", int64(r.Offset))
		}
	case TypeReady:
		switch {
		case r.Conn > uint64(observer.ReadyEpoll):
			return bad("conn", int64(r.Conn))
		case r.Result > 0 || r.Result < -MaxErrno:
			return bad("result", int64(r.Result))
		case r.Offset > observer.MaxReady || (r.Result != 0 && r.Offset != 0):
			return bad("offset", int64(r.Offset))
		case uint64(plen) != r.Offset*ReadyFdLen:
			return bad("len", int64(n))
		}
		for p := b[RecHeaderLen:min(len(b), RecHeaderLen+plen)]; len(p) >= ReadyFdLen; p = p[ReadyFdLen:] {
			if le.Uint16(p[6:]) != 0 || le.Uint16(p[4:]) == 0 {
				return bad("ready fd", int64(le.Uint32(p)))
			}
		}
	case TypeValue:
		switch {
		case r.Conn != uint64(observer.ValueGetpid) && r.Conn != uint64(observer.ValueGethostname):
			return bad("conn", int64(r.Conn))
		case r.Result != 0:
			return bad("result", int64(r.Result))
		case r.Offset != 0:
			return bad("offset", int64(r.Offset))
		case plen > observer.MaxValue:
			return bad("len", int64(n))
		}
	default:
		return bad("type", int64(r.Type))
	}
	if r.Offset+uint64(plen) < r.Offset {
		return bad("offset", int64(r.Offset))
	}
	if len(b) < RecHeaderLen+plen {
		return Record{}, 0, &FormatError{Field: "payload", Err: io.ErrUnexpectedEOF}
	}
	r.Payload = b[RecHeaderLen : RecHeaderLen+plen]
	return r, Stride(plen), nil
}

// Append encodes r (with its padding) onto b, as the shim does. For tests
// and the fuzz corpus; the C side is the producer.
func Append(b []byte, r *Record) []byte {
	n := RecHeaderLen + len(r.Payload)
	var h [RecHeaderLen]byte
	le := binary.LittleEndian
	le.PutUint32(h[0:], uint32(n))
	h[4] = byte(r.Type)
	h[5] = Version
	le.PutUint32(h[8:], uint32(r.Result))
	le.PutUint64(h[16:], r.Conn)
	le.PutUint64(h[24:], r.Offset)
	b = append(b, h[:]...)
	b = append(b, r.Payload...)
	for i := n; i < Stride(len(r.Payload)); i++ {
		b = append(b, 0)
	}
	return b
}

// Owner is the msglog Owner of a process's log: the job in the high 32
// bits (a fold of the FNV-1a 64 hash of the job id, as the shim's hello
// carries it) and the logical process id in the low 32 (the top half of
// its connection ids). Protectors keep the logs of many jobs, whose ranks
// reuse the same ids.
func Owner(jobHash uint64, lpid uint32) uint64 {
	return uint64(uint32(jobHash>>32)^uint32(jobHash))<<32 | uint64(lpid)
}
