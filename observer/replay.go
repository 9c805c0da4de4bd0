package observer

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
)

// Sentinel errors of a replay; callers branch on them with errors.Is.
var (
	// ErrLive: the log is exhausted. The call that got it, and every
	// later one, runs live; Replay.Live says where each connection
	// resumes. It is not a failure.
	ErrLive = errors.New("observer: log exhausted, run live")
	// ErrDiverged is matched by every *PathError and *OutputError: the
	// restarted process did not do what the original run did. The job
	// must be stopped.
	ErrDiverged = errors.New("observer: re-execution diverged")
	// ErrIncomplete: the log is missing bytes a determinant needs (a
	// receive whose data is not logged, a determinant cut short). Logging
	// was not pessimistic, or the log is damaged.
	ErrIncomplete = errors.New("observer: log incomplete")
)

// PathError says that a restarted process made a call that differs from
// the one its log has at that point: it left the path of the original run.
type PathError struct {
	Owner  uint64      // the logical process
	Index  uint64      // determinants replayed before this one
	Offset uint64      // determinant stream offset of the logged determinant
	Call   string      // what the process did
	Logged Determinant // what the original run did there
}

func (e *PathError) Error() string {
	return fmt.Sprintf("observer: process %d diverged at determinant %d (determinant stream offset %d): it called %s, the log has %s",
		e.Owner, e.Index, e.Offset, e.Call, &e.Logged)
}

// Is makes errors.Is(err, ErrDiverged) true.
func (e *PathError) Is(target error) bool { return target == ErrDiverged }

// ConnState is where one connection of a process stands, in bytes of its
// two directions.
type ConnState struct {
	Conn      uint64
	Delivered uint64 // received bytes the application has been given
	Sent      uint64 // bytes the application has sent (the sum of send counts)
	// Logged (in Live only) is the end of the logged received bytes: the
	// peer resumes sending at Logged, and the bytes [Delivered, Logged)
	// are served from the log before any live byte.
	Logged uint64
	// Unlogged: the received bytes of this connection are not in the log
	// (the Opener returned nil: its peer is in the same checkpoint group
	// and regenerates them). Logged is then Delivered.
	Unlogged bool
}

// Checkpoint is where a replay starts. The zero value is the start of the
// run (the exec backend re-executes from it); a checkpoint image records
// the determinant stream offset and each open connection's Delivered and
// Sent (Logged and Unlogged are ignored).
type Checkpoint struct {
	Determinants uint64
	Conns        []ConnState
}

// Live is what a replay leaves for the live run once its log is exhausted.
type Live struct {
	// Determinants is the end of the determinant stream: the live run's
	// determinants are appended from here.
	Determinants uint64
	Replayed     uint64      // determinants replayed
	Conns        []ConnState // every connection the replay knows, by id
}

type replayConn struct {
	st     ConnState
	data   *byteReader // nil: not logged
	opened bool
}

// Replay answers a restarted process's calls from its log, in order: the
// replay cursor. It is a pure state machine over its Sources: no
// goroutines, not safe for concurrent use (the process's calls are
// serialized by the caller, as they were when they were logged).
//
// Each call method checks that the process's call matches the next
// determinant and returns that determinant (the answer the original run
// got). Errors: ErrLive when the log is exhausted (then see Live), a
// *PathError (ErrDiverged) when the call does not match, an error
// matching ErrIncomplete when the log lacks bytes, or a read error of a
// Source. After a non-ErrLive error every call returns the same error.
type Replay struct {
	owner uint64
	dets  byteReader
	open  Opener
	conns map[uint64]*replayConn
	index uint64
	live  *Live
	err   error
}

// NewReplay returns the replay of owner's run from cp. dets reads the
// owner's determinant stream from cp.Determinants; open opens the data
// streams.
func NewReplay(owner uint64, dets Source, open Opener, cp Checkpoint) *Replay {
	r := &Replay{owner: owner, dets: byteReader{src: dets, off: cp.Determinants}, open: open, conns: map[uint64]*replayConn{}}
	for _, c := range cp.Conns {
		r.conns[c.Conn] = &replayConn{st: ConnState{Conn: c.Conn, Delivered: c.Delivered, Sent: c.Sent}}
	}
	return r
}

// Live reports where the live run starts, once a call has returned
// ErrLive.
func (r *Replay) Live() (Live, bool) {
	if r.live == nil {
		return Live{}, false
	}
	l := *r.live
	l.Conns = slices.Clone(l.Conns)
	return l, true
}

// Offset is the determinant stream offset of the next determinant.
func (r *Replay) Offset() uint64 { return r.dets.off }

// Replayed is the number of determinants replayed so far.
func (r *Replay) Replayed() uint64 { return r.index }

func (r *Replay) conn(id uint64) *replayConn {
	c := r.conns[id]
	if c == nil {
		c = &replayConn{st: ConnState{Conn: id}}
		r.conns[id] = c
	}
	if !c.opened {
		c.opened = true
		if src := r.open(id, c.st.Delivered); src != nil {
			c.data = &byteReader{src: src, off: c.st.Delivered}
		}
		c.st.Unlogged = c.data == nil
	}
	return c
}

// next returns the next determinant and its stream offset.
func (r *Replay) next() (Determinant, uint64, error) {
	if r.err != nil {
		return Determinant{}, 0, r.err
	}
	if r.live != nil {
		return Determinant{}, 0, ErrLive
	}
	for {
		d, n, err := DecodeDeterminant(r.dets.buf)
		if err == nil {
			off := r.dets.off
			d.Ready, d.Value = slices.Clone(d.Ready), slices.Clone(d.Value)
			r.dets.consume(n)
			return d, off, nil
		}
		if err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF) {
			return Determinant{}, 0, r.fail(fmt.Errorf("observer: replay of process %d: determinant stream offset %d: %w", r.owner, r.dets.off, err))
		}
		switch ferr := r.dets.fill(); {
		case ferr == io.EOF && err == io.EOF:
			return Determinant{}, 0, r.finish()
		case ferr == io.EOF:
			return Determinant{}, 0, r.fail(fmt.Errorf("%w: replay of process %d: the determinant stream ends inside a determinant at offset %d: %w",
				ErrIncomplete, r.owner, r.dets.off, err))
		case ferr != nil:
			return Determinant{}, 0, r.fail(fmt.Errorf("observer: replay of process %d: read determinants at offset %d: %w", r.owner, r.dets.off+uint64(len(r.dets.buf)), ferr))
		}
	}
}

func (r *Replay) fail(err error) error {
	r.err = err
	return err
}

// finish switches to live: it finds the end of every logged data stream.
func (r *Replay) finish() error {
	l := &Live{Determinants: r.dets.off, Replayed: r.index}
	for id := range r.conns {
		c := r.conn(id)
		c.st.Logged = c.st.Delivered
		if c.data != nil {
			end, err := c.data.end()
			if err != nil {
				return r.fail(fmt.Errorf("observer: replay of process %d: find the end of connection %s's data: %w", r.owner, ConnString(id), err))
			}
			c.st.Logged = end
		}
		l.Conns = append(l.Conns, c.st)
	}
	slices.SortFunc(l.Conns, func(a, b ConnState) int { return cmp.Compare(a.Conn, b.Conn) })
	r.live = l
	return ErrLive
}

// diverge records and returns a *PathError; call describes the call made
// (formatted only on a divergence: replay is a hot path).
func (r *Replay) diverge(d Determinant, off uint64, format string, args ...any) error {
	return r.fail(&PathError{Owner: r.owner, Index: r.index, Offset: off, Call: fmt.Sprintf(format, args...), Logged: d})
}

// Recv answers a receive of up to size bytes on conn. On success d.N is
// the count to return (d.N ≤ size; 0 is the end of stream) and data holds
// those bytes from the log; data is nil when d.Errno is set (EAGAIN,
// EINTR: return it) and when conn is not logged (then the caller must
// read exactly d.N bytes from the live connection).
func (r *Replay) Recv(conn uint64, size int) (d Determinant, data []byte, err error) {
	d, off, err := r.next()
	if err != nil {
		return Determinant{}, nil, err
	}
	if d.Kind != KindRecv || d.Conn != conn || d.N > uint64(max(size, 0)) {
		return Determinant{}, nil, r.diverge(d, off, "recv on connection %s (up to %d bytes)", ConnString(conn), size)
	}
	c := r.conn(conn)
	if d.N > 0 && c.data != nil {
		if data, err = c.data.read(int(d.N)); err != nil {
			return Determinant{}, nil, r.fail(fmt.Errorf("%w: replay of process %d: determinant %d (%s) needs bytes [%d, %d) of connection %s: %w",
				ErrIncomplete, r.owner, r.index, &d, c.st.Delivered, c.st.Delivered+d.N, ConnString(conn), err))
		}
	}
	c.st.Delivered += d.N
	r.index++
	return d, data, nil
}

// Send answers a send of n bytes on conn: d.N is how many the original
// send accepted (≤ n), or d.Errno its failure. The caller passes the
// first d.N bytes to the connection's OutputCheck.
func (r *Replay) Send(conn uint64, n int) (Determinant, error) {
	d, off, err := r.next()
	if err != nil {
		return Determinant{}, err
	}
	if d.Kind != KindSend || d.Conn != conn || d.N > uint64(max(n, 0)) {
		return Determinant{}, r.diverge(d, off, "send on connection %s (%d bytes)", ConnString(conn), n)
	}
	r.conn(conn).st.Sent += d.N
	r.index++
	return d, nil
}

// Connect answers a connect to peer (a logical address): d.Errno, or the
// connection d.Conn it made. Every attempt of a retried connect is one
// call.
func (r *Replay) Connect(peer netip.AddrPort) (Determinant, error) {
	d, off, err := r.next()
	if err != nil {
		return Determinant{}, err
	}
	if d.Kind != KindConnect || d.Peer != peer {
		return Determinant{}, r.diverge(d, off, "connect to %s", peer)
	}
	if d.Errno == 0 {
		r.conn(d.Conn)
	}
	r.index++
	return d, nil
}

// Accept answers an accept on logical port port: d.Errno, or the
// connection d.Conn the accept must return (the caller waits for that
// connection, holding any other that arrives first).
func (r *Replay) Accept(port uint16) (Determinant, error) {
	d, off, err := r.next()
	if err != nil {
		return Determinant{}, err
	}
	if d.Kind != KindAccept || d.Port != port {
		return Determinant{}, r.diverge(d, off, "accept on port %d", port)
	}
	if d.Errno == 0 {
		r.conn(d.Conn)
	}
	r.index++
	return d, nil
}

// Ready answers a poll, select or epoll_wait: d.Ready is the ready set
// to report (empty: a timeout), or d.Errno its failure.
func (r *Replay) Ready(call ReadyCall) (Determinant, error) {
	d, off, err := r.next()
	if err != nil {
		return Determinant{}, err
	}
	if d.Kind != KindReady || d.ReadyCall != call {
		return Determinant{}, r.diverge(d, off, "%s", call)
	}
	r.index++
	return d, nil
}

// Value answers call about ref (see ValueCall) with the bytes d.Value the
// original run saw.
func (r *Replay) Value(call ValueCall, ref uint64) (Determinant, error) {
	d, off, err := r.next()
	if err != nil {
		return Determinant{}, err
	}
	if d.Kind != KindValue || d.ValueCall != call || d.Ref != ref {
		return Determinant{}, r.diverge(d, off, "%s(%d)", call, ref)
	}
	r.index++
	return d, nil
}
