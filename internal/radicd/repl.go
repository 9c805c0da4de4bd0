package radicd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/internal/fabric"
	"github.com/radic-project/radic/msglog"
	"github.com/radic-project/radic/msglog/record"
)

// The replication stream: how a node's radicd ships its processes'
// pessimistic log to each of its k protectors. One TCP connection per
// protector, opened as an HTTP upgrade of POST /v1/replica/stream?node=ID
// on the protector's daemon port (HTTP stays the control plane; no second
// listener), or with --fabric bg one stream on the Blue Gene fabric
// (delta-t and bulk messaging, internal/fabric), then framed both ways:
//
//	node -> protector, a batch:  u32 length | u64 seq | records (record.AppendRecord, concatenated)
//	protector -> node, an ack:   u64 received | u64 stored | u32 errlen | err
//
// Batches are pipelined (sent without waiting) and acknowledged
// cumulatively: received = every batch up to that seq is in the
// protector's memory, checked (CRC) and queued for its store; stored =
// written to the store and, with --store-sync always, fsynced. A batch is
// stable ("logged") once every protector has received it (--log-stable
// memory, the default: RADIC's model, a copy on another node) or stored it
// (--log-stable disk). The node keeps each batch until every protector has
// stored it, so a protector daemon that is killed (or a connection that
// breaks) loses nothing: on reconnection the node sends again everything
// not yet stored, from the oldest, and the store's appends are idempotent
// (msglog: identical bytes already held are skipped).
//
// Durability: with memory, a batch is stable while it may exist only in
// the memory of the protectors and of the node; a failure of the node, or
// of a protector (process or node), loses no stable data. A simultaneous
// crash of the node and all k protectors before the protectors' store
// writes (and fsync, per --store-sync) is beyond the fault model and can
// lose the last batches. --log-stable disk makes stable wait for the
// protectors' stores (with --store-sync always: on their disks).

const (
	replUpgrade  = "radic-log/1"
	replHdrLen   = 12
	replAckLen   = 20
	replMaxFrame = maxBody
	// replQueue bounds the batches a protector holds received but not yet
	// stored, per protected node; past it the protector stops reading
	// (TCP back-pressure: the node's processes' sends wait).
	replQueue = 64
	// replMaxErr bounds the error text of an ack.
	replMaxErr = 1024
	// replReadBuf is the protector's read buffer per stream.
	replReadBuf = 64 << 10
)

// LogStable says when a batch of the log is stable on a protector.
type LogStable int

const (
	// StableMemory: once the protector has it in memory (received).
	StableMemory LogStable = iota
	// StableDisk: once the protector's store has written it (and
	// fsynced it, with --store-sync always).
	StableDisk
)

func (s LogStable) String() string {
	if s == StableDisk {
		return "disk"
	}
	return "memory"
}

// ParseLogStable parses "memory" or "disk".
func ParseLogStable(v string) (LogStable, error) {
	switch v {
	case "memory":
		return StableMemory, nil
	case "disk":
		return StableDisk, nil
	}
	return 0, fmt.Errorf("unknown log-stable %q (want memory or disk)", v)
}

// ---- the node's side ----

// replicator keeps one stream per protector.
type replicator struct {
	d   *Daemon
	log *slog.Logger
	ctx context.Context

	mu sync.Mutex
	// +checklocks:mu
	streams map[heartbeat.NodeID]*replStream
	// +checklocks:mu
	prots []heartbeat.NodeID
	// +checklocks:mu
	protsErr error
	// +checklocks:mu
	protsAt time.Time

	// lookup and addr find the protectors and their addresses (the
	// ring's and the locator's; fakes in tests).
	lookup func(ctx context.Context) ([]heartbeat.NodeID, error)
	addr   func(id heartbeat.NodeID) (netip.AddrPort, bool)
}

// replProtsTTL: how long the protector set read from the ring is reused.
// A protector declared dead stays in it that long at most; batches sent to
// it are then sent again to the new set (their shipment fails).
const replProtsTTL = 50 * time.Millisecond

func newReplicator(d *Daemon) *replicator {
	return &replicator{d: d, log: d.log, streams: map[heartbeat.NodeID]*replStream{},
		lookup: d.currentProtectors,
		addr:   func(id heartbeat.NodeID) (netip.AddrPort, bool) { return d.loc.peerAddr(int(id)) }}
}

// protectors returns this node's current protectors.
func (rp *replicator) protectors(ctx context.Context) ([]heartbeat.NodeID, error) {
	rp.mu.Lock()
	if time.Since(rp.protsAt) < replProtsTTL {
		p, err := rp.prots, rp.protsErr
		rp.mu.Unlock()
		return p, err
	}
	rp.mu.Unlock()
	p, err := rp.lookup(ctx)
	rp.mu.Lock()
	rp.prots, rp.protsErr, rp.protsAt = p, err, time.Now()
	// Streams to nodes that no longer protect this one end; their
	// unfinished shipments fail and are sent again to the new set.
	if err == nil {
		for id, s := range rp.streams {
			if !containsID(p, id) {
				delete(rp.streams, id)
				s.close(fmt.Errorf("node %d no longer protects this node", id))
			}
		}
	}
	rp.mu.Unlock()
	return p, err
}

func containsID(ids []heartbeat.NodeID, id heartbeat.NodeID) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// currentProtectors is this node's protectors, all k of them alive.
func (d *Daemon) currentProtectors(ctx context.Context) ([]heartbeat.NodeID, error) {
	prots, err := d.ringProtectors(ctx)
	if err != nil {
		return nil, err
	}
	if len(prots) < d.cfg.Protectors {
		return prots, &httpError{http.StatusServiceUnavailable,
			fmt.Sprintf("only %d of %d protectors alive (%s): nothing is logged until k are", len(prots), d.cfg.Protectors, joinIDs(prots))}
	}
	return prots, nil
}

func (rp *replicator) stream(id heartbeat.NodeID) *replStream {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	s := rp.streams[id]
	if s == nil {
		s = &replStream{rp: rp, peer: id, wkick: make(chan struct{}, 1), stop: make(chan struct{})}
		rp.streams[id] = s
		go s.routineReplStream(rp.ctx)
	}
	return s
}

// shipHooks are what a shipment tells its submitter; each runs on the
// goroutine that learnt it (an ack reader: the hold path's shortest way
// back to the process, or a closing stream) and must not block.
type shipHooks struct {
	onStable func() // the batch is stable
	onFail   func() // the shipment failed: it must be submitted again
	onStored func() // every protector has stored it: no stream holds the body any more
}

// submit sends body (encoded records; the replicator keeps it until every
// protector has stored it: the caller must not change it before
// onStored) to every protector, pipelined. The shipment's wait says when
// it is stable.
func (rp *replicator) submit(ctx context.Context, body []byte, h shipHooks) shipment {
	prots, err := rp.protectors(ctx)
	if err != nil {
		if h.onFail != nil {
			h.onFail()
		}
		return failedShipment{err}
	}
	tk := &ticket{done: make(chan struct{}), need: rp.d.cfg.LogStable, hooks: h}
	tk.left.Store(int32(len(prots)))
	tk.storedLeft.Store(int32(len(prots)))
	for _, id := range prots {
		s := rp.stream(id)
		tk.streams = append(tk.streams, s)
		s.send(body, tk)
	}
	return tk
}

// A shipment is a batch on its way to the protectors.
type shipment interface {
	// wait returns nil once the batch is stable; an error of type
	// *stillTrying while it is not yet and a protector reports a
	// problem (the batch keeps going: wait again); another error when
	// the batch must be submitted again.
	wait(ctx context.Context) error
	// poll is wait without waiting: errInFlight while the batch is on
	// its way without a problem.
	poll() error
}

// errInFlight: a shipment is on its way.
var errInFlight = errors.New("in flight")

type failedShipment struct{ err error }

func (f failedShipment) wait(context.Context) error { return f.err }
func (f failedShipment) poll() error                { return f.err }

// stillTrying: the shipment goes on, but a protector has a problem.
type stillTrying struct{ msg string }

func (e *stillTrying) Error() string { return e.msg }

// ticket is a batch submitted to a set of streams.
type ticket struct {
	left       atomic.Int32 // streams that have yet to make it stable
	done       chan struct{}
	once       sync.Once
	failed     atomic.Pointer[error]
	need       LogStable
	streams    []*replStream
	hooks      shipHooks
	storedLeft atomic.Int32 // streams that have yet to store it
}

func (t *ticket) ackOne() {
	if t.left.Add(-1) == 0 {
		if t.hooks.onStable != nil && t.failed.Load() == nil {
			t.hooks.onStable()
		}
		t.once.Do(func() { close(t.done) })
	}
}

func (t *ticket) storedOne() {
	if t.storedLeft.Add(-1) == 0 && t.hooks.onStored != nil {
		t.hooks.onStored()
	}
}

func (t *ticket) fail(err error) {
	if t.failed.CompareAndSwap(nil, &err) {
		t.once.Do(func() { close(t.done) })
		if t.hooks.onFail != nil {
			t.hooks.onFail()
		}
	}
}

func (t *ticket) poll() error {
	select {
	case <-t.done:
		if e := t.failed.Load(); e != nil {
			return *e
		}
		return nil
	default:
	}
	for _, s := range t.streams {
		if msg := s.problem(); msg != "" {
			return &stillTrying{msg}
		}
	}
	return errInFlight
}

func (t *ticket) wait(ctx context.Context) error {
	tm := time.NewTimer(time.Second)
	defer tm.Stop()
	for {
		select {
		case <-t.done:
			if e := t.failed.Load(); e != nil {
				return *e
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tm.C:
			for _, s := range t.streams {
				if msg := s.problem(); msg != "" {
					return &stillTrying{msg}
				}
			}
			tm.Reset(time.Second)
		}
	}
}

// replBatch is a batch held by a stream until stored.
type replBatch struct {
	seq    uint64
	body   []byte
	tk     *ticket
	stable bool // tk was told
}

// replStream is the stream to one protector. Its routine connects,
// resends and reads acks; send writes batches directly when connected.
type replStream struct {
	rp   *replicator
	peer heartbeat.NodeID
	stop chan struct{}

	wkick chan struct{}
	mu    sync.Mutex
	// +checklocks:mu
	conn net.Conn // nil while disconnected
	// +checklocks:mu
	seq uint64 // last assigned
	// +checklocks:mu
	written uint64 // last written on conn
	// +checklocks:mu
	writing bool // a goroutine writes on conn
	// +checklocks:mu
	pend []*replBatch // not yet stored, in seq order
	// +checklocks:mu
	err string // the protector's (or the connection's) last problem
	// +checklocks:mu
	closed error
}

func (s *replStream) problem() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *replStream) close(err error) {
	s.mu.Lock()
	if s.closed != nil {
		s.mu.Unlock()
		return
	}
	s.closed = err
	c := s.conn
	pend := s.pend
	s.pend = nil
	s.mu.Unlock()
	close(s.stop)
	if c != nil {
		c.Close()
	}
	for _, b := range pend {
		if !b.stable {
			b.tk.fail(err)
		}
	}
}

// replInline: a batch up to this size is written by the goroutine that
// submits it when nothing is being written (the hold path's small
// batches: no hand-off); larger ones, and any batch behind another, are
// written by the connection's writer, so that the drain prepares the next
// batch while this one goes out.
const replInline = 64 << 10

func (s *replStream) send(body []byte, tk *ticket) {
	s.mu.Lock()
	if s.closed != nil {
		err := s.closed
		s.mu.Unlock()
		tk.fail(err)
		return
	}
	s.seq++
	b := &replBatch{seq: s.seq, body: body, tk: tk}
	s.pend = append(s.pend, b)
	c := s.conn
	if c != nil && len(s.pend) == 1 {
		s.setAckDeadline(c) // the reader may wait without one
	}
	inline := c != nil && !s.writing && s.written == b.seq-1 && len(body) <= replInline
	if inline {
		s.writing = true
	}
	s.mu.Unlock()
	if !inline {
		s.kickWriter()
		return
	}
	err := writeBatch(c, b)
	s.mu.Lock()
	s.writing = false
	if err == nil && s.conn == c {
		s.written = b.seq
	}
	more := s.written < s.seq // others came meanwhile: the writer's
	s.mu.Unlock()
	if err != nil {
		c.Close() // the routine reconnects and resends
	}
	if more {
		s.kickWriter()
	}
}

func (s *replStream) kickWriter() {
	select {
	case s.wkick <- struct{}{}:
	default:
	}
}

// routineReplWriter writes the stream's batches on c, in order, until c
// is replaced or fails.
func (s *replStream) routineReplWriter(c net.Conn, done <-chan struct{}) {
	for {
		select {
		case <-s.wkick:
		case <-done:
			return
		}
		for {
			s.mu.Lock()
			if s.writing || s.conn != c || len(s.pend) == 0 {
				s.mu.Unlock()
				break
			}
			i := int(s.written + 1 - s.pend[0].seq)
			if s.written+1 < s.pend[0].seq {
				i = 0
			}
			if i >= len(s.pend) {
				s.mu.Unlock()
				break
			}
			b := s.pend[i]
			s.writing = true
			s.mu.Unlock()
			err := writeBatch(c, b)
			s.mu.Lock()
			s.writing = false
			if err == nil && s.conn == c {
				s.written = b.seq
			}
			s.mu.Unlock()
			if err != nil {
				c.Close() // the routine reconnects and resends
				return
			}
		}
	}
}

func writeBatch(c net.Conn, b *replBatch) error {
	var h [replHdrLen]byte
	binary.LittleEndian.PutUint32(h[0:], uint32(len(b.body)))
	binary.LittleEndian.PutUint64(h[4:], b.seq)
	bufs := net.Buffers{h[:], b.body}
	c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := bufs.WriteTo(c)
	return err
}

// routineReplStream keeps the stream connected until it is closed.
func (s *replStream) routineReplStream(ctx context.Context) {
	log := s.rp.log.With("protector", s.peer)
	log.Info("RoutineReplStream starting")
	defer log.Info("RoutineReplStream stopped")
	stopOnDone := context.AfterFunc(ctx, func() { s.close(errors.New("daemon stopping")) })
	defer stopOnDone()
	backoff := 20 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			s.close(errors.New("daemon stopping"))
			return
		case <-s.stop:
			return
		default:
		}
		c, br, err := s.dial(ctx)
		if err == nil {
			backoff = 20 * time.Millisecond
			err = s.serve(c, br)
			c.Close()
		}
		if err != nil {
			s.mu.Lock()
			s.err = fmt.Sprintf("protector %d: %v", s.peer, err)
			s.conn = nil
			s.mu.Unlock()
			log.Debug("log stream to protector broken", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-s.stop:
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (s *replStream) dial(ctx context.Context) (net.Conn, *bufio.Reader, error) {
	if fab := s.rp.d.fab; fab != nil {
		c, err := fab.Dial(s.peer, fabric.ServiceReplica, []byte(strconv.Itoa(int(s.rp.d.self))))
		if err != nil {
			return nil, nil, err
		}
		return c, bufio.NewReaderSize(c, 4096), nil
	}
	addr, ok := s.rp.addr(s.peer)
	if !ok {
		return nil, nil, errors.New("no address")
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var dl net.Dialer
	c, err := dl.DialContext(dctx, "tcp", addr.String())
	if err != nil {
		return nil, nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "POST /v1/replica/stream?node=%d HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\nContent-Length: 0\r\n\r\n", s.rp.d.self, addr, replUpgrade)
	br := bufio.NewReaderSize(c, 4096)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		resp.Body.Close()
		c.Close()
		return nil, nil, &httpError{resp.StatusCode, fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))}
	}
	c.SetDeadline(time.Time{})
	return c, br, nil
}

// serve resends every batch not yet stored, then reads acks until the
// connection breaks.
func (s *replStream) serve(c net.Conn, br *bufio.Reader) error {
	s.mu.Lock()
	s.conn = c
	s.written = s.seq // all of pend goes again
	if len(s.pend) > 0 {
		s.written = s.pend[0].seq - 1
	}
	s.mu.Unlock()
	done := make(chan struct{})
	defer close(done)
	go s.routineReplWriter(c, done)
	s.kickWriter()
	var a [replAckLen]byte
	for {
		s.mu.Lock()
		s.setAckDeadline(c)
		s.mu.Unlock()
		if _, err := io.ReadFull(br, a[:]); err != nil {
			return err
		}
		recv := binary.LittleEndian.Uint64(a[0:])
		stored := binary.LittleEndian.Uint64(a[8:])
		n := binary.LittleEndian.Uint32(a[16:])
		var msg string
		if n > 0 {
			if n > replMaxErr {
				return fmt.Errorf("ack error of %d bytes", n)
			}
			m := make([]byte, n)
			if _, err := io.ReadFull(br, m); err != nil {
				return err
			}
			msg = fmt.Sprintf("protector %d: %s", s.peer, m)
		}
		s.ack(recv, stored, msg)
	}
}

// replAckTimeout: a protector that holds batches of ours acks within
// seconds; a connection that says nothing for this long while it does is
// taken as broken (a protector whose node vanished sends no RST).
var replAckTimeout = 30 * time.Second // a variable for tests

// setAckDeadline gives c's reader (which may be blocked already) a deadline
// while batches wait for their acks, none while the stream is idle: an
// idle connection has nothing to say.
//
// +checklocks:s.mu
func (s *replStream) setAckDeadline(c net.Conn) {
	if len(s.pend) > 0 {
		c.SetReadDeadline(time.Now().Add(replAckTimeout))
	} else {
		c.SetReadDeadline(time.Time{})
	}
}

func (s *replStream) ack(recv, stored uint64, msg string) {
	var tell []*ticket
	s.mu.Lock()
	s.err = msg
	i := 0
	for ; i < len(s.pend); i++ {
		b := s.pend[i]
		if b.seq > recv && b.seq > stored {
			break
		}
		if !b.stable && (b.seq <= stored || (b.tk.need == StableMemory && b.seq <= recv)) {
			b.stable = true
			tell = append(tell, b.tk)
		}
	}
	// Drop the stored ones.
	j := 0
	var done []*ticket
	for j < len(s.pend) && s.pend[j].seq <= stored {
		done = append(done, s.pend[j].tk)
		s.pend[j] = nil
		j++
	}
	s.pend = s.pend[j:]
	s.mu.Unlock()
	for _, t := range tell {
		t.ackOne()
	}
	for _, t := range done {
		t.storedOne()
	}
}

// ---- the protector's side ----

// logWriter stores the batches of one protected node, in the order
// received (over any of its connections), behind the acks.
type logWriter struct {
	id heartbeat.NodeID
	st *msglog.Store
	q  chan *replFrame
	// kick wakes a writer that lets frames queue up (logWriteDelay)
	// once many wait; qbytes counts the bytes queued.
	kick   chan struct{}
	qbytes atomic.Int64

	// taken counts the frames read (and so perhaps acknowledged: with
	// --log-stable memory a frame is stable before it is stored);
	// stored, those the store holds. settle waits for the one to reach
	// the other.
	taken   atomic.Uint64
	stored  atomic.Uint64
	smu     sync.Mutex
	storedC chan struct{} // closed (and replaced) when stored moves

	mu sync.Mutex
	// +checklocks:mu
	conn *replConn // the node's current connection
}

type replFrame struct {
	seq  uint64
	recs []msglog.Record
	encs [][]byte // each record's encoding, as received (written as is)
	size int
	c    *replConn
}

// replConn is one protected node's connection.
type replConn struct {
	c      net.Conn
	wmu    sync.Mutex
	recv   atomic.Uint64
	stored atomic.Uint64
	err    atomic.Pointer[string]
	done   chan struct{}
}

// sendAck writes the connection's acknowledgement.
func (rc *replConn) sendAck() error {
	var a [replAckLen]byte
	var msg string
	if p := rc.err.Load(); p != nil {
		msg = *p
	}
	if len(msg) > replMaxErr {
		msg = msg[:replMaxErr]
	}
	rc.wmu.Lock()
	defer rc.wmu.Unlock()
	binary.LittleEndian.PutUint64(a[0:], rc.recv.Load())
	binary.LittleEndian.PutUint64(a[8:], rc.stored.Load())
	binary.LittleEndian.PutUint32(a[16:], uint32(len(msg)))
	rc.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if len(msg) == 0 {
		_, err := rc.c.Write(a[:])
		return err
	}
	bufs := net.Buffers{a[:], []byte(msg)}
	_, err := bufs.WriteTo(rc.c)
	return err
}

func (d *Daemon) logWriterFor(id heartbeat.NodeID) (*logWriter, error) {
	d.writersMu.Lock()
	defer d.writersMu.Unlock()
	if w := d.writers[id]; w != nil {
		return w, nil
	}
	st, err := d.stores.get(id)
	if err != nil {
		return nil, err
	}
	w := &logWriter{id: id, st: st, q: make(chan *replFrame, replQueue), kick: make(chan struct{}, 1)}
	if d.writers == nil {
		d.writers = map[heartbeat.NodeID]*logWriter{}
	}
	d.writers[id] = w
	go d.routineLogWriter(w)
	return w, nil
}

// storedMore counts n more frames stored and wakes settle's waiters.
func (w *logWriter) storedMore(n uint64) {
	w.smu.Lock()
	w.stored.Add(n)
	if w.storedC != nil {
		close(w.storedC)
		w.storedC = nil
	}
	w.smu.Unlock()
}

// settle waits (up to max) until the store holds every frame read so far.
// A reader of the store that must see everything acknowledged calls it
// first: with --log-stable memory the node's ring counts a batch stable
// (and, its process dead, its ring routine ends, and a replay begins) as
// soon as the protector has it in memory, while the batch may still wait
// for the writer (logWriteDelay). A replay that listed and read the
// streams meanwhile saw a cut between them: a connection's bytes read
// before the writer stored a batch, the determinant stream after it
// (CI: "receives returned 2203566 bytes, 2203545 are logged").
func (w *logWriter) settle(ctx context.Context, max time.Duration) error {
	target := w.taken.Load()
	deadline := time.NewTimer(max)
	defer deadline.Stop()
	for {
		w.smu.Lock()
		if w.stored.Load() >= target {
			w.smu.Unlock()
			return nil
		}
		if w.storedC == nil {
			w.storedC = make(chan struct{})
		}
		ch := w.storedC
		w.smu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("the store of node %d's log has not taken %d received batches within %v", w.id, target-w.stored.Load(), max)
		}
	}
}

// settleLog makes the store of node id's log hold everything this
// protector has acknowledged (see logWriter.settle); a node never
// protected here has nothing to wait for.
func (d *Daemon) settleLog(ctx context.Context, id heartbeat.NodeID) error {
	d.writersMu.Lock()
	w := d.writers[id]
	d.writersMu.Unlock()
	if w == nil {
		return nil
	}
	return w.settle(ctx, 30*time.Second)
}

// handleReplicaStream takes node=ID's replication stream (an HTTP upgrade).
func (d *Daemon) handleReplicaStream(w http.ResponseWriter, r *http.Request) {
	id, err := nodeParam(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), replUpgrade) {
		http.Error(w, "want Upgrade: "+replUpgrade, http.StatusBadRequest)
		return
	}
	lw, err := d.logWriterFor(id)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", replUpgrade); err != nil {
		return
	}
	// The server's reader buffers 4 KiB: a frame larger than that (a
	// hold's batch is a header and ~4 KiB of records under Jacobi) took
	// two reads. Reading through a larger buffer takes what has arrived
	// in one system call (dear on this VM: each one traps).
	d.serveReplicaStream(c, bufio.NewReaderSize(brw.Reader, replReadBuf), id, lw)
}

// serveReplicaStream reads node id's log stream from c (a TCP connection
// or a stream on the fabric) until it breaks.
func (d *Daemon) serveReplicaStream(c net.Conn, br *bufio.Reader, id heartbeat.NodeID, lw *logWriter) {
	rc := &replConn{c: c, done: make(chan struct{})}
	defer close(rc.done)
	// One connection per node at a time: the previous one ends (its
	// frames are all queued before this one's).
	lw.mu.Lock()
	prev := lw.conn
	lw.conn = rc
	lw.mu.Unlock()
	if prev != nil {
		prev.c.Close()
		<-prev.done
	}
	log := d.log.With("protected_node", id)
	log.Debug("log stream from node opened", "remote", c.RemoteAddr().String())
	err := d.readReplStream(rc, br, lw)
	log.Debug("log stream from node closed", "err", err)
}

// routineFabricReplica accepts the log streams that nodes open on the
// fabric (--fabric bg): their hello is the node's id.
func (d *Daemon) routineFabricReplica(ctx context.Context) {
	d.log.Info("RoutineFabricReplica starting")
	defer d.log.Info("RoutineFabricReplica stopped")
	accepted := d.fab.Listen(fabric.ServiceReplica)
	for {
		var a fabric.Accepted
		select {
		case <-ctx.Done():
			return
		case a = <-accepted:
		}
		id, err := strconv.ParseUint(string(a.Hello), 10, 32)
		if err != nil || heartbeat.NodeID(id) != a.Stream.Peer() {
			d.log.Warn("a log stream on the fabric with a bad hello", "from", a.Stream.Peer(), "hello", string(a.Hello))
			a.Stream.Close()
			continue
		}
		lw, err := d.logWriterFor(heartbeat.NodeID(id))
		if err != nil {
			d.log.Warn("cannot take a log stream", "from", id, "err", err)
			a.Stream.Close()
			continue
		}
		go func() {
			defer a.Stream.Close()
			d.serveReplicaStream(a.Stream, bufio.NewReaderSize(a.Stream, replReadBuf), heartbeat.NodeID(id), lw)
		}()
	}
}

func (d *Daemon) readReplStream(rc *replConn, br *bufio.Reader, lw *logWriter) error {
	var h [replHdrLen]byte
	ackRecv := d.cfg.LogStable == StableMemory
	for {
		rc.c.SetReadDeadline(time.Time{})
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return err
		}
		n := binary.LittleEndian.Uint32(h[0:])
		seq := binary.LittleEndian.Uint64(h[4:])
		if n > replMaxFrame {
			return fmt.Errorf("frame of %d bytes", n)
		}
		// A fresh buffer per frame: the store keeps the payloads (its
		// cache) without copying them.
		body := make([]byte, n)
		rc.c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.ReadFull(br, body); err != nil {
			return err
		}
		recs, encs, err := splitRecords(body)
		if err != nil {
			msg := "records: " + err.Error()
			rc.err.Store(&msg)
			rc.sendAck()
			return errors.New(msg)
		}
		// Ack on receipt (the frame is in memory, checked), before
		// queueing it, which may wake the writer's thread: the ack is on
		// the process's hold path, the write is not. Only when nothing
		// more is already waiting to be read: the next frame's ack
		// covers this one.
		//
		// A frame counted as taken is queued even if its ack cannot be
		// sent (the node died meanwhile): settle waits for every taken
		// frame to be stored, and a frame dropped here made the listing
		// that a replay of that node starts with wait until it timed
		// out, and the restart fail (BenchmarkRecoveryTimes, kill-node:
		// "streams of node 1's group on node 0: ... context deadline
		// exceeded"). Storing it is right too: the node may have seen an
		// earlier ack cover it, and its process received those bytes.
		lw.taken.Add(1) // before the ack: a reader that trusts it settles
		rc.recv.Store(seq)
		var ackErr error
		if ackRecv && br.Buffered() < replHdrLen {
			ackErr = rc.sendAck()
		}
		lw.qbytes.Add(int64(n))
		select {
		case lw.q <- &replFrame{seq: seq, recs: recs, encs: encs, size: len(body), c: rc}:
		case <-d.logs.ctx.Done():
			return errors.New("daemon stopping")
		}
		if len(lw.q) >= logWriteKick || lw.qbytes.Load() >= logWriteBytes {
			select {
			case lw.kick <- struct{}{}:
			default:
			}
		}
		if ackErr != nil {
			return ackErr
		}
	}
}

// splitRecords decodes (and checks) a body of concatenated records; the
// payloads and the encodings alias it.
func splitRecords(b []byte) ([]msglog.Record, [][]byte, error) {
	out := make([]msglog.Record, 0, 4)
	encs := make([][]byte, 0, 4)
	for len(b) > 0 {
		r, n, err := record.Decode(b)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, r)
		encs = append(encs, b[:n:n])
		b = b[n:]
	}
	return out, encs, nil
}

// logWriteDelay: with --log-stable memory, stable does not wait for the
// protector's store, so its writer takes the frames of a node every
// logWriteDelay (or once logWriteKick frames or logWriteBytes wait), not
// as each comes: it writes them and fsyncs (--store-sync always) once for
// all. Per frame, a ping-pong cost a wake-up of the writer, its store
// write and an fsync (a virtio kick and ext4 writeback: ~35% of both
// cores in the 8 B round trip, measured with perf), all competing for the
// CPU with the process that waits for the ack. The node keeps every batch
// until it is stored, so the delay costs memory, never stability.
//
// It was 5 ms with a kick at replQueue/4 frames: under Jacobi (4 netns
// nodes, a hold per rank every ~0.5-2 ms) each protector's writer still
// woke ~110 times a second and fsynced as often (450 fsyncs/s over 4
// radicds), the store write and fsync a fifth of radicd's CPU (perf).
// 50 ms and replQueue/2 frames: ~20 passes a second per protected node.
// The cost is the time a batch waits for "stored" (the node holds its
// body that much longer, and a replay's settle waits up to that long).
const (
	logWriteDelay = 50 * time.Millisecond
	logWriteKick  = replQueue / 2
	logWriteBytes = 4 << 20
)

// routineLogWriter stores one protected node's batches, fsyncs per
// --store-sync (once for all the batches taken together), and acks them
// as stored.
func (d *Daemon) routineLogWriter(w *logWriter) {
	log := d.log.With("protected_node", w.id)
	log.Info("RoutineLogWriter starting")
	defer log.Info("RoutineLogWriter stopped")
	ctx := d.logs.ctx
	lazy := d.cfg.LogStable == StableMemory
	window := time.NewTimer(time.Hour)
	window.Stop()
	var batch []*replFrame
	for {
		var f *replFrame
		select {
		case f = <-w.q:
		case <-ctx.Done():
			return
		}
		batch = append(batch[:0], f)
		if lazy {
			// Let the frames of the next logWriteDelay queue up; the
			// reader kicks when many wait.
			window.Reset(logWriteDelay)
			select {
			case <-window.C:
			case <-w.kick:
				window.Stop()
			case <-ctx.Done():
				return
			}
		}
	more:
		for len(batch) < 4*replQueue {
			select {
			case f = <-w.q:
				batch = append(batch, f)
			default:
				break more
			}
		}
		for _, f := range batch {
			d.storeFrame(ctx, log, w, f)
			w.qbytes.Add(-int64(f.size))
		}
		w.storedMore(uint64(len(batch)))
		if d.cfg.StoreSync == msglog.SyncAlways {
			for {
				err := w.st.Sync()
				if err == nil {
					break
				}
				msg := "store: " + err.Error()
				batch[len(batch)-1].c.err.Store(&msg)
				log.Error("cannot fsync the store: stored acks wait", "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
			}
		}
		// Tell each connection how far it is stored.
		var last *replConn
		for _, f := range batch {
			f.c.stored.Store(f.seq)
			if last != nil && last != f.c {
				last.sendAck()
			}
			last = f.c
		}
		last.sendAck()
		clear(batch)
	}
}

// storeFrame writes a frame's records, retrying while the store is full
// (the protector holds them in memory meanwhile and says why in its acks).
func (d *Daemon) storeFrame(ctx context.Context, log *slog.Logger, w *logWriter, f *replFrame) {
	backoff := 50 * time.Millisecond
	recs, encs := f.recs, f.encs
	for len(recs) > 0 {
		n, err := w.st.Write(recs, encs)
		recs, encs = recs[n:], encs[n:]
		if err == nil {
			if f.c.err.Load() != nil {
				f.c.err.Store(nil)
			}
			return
		}
		msg := "store: " + err.Error()
		if errors.Is(err, msglog.ErrFull) {
			msg = "store full (507): " + err.Error()
		}
		f.c.err.Store(&msg)
		f.c.sendAck()
		if !errors.Is(err, msglog.ErrFull) {
			// Conflict, gap, invalid: retrying cannot help. Loud, and the
			// records are skipped (the node sees the reason in the acks).
			log.Error("cannot store a protected node's log records: skipped", "err", err, "records", len(recs))
			recs, encs = recs[1:], encs[1:]
			continue
		}
		log.Warn("protected node's log records wait in memory: the store is full", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}
