package observer

import (
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/radic-project/radic/msglog"
)

// The scenario: a master (logical process 3) connects to a server,
// retrying while it is refused, accepts two workers in whatever order they
// come, polls them, receives their bytes in whatever pieces arrive
// (EAGAIN included) and reports each piece to the server with sends that
// may be partial. Its run is recorded into a msglog store, it dies, and it
// is re-executed against a Replay of that store: every answer must be the
// same, and its regenerated output must check against what the server had.

// sys is the process's view of the system calls.
type sys interface {
	getpid() ([]byte, error)
	connect(peer netip.AddrPort) (uint64, syscall.Errno, error)
	accept(port uint16) (uint64, syscall.Errno, error)
	poll() ([]ReadyFd, error)
	recv(conn uint64, size int) ([]byte, syscall.Errno, error)
	send(conn uint64, p []byte) (int, syscall.Errno, error)
}

// Program variants (mutations of the re-executed program).
const (
	original   = iota
	otherConn  // at piece pieceOtherConn, receives from the other worker
	otherBytes // at piece pieceOtherBytes, reports something else (as if it read the clock)
)

const pieceOtherConn, pieceOtherBytes = 5, 120

const (
	master     = 3
	masterPort = 6000
)

// program is the process. It returns the error that stopped it (nil at
// its end).
func program(s sys, variant int) error {
	pid, err := s.getpid()
	if err != nil {
		return err
	}
	var srv uint64
	for {
		c, e, err := s.connect(server)
		if err != nil {
			return err
		}
		if e == 0 {
			srv = c
			break
		}
		if e != syscall.ECONNREFUSED {
			return fmt.Errorf("connect: %v", e)
		}
	}
	workers := map[uint32]uint64{} // fd -> connection
	for len(workers) < 2 {
		c, e, err := s.accept(masterPort)
		if err != nil {
			return err
		}
		if e == 0 {
			workers[uint32(4+len(workers))] = c
		}
	}
	sendAll := func(p []byte) error {
		for len(p) > 0 {
			n, e, err := s.send(srv, p)
			if err != nil {
				return err
			}
			if e == 0 {
				p = p[n:]
			}
		}
		return nil
	}
	piece := 0
	for len(workers) > 0 {
		ready, err := s.poll()
		if err != nil {
			return err
		}
		for _, r := range ready {
			c := workers[r.Fd]
			if variant == otherConn && piece == pieceOtherConn {
				c = workers[4+(r.Fd-4+1)%2]
			}
			b, e, err := s.recv(c, 64)
			if err != nil {
				return err
			}
			if e != 0 {
				continue
			}
			if len(b) == 0 {
				delete(workers, r.Fd)
				continue
			}
			piece++
			msg := fmt.Sprintf("%s %s %d %08x %x\n", pid, ConnString(c), piece, crc32.ChecksumIEEE(b), b)
			if variant == otherBytes && piece == pieceOtherBytes {
				msg = "12:00:01" + msg[8:]
			}
			if err := sendAll([]byte(msg)); err != nil {
				return err
			}
		}
	}
	return nil
}

// world is the live system the original run sees: seeded and
// deterministic, so that a variant run against a fresh world makes the
// same choices.
type world struct {
	rng      *rand.Rand
	refusals int
	again    bool
	pending  []uint64          // workers not accepted yet
	fds      map[uint32]uint64 // accepted workers by fd
	data     map[uint64][]byte // what each worker sends
	read     map[uint64]int    // and how much was received
	server   []byte            // what the server received
}

func newWorld(seed uint64) *world {
	w := &world{rng: rand.New(rand.NewPCG(seed, 7)), refusals: 3, again: true,
		fds: map[uint32]uint64{}, data: map[uint64][]byte{}, read: map[uint64]int{}}
	w.pending = []uint64{1 << 32, 2 << 32}
	if w.rng.IntN(2) == 0 {
		w.pending[0], w.pending[1] = w.pending[1], w.pending[0]
	}
	for i, c := range w.pending {
		w.data[c] = stream(seed+uint64(i), 3000+w.rng.IntN(3000))
	}
	return w
}

func (w *world) getpid() ([]byte, error) { return []byte("4242"), nil }

func (w *world) connect(peer netip.AddrPort) (uint64, syscall.Errno, error) {
	if w.refusals > 0 {
		w.refusals--
		return 0, syscall.ECONNREFUSED, nil
	}
	return master << 32, 0, nil // the master's first connect (number 0)
}

func (w *world) accept(port uint16) (uint64, syscall.Errno, error) {
	if w.again {
		w.again = false
		return 0, syscall.EAGAIN, nil
	}
	c := w.pending[0]
	w.pending = w.pending[1:]
	w.fds[uint32(4+len(w.fds))] = c
	return c, 0, nil
}

func (w *world) poll() ([]ReadyFd, error) {
	var out []ReadyFd
	for fd := uint32(4); fd < 6; fd++ {
		if _, ok := w.fds[fd]; ok && w.rng.IntN(3) > 0 {
			out = append(out, ReadyFd{Fd: fd, Events: 1})
		}
	}
	return out, nil
}

func (w *world) recv(conn uint64, size int) ([]byte, syscall.Errno, error) {
	left := w.data[conn][w.read[conn]:]
	if len(left) > 0 && w.rng.IntN(10) == 0 {
		return nil, syscall.EAGAIN, nil
	}
	if len(left) == 0 { // the end of the stream: poll stops reporting it
		for fd, c := range w.fds {
			if c == conn {
				delete(w.fds, fd)
			}
		}
	}
	n := min(len(left), 1+w.rng.IntN(size))
	w.read[conn] += n
	return left[:n:n], 0, nil
}

func (w *world) send(conn uint64, p []byte) (int, syscall.Errno, error) {
	if w.rng.IntN(10) == 0 {
		return 0, syscall.EAGAIN, nil
	}
	n := 1 + w.rng.IntN(len(p))
	w.server = append(w.server, p[:n]...)
	return n, 0, nil
}

var errDied = errors.New("the node died")

// recorder runs the process against a world and logs what an observer
// logs: each receive's bytes, and every determinant (in batches, always
// before a send leaves: pessimistic). The process dies at call dieAt.
type recorder struct {
	t      *testing.T
	w      *world
	store  *msglog.Store
	dets   []byte // not yet appended
	detEnd uint64
	got    map[uint64]uint64 // received bytes logged per connection
	sent   []byte            // everything the process sent
	calls  int
	dieAt  int
	trace  []string
}

// die counts a call and says whether the process dies before making it.
func (r *recorder) die() bool {
	r.calls++
	return r.calls > r.dieAt
}

func (r *recorder) log(d Determinant, data []byte) {
	if len(data) > 0 {
		k, _ := DataKey(master, d.Conn)
		if err := r.store.Append(msglog.Record{Kind: msglog.KindData, Owner: k.Owner, Stream: k.Stream, Offset: r.got[d.Conn], Payload: data}); err != nil {
			r.t.Fatal(err)
		}
		r.got[d.Conn] += uint64(len(data))
	}
	var err error
	if r.dets, err = AppendDeterminant(r.dets, &d); err != nil {
		r.t.Fatal(err)
	}
	if len(r.dets) > 40 {
		r.flush()
	}
}

func (r *recorder) flush() {
	if len(r.dets) == 0 {
		return
	}
	k := DeterminantKey(master)
	if err := r.store.Append(msglog.Record{Kind: msglog.KindDeterminant, Owner: k.Owner, Stream: k.Stream, Offset: r.detEnd, Payload: r.dets}); err != nil {
		r.t.Fatal(err)
	}
	r.detEnd += uint64(len(r.dets))
	r.dets = r.dets[:0]
}

// trace records a call with its answer.
func trace(tr *[]string, format string, args ...any) { *tr = append(*tr, fmt.Sprintf(format, args...)) }

// The calls: ask the world, log the answer, return it.

func (r *recorder) getpid() ([]byte, error) {
	if r.die() {
		return nil, errDied
	}
	v, _ := r.w.getpid()
	r.log(Determinant{Kind: KindValue, ValueCall: ValueGetpid, Value: v}, nil)
	trace(&r.trace, "getpid = %q", v)
	return v, nil
}

func (r *recorder) connect(peer netip.AddrPort) (uint64, syscall.Errno, error) {
	if r.die() {
		return 0, 0, errDied
	}
	c, e, _ := r.w.connect(peer)
	r.log(Determinant{Kind: KindConnect, Conn: c, Errno: e, Peer: peer}, nil)
	trace(&r.trace, "connect %v = %s %v", peer, ConnString(c), e)
	return c, e, nil
}

func (r *recorder) accept(port uint16) (uint64, syscall.Errno, error) {
	if r.die() {
		return 0, 0, errDied
	}
	c, e, _ := r.w.accept(port)
	r.log(Determinant{Kind: KindAccept, Port: port, Conn: c, Errno: e}, nil)
	trace(&r.trace, "accept %d = %s %v", port, ConnString(c), e)
	return c, e, nil
}

func (r *recorder) poll() ([]ReadyFd, error) {
	if r.die() {
		return nil, errDied
	}
	set, _ := r.w.poll()
	r.log(Determinant{Kind: KindReady, ReadyCall: ReadyPoll, Ready: set}, nil)
	trace(&r.trace, "poll = %v", set)
	return set, nil
}

func (r *recorder) recv(conn uint64, size int) ([]byte, syscall.Errno, error) {
	if r.die() {
		return nil, 0, errDied
	}
	b, e, _ := r.w.recv(conn, size)
	r.log(Determinant{Kind: KindRecv, Conn: conn, N: uint64(len(b)), Errno: e}, b)
	trace(&r.trace, "recv %s %d = %q %v", ConnString(conn), size, b, e)
	return b, e, nil
}

func (r *recorder) send(conn uint64, p []byte) (int, syscall.Errno, error) {
	if r.die() {
		return 0, 0, errDied
	}
	r.flush() // pessimism: nothing leaves before the log has what it depends on
	n, e, _ := r.w.send(conn, p)
	r.sent = append(r.sent, p[:n]...)
	r.log(Determinant{Kind: KindSend, Conn: conn, N: uint64(n), Errno: e}, nil)
	trace(&r.trace, "send %s %d = %d %v", ConnString(conn), len(p), n, e)
	return n, e, nil
}

// replayer is the re-executed process's system: answers from a Replay,
// sends through an OutputCheck against the server's summary.
type replayer struct {
	t     *testing.T
	r     *Replay
	check *OutputCheck
	fresh []byte // regenerated bytes the server did not have
	trace []string
}

func (p *replayer) getpid() ([]byte, error) {
	d, err := p.r.Value(ValueGetpid, 0)
	if err != nil {
		return nil, err
	}
	trace(&p.trace, "getpid = %q", d.Value)
	return d.Value, nil
}

func (p *replayer) connect(peer netip.AddrPort) (uint64, syscall.Errno, error) {
	d, err := p.r.Connect(peer)
	if err != nil {
		return 0, 0, err
	}
	trace(&p.trace, "connect %v = %s %v", peer, ConnString(d.Conn), d.Errno)
	return d.Conn, d.Errno, nil
}

func (p *replayer) accept(port uint16) (uint64, syscall.Errno, error) {
	d, err := p.r.Accept(port)
	if err != nil {
		return 0, 0, err
	}
	trace(&p.trace, "accept %d = %s %v", port, ConnString(d.Conn), d.Errno)
	return d.Conn, d.Errno, nil
}

func (p *replayer) poll() ([]ReadyFd, error) {
	d, err := p.r.Ready(ReadyPoll)
	if err != nil {
		return nil, err
	}
	trace(&p.trace, "poll = %v", d.Ready)
	return d.Ready, nil
}

func (p *replayer) recv(conn uint64, size int) ([]byte, syscall.Errno, error) {
	d, b, err := p.r.Recv(conn, size)
	if err != nil {
		return nil, 0, err
	}
	trace(&p.trace, "recv %s %d = %q %v", ConnString(conn), size, b, d.Errno)
	return b, d.Errno, nil
}

func (p *replayer) send(conn uint64, b []byte) (int, syscall.Errno, error) {
	d, err := p.r.Send(conn, len(b))
	if err != nil {
		return 0, 0, err
	}
	fresh, err := p.check.Write(b[:d.N])
	if err != nil {
		return 0, 0, err
	}
	p.fresh = append(p.fresh, fresh...)
	trace(&p.trace, "send %s %d = %d %v", ConnString(conn), len(b), d.N, d.Errno)
	return int(d.N), d.Errno, nil
}

// testSeed returns TEST_SEED or a default, and logs it.
func testSeed(t *testing.T) uint64 {
	seed := uint64(1)
	if v := os.Getenv("TEST_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("TEST_SEED=%q: %v", v, err)
		}
		seed = s
	}
	t.Logf("TEST_SEED=%d", seed)
	return seed
}

type run struct {
	store   *msglog.Store
	rec     *recorder
	lost    []byte // sent bytes the server never got (in flight at the death)
	summary Summary
}

// record runs the original process to its death at a fraction of its
// calls and returns its log.
func record(t *testing.T, seed uint64, dieFrac float64) *run {
	full := &recorder{t: t, w: newWorld(seed), store: openStore(t), dieAt: 1 << 30, got: map[uint64]uint64{}}
	if err := program(full, original); err != nil {
		t.Fatalf("fault-free run: %v", err)
	}
	rec := &recorder{t: t, w: newWorld(seed), store: openStore(t), dieAt: int(float64(full.calls) * dieFrac), got: map[uint64]uint64{}}
	if err := program(rec, original); err != errDied {
		t.Fatalf("original run ended with %v, want %v", err, errDied)
	}
	rec.flush()
	// In flight at the death: the last bytes sent never reached the
	// server, and 10 bytes of worker 1 reached the shim and the log but
	// not the application.
	w := rec.w
	lost := w.server[len(w.server)-min(5, len(w.server)):]
	w.server = w.server[:len(w.server)-len(lost)]
	w1 := uint64(1 << 32)
	if _, accepted := rec.got[w1]; accepted {
		extra := w.data[w1][w.read[w1]:]
		extra = extra[:min(10, len(extra))]
		if len(extra) > 0 {
			if err := rec.store.Append(msglog.Record{Kind: msglog.KindData, Owner: master, Stream: w1, Offset: rec.got[w1], Payload: extra}); err != nil {
				t.Fatal(err)
			}
			rec.got[w1] += uint64(len(extra))
		}
	}
	h, _ := NewStreamHash(MinBlock, 0, 0)
	h.Write(w.server)
	t.Logf("seed %d: the original run died at call %d of %d, after %d bytes of determinants; the server had %d bytes",
		seed, rec.dieAt, full.calls, rec.detEnd, len(w.server))
	return &run{store: rec.store, rec: rec, lost: lost, summary: h.Summary()}
}

func openStore(t *testing.T) *msglog.Store {
	s, err := msglog.Open(t.TempDir(), msglog.Options{Sync: msglog.SyncNever, SegmentSize: msglog.MinSegmentSize})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// reexecute runs variant against a Replay of the run's log, its output
// checked against the server's summary.
func (o *run) reexecute(t *testing.T, variant int) (*replayer, error) {
	check, err := NewOutputCheck(master, master<<32, 0, 0, o.summary)
	if err != nil {
		t.Fatal(err)
	}
	r := NewReplay(master, o.store.Read(master, DeterminantStream, 0),
		func(conn, from uint64) Source { return o.store.Read(master, conn, from) }, Checkpoint{})
	p := &replayer{t: t, r: r, check: check}
	return p, program(p, variant)
}

func TestScenarioReplay(t *testing.T) {
	base := testSeed(t)
	for i := range uint64(8) {
		seed := base + i
		for _, frac := range []float64{0.05, 0.5, 0.95} {
			o := record(t, seed, frac)
			p, err := o.reexecute(t, original)
			if err != ErrLive {
				t.Fatalf("seed %d: re-execution ended with %v, want ErrLive", seed, err)
			}
			if diff := cmp.Diff(o.rec.trace, p.trace); diff != "" {
				t.Fatalf("seed %d: replayed calls (-original +replayed):\n%s", seed, diff)
			}
			// Every regenerated byte the server had was checked and
			// dropped; those in flight are to be sent.
			if string(p.fresh) != string(o.lost) {
				t.Errorf("seed %d: fresh bytes = %q, want the bytes in flight %q", seed, p.fresh, o.lost)
			}
			live, ok := p.r.Live()
			w := o.rec.w
			want := Live{Determinants: o.rec.detEnd, Replayed: uint64(len(o.rec.trace))}
			for _, c := range []uint64{1 << 32, 2 << 32} {
				if _, accepted := o.rec.got[c]; accepted || slices.Contains(slices.Collect(maps.Values(w.fds)), c) {
					want.Conns = append(want.Conns, ConnState{Conn: c, Delivered: uint64(w.read[c]), Logged: o.rec.got[c]})
				}
			}
			if w.refusals == 0 {
				want.Conns = append(want.Conns, ConnState{Conn: master << 32, Sent: uint64(len(o.rec.sent))})
			}
			if diff := cmp.Diff(want, live); !ok || diff != "" {
				t.Errorf("seed %d, death at %d: Live() (-want +got):\n%s", seed, o.rec.dieAt, diff)
			}
		}
	}
}

// A re-executed process that takes another path: receives from the other
// worker at piece pieceOtherConn.
func TestScenarioOtherCall(t *testing.T) {
	seed := testSeed(t)
	o := record(t, seed, 0.95)
	p, err := o.reexecute(t, otherConn)
	var pe *PathError
	if !errors.As(err, &pe) || !errors.Is(err, ErrDiverged) {
		t.Fatalf("re-execution of the mutant ended with %v, want a *PathError", err)
	}
	t.Log(err)
	// Everything before the divergence was answered as in the original.
	if diff := cmp.Diff(o.rec.trace[:len(p.trace)], p.trace); diff != "" {
		t.Errorf("calls before the divergence (-original +replayed):\n%s", diff)
	}
	if pe.Owner != master || pe.Index != uint64(len(p.trace)) || pe.Logged.Kind != KindRecv {
		t.Errorf("PathError = %+v; want owner %d, index %d, a logged recv", pe, master, len(p.trace))
	}
	if want := fmt.Sprintf("the log has %s", &pe.Logged); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "it called recv on connection ") {
		t.Errorf("error %q does not name the call and the logged one", err)
	}
}

// A re-executed process that sends other bytes (as if it had read the
// clock) at piece pieceOtherBytes, past the first blocks.
func TestScenarioOtherBytes(t *testing.T) {
	seed := testSeed(t)
	o := record(t, seed, 0.95)
	// Where the mutant's output first differs: its run against a fresh
	// world makes the same choices, only one message differs.
	mut := &recorder{t: t, w: newWorld(seed), store: openStore(t), dieAt: 1 << 30, got: map[uint64]uint64{}}
	if err := program(mut, otherBytes); err != nil {
		t.Fatal(err)
	}
	first := 0
	for o.rec.sent[first] == mut.sent[first] {
		first++
	}
	_, err := o.reexecute(t, otherBytes)
	var oe *OutputError
	if !errors.As(err, &oe) || !errors.Is(err, ErrDiverged) {
		t.Fatalf("re-execution of the mutant ended with %v, want an *OutputError", err)
	}
	t.Log(err)
	if oe.Owner != master || oe.Conn != master<<32 || uint64(first) < oe.From || uint64(first) >= oe.To || oe.To-oe.From > MinBlock {
		t.Errorf("OutputError = %+v; want process %d, connection %s, a range of at most one block holding byte %d", oe, master, ConnString(master<<32), first)
	}
}
