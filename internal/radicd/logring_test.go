package radicd

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/radic-project/radic/msglog"
	"github.com/radic-project/radic/msglog/record"
	"github.com/radic-project/radic/observer"
	"github.com/radic-project/radic/observer/logring"
)

// testRing is the producer's side of a ring, written as the shim's C does.
type testRing struct {
	path string
	mem  []byte
	head uint64
	size uint64
}

func newTestRing(t *testing.T, size uint64, owner uint64, pid int) *testRing {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ring")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(logring.HeaderSize + size)); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(logring.HeaderSize+size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	le := binary.LittleEndian
	le.PutUint32(mem[logring.OffVersion:], logring.Version)
	le.PutUint64(mem[logring.OffHeaderSize:], logring.HeaderSize)
	le.PutUint64(mem[logring.OffDataSize:], size)
	le.PutUint64(mem[logring.OffOwner:], owner)
	le.PutUint64(mem[logring.OffPid:], uint64(pid))
	le.PutUint32(mem[logring.OffMagic:], logring.Magic)
	return &testRing{path: path, mem: mem, size: size}
}

func (r *testRing) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[off])) }
func (r *testRing) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem[off])) }

// append writes records (wrapping) and commits them.
func (r *testRing) append(recs ...logring.Record) {
	var b []byte
	for i := range recs {
		b = logring.Append(b, &recs[i])
	}
	for i, c := range b {
		r.mem[logring.HeaderSize+int((r.head+uint64(i))&(r.size-1))] = c
	}
	r.head += uint64(len(b))
	atomic.StoreUint64(r.u64(logring.OffHead), r.head)
}

// hold is the shim's wait for the log: count itself waiting, ring, sleep
// on stable_seq until stable covers head.
func (r *testRing) hold(t *testing.T, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		seq := atomic.LoadUint32(r.u32(logring.OffStableSeq))
		if atomic.LoadUint64(r.u64(logring.OffStable)) >= r.head {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		atomic.AddUint32(r.u32(logring.OffProducerWaiting), 1)
		atomic.AddUint32(r.u32(logring.OffDoorbell), 1)
		if atomic.LoadUint32(r.u32(logring.OffConsumerWaiting)) != 0 {
			futex(r.u32(logring.OffDoorbell), futexWake, 1, nil)
		}
		if atomic.LoadUint64(r.u64(logring.OffStable)) < r.head {
			ts := unix.NsecToTimespec(int64(50 * time.Millisecond))
			futex(r.u32(logring.OffStableSeq), futexWait, seq, &ts)
		}
		atomic.AddUint32(r.u32(logring.OffProducerWaiting), ^uint32(0))
	}
}

func (r *testRing) lastError() string {
	b := r.mem[logring.OffLastError : logring.OffLastError+logring.LastErrorLen]
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// TestLogRingDrain runs RoutineLogRing on a ring written as the shim
// writes it: records reach the (fake) protectors as msglog records, the
// stable offset is published only once they are stored (a full protector,
// 507, holds it back and leaves the reason in the header), a waiting
// producer is woken, and the routine ends with its process.
func TestLogRingDrain(t *testing.T) {
	proc := exec.Command("sleep", "60")
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	defer proc.Process.Kill()
	const owner = 7<<32 | 3
	r := newTestRing(t, 64<<10, owner, proc.Process.Pid)

	var mu sync.Mutex
	var stored []msglog.Record
	full := atomic.Bool{}
	full.Store(true)
	lr := &logRings{log: slog.New(slog.NewTextHandler(os.Stderr, nil)), replicate: func(ctx context.Context, body []byte) error {
		if full.Load() {
			return &httpError{507, "protector 2: 507 Insufficient Storage: msglog: store full"}
		}
		recs, err := decodeRecords(body)
		if err != nil {
			return err
		}
		mu.Lock()
		stored = append(stored, recs...)
		mu.Unlock()
		return nil
	}}
	ring, err := mapLogRing(logRegistration{Path: r.path, Owner: owner, Pid: proc.Process.Pid, Lpid: "3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(r.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the ring's name is still there after mapping (%v)", err)
	}
	done := make(chan struct{})
	go func() { lr.routineLogRing(context.Background(), ring); close(done) }()

	// 40 KiB in records of up to 10 KiB: the ring (64 KiB) wraps.
	var want []byte
	for i := range 4 {
		p := make([]byte, 10<<10)
		for j := range p {
			p[j] = byte(i*31 + j)
		}
		r.append(logring.Record{Type: logring.TypeRecvData, Result: int32(len(p)), Conn: 5, Offset: uint64(len(want)), Payload: p})
		want = append(want, p...)
	}
	if r.hold(t, 300*time.Millisecond) {
		t.Fatal("stable moved while the protector refused the records")
	}
	if e := r.lastError(); !strings.Contains(e, "507") {
		t.Errorf("header's last error = %q, want the protector's 507", e)
	}
	full.Store(false)
	if !r.hold(t, 5*time.Second) {
		t.Fatalf("stable = %d, want %d after the protector took the records", atomic.LoadUint64(r.u64(logring.OffStable)), r.head)
	}
	if e := r.lastError(); e != "" {
		t.Errorf("header's last error = %q after success, want none", e)
	}
	for i := range 3 { // wrap around the end
		p := make([]byte, 9<<10)
		for j := range p {
			p[j] = byte(i + j*7)
		}
		r.append(logring.Record{Type: logring.TypeRecvData, Result: int32(len(p)), Conn: 5, Offset: uint64(len(want)), Payload: p})
		want = append(want, p...)
		if !r.hold(t, 5*time.Second) {
			t.Fatal("a hold was not released")
		}
	}
	r.append(logring.Record{Type: logring.TypeRecv, Result: 0, Conn: 5, Offset: uint64(len(want))})
	if !r.hold(t, 5*time.Second) {
		t.Fatal("a hold was not released")
	}
	proc.Process.Signal(syscall.SIGKILL)
	proc.Wait()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("RoutineLogRing did not end after its process")
	}

	var data []byte
	var dets []observer.Determinant
	mu.Lock()
	defer mu.Unlock()
	for _, rec := range stored {
		if rec.Owner != owner {
			t.Errorf("record of owner %d, want %d", rec.Owner, owner)
		}
		switch rec.Kind {
		case record.KindData:
			if rec.Offset != uint64(len(data)) {
				t.Fatalf("data record at %d, want %d", rec.Offset, len(data))
			}
			data = append(data, rec.Payload...)
		case record.KindDeterminant:
			for p := rec.Payload; len(p) > 0; {
				d, n, err := observer.DecodeDeterminant(p)
				if err != nil {
					t.Fatal(err)
				}
				dets = append(dets, d)
				p = p[n:]
			}
		}
	}
	if string(data) != string(want) {
		t.Errorf("stored %d bytes, want %d (or they differ)", len(data), len(want))
	}
	if len(dets) != 8 || dets[7].N != 0 || dets[0].N != 10<<10 {
		t.Errorf("determinants %v, want 7 receives and the end of stream", dets)
	}
}

// hungShipment is a batch sent to a protector that vanished without a
// word: in flight until the replicator gives it up (fail).
type hungShipment struct {
	h      shipHooks
	failed atomic.Bool
}

func (s *hungShipment) fail() {
	if !s.failed.Swap(true) {
		s.h.onFail()
	}
}

func (s *hungShipment) poll() error {
	if s.failed.Load() {
		return errors.New("node 2 no longer protects this node")
	}
	return errInFlight
}

func (s *hungShipment) wait(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }

// TestLogRingProtectorReplaced: a batch in flight to a protector that died
// silently (no error, no ack) while the process holds a send is sent again
// once the ring names a new protector, with no other batch to make
// anyone ask the ring (a job in lockstep waits for exactly this one).
func TestLogRingProtectorReplaced(t *testing.T) {
	proc := exec.Command("sleep", "60")
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { proc.Process.Kill(); proc.Wait() }()
	const owner = 7<<32 | 4
	r := newTestRing(t, 64<<10, owner, proc.Process.Pid)

	var mu sync.Mutex
	var hung []*hungShipment
	replaced := atomic.Bool{}
	lr := &logRings{log: slog.New(slog.NewTextHandler(os.Stderr, nil)),
		submit: func(ctx context.Context, body []byte, h shipHooks) shipment {
			if replaced.Load() { // the new protector: stable at once
				h.onStable()
				h.onStored()
				return failedShipment{nil}
			}
			s := &hungShipment{h: h}
			mu.Lock()
			hung = append(hung, s)
			mu.Unlock()
			return s
		},
		refresh: func(context.Context) {
			// The ring has replaced the protector by now: the streams to
			// it close, failing what they held.
			if replaced.Swap(true) {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, s := range hung {
				s.fail()
			}
		}}
	ring, err := mapLogRing(logRegistration{Path: r.path, Owner: owner, Pid: proc.Process.Pid, Lpid: "4"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { lr.routineLogRing(ctx, ring); close(done) }()
	defer func() { cancel(); <-done }()

	r.append(logring.Record{Type: logring.TypeRecvData, Result: 3, Conn: 5, Payload: []byte("abc")})
	if !r.hold(t, 5*time.Second) {
		t.Fatalf("stable = %d, want %d: the batch waits on the vanished protector (refreshed: %v)",
			atomic.LoadUint64(r.u64(logring.OffStable)), r.head, replaced.Load())
	}
}
