package main

/*
#include "shim.h"
#include "conn.h"
#include <stdint.h>
#include <sys/mman.h>
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/radic-project/radic/observer"
	"github.com/radic-project/radic/observer/logring"
	"github.com/radic-project/radic/observer/replayfile"
)

// Replay, the shim's half (ARCHITECTURE.md, "Replay"). A rank that radicd
// restarted (the exec backend: re-executed from its launch record) has
// RADIC_REPLAY=<epoch> in its environment, and RADIC_REPLAY_LOG naming
// its log if anything was logged: a file radicd laid out
// (observer/replayfile) from the records of its streams, fetched from the
// protector that holds them. Before main() the shim maps it, rebuilds its
// receives per connection (observer.ReceivesFrom), and hands each
// connection's bytes, in place in the mapping, and receive results to C
// when the app creates that connection again (same logical id: same
// connect order). C serves receives from them until they are exhausted,
// then unmaps them; Go resumes the connection with the surviving peer,
// whose digest of what it received checks the sends the process
// regenerates (C, radic_conn_swap and the send path).

type replayState struct {
	epoch uint32
	owner uint64
	log   *observer.ReceiveLog

	mu sync.Mutex
	// +checklocks:mu
	handed map[uint64]int // connections whose logs went to C (attach): their bytes
	// +checklocks:mu
	resumed map[uint64]bool // logged connections resumed with their peer
	// +checklocks:mu
	accepts map[uint16][]uint64 // logged accepts the app has not made again, per port
	// +checklocks:mu
	held map[uint16][]*heldConn // connections accepted out of turn, per port
	// +checklocks:mu
	connects []observer.Determinant // logged connects not yet made again
	// +checklocks:mu
	firstAttach time.Time // when the first connection took its log: the replay's start
}

// fetchReplay maps this process's log from the file at path (empty:
// nothing was logged).
func (s *safeSockets) fetchReplay(epochEnv, path string) (*replayState, error) {
	epoch, err := strconv.ParseUint(epochEnv, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("RADIC_REPLAY=%q: want the restart's epoch", epochEnv)
	}
	owner := logring.Owner(s.jobHash, s.lpid)
	start := time.Now()
	var dets []byte
	data := map[uint64][]byte{}
	if path != "" {
		file, err := mapReplayFile(path)
		if err != nil {
			return nil, err
		}
		h, err := replayfile.Decode(file)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		dets = h.Dets.Bytes(file)
		for _, c := range h.Conns {
			if c.Len > 0 {
				data[c.Conn] = c.Bytes(file)
			}
		}
		// The header's and the determinants' pages go once decoded.
		head := h.Size
		if len(h.Conns) > 0 {
			head = h.Conns[0].Off
		}
		defer C.radic_big_free(unsafe.Pointer(unsafe.SliceData(file)), C.uint64_t(head))
	}
	mapped := time.Now()
	log, err := observer.ReceivesFrom(dets, data)
	if err != nil {
		return nil, err
	}
	var n int
	for _, c := range log.Conns {
		n += len(c.Data)
	}
	logf("restarted (epoch %d): replaying %d connections, %d bytes, %d polls, %d determinant bytes (mapped in %v, decoded in %v)", epoch, len(log.Conns), n, len(log.Ready), log.DetLen,
		mapped.Sub(start).Round(time.Millisecond), time.Since(mapped).Round(time.Millisecond))
	if err := replayPolls(log.Ready); err != nil {
		return nil, err
	}
	setIdentity(log.Identity)
	accepts := map[uint16][]uint64{}
	for port, ids := range log.Accepts {
		accepts[port] = append([]uint64(nil), ids...)
	}
	return &replayState{epoch: uint32(epoch), owner: owner, log: log, handed: map[uint64]int{}, resumed: map[uint64]bool{},
		accepts: accepts, held: map[uint16][]*heldConn{}, connects: slices.Clone(log.Connects)}, nil
}

// setIdentity gives the process the pid and host name its first run saw
// (shim/c/identity.c), if its log holds them.
func setIdentity(id map[observer.ValueCall][]byte) {
	pid := 0
	if v := id[observer.ValueGetpid]; len(v) == 8 {
		pid = int(binary.LittleEndian.Uint64(v))
	}
	var host *C.char
	if v, ok := id[observer.ValueGethostname]; ok {
		host = C.CString(string(v))
		defer C.free(unsafe.Pointer(host))
	}
	if pid != 0 || host != nil {
		C.radic_set_identity(C.int(pid), host)
		debugf("the first run's identity: pid %d, host %q", pid, id[observer.ValueGethostname])
	}
}

// mapReplayFile maps the file at path, read-only.
func mapReplayFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() == 0 {
		return nil, fmt.Errorf("%s: empty", path)
	}
	p := C.mmap(nil, C.size_t(fi.Size()), C.PROT_READ, C.MAP_SHARED|C.MAP_POPULATE, C.int(f.Fd()), 0)
	if uintptr(p) == ^uintptr(0) { // MAP_FAILED
		return nil, fmt.Errorf("%s: mmap of %d bytes failed", path, fi.Size())
	}
	return unsafe.Slice((*byte)(p), fi.Size()), nil
}

// failedConnect: a connect to peer whose turn in the first run failed (the
// next logged connect is a failure to peer) fails again, at once, with the
// logged errno: a program that retries until its peer listens tries as
// often as it did. next is the id the next connection would get: logged
// connections below it were made again.
func (r *replayState) failedConnect(peer netip.AddrPort, next uint64) (errno int, ok bool) {
	if r == nil {
		return 0, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.connects) > 0 && r.connects[0].Errno == 0 && r.connects[0].Conn < next {
		r.connects = r.connects[1:]
	}
	if len(r.connects) == 0 || r.connects[0].Errno == 0 || r.connects[0].Peer != peer {
		return 0, false
	}
	e := r.connects[0].Errno
	r.connects = r.connects[1:]
	return int(e), true
}

// replayPolls hands C the logged polls (radic_replay_polls).
func replayPolls(polls []observer.Determinant) error {
	var v []uint32
	for _, d := range polls {
		// The call rides in the count's top byte (MaxReady < 1<<24).
		v = append(v, uint32(d.Errno), uint32(d.ReadyCall)<<24|uint32(len(d.Ready)))
		for _, r := range d.Ready {
			v = append(v, r.Fd, r.Events, uint32(r.Conn), uint32(r.Conn>>32))
		}
	}
	if len(v) == 0 {
		return nil
	}
	if C.radic_replay_polls((*C.uint32_t)(unsafe.Pointer(&v[0])), C.uint64_t(len(v))) < 0 {
		return fmt.Errorf("out of memory for %d logged polls", len(polls))
	}
	return nil
}

// logged reports whether connection id has a log to replay.
func (r *replayState) logged(id uint64) bool {
	if r == nil {
		return false
	}
	_, ok := r.log.Conns[id]
	return ok
}

// attach hands connection id's log to C.
func (r *replayState) attach(c *conn) {
	r.mu.Lock()
	cr := r.log.Conns[c.id]
	if r.handed[c.id] > 0 {
		// Its bytes went to C with its first connection: a second one
		// would replay nothing where the log has bytes.
		r.mu.Unlock()
		logf("connection %s: its log was attached already: stopping", c)
		os.Exit(1)
	}
	r.handed[c.id] = len(cr.Data)
	if r.firstAttach.IsZero() {
		r.firstAttach = time.Now()
	}
	// The data's region of the mapping goes over to C as it is (and Go
	// forgets it: C unmaps it, to its page's end, once the log is used
	// up; the next region starts on the next page).
	var data unsafe.Pointer
	owned := C.uint64_t(0)
	if cap(cr.Data) > 0 {
		data, owned = unsafe.Pointer(unsafe.SliceData(cr.Data)), C.uint64_t((cap(cr.Data)+replayfile.PageSize-1)&^(replayfile.PageSize-1))
	}
	n := len(cr.Data)
	cr.Data = nil
	r.mu.Unlock()
	var res *C.int64_t
	if len(cr.Results) > 0 {
		res = (*C.int64_t)(unsafe.Pointer(&cr.Results[0]))
	}
	if C.radic_conn_replay(c.c, data, C.uint64_t(n), owned, res, C.uint64_t(len(cr.Results))) < 0 {
		logf("connection %s: out of memory for its replay: stopping", c)
		os.Exit(1)
	}
	c.replayed = true
	if c.initiator {
		// Our resumes must not look stale to the peer, which counted the
		// earlier run's attempts. (As the acceptor we take the peer's.)
		c.attempt = r.epoch << 20
	}
	debugf("connection %s: replaying %d bytes, %d receives", c, n, len(cr.Results))
}

// Accept order. The app's accepts must return its logged connections in
// the order they returned them before (a farm's master that numbers its
// workers in accept order takes another path otherwise), but they come to
// the listener in whatever order their initiators resume them, and
// connections new since the log may come first. So a stand-in for a logged
// connection goes to the listener only in its turn, and a new connection
// the app accepts before the logged ones are all given back is taken from
// it (held) and sent again, through a stand-in, after them.

// heldConn is a connection accepted out of turn: our duplicate of its
// socket, and what its hello said.
type heldConn struct {
	fd      int
	id      uint64
	paddr   netip.AddrPort // the initiator's logical address
	ctlAddr netip.AddrPort // its control listener
}

// acceptTurn reports whether connection id may be given to an accept on
// port now: no logged accept on port is still to come, or id is the next.
func (r *replayState) acceptTurn(port uint16, id uint64) bool {
	if r == nil {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.turnLocked(port, id)
}

// +checklocks:r.mu
func (r *replayState) turnLocked(port uint16, id uint64) bool {
	q := r.accepts[port]
	return len(q) == 0 || q[0] == id
}

// holdUnlessTurn holds h, accepted on port, unless it is its turn.
func (r *replayState) holdUnlessTurn(port uint16, h *heldConn) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.turnLocked(port, h.id) {
		return false
	}
	r.held[port] = append(r.held[port], h)
	return true
}

// acceptDone notes that the app accepted connection id on port. When that
// was the last logged accept on port, it returns the connections held
// meanwhile, in the order they came.
func (r *replayState) acceptDone(port uint16, id uint64) []*heldConn {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.accepts[port]
	if len(q) == 0 || q[0] != id {
		return nil
	}
	if q = q[1:]; len(q) > 0 {
		r.accepts[port] = q
		return nil
	}
	delete(r.accepts, port)
	held := r.held[port]
	delete(r.held, port)
	return held
}

// resumedConn notes a logged connection resumed with its peer.
func (r *replayState) resumedConn(id uint64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.resumed[id] = true
	r.mu.Unlock()
}

// routineProgress tells radicd when every logged connection has resumed
// (the protector's Reconnected) and when every log is used up (Live).
// It looks every progressEvery while the replay lasts (a second or so):
// at 20 ms the replay phase of a 14 MB log measured 40 ms, mostly the
// tick, and the recovery ended that much later.
func (s *safeSockets) routineProgress() {
	r := s.replay
	t := time.NewTicker(progressEvery)
	defer t.Stop()
	stage := "reconnected"
	for range t.C {
		r.mu.Lock()
		n := len(r.resumed)
		r.mu.Unlock()
		if stage == "reconnected" && n >= len(r.log.Conns) {
			s.postStage(stage)
			stage = "live"
		}
		if stage == "live" && C.radic_replaying == 0 {
			// Every log that was attached is exhausted, and every logged
			// connection was created (resumed implies attached).
			s.postStage(stage)
			r.mu.Lock()
			var n int
			for _, b := range r.handed {
				n += b
			}
			first := r.firstAttach
			r.mu.Unlock()
			if first.IsZero() || n == 0 {
				logf("replay done: live")
				return
			}
			took := time.Since(first)
			logf("replay done: live: %d bytes replayed in %v from the first connection's attach (%.0f MB/s)", n, took.Round(time.Millisecond), float64(n)/took.Seconds()/1e6)
			return
		}
	}
}

// finishedEvery is how often a restarted process with logged connections
// not resumed yet asks whether their peers have finished.
const finishedEvery = 250 * time.Millisecond

// routineFinishedPeers settles the logged connections whose peer rank has
// finished (its daemons say so: it exited on its own and its output is
// delivered, launch.RankLoc.Finished) and that therefore will never
// resume: a process killed after its peers had exited would otherwise
// wait for them until the reconnect phase timed out. A finished peer
// exited only once every byte it sent had been acknowledged (its exit
// waits for that), and only logged bytes are acknowledged: its stream
// ends where the log does. It stops once every logged connection is
// resumed or settled.
func (s *safeSockets) routineFinishedPeers() {
	r := s.replay
	t := time.NewTicker(finishedEvery)
	defer t.Stop()
	for range t.C {
		waiting := r.unresumed()
		if len(waiting) == 0 {
			return
		}
		done, err := s.finishedRanks()
		if err != nil {
			debugf("which peers have finished is not known: %v", err)
			continue
		}
		for _, id := range waiting {
			s.settleFinished(id, done)
		}
	}
}

// unresumed is the logged connections not resumed (or settled) yet.
func (r *replayState) unresumed() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []uint64
	for id := range r.log.Conns {
		if !r.resumed[id] {
			ids = append(ids, id)
		}
	}
	return ids
}

// acceptPort is the logical port on which the app will accept logged
// connection id again, if it has not yet.
func (r *replayState) acceptPort(id uint64) (uint16, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for port, ids := range r.accepts {
		if slices.Contains(ids, id) {
			return port, true
		}
	}
	return 0, false
}

// finishedRanks asks radicd which ranks of the job have finished: their
// logical process ids, and the node each was launched on (whose logical
// address is theirs).
func (s *safeSockets) finishedRanks() (map[string]int, error) {
	var jr struct {
		Ranks []struct {
			Rank     int  `json:"rank"`
			Group    int  `json:"group"`
			Finished bool `json:"finished"`
		} `json:"ranks"`
	}
	if err := s.loc.get("/v1/recovery/jobs/"+url.PathEscape(s.job), nil, &jr); err != nil {
		return nil, err
	}
	done := map[string]int{}
	for _, l := range jr.Ranks {
		if l.Finished {
			done[strconv.Itoa(l.Rank)] = l.Group
		}
	}
	return done, nil
}

// settleFinished settles logged connection id if its peer is among done:
// made again by the app, it never resumes (conn.peerGone); not accepted
// again yet, a stand-in brings it to the app's accept in its turn, since
// its initiator will not.
func (s *safeSockets) settleFinished(id uint64, done map[string]int) {
	s.mu.Lock()
	c := s.byID[id]
	s.mu.Unlock()
	if c != nil {
		peer := c.peerLpid
		if !c.initiator {
			peer = initiatorLpid(id)
		}
		if _, ok := done[peer]; ok {
			c.peerGone()
			s.replay.resumedConn(id)
		}
		return
	}
	port, ok := s.replay.acceptPort(id)
	node, finished := done[initiatorLpid(id)]
	if !ok || !finished {
		return // not made again yet, or a peer that has not finished
	}
	s.mu.Lock()
	p := s.pending[id]
	if p == nil && !s.gone[id] {
		p = &pendingConn{s: s, id: id}
		s.pending[id] = p
	}
	s.mu.Unlock()
	if p == nil {
		return
	}
	p.mu.Lock()
	send := !p.peerDone && p.resume == nil && !p.stood && !p.adopted
	// The initiator's port is not logged: its node's address stands
	// for it, as accept's answer and the connection's peer name.
	p.peerDone, p.port, p.paddr = true, port, netip.AddrPortFrom(s.loc.logicalOf(node), 0)
	if send {
		p.stood = true
	}
	p.mu.Unlock()
	if send {
		logf("connection %d:%d: its initiator, rank %s, has finished: a stand-in brings it to the app", id>>32, uint32(id), initiatorLpid(id))
		go p.standIn(port)
	}
}

// initiatorLpid is the logical process id of connection id's initiator
// when it is a rank (its number makes the id's high half); "" for a
// process a rank started (a hash).
func initiatorLpid(id uint64) string {
	if id>>63 != 0 {
		return ""
	}
	return strconv.FormatUint(id>>32, 10)
}

// progressEvery: see routineProgress.
const progressEvery = 2 * time.Millisecond

func (s *safeSockets) postStage(stage string) {
	req, err := newRequest("POST", fmt.Sprintf("http://%s/v1/replay/%d/%s", s.loc.daemon, s.replay.owner, stage), "")
	if err == nil {
		var resp *http.Response
		if resp, err = s.loc.hc.Do(req); err == nil {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			if resp.StatusCode/100 != 2 {
				err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
			}
		}
	}
	if err != nil {
		logf("cannot tell radicd that replay reached %s: %v", stage, err)
		return
	}
	debugf("told radicd that replay reached %s", stage)
}
