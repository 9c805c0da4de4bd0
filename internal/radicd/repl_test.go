package radicd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/msglog"
	"github.com/radic-project/radic/msglog/record"
)

// replPair is a protected node (a replicator) and its one protector (a
// daemon serving POST /v1/replica/stream), over real TCP.
type replPair struct {
	rp   *replicator
	prot *Daemon
	srv  *httptest.Server
}

func newReplPair(t *testing.T, stable LogStable) *replPair {
	return newReplPairOpts(t, stable, msglog.Options{Sync: msglog.SyncAlways})
}

func newReplPairOpts(t *testing.T, stable LogStable, opts msglog.Options) *replPair {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, err := openStores(t.TempDir(), opts, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	prot := &Daemon{cfg: Config{StoreSync: msglog.SyncAlways, LogStable: stable}, log: log, stores: st, logs: &logRings{ctx: ctx}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/replica/stream", prot.handleReplicaStream)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(cancel) // first: the streams end, then the server can close
	ap := netip.MustParseAddrPort(srv.Listener.Addr().String())

	node := &Daemon{self: 1, cfg: Config{Protectors: 1, LogStable: stable}, log: log}
	rp := newReplicator(node)
	rp.ctx = ctx
	rp.lookup = func(context.Context) ([]heartbeat.NodeID, error) { return []heartbeat.NodeID{2}, nil }
	rp.addr = func(heartbeat.NodeID) (netip.AddrPort, bool) { return ap, true }
	return &replPair{rp: rp, prot: prot, srv: srv}
}

func dataBody(owner, off uint64, payload []byte) []byte {
	r := msglog.Record{Kind: record.KindData, Owner: owner, Stream: 5, Offset: off, Payload: payload}
	return record.AppendRecord(nil, &r)
}

// stored reads back node 1's stream (owner, 5) from the protector's store.
func (p *replPair) stored(t *testing.T, owner uint64) []byte {
	t.Helper()
	st := p.prot.stores.lookup(1)
	if st == nil {
		return nil
	}
	var got []byte
	c := st.Read(owner, 5, 0)
	for {
		r, err := c.Next()
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Payload...)
	}
}

func (p *replPair) waitStored(t *testing.T, owner uint64, want []byte) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := p.stored(t, owner)
		if bytes.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("protector's store holds %d bytes (%q...), want %d", len(got), got[:min(len(got), 16)], len(want))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Batches pipelined on the stream become stable in order, each
// acknowledged once, and the protector's store ends up with every byte;
// a broken connection is reopened and what was not yet stored is sent
// again, which the store takes as duplicates.
func TestReplStreamPipelinedAndResent(t *testing.T) {
	for _, stable := range []LogStable{StableMemory, StableDisk} {
		t.Run(stable.String(), func(t *testing.T) {
			p := newReplPair(t, stable)
			ctx := context.Background()
			var want []byte
			var ships []shipment
			stableOrder := make(chan int, 100)
			for i := range 20 {
				payload := bytes.Repeat([]byte{byte('a' + i)}, 100+i)
				ships = append(ships, p.rp.submit(ctx, dataBody(9, uint64(len(want)), payload), shipHooks{onStable: func() { stableOrder <- i }}))
				want = append(want, payload...)
			}
			for i, sh := range ships {
				if err := sh.wait(ctx); err != nil {
					t.Fatalf("batch %d: wait = %v", i, err)
				}
			}
			for i := range 20 {
				if got := <-stableOrder; got != i {
					t.Fatalf("batch %d became stable in place %d", got, i)
				}
			}
			p.waitStored(t, 9, want)

			// Break the connection under the stream, with batches
			// unacknowledged (sent into the dead socket or queued).
			s := p.rp.stream(2)
			s.mu.Lock()
			c := s.conn
			s.mu.Unlock()
			if c == nil {
				t.Fatal("no connection after 20 acknowledged batches")
			}
			c.Close()
			ships = ships[:0]
			for i := range 10 {
				payload := bytes.Repeat([]byte{byte('A' + i)}, 1000)
				ships = append(ships, p.rp.submit(ctx, dataBody(9, uint64(len(want)), payload), shipHooks{}))
				want = append(want, payload...)
			}
			for i, sh := range ships {
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := sh.wait(wctx)
				cancel()
				var still *stillTrying
				for errors.As(err, &still) {
					wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					err = sh.wait(wctx)
					cancel()
				}
				if err != nil {
					t.Fatalf("batch %d after the break: wait = %v", i, err)
				}
			}
			p.waitStored(t, 9, want)
			if d := p.prot.stores.lookup(1).Stats().Conflicts.Load(); d != 0 {
				t.Errorf("store conflicts = %d, want 0", d)
			}
		})
	}
}

// A protector that leaves the set fails the shipments still waiting on
// it, so that they are sent again to the new set.
func TestReplStreamProtectorGone(t *testing.T) {
	p := newReplPair(t, StableMemory)
	ctx := context.Background()
	// Nobody listens at this address: the batch waits.
	p.rp.addr = func(heartbeat.NodeID) (netip.AddrPort, bool) { return netip.MustParseAddrPort("127.0.0.1:1"), true }
	sh := p.rp.submit(ctx, dataBody(9, 0, []byte("x")), shipHooks{})
	p.rp.mu.Lock()
	p.rp.protsAt = time.Time{}
	p.rp.mu.Unlock()
	p.rp.lookup = func(context.Context) ([]heartbeat.NodeID, error) { return []heartbeat.NodeID{3}, nil }
	if _, err := p.rp.protectors(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := sh.wait(wctx)
	var still *stillTrying
	for errors.As(err, &still) {
		err = sh.wait(wctx)
	}
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait = %v, want the protector's departure", err)
	}
}

// A protector that goes silent (its node vanished: no RST, no FIN) while a
// batch waits on it is a problem within replAckTimeout, even when the
// stream's reader started waiting while it was idle (with no deadline).
func TestReplStreamSilentProtector(t *testing.T) {
	defer func(d time.Duration) { replAckTimeout = d }(replAckTimeout)
	replAckTimeout = 300 * time.Millisecond
	p := newReplPair(t, StableMemory)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // upgrades, then reads and never answers
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", replUpgrade)
		io.Copy(io.Discard, br)
	}()
	p.rp.addr = func(heartbeat.NodeID) (netip.AddrPort, bool) {
		return netip.MustParseAddrPort(ln.Addr().String()), true
	}
	s := p.rp.stream(2)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		up := s.conn != nil
		s.mu.Unlock()
		if up {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stream did not connect")
		}
	}
	time.Sleep(50 * time.Millisecond) // its reader waits, idle
	sh := p.rp.submit(context.Background(), dataBody(9, 0, []byte("x")), shipHooks{})
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var still *stillTrying
		if err := sh.poll(); errors.As(err, &still) {
			t.Logf("the shipment reports: %v", err)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shipment still says %v after 3 s of a silent protector (ack timeout %v)", sh.poll(), replAckTimeout)
		}
	}
}

// A protector whose store is full says so in its acks: with --log-stable
// disk the batch waits (the shipment reports the reason and goes on); with
// memory it is stable (received) while the protector keeps it and retries.
func TestReplStreamStoreFull(t *testing.T) {
	for _, stable := range []LogStable{StableDisk, StableMemory} {
		t.Run(stable.String(), func(t *testing.T) {
			p := newReplPairOpts(t, stable, msglog.Options{Sync: msglog.SyncAlways, MaxBytes: 16 << 10})
			ctx := context.Background()
			sh := p.rp.submit(ctx, dataBody(9, 0, bytes.Repeat([]byte("z"), 64<<10)), shipHooks{})
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			err := sh.wait(wctx)
			if stable == StableMemory {
				if err != nil {
					t.Fatalf("wait = %v, want stable (received) while the store is full", err)
				}
				// The reason still reaches the node.
				deadline := time.Now().Add(5 * time.Second)
				for p.rp.stream(2).problem() == "" && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				err = &stillTrying{p.rp.stream(2).problem()}
			}
			var still *stillTrying
			if !errors.As(err, &still) || !bytes.Contains([]byte(still.msg), []byte("store full (507)")) {
				t.Fatalf("wait = %v, want the protector's \"store full (507)\" while it retries", err)
			}
		})
	}
}

// With --log-stable memory a batch is stable once the protector has read
// it, before its writer stores it; a listing of the store (what a replay
// or a re-protection reads up to) must still cover every stable batch. A
// replay that read a connection's bytes before the writer's last batch
// and the determinants after it saw more received than logged (CI).
func TestReplListingCoversStable(t *testing.T) {
	p := newReplPair(t, StableMemory)
	ctx := context.Background()
	var end uint64
	for i := range 20 {
		payload := bytes.Repeat([]byte{byte('a' + i)}, 64+i)
		if err := p.rp.submit(ctx, dataBody(9, end, payload), shipHooks{}).wait(ctx); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		end += uint64(len(payload))
		req := httptest.NewRequest("GET", "/v1/replica/streams?node=1", nil)
		rec := httptest.NewRecorder()
		p.prot.handleReplicaStreams(rec, req)
		var list []msglog.StreamInfo
		if err := json.NewDecoder(rec.Body).Decode(&list); err != nil {
			t.Fatalf("batch %d: listing: %v (%d)", i, err, rec.Code)
		}
		if len(list) != 1 || list[0].End != end {
			t.Fatalf("batch %d is stable, but the protector lists %+v; want stream 5 of owner 9 ending at %d", i, list, end)
		}
	}
}

// settle returns once the writer stored what was taken before the call,
// and says how many batches are missing when it gives up.
func TestLogWriterSettle(t *testing.T) {
	w := &logWriter{id: 3}
	w.taken.Add(2)
	done := make(chan error, 1)
	go func() { done <- w.settle(context.Background(), time.Minute) }()
	w.storedMore(1)
	select {
	case err := <-done:
		t.Fatalf("settle returned %v with a batch still unstored", err)
	case <-time.After(20 * time.Millisecond):
	}
	w.storedMore(1)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	w.taken.Add(1)
	if err := w.settle(context.Background(), time.Millisecond); err == nil || !strings.Contains(err.Error(), "1 received batches") {
		t.Fatalf("settle with a batch never stored = %v; want the count named", err)
	}
}

// TestReplFrameKeptWhenAckFails: a frame read whole is stored even when
// its receipt cannot be acknowledged (the node died just then), so that
// settle, and the listing a replay starts with, does not wait for a frame
// that was counted and dropped.
func TestReplFrameKeptWhenAckFails(t *testing.T) {
	p := newReplPair(t, StableMemory)
	lw, err := p.prot.logWriterFor(1)
	if err != nil {
		t.Fatal(err)
	}
	body := dataBody(9, 0, []byte("received by a process whose node died"))
	var frame bytes.Buffer
	var h [replHdrLen]byte
	binary.LittleEndian.PutUint32(h[0:], uint32(len(body)))
	binary.LittleEndian.PutUint64(h[4:], 1)
	frame.Write(h[:])
	frame.Write(body)
	ours, theirs := net.Pipe()
	theirs.Close() // every ack fails
	rc := &replConn{c: ours, done: make(chan struct{})}
	if err := p.prot.readReplStream(rc, bufio.NewReader(&frame), lw); err == nil {
		t.Fatal("readReplStream returned no error though its ack could not be sent")
	}
	if err := lw.settle(context.Background(), 5*time.Second); err != nil {
		t.Fatalf("settle after a failed ack: %v", err)
	}
	p.waitStored(t, 9, []byte("received by a process whose node died"))
}
