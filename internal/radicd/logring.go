package radicd

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/radic-project/radic/msglog/record"
	"github.com/radic-project/radic/observer/logring"
)

// The pessimistic log, radicd's half: a managed process with recovery on
// hands its log ring (observer/logring) to its node's radicd with POST
// /v1/logring; RoutineLogRing drains it, ships the records to the node's
// protectors (the replication path of POST /v1/log: stored once all k
// have them), then publishes the stable offset in the ring's header and
// wakes the process's threads waiting on it.
//
// Why a path under /dev/shm registered over HTTP, not an fd passed over a
// unix socket: the shim already speaks HTTP to radicd (RADIC_DAEMON, which
// in netns mode is reachable only inside the node's namespace, as the
// process is), so no second listener, socket file or permission scheme is
// needed; the file is O_EXCL, mode 0600, and unlinked as soon as radicd has
// mapped it, so it lives for a few milliseconds and nothing leaks if either
// side dies.

type logRings struct {
	ctx context.Context
	wg  sync.WaitGroup
	log *slog.Logger
	// submit ships encoded records to every protector (the daemon's
	// replication streams, repl.go); when nil, replicate stores them,
	// blocking (a fake in tests).
	submit    func(ctx context.Context, body []byte, h shipHooks) shipment
	replicate func(ctx context.Context, body []byte) error
	// refresh re-reads the protector set (closing the streams to nodes
	// that no longer protect this one, which fails their shipments so
	// they go to the new set); nil in tests.
	refresh func(ctx context.Context)

	omu sync.Mutex
	// +checklocks:omu
	byOwner map[uint64]chan struct{} // closed when the owner's ring routine ends

	bytes   atomic.Uint64
	records atomic.Uint64
	active  atomic.Int64
	stuck   atomic.Int64 // rings whose shipments fail
}

// logRing is one process's mapped ring.
type logRing struct {
	reg   logRegistration
	mem   []byte
	data  []byte
	size  uint64
	pidfd int
	conv  *logring.Converter
	sent  uint64 // shipped (the drain's)

	lr *logRings

	// retry wakes routineLogRetry: a shipment failed, or the first batch
	// after it went idle (retryIdle) was shipped. room: a batch was
	// published (the drain may wait for room among logInflight).
	retry     chan struct{}
	retryIdle atomic.Bool
	room      chan struct{}
	free      chan []byte // bodies stored by every protector, for reuse
	failing   atomic.Bool // the header holds a shipment's failure

	pmu sync.Mutex
	// +checklocks:pmu
	stable uint64 // published
	// +checklocks:pmu
	pend []*inflight // shipped, not yet published, in order
}

// addPending registers a batch before it is shipped.
func (r *logRing) addPending(it *inflight) {
	r.pmu.Lock()
	r.pend = append(r.pend, it)
	r.pmu.Unlock()
}

// pending is how many batches are shipped and not yet published.
func (r *logRing) pending() int {
	r.pmu.Lock()
	defer r.pmu.Unlock()
	return len(r.pend)
}

// markStable notes batch idx stable and publishes every batch stable in
// order from the oldest: whoever learns it first (the goroutine that read
// the last protector's ack) moves the process on, with no other goroutine
// woken on the way.
func (r *logRing) markStable(idx uint64) {
	r.pmu.Lock()
	if len(r.pend) == 0 || idx < r.pend[0].idx || idx-r.pend[0].idx >= uint64(len(r.pend)) {
		r.pmu.Unlock()
		return // published already
	}
	r.pend[idx-r.pend[0].idx].done = true
	var head, payload uint64
	recs := 0
	n := 0
	for n < len(r.pend) && r.pend[n].done {
		head = r.pend[n].head
		payload += r.pend[n].payload
		recs += r.pend[n].recs
		r.pend[n] = nil
		n++
	}
	if n > 0 {
		r.pend = r.pend[n:]
		if r.failing.Load() {
			r.failing.Store(false)
			r.setError("")
			r.lr.stuck.Add(-1)
			r.lr.log.Info("received bytes are logged again", "lpid", r.reg.Lpid, "pid", r.reg.Pid)
		}
		r.publishLocked(head)
	}
	r.pmu.Unlock()
	if n > 0 {
		r.lr.bytes.Add(payload)
		r.lr.records.Add(uint64(recs))
		select {
		case r.room <- struct{}{}:
		default:
		}
	}
}

// logRegistration is POST /v1/logring's body (shim/logring.go).
type logRegistration struct {
	Path  string `json:"path"`
	Job   string `json:"job"`
	Lpid  string `json:"lpid"`
	Owner uint64 `json:"owner"`
	Pid   int    `json:"pid"`
}

func (r *logRing) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[off])) }
func (r *logRing) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem[off])) }

// handleLogRing maps a process's ring and starts draining it.
func (d *Daemon) handleLogRing(w http.ResponseWriter, req *http.Request) {
	var reg logRegistration
	if err := json.NewDecoder(http.MaxBytesReader(w, req.Body, 4096)).Decode(&reg); err != nil {
		http.Error(w, "log ring registration: "+err.Error(), http.StatusBadRequest)
		return
	}
	r, err := mapLogRing(reg)
	if err != nil {
		d.log.Error("cannot take a process's log ring: the process will stop", "lpid", reg.Lpid, "pid", reg.Pid, "path", reg.Path, "err", err)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	lr := d.logs
	if lr.ctx == nil || lr.ctx.Err() != nil {
		r.close()
		http.Error(w, "radicd is not running its log", http.StatusServiceUnavailable)
		return
	}
	if d.rec != nil {
		// A restarted process's determinants continue its earlier run's.
		r.conv = logring.NewConverter(reg.Owner, d.rec.replays.detOffset(reg.Owner))
	}
	lr.active.Add(1)
	done := lr.ownerStarted(reg.Owner)
	lr.wg.Go(func() {
		defer lr.active.Add(-1)
		defer close(done)
		lr.routineLogRing(lr.ctx, r)
	})
	w.WriteHeader(http.StatusNoContent)
}

// ownerStarted notes a ring routine for owner; the channel is closed when
// it ends.
func (lr *logRings) ownerStarted(owner uint64) chan struct{} {
	ch := make(chan struct{})
	lr.omu.Lock()
	if lr.byOwner == nil {
		lr.byOwner = map[uint64]chan struct{}{}
	}
	lr.byOwner[owner] = ch
	lr.omu.Unlock()
	return ch
}

// waitOwner waits (up to max) until the last ring routine of owner has
// shipped everything its process appended and stopped.
func (lr *logRings) waitOwner(owner uint64, max time.Duration) {
	lr.omu.Lock()
	ch := lr.byOwner[owner]
	lr.omu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-time.After(max):
		lr.log.Warn("the log ring of a dead process is still shipping; replaying what is stored", "owner", fmt.Sprintf("%x", owner))
	}
}

// mapLogRing opens, checks and maps a ring, and removes its name.
func mapLogRing(reg logRegistration) (*logRing, error) {
	fail := func(format string, args ...any) (*logRing, error) {
		return nil, fmt.Errorf("log ring %s: "+format, append([]any{reg.Path}, args...)...)
	}
	f, err := os.OpenFile(reg.Path, os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fail("%v", err)
	}
	defer f.Close()
	os.Remove(reg.Path) // mapped or refused, the name has done its work
	st, err := f.Stat()
	if err != nil {
		return fail("%v", err)
	}
	total := st.Size()
	if total < logring.HeaderSize+logring.MinDataSize || total > logring.HeaderSize+logring.MaxDataSize {
		return fail("size %d is not a header and a ring of %d to %d bytes", total, logring.MinDataSize, logring.MaxDataSize)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(total), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("cannot map it: %v", err)
	}
	r := &logRing{reg: reg, mem: mem, pidfd: -1, retry: make(chan struct{}, 1), room: make(chan struct{}, 1), free: make(chan []byte, logFree)}
	hdr := func(off int) uint64 { return atomic.LoadUint64(r.u64(off)) }
	size := hdr(logring.OffDataSize)
	switch {
	case atomic.LoadUint32(r.u32(logring.OffMagic)) != logring.Magic:
		err = errors.New("bad magic (not a radic log ring)")
	case atomic.LoadUint32(r.u32(logring.OffVersion)) != logring.Version:
		err = fmt.Errorf("version %d, this radicd reads %d", atomic.LoadUint32(r.u32(logring.OffVersion)), logring.Version)
	case hdr(logring.OffHeaderSize) != logring.HeaderSize:
		err = fmt.Errorf("header size %d, want %d", hdr(logring.OffHeaderSize), logring.HeaderSize)
	case size&(size-1) != 0 || logring.HeaderSize+size != uint64(total):
		err = fmt.Errorf("data size %d does not fit the file's %d bytes", size, total)
	case hdr(logring.OffOwner) != reg.Owner:
		err = fmt.Errorf("owner %d, the registration says %d", hdr(logring.OffOwner), reg.Owner)
	case hdr(logring.OffStable) != 0 || hdr(logring.OffHead) > size:
		err = errors.New("already in use")
	}
	if err == nil {
		r.pidfd, err = unix.PidfdOpen(reg.Pid, 0)
		if err != nil {
			err = fmt.Errorf("process %d: %v", reg.Pid, err)
		}
	}
	if err != nil {
		unix.Munmap(mem)
		return fail("%v", err)
	}
	r.size = size
	r.data = mem[logring.HeaderSize:]
	r.conv = logring.NewConverter(reg.Owner, 0)
	return r, nil
}

func (r *logRing) close() {
	if r.pidfd >= 0 {
		unix.Close(r.pidfd)
	}
	unix.Munmap(r.mem)
}

func (r *logRing) exited() bool {
	p := []unix.PollFd{{Fd: int32(r.pidfd), Events: unix.POLLIN}}
	n, _ := unix.Poll(p, 0)
	return n > 0
}

func futex(addr *uint32, op int, val uint32, ts *unix.Timespec) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), uintptr(op), uintptr(val), uintptr(unsafe.Pointer(ts)), 0, 0)
}

const (
	futexWait = 0 // FUTEX_WAIT: shared, the ring is in two processes
	futexWake = 1
	// logIdle bounds a sleep on the doorbell: how soon an exited process
	// is noticed.
	logIdle = 200 * time.Millisecond
)

// sleep waits for the doorbell (or logIdle): radicd drains a ring only
// when its process is about to wait for the log (a send, a close, an
// acknowledgement, a full ring), or at the latest every logIdle.
//
// It returns true if the doorbell rang (or was ringing), false after a
// timeout.
func (r *logRing) sleep() bool {
	bell := r.u32(logring.OffDoorbell)
	waiting := r.u32(logring.OffConsumerWaiting)
	seen := atomic.LoadUint32(bell)
	atomic.StoreUint32(waiting, 1)
	// The shim counts itself in producer_waiting before it rings: a ring
	// before our load of the bell shows here; one after it changes the
	// bell (the futex returns at once) or sees waiting and wakes us.
	if atomic.LoadUint32(r.u32(logring.OffProducerWaiting)) == 0 ||
		atomic.LoadUint64(r.u64(logring.OffHead)) == r.sent {
		ts := unix.NsecToTimespec(int64(logIdle))
		futex(bell, futexWait, seen, &ts)
	}
	atomic.StoreUint32(waiting, 0)
	return atomic.LoadUint32(bell) != seen
}

// publishLocked stores the stable offset and wakes the process's waiters.
func (r *logRing) publishLocked(stable uint64) {
	r.stable = stable
	atomic.StoreUint64(r.u64(logring.OffStable), stable)
	atomic.AddUint32(r.u32(logring.OffStableSeq), 1)
	if atomic.LoadUint32(r.u32(logring.OffProducerWaiting)) > 0 {
		futex(r.u32(logring.OffStableSeq), futexWake, 1<<31-1, nil)
	}
}

func (r *logRing) setError(msg string) {
	b := r.mem[logring.OffLastError : logring.OffLastError+logring.LastErrorLen]
	n := copy(b[:len(b)-1], msg)
	clear(b[n:])
}

// logBatch bounds one shipment: the process's stable offset moves (and a
// full ring frees) in steps of this size while a large backlog ships.
const logBatch = 1 << 20

// logBacklog: an awake radicd ships again at once when this much waits.
const logBacklog = 256 << 10

// boundary is the end of the last record that starts before
// r.sent+limit (at least one record), or head.
func (r *logRing) boundary(head, limit uint64) uint64 {
	if head-r.sent <= limit {
		return head
	}
	x := r.sent
	for x < head {
		var l [4]byte
		for i := range l {
			l[i] = r.data[(x+uint64(i))&(r.size-1)]
		}
		n := uint64(logring.Stride(int(binary.LittleEndian.Uint32(l[:])) - logring.RecHeaderLen))
		if n == 0 || n > r.size || x+n > head {
			return head // let the decoder name what is wrong
		}
		if x+n-r.sent > limit && x > r.sent {
			return x
		}
		x += n
	}
	return x
}

// take returns [r.sent, head) unwrapped: the ring's own memory when it
// does not wrap (the producer leaves everything past stable alone), else a
// copy in buf.
func (r *logRing) take(head uint64, buf *[]byte) []byte {
	if o := r.sent & (r.size - 1); o+(head-r.sent) <= r.size {
		return r.data[o : o+(head-r.sent)]
	}
	b := (*buf)[:0]
	for x := r.sent; x < head; {
		o := x & (r.size - 1)
		n := min(head-x, r.size-o)
		b = append(b, r.data[o:o+n]...)
		x += n
	}
	*buf = b
	return b
}

// spareProcs gives the Go scheduler more Ps than CPUs (unless GOMAXPROCS
// is set). The log's hold path blocks goroutines in system calls that
// last: each ring's drain sleeps in FUTEX_WAIT on its doorbell, each
// protected node's writer in fsync. Such a goroutine keeps its P until
// sysmon takes it back (20 us to 10 ms later, sysmon sleeping longer the
// idler the process); with GOMAXPROCS = 2 (this 2-core host) a drain and
// a writer asleep leave no P to run the netpoller's goroutines (the acks),
// and a hold waits for sysmon. Measured: 8 B round trip 410-420 us with 2
// Ps, 275-318 us with 8.
func spareProcs() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(runtime.NumCPU() + 6)
	}
}

// drainYield: how often a ring's drain passes through the scheduler.
//
// The drain never blocks in Go: it sleeps in FUTEX_WAIT (a system call)
// and, woken, keeps its P and goes on, hold after hold, without a
// reschedule. To the runtime's sysmon it is then one goroutine running on
// the same schedule tick for ever: every time sysmon looks (10 ms after
// it last saw the tick move) it "preempts" it by taking its P away in the
// system call (runtime.retake), hands the P to another thread, and, since
// it took a P, drops its own polling period back to 20 us. Measured on
// Jacobi under --recovery (4 netns nodes, uprobes on runtime.retake):
// 229 retakes/s over the 4 radicds, sysmon woken ~9,500 times/s, a third
// of radicd's context switches, and each woken drain found its P gone
// (exitsyscall's slow path: another thread woken to run it). A yield at
// most every drainYield (under sysmon's 10 ms) moves the tick, at the
// cost of one scheduler pass per drainYield, not per hold: 8-35
// retakes/s, sysmon ~1,500 wake-ups/s. A yield is not free (Gosched
// wakes a spinning thread: ~2.5 futex calls); 5 ms gave the same retakes
// for more yields (600-650/s over 4 rings, against 430/s at 8 ms).
const drainYield = 8 * time.Millisecond

// logInflight bounds the batches of one ring shipped and not yet stable:
// the drain ships the next while earlier ones are on their way.
const logInflight = 8

// inflight is a batch shipped, waiting to be stable.
type inflight struct {
	idx     uint64 // the ring's batch number
	head    uint64 // the ring's stable offset once it is
	body    []byte
	sh      shipment
	payload uint64
	recs    int
	done    bool // stable (under the ring's pmu)
}

// routineLogRing drains one process's ring until the process has exited
// and everything it appended is stable. It ships batch after batch
// without waiting for the protectors (up to logInflight); the goroutine
// that reads a batch's last ack publishes the stable offset
// (markStable), and routineLogRetry, woken only when a shipment fails or
// after idleness, sends again what failed and says why.
//
// Nothing but the drain and that ack reader runs per batch: a hand-off to
// a goroutine per batch (the shipment's waiter) cost two goroutine
// wake-ups per hold, each waking an OS thread on this 2-core host.
func (lr *logRings) routineLogRing(ctx context.Context, r *logRing) {
	log := lr.log.With("lpid", r.reg.Lpid, "pid", r.reg.Pid, "job", r.reg.Job)
	log.Info("RoutineLogRing starting", "ring_bytes", r.size)
	r.lr = lr
	stopRetry := make(chan struct{})
	retryDone := make(chan struct{})
	r.retryIdle.Store(true) // nothing pending yet: the first batch wakes it
	go func() {
		defer close(retryDone)
		lr.routineLogRetry(ctx, r, log, stopRetry)
	}()
	defer func() {
		// Everything shipped is stable before the ring goes (or the
		// daemon stops).
		for r.pending() > 0 && ctx.Err() == nil {
			select {
			case <-r.room:
			case <-ctx.Done():
			case <-time.After(logIdle):
			}
		}
		close(stopRetry)
		<-retryDone
		r.close()
		r.pmu.Lock()
		stable := r.stable
		r.pmu.Unlock()
		log.Info("RoutineLogRing stopped", "stable", stable)
	}()
	var buf []byte
	var nextIdx uint64
	idle := false     // woken (by the doorbell or the timeout) since the last drain
	checkExit := true // a sleep timed out: is the process gone? (a system call, not paid per hold)
	lastYield := time.Now()
	for ctx.Err() == nil {
		if now := time.Now(); now.Sub(lastYield) >= drainYield {
			// See drainYield.
			runtime.Gosched()
			lastYield = now
		}
		head := atomic.LoadUint64(r.u64(logring.OffHead))
		if head == r.sent && checkExit && r.exited() {
			if atomic.LoadUint64(r.u64(logring.OffHead)) == r.sent {
				return
			}
			continue
		}
		if head == r.sent || (!idle && head-r.sent < logBacklog && atomic.LoadUint32(r.u32(logring.OffProducerWaiting)) == 0) {
			// Nothing to do, or little and nobody waits for it yet:
			// batch more. A backlog of logBacklog keeps an awake radicd
			// shipping (the process pays nothing for it), so that a
			// stream whose receiver rarely waits is not logged in fits
			// and starts, each ending when the waiter is satisfied.
			checkExit = !r.sleep()
			idle = true
			continue
		}
		idle = false
		if head < r.sent || head-r.sent > r.size {
			log.Error("the log ring's head is out of range: its process's sends wait for ever", "head", head, "sent", r.sent)
			r.setError("radicd: the ring's head is out of range")
			return
		}
		for r.pending() >= logInflight {
			select {
			case <-r.room:
			case <-ctx.Done():
				return
			}
		}
		head = r.boundary(head, logBatch)
		rrecs, err := logring.DecodeAll(r.take(head, &buf))
		// The body goes to the protectors' streams, which keep it until
		// every protector has stored it (after it is stable, with
		// --log-stable memory): a buffer of its own, reused once stored
		// (a fresh 1 MiB per batch cost its zeroing and page faults).
		// The records are encoded into it straight from the ring.
		size := record.HeaderLen
		for i := range rrecs {
			size += record.HeaderLen + len(rrecs[i].Payload)
		}
		var body []byte
		select {
		case body = <-r.free:
		default:
		}
		if cap(body) < size {
			body = make([]byte, 0, bodyCap(size))
		}
		var payload uint64
		if err == nil {
			body, _, payload, err = r.conv.AppendEncoded(body[:0], rrecs)
		}
		if err != nil {
			log.Error("the log ring holds records that cannot be logged: the process's sends wait for ever", "err", err)
			r.setError("radicd: " + err.Error())
			return
		}
		it := &inflight{idx: nextIdx, head: head, body: body, payload: payload, recs: len(rrecs)}
		nextIdx++
		r.addPending(it)
		sh := lr.ship(ctx, r, it.idx, body)
		r.pmu.Lock()
		it.sh = sh
		r.pmu.Unlock()
		// A shipment that failed at once kicked the retry routine before
		// it.sh was set: kick it again, now that it can see it.
		if err := sh.poll(); (err != nil && !errors.Is(err, errInFlight)) || r.retryIdle.CompareAndSwap(true, false) {
			r.kickRetry()
		}
		r.sent = head
	}
}

// Batch bodies: how many stored ones a ring keeps for reuse, and the
// size under which one is a small allocation.
//
// A body is reused only once every protector has stored it, which with
// --log-stable memory is up to logWriteDelay after it was stable: a ring
// that holds every few hundred microseconds (Jacobi's halo exchange) has
// tens of bodies waiting for their store at any time. With 16 kept and
// each new body 64 KiB (a large allocation: zeroed, fresh pages, page
// faults), allocating them was 7% of radicd's CPU under Jacobi (perf). A
// small batch now gets a small body (Go's size classes, from its caches),
// and up to logFree are kept, of which at most 2*logInflight large.
const (
	logFree      = 64
	logBodySmall = 16 << 10
)

// bodyCap is the capacity of a new body for size bytes.
func bodyCap(size int) int {
	if size <= logBodySmall {
		return logBodySmall
	}
	return max(size, 64<<10)
}

// recycle takes back a body every protector has stored.
func (r *logRing) recycle(body []byte) {
	if cap(body) > logBodySmall && len(r.free) >= 2*logInflight {
		return // a few large ones are enough
	}
	select {
	case r.free <- body[:0]:
	default:
	}
}

func (r *logRing) kickRetry() {
	select {
	case r.retry <- struct{}{}:
	default:
	}
}

// ship starts a batch on its way to the protectors.
func (lr *logRings) ship(ctx context.Context, r *logRing, idx uint64, body []byte) shipment {
	if lr.submit != nil {
		return lr.submit(ctx, body, shipHooks{
			onStable: func() { r.markStable(idx) },
			onFail:   r.kickRetry,
			onStored: func() { r.recycle(body) },
		})
	}
	s := &syncShipment{done: make(chan struct{})}
	go func() {
		err := lr.replicate(ctx, body)
		s.err = err
		close(s.done)
		if err == nil {
			r.markStable(idx)
		} else {
			r.kickRetry()
		}
	}()
	return s
}

// syncShipment ships through a blocking replicate (tests).
type syncShipment struct {
	done chan struct{}
	err  error
}

func (s *syncShipment) wait(ctx context.Context) error {
	select {
	case <-s.done:
		return s.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *syncShipment) poll() error {
	select {
	case <-s.done:
		return s.err
	default:
		return errInFlight
	}
}

// pendingCheck: how often routineLogRetry looks at batches that are not
// stable yet (and asks the ring whether their protectors still are).
const pendingCheck = 200 * time.Millisecond

// routineLogRetry looks after the ring's shipments that are not stable:
// it sends again those that failed (after a backoff, the oldest first)
// and, while one fails or a protector reports a problem, says why (logged
// once per reason and every 10 s, and left in the ring's header for the
// process's own log). It sleeps while nothing is pending: it is woken by
// a failure (the ticket's onFail) or by the first batch shipped after it
// went idle, then looks again every pendingCheck while batches are pending.
func (lr *logRings) routineLogRetry(ctx context.Context, r *logRing, log *slog.Logger, stop <-chan struct{}) {
	backoff := 20 * time.Millisecond
	var retryAt time.Time
	var lastMsg string
	var lastAt time.Time
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-r.retry:
		case <-t.C:
		}
		t.Stop()
		// The shipments not yet stable, oldest first.
		r.pmu.Lock()
		var open []*inflight
		for _, it := range r.pend {
			if !it.done && it.sh != nil {
				open = append(open, it)
			}
		}
		r.pmu.Unlock()
		next := time.Duration(0)
		failedAny := false
		for _, it := range open {
			err := it.sh.poll()
			if err == nil || errors.Is(err, errInFlight) {
				continue
			}
			msg := err.Error()
			var he *httpError
			if errors.As(err, &he) && he.code == http.StatusInsufficientStorage {
				msg = "a protector's store is full (507): " + msg
			}
			if r.failing.CompareAndSwap(false, true) {
				lr.stuck.Add(1)
			}
			if msg != lastMsg || time.Since(lastAt) > 10*time.Second {
				log.Warn("cannot log received bytes on the protectors: the process's sends wait (nothing unlogged is acknowledged)", "err", msg, "bytes", len(it.body))
				lastMsg, lastAt = msg, time.Now()
				r.setError(msg)
			}
			var still *stillTrying
			if errors.As(err, &still) {
				continue // the shipment goes on
			}
			failedAny = true
			if now := time.Now(); now.Before(retryAt) {
				next = retryAt.Sub(now)
				break
			}
			sh := lr.ship(ctx, r, it.idx, it.body)
			r.pmu.Lock()
			it.sh = sh
			r.pmu.Unlock()
		}
		if len(open) > 0 && lr.refresh != nil {
			// A batch waits, perhaps on a protector that was replaced
			// (declared dead: its connection may stay silent, with no
			// error, for as long as replAckTimeout; a spare promoted):
			// ask the ring again, which fails the shipments to nodes
			// that no longer protect this one, to be sent to the new
			// set. Nothing else asks while the process waits for them.
			lr.refresh(ctx)
		}
		if failedAny {
			if next == 0 {
				retryAt = time.Now().Add(backoff)
				backoff = min(2*backoff, 2*time.Second)
				next = time.Until(retryAt)
			}
		} else {
			backoff = 20 * time.Millisecond
			retryAt = time.Time{}
		}
		switch {
		case next > 0:
			t.Reset(next)
		case len(open) > 0:
			t.Reset(pendingCheck)
		default:
			// Idle: the next batch shipped wakes us.
			r.retryIdle.Store(true)
			if r.pending() > 0 && r.retryIdle.CompareAndSwap(true, false) {
				t.Reset(pendingCheck)
			}
		}
	}
}
