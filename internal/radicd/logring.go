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

	"github.com/radic-project/radic/msglog"
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
	submit    func(ctx context.Context, body []byte, onStable func()) shipment
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
	stuck   atomic.Int64 // rings whose last shipment failed
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

	pmu sync.Mutex
	// +checklocks:pmu
	stable uint64 // published
	// +checklocks:pmu
	pend []pendPub // shipped, not yet published, in order
}

// pendPub is a shipped batch waiting for its turn to be published.
type pendPub struct {
	idx  uint64
	head uint64
	done bool
}

// addPending registers batch idx (ending at head) before it is shipped.
func (r *logRing) addPending(idx, head uint64) {
	r.pmu.Lock()
	r.pend = append(r.pend, pendPub{idx: idx, head: head})
	r.pmu.Unlock()
}

// markStable notes batch idx stable and publishes every batch stable in
// order from the oldest: whoever learns it first (the goroutine that read
// the last protector's ack, or the acks routine) moves the process on.
func (r *logRing) markStable(idx uint64) {
	r.pmu.Lock()
	defer r.pmu.Unlock()
	if len(r.pend) == 0 || idx < r.pend[0].idx {
		return // published already
	}
	r.pend[idx-r.pend[0].idx].done = true
	var head uint64
	n := 0
	for n < len(r.pend) && r.pend[n].done {
		head = r.pend[n].head
		n++
	}
	if n > 0 {
		r.pend = r.pend[n:]
		r.publishLocked(head)
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
	r := &logRing{reg: reg, mem: mem, pidfd: -1}
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
func (r *logRing) sleep() {
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
}

// routineLogRing drains one process's ring until the process has exited
// and everything it appended is stable. It ships batch after batch
// without waiting for the protectors (up to logInflight); its acks
// routine waits for each in order and publishes the stable offset.
func (lr *logRings) routineLogRing(ctx context.Context, r *logRing) {
	log := lr.log.With("lpid", r.reg.Lpid, "pid", r.reg.Pid, "job", r.reg.Job)
	log.Info("RoutineLogRing starting", "ring_bytes", r.size)
	q := make(chan inflight, logInflight)
	free := make(chan []byte, logInflight+1)
	acksDone := make(chan struct{})
	go func() {
		defer close(acksDone)
		lr.routineLogAcks(ctx, r, log, q, free)
	}()
	defer func() {
		close(q)
		<-acksDone
		r.close()
		r.pmu.Lock()
		stable := r.stable
		r.pmu.Unlock()
		log.Info("RoutineLogRing stopped", "stable", stable)
	}()
	var buf []byte
	var recs []msglog.Record
	var nextIdx uint64
	idle := false // woken (by the doorbell or the timeout) since the last drain
	for ctx.Err() == nil {
		head := atomic.LoadUint64(r.u64(logring.OffHead))
		if head == r.sent && r.exited() {
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
			r.sleep()
			idle = true
			continue
		}
		idle = false
		if head < r.sent || head-r.sent > r.size {
			log.Error("the log ring's head is out of range: its process's sends wait for ever", "head", head, "sent", r.sent)
			r.setError("radicd: the ring's head is out of range")
			return
		}
		head = r.boundary(head, logBatch)
		rrecs, err := logring.DecodeAll(r.take(head, &buf))
		if err == nil {
			recs, err = r.conv.Convert(recs[:0], rrecs)
		}
		if err != nil {
			log.Error("the log ring holds records that cannot be logged: the process's sends wait for ever", "err", err)
			r.setError("radicd: " + err.Error())
			return
		}
		// The body goes to the protectors' streams, which keep it until
		// stored: a buffer of its own (recycled by the acks routine).
		var body []byte
		select {
		case body = <-free:
		default:
		}
		body = body[:0]
		var payload uint64
		for i := range recs {
			body = record.AppendRecord(body, &recs[i])
			payload += uint64(len(recs[i].Payload))
		}
		idx := nextIdx
		nextIdx++
		r.addPending(idx, head)
		it := inflight{idx: idx, head: head, body: body, sh: lr.ship(ctx, r, idx, body), payload: payload, recs: len(rrecs)}
		select {
		case q <- it:
		case <-acksDone:
			return
		case <-ctx.Done():
			return
		}
		r.sent = head
	}
}

// ship starts a batch on its way to the protectors.
func (lr *logRings) ship(ctx context.Context, r *logRing, idx uint64, body []byte) shipment {
	if lr.submit != nil {
		return lr.submit(ctx, body, func() { r.markStable(idx) })
	}
	return syncShipment{lr.replicate, body}
}

// syncShipment ships through a blocking replicate (tests).
type syncShipment struct {
	replicate func(ctx context.Context, body []byte) error
	body      []byte
}

func (s syncShipment) wait(ctx context.Context) error { return s.replicate(ctx, s.body) }

// routineLogAcks waits for the ring's shipments in order, publishes each
// one's stable offset, and sends again those that fail, until they are
// stable (or the daemon stops). While one is not, the process's sends
// wait: the reason is logged (once per reason, and every 10 s) and left in
// the ring's header for the process's own log.
func (lr *logRings) routineLogAcks(ctx context.Context, r *logRing, log *slog.Logger, q <-chan inflight, free chan<- []byte) {
	for it := range q {
		backoff := 20 * time.Millisecond
		var lastMsg string
		var lastAt time.Time
		failed := false
		for {
			err := it.sh.wait(ctx)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			msg := err.Error()
			var he *httpError
			if errors.As(err, &he) && he.code == http.StatusInsufficientStorage {
				msg = "a protector's store is full (507): " + msg
			}
			if !failed {
				failed = true
				lr.stuck.Add(1)
			}
			if msg != lastMsg || time.Since(lastAt) > 10*time.Second {
				log.Warn("cannot log received bytes on the protectors: the process's sends wait (nothing unlogged is acknowledged)", "err", msg, "bytes", len(it.body))
				lastMsg, lastAt = msg, time.Now()
				r.setError(msg)
			}
			var still *stillTrying
			if errors.As(err, &still) {
				// The shipment goes on, unless its protector was replaced
				// (declared dead, a spare promoted): nothing else asks the
				// ring again while the process waits for this batch.
				if lr.refresh != nil {
					lr.refresh(ctx)
				}
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
			it.sh = lr.ship(ctx, r, it.idx, it.body)
		}
		if failed {
			lr.stuck.Add(-1)
			r.setError("")
			log.Info("received bytes are logged again", "bytes", len(it.body))
		}
		lr.bytes.Add(it.payload)
		lr.records.Add(uint64(it.recs))
		r.markStable(it.idx)
		select {
		case free <- it.body[:0]:
		default:
		}
	}
}
