package observer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"syscall"
)

// Specification constants of the determinant format (see the package doc
// for the byte layout).
const (
	// DeterminantVersion is the format version, the high nibble of every
	// determinant's first byte.
	DeterminantVersion = 1
	// MaxCount bounds a receive or send count: Linux's MAX_RW_COUNT, the
	// most one read or write call moves.
	MaxCount = 0x7ffff000
	// MaxErrno bounds an errno (Linux's MAX_ERRNO).
	MaxErrno = 4095
	// MaxReady bounds the ready set of one poll, select or epoll_wait.
	MaxReady = 1 << 16
	// MaxValue bounds the bytes of one Value determinant (a host name is
	// at most 64, a sockaddr 128).
	MaxValue = 4096
	// MaxDeterminantLen bounds one encoded determinant: a full ready set
	// (1 + 1 + 2 + 3 + MaxReady·(5+5+10) bytes) is the largest.
	MaxDeterminantLen = 7 + MaxReady*20
)

// Kind says which call a determinant answers. Zero is invalid, so that
// zeroed bytes never decode.
type Kind uint8

// Determinant kinds (the low nibble of the first byte).
const (
	KindRecv    Kind = 1 // a receive on Conn returned N bytes (0: end of stream) or Errno (EAGAIN, EINTR, ...)
	KindSend    Kind = 2 // a send on Conn accepted N bytes or failed with Errno
	KindConnect Kind = 3 // a connect to Peer made connection Conn (Errno 0), or failed with Errno
	KindAccept  Kind = 4 // an accept on logical port Port returned connection Conn, or failed with Errno
	KindReady   Kind = 5 // a poll/select/epoll_wait (ReadyCall) reported Ready, or failed with Errno
	KindValue   Kind = 6 // a call (ValueCall) on Ref returned the bytes Value
	maxKind          = KindValue
)

var kindNames = [...]string{KindRecv: "recv", KindSend: "send", KindConnect: "connect", KindAccept: "accept", KindReady: "ready", KindValue: "value"}

func (k Kind) String() string {
	if k >= 1 && k <= maxKind {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// ReadyCall is the readiness call a KindReady determinant answers.
type ReadyCall uint8

// Readiness calls. ppoll and pselect are logged as poll and select.
const (
	ReadyPoll    ReadyCall = 1
	ReadySelect  ReadyCall = 2
	ReadyEpoll   ReadyCall = 3
	maxReadyCall           = ReadyEpoll
)

func (c ReadyCall) String() string {
	switch c {
	case ReadyPoll:
		return "poll"
	case ReadySelect:
		return "select"
	case ReadyEpoll:
		return "epoll_wait"
	}
	return fmt.Sprintf("readycall(%d)", uint8(c))
}

// ValueCall is the call whose answer a KindValue determinant holds.
type ValueCall uint8

// Calls whose values the application sees. Ref is what the call was
// about: 0 for getpid and gethostname, the connection for getsockname,
// getpeername and getsockopt(SO_ERROR).
const (
	ValueGetpid      ValueCall = 1
	ValueGethostname ValueCall = 2
	ValueGetsockname ValueCall = 3
	ValueGetpeername ValueCall = 4
	ValueSockError   ValueCall = 5 // getsockopt(SO_ERROR), e.g. after a non-blocking connect
	maxValueCall               = ValueSockError
)

var valueNames = [...]string{ValueGetpid: "getpid", ValueGethostname: "gethostname", ValueGetsockname: "getsockname", ValueGetpeername: "getpeername", ValueSockError: "getsockopt(SO_ERROR)"}

func (c ValueCall) String() string {
	if c >= 1 && c <= maxValueCall {
		return valueNames[c]
	}
	return fmt.Sprintf("valuecall(%d)", uint8(c))
}

// ReadyFd is one entry of a ready set: an fd the call reported and its
// events (poll revents, epoll events; select: 1 read, 4 write, 8 except,
// as POLLIN, POLLOUT, POLLPRI).
//
// Conn names the managed connection the fd was, plus one (0: the fd of no
// managed connection): a replay finds the connection by its id, since the
// fd numbers of a re-executed process need not be its first run's (the
// control plane's sockets take numbers at their own moments).
type ReadyFd struct {
	Fd     uint32
	Events uint32
	Conn   uint64
}

// Determinant is one decoded determinant. Which fields a kind uses:
//
//	KindRecv, KindSend  Conn, N, Errno (Errno != 0 implies N == 0)
//	KindConnect         Conn, Errno, Peer (Conn is meaningful when Errno is 0)
//	KindAccept          Port, Conn, Errno
//	KindReady           ReadyCall, Errno, Ready (in the order reported)
//	KindValue           ValueCall, Ref, Value
//
// Other fields must be zero: the encoding is canonical, so a decoded
// determinant encodes to the same bytes.
type Determinant struct {
	Kind      Kind
	Conn      uint64
	N         uint64
	Errno     syscall.Errno
	Peer      netip.AddrPort
	Port      uint16
	ReadyCall ReadyCall
	Ready     []ReadyFd
	ValueCall ValueCall
	Ref       uint64
	Value     []byte
}

func (d *Determinant) String() string {
	var b strings.Builder
	switch d.Kind {
	case KindRecv, KindSend:
		fmt.Fprintf(&b, "%s on connection %s ", d.Kind, ConnString(d.Conn))
		if d.Errno != 0 {
			fmt.Fprintf(&b, "failed with %s", errnoString(d.Errno))
		} else {
			fmt.Fprintf(&b, "returned %d", d.N)
		}
	case KindConnect:
		fmt.Fprintf(&b, "connect to %s ", d.Peer)
		if d.Errno != 0 {
			fmt.Fprintf(&b, "failed with %s", errnoString(d.Errno))
		} else {
			fmt.Fprintf(&b, "made connection %s", ConnString(d.Conn))
		}
	case KindAccept:
		fmt.Fprintf(&b, "accept on port %d ", d.Port)
		if d.Errno != 0 {
			fmt.Fprintf(&b, "failed with %s", errnoString(d.Errno))
		} else {
			fmt.Fprintf(&b, "returned connection %s", ConnString(d.Conn))
		}
	case KindReady:
		fmt.Fprintf(&b, "%s ", d.ReadyCall)
		if d.Errno != 0 {
			fmt.Fprintf(&b, "failed with %s", errnoString(d.Errno))
		} else {
			fmt.Fprintf(&b, "reported %v", d.Ready)
		}
	case KindValue:
		fmt.Fprintf(&b, "%s(%d) returned %q", d.ValueCall, d.Ref, d.Value)
	default:
		fmt.Fprintf(&b, "%s", d.Kind)
	}
	return b.String()
}

func errnoString(e syscall.Errno) string { return fmt.Sprintf("errno %d (%v)", uint32(e), e) }

// ConnString formats a logical connection id as the shim does:
// initiator's logical process id, a colon, its connect number.
func ConnString(conn uint64) string { return fmt.Sprintf("%d:%d", conn>>32, uint32(conn)) }

// ErrFormat is matched (errors.Is) by every *FormatError that is not a
// truncation.
var ErrFormat = errors.New("observer: bad format")

// FormatError says which field of an encoded determinant or summary is
// wrong. Err is io.ErrUnexpectedEOF when the input ends inside the field
// (errors.Is(err, io.ErrUnexpectedEOF) then holds), else ErrFormat.
type FormatError struct {
	What  string // "determinant recv", "summary", ...
	Field string // "version", "kind", "conn", "n", "errno", "length", ...
	Value uint64 // the value found, where it is a number
	Max   uint64 // the largest value allowed, where there is one
	Err   error
}

func (e *FormatError) Error() string {
	switch {
	case errors.Is(e.Err, io.ErrUnexpectedEOF):
		return fmt.Sprintf("observer: %s: truncated in field %s", e.What, e.Field)
	case e.Max != 0:
		return fmt.Sprintf("observer: %s: bad %s %d (max %d)", e.What, e.Field, e.Value, e.Max)
	}
	return fmt.Sprintf("observer: %s: bad %s %d", e.What, e.Field, e.Value)
}

func (e *FormatError) Unwrap() error { return e.Err }

// Validate reports why d cannot be encoded, or nil.
func (d *Determinant) Validate() error {
	bad := func(field string, v, max uint64) error {
		return &FormatError{What: "determinant " + d.Kind.String(), Field: field, Value: v, Max: max, Err: ErrFormat}
	}
	if d.Errno > MaxErrno {
		return bad("errno", uint64(d.Errno), MaxErrno)
	}
	if d.Conn == DeterminantStream {
		return bad("conn", d.Conn, DeterminantStream-1)
	}
	var z Determinant // the fields a kind does not use must be zero
	switch d.Kind {
	case KindRecv, KindSend:
		z = Determinant{Kind: d.Kind, Conn: d.Conn, N: d.N, Errno: d.Errno}
		if d.N > MaxCount {
			return bad("n", d.N, MaxCount)
		}
		if d.Errno != 0 && d.N != 0 {
			return bad("n", d.N, 0)
		}
	case KindConnect:
		z = Determinant{Kind: d.Kind, Conn: d.Conn, Errno: d.Errno, Peer: d.Peer}
		if d.Peer.Addr().Zone() != "" {
			return bad("peer (zone)", 0, 0)
		}
	case KindAccept:
		z = Determinant{Kind: d.Kind, Port: d.Port, Conn: d.Conn, Errno: d.Errno}
	case KindReady:
		z = Determinant{Kind: d.Kind, ReadyCall: d.ReadyCall, Errno: d.Errno}
		if d.ReadyCall == 0 || d.ReadyCall > maxReadyCall {
			return bad("call", uint64(d.ReadyCall), uint64(maxReadyCall))
		}
		if len(d.Ready) > MaxReady {
			return bad("length", uint64(len(d.Ready)), MaxReady)
		}
		if d.Errno != 0 && len(d.Ready) != 0 {
			return bad("length", uint64(len(d.Ready)), 0)
		}
	case KindValue:
		z = Determinant{Kind: d.Kind, ValueCall: d.ValueCall, Ref: d.Ref}
		if d.ValueCall == 0 || d.ValueCall > maxValueCall {
			return bad("call", uint64(d.ValueCall), uint64(maxValueCall))
		}
		if len(d.Value) > MaxValue {
			return bad("length", uint64(len(d.Value)), MaxValue)
		}
	default:
		return bad("kind", uint64(d.Kind), uint64(maxKind))
	}
	if z.N != d.N || z.Conn != d.Conn || z.Errno != d.Errno || z.Peer != d.Peer || z.Port != d.Port ||
		z.ReadyCall != d.ReadyCall || z.ValueCall != d.ValueCall || z.Ref != d.Ref ||
		(d.Kind != KindReady && d.Ready != nil) || (d.Kind != KindValue && d.Value != nil) {
		return bad("unused field (not zero)", 0, 0)
	}
	return nil
}

// AppendDeterminant appends the encoding of d to b and returns the extended
// slice, or b unchanged and the error of [Determinant.Validate].
func AppendDeterminant(b []byte, d *Determinant) ([]byte, error) {
	if err := d.Validate(); err != nil {
		return b, err
	}
	b = append(b, DeterminantVersion<<4|byte(d.Kind))
	u := binary.AppendUvarint
	switch d.Kind {
	case KindRecv, KindSend:
		b = u(u(u(b, d.Conn), uint64(d.Errno)), d.N)
	case KindConnect:
		b = appendAddrPort(u(u(b, d.Conn), uint64(d.Errno)), d.Peer)
	case KindAccept:
		b = u(u(u(b, uint64(d.Port)), d.Conn), uint64(d.Errno))
	case KindReady:
		b = u(u(append(b, byte(d.ReadyCall)), uint64(d.Errno)), uint64(len(d.Ready)))
		for _, r := range d.Ready {
			b = u(u(u(b, uint64(r.Fd)), uint64(r.Events)), r.Conn)
		}
	case KindValue:
		b = u(u(append(b, byte(d.ValueCall)), d.Ref), uint64(len(d.Value)))
		b = append(b, d.Value...)
	}
	return b, nil
}

// Peer family bytes.
const (
	familyNone = 0
	familyIPv4 = 4
	familyIPv6 = 6
)

func appendAddrPort(b []byte, ap netip.AddrPort) []byte {
	a := ap.Addr()
	switch {
	case !a.IsValid():
		return append(b, familyNone)
	case a.Is4():
		b = append(b, familyIPv4)
	default:
		b = append(b, familyIPv6)
	}
	b = append(b, a.AsSlice()...)
	return binary.BigEndian.AppendUint16(b, ap.Port())
}

// decoder reads the fields of one determinant, remembering the first
// error. Every field is checked as it is read.
type decoder struct {
	b    []byte
	n    int
	what string
	err  error
}

func (d *decoder) fail(field string, v, max uint64, cause error) {
	if d.err == nil {
		d.err = &FormatError{What: d.what, Field: field, Value: v, Max: max, Err: cause}
	}
}

func (d *decoder) byte(field string) byte {
	if d.err != nil {
		return 0
	}
	if d.n >= len(d.b) {
		d.fail(field, 0, 0, io.ErrUnexpectedEOF)
		return 0
	}
	d.n++
	return d.b[d.n-1]
}

// uvarint reads a minimal unsigned varint no larger than max (0: any).
func (d *decoder) uvarint(field string, max uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, k := binary.Uvarint(d.b[d.n:])
	switch {
	case k == 0:
		d.fail(field, 0, 0, io.ErrUnexpectedEOF)
		return 0
	case k < 0:
		d.fail(field+" (varint overflow)", 0, 0, ErrFormat)
		return 0
	case k > 1 && d.b[d.n+k-1] == 0:
		d.fail(field+" (varint not minimal)", v, 0, ErrFormat)
		return 0
	case max != 0 && v > max:
		d.fail(field, v, max, ErrFormat)
		return 0
	}
	d.n += k
	return v
}

func (d *decoder) bytes(field string, n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b)-d.n < n {
		d.fail(field, 0, 0, io.ErrUnexpectedEOF)
		return nil
	}
	d.n += n
	return d.b[d.n-n : d.n : d.n]
}

func (d *decoder) addrPort(field string) netip.AddrPort {
	var a netip.Addr
	switch f := d.byte(field + " family"); {
	case d.err != nil:
		return netip.AddrPort{}
	case f == familyNone:
		return netip.AddrPort{}
	case f == familyIPv4:
		if b := d.bytes(field, 4); b != nil {
			a = netip.AddrFrom4([4]byte(b))
		}
	case f == familyIPv6:
		if b := d.bytes(field, 16); b != nil {
			a = netip.AddrFrom16([16]byte(b))
		}
	default:
		d.fail(field+" family", uint64(f), 0, ErrFormat)
		return netip.AddrPort{}
	}
	p := d.bytes(field+" port", 2)
	if d.err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(a, binary.BigEndian.Uint16(p))
}

// DecodeDeterminant decodes the determinant at the start of b and returns
// it with the number of bytes consumed. Ready and Value alias b. It returns
// io.EOF for empty b, a *FormatError wrapping io.ErrUnexpectedEOF when b
// is a valid but short prefix of a determinant, and a *FormatError
// wrapping ErrFormat naming the bad field otherwise. Fields are checked as
// they are read, so a short prefix is told from garbage.
func DecodeDeterminant(b []byte) (Determinant, int, error) {
	if len(b) == 0 {
		return Determinant{}, 0, io.EOF
	}
	dec := decoder{b: b, what: "determinant"}
	tag := dec.byte("version")
	if v := tag >> 4; v != DeterminantVersion {
		return Determinant{}, 0, &FormatError{What: "determinant", Field: "version", Value: uint64(v), Max: DeterminantVersion, Err: ErrFormat}
	}
	k := Kind(tag & 0xf)
	if k == 0 || k > maxKind {
		return Determinant{}, 0, &FormatError{What: "determinant", Field: "kind", Value: uint64(k), Max: uint64(maxKind), Err: ErrFormat}
	}
	dec.what = "determinant " + k.String()
	d := Determinant{Kind: k}
	switch k {
	case KindRecv, KindSend:
		d.Conn = dec.uvarint("conn", DeterminantStream-1)
		d.Errno = syscall.Errno(dec.uvarint("errno", MaxErrno))
		if d.Errno != 0 {
			d.N = dec.uvarint("n", 0)
			if d.N != 0 && dec.err == nil {
				dec.fail("n (with an errno)", d.N, 0, ErrFormat)
			}
		} else {
			d.N = dec.uvarint("n", MaxCount)
		}
	case KindConnect:
		d.Conn = dec.uvarint("conn", DeterminantStream-1)
		d.Errno = syscall.Errno(dec.uvarint("errno", MaxErrno))
		d.Peer = dec.addrPort("peer")
	case KindAccept:
		d.Port = uint16(dec.uvarint("port", 1<<16-1))
		d.Conn = dec.uvarint("conn", DeterminantStream-1)
		d.Errno = syscall.Errno(dec.uvarint("errno", MaxErrno))
	case KindReady:
		d.ReadyCall = ReadyCall(dec.byte("call"))
		if dec.err == nil && (d.ReadyCall == 0 || d.ReadyCall > maxReadyCall) {
			dec.fail("call", uint64(d.ReadyCall), uint64(maxReadyCall), ErrFormat)
		}
		d.Errno = syscall.Errno(dec.uvarint("errno", MaxErrno))
		max := uint64(MaxReady)
		if d.Errno != 0 {
			max = 0
		}
		n := dec.uvarint("length", 0)
		if dec.err == nil && n > max {
			dec.fail("length", n, max, ErrFormat)
		}
		if dec.err == nil && n > 0 {
			d.Ready = make([]ReadyFd, 0, min(n, uint64(len(b)/3)))
			for range n {
				fd := dec.uvarint("fd", 1<<32-1)
				ev := dec.uvarint("events", 1<<32-1)
				conn := dec.uvarint("conn", DeterminantStream)
				if dec.err != nil {
					break
				}
				d.Ready = append(d.Ready, ReadyFd{Fd: uint32(fd), Events: uint32(ev), Conn: conn})
			}
		}
	case KindValue:
		d.ValueCall = ValueCall(dec.byte("call"))
		if dec.err == nil && (d.ValueCall == 0 || d.ValueCall > maxValueCall) {
			dec.fail("call", uint64(d.ValueCall), uint64(maxValueCall), ErrFormat)
		}
		d.Ref = dec.uvarint("ref", 0)
		n := dec.uvarint("length", MaxValue)
		if dec.err == nil && n > 0 {
			d.Value = dec.bytes("value", int(n))
		}
	}
	if dec.err != nil {
		return Determinant{}, 0, dec.err
	}
	return d, dec.n, nil
}
