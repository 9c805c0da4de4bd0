package main

/*
#include "shim.h"
#include "conn.h"
#include "sockio.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/radic-project/radic/shim/wire"
)

// The control channel: one TCP connection per logical connection, beside
// the data stream (the thesis's "socket de control"), opened by the
// initiator to the acceptor process's control listener. The same listener
// takes resume connections, which become the new data stream.
//
// Its frames, and the hello, are in package wire.
type frame = wire.Frame

// Frames on raw fds (resume streams, which the app will own).
func writeFrameFd(fd int, f frame) error {
	b := f.Bytes()
	if e := C.radic_sock_write_full(C.int(fd), unsafe.Pointer(&b[0]), wire.FrameLen, C.int(handshakeWait.Milliseconds())); e < 0 {
		return syscall.Errno(-e)
	}
	return nil
}

func readFrameFd(fd int) (frame, error) {
	b := make([]byte, wire.FrameLen)
	if e := C.radic_sock_read_full(C.int(fd), unsafe.Pointer(&b[0]), wire.FrameLen, C.int(handshakeWait.Milliseconds())); e < 0 {
		return frame{}, syscall.Errno(-e)
	}
	return wire.ParseFrame(b)
}

func readFrame(nc net.Conn, timeout time.Duration) (frame, error) {
	b := make([]byte, wire.FrameLen)
	nc.SetReadDeadline(time.Now().Add(timeout))
	if _, err := io.ReadFull(nc, b); err != nil {
		return frame{}, err
	}
	return wire.ParseFrame(b)
}

func writeFrame(nc net.Conn, f frame) error {
	nc.SetWriteDeadline(time.Now().Add(handshakeWait))
	_, err := nc.Write(f.Bytes())
	return err
}

func newRequest(method, url, body string) (*http.Request, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err == nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, err
}

// ---- the control listener ---------------------------------------------------

func (s *safeSockets) serveCtl() {
	for {
		nc, err := s.ctlLn.Accept()
		if err != nil {
			logf("control listener: %v", err)
			return
		}
		go s.ctlConn(nc)
	}
}

func (s *safeSockets) ctlConn(nc net.Conn) {
	f, err := readFrame(nc, handshakeWait)
	if err != nil {
		debugf("control listener: %s: %v", nc.RemoteAddr(), err)
		nc.Close()
		return
	}
	s.route(f, nc)
}

// route hands a control stream to its connection, or holds it for a
// connection the app has not accepted yet.
func (s *safeSockets) route(f frame, nc net.Conn) {
	s.mu.Lock()
	c := s.byID[f.ID]
	if c == nil && !s.gone[f.ID] && (f.Type == wire.Open || f.Type == wire.Resume) {
		p := s.pending[f.ID]
		if p == nil {
			p = &pendingConn{s: s, id: f.ID}
			s.pending[f.ID] = p
		}
		s.mu.Unlock()
		p.hold(f, nc)
		return
	}
	s.mu.Unlock()
	switch {
	case c == nil:
		writeFrame(nc, frame{Type: wire.Refuse, ID: f.ID})
		nc.Close()
	case f.Type == wire.Open:
		c.attachCtl(nc, f.Attempt)
	case f.Type == wire.Resume:
		c.acceptResume(nc, f)
	default:
		nc.Close()
	}
}

// pendingConn is what the initiator of a connection sent before the app
// accepted it (it may sit in the listen backlog for as long as the app
// likes): its control channel, answered with acknowledgements of nothing
// so that a slow accept is not taken for a failure, and its newest resume,
// since the data stream can break before the app takes it, even before
// the radic hello came through on it (its node moved).
type pendingConn struct {
	s  *safeSockets
	id uint64

	mu      sync.Mutex
	adopted bool
	ctl     net.Conn
	ctlF    frame
	resume  net.Conn
	resumeF frame
	stood   bool // a stand-in was sent to the app's listener
	// peerDone: a logged connection whose initiator has finished (replay.go,
	// settleFinished): no resume will come, and a stand-in to port
	// brings the connection to the app's accept all the same.
	peerDone bool
	port     uint16
	paddr    netip.AddrPort
}

func (p *pendingConn) hold(f frame, nc net.Conn) {
	p.mu.Lock()
	if p.adopted { // accepted meanwhile: the connection takes it
		p.mu.Unlock()
		p.s.route(f, nc)
		return
	}
	if f.Type == wire.Open {
		if p.ctl != nil {
			p.ctl.Close()
		}
		p.ctl, p.ctlF = nc, f
		go p.ackNothing(nc)
	} else {
		if p.resume != nil {
			p.resume.Close()
		}
		p.resume, p.resumeF = nc, f
		if !p.stood {
			p.stood = true
			go p.standIn(f.Listener)
		}
	}
	p.mu.Unlock()
}

// standIn sends the connection's stand-in to the app's listener on port.
// When the app has no listener there yet (a restarted process resumed by
// its peer before it listened again), listen sends it (standInsFor).
func (p *pendingConn) standIn(port uint16) {
	p.mu.Lock()
	if !p.s.replay.acceptTurn(port, p.id) {
		p.stood = false // nextAccept sends it in its turn
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	for p.s.sendStandIn(p.id, port, nil) == errNoListener {
		p.mu.Lock()
		p.stood = false
		p.mu.Unlock()
		if !p.s.listening(port) {
			return
		}
		// The listener came since: unless listen's scan took it, again.
		p.mu.Lock()
		if p.stood || p.adopted {
			p.mu.Unlock()
			return
		}
		p.stood = true
		p.mu.Unlock()
	}
}

// standInsFor sends the stand-ins that waited for a listener on port.
func (s *safeSockets) standInsFor(port uint16) {
	s.mu.Lock()
	ps := make([]*pendingConn, 0, len(s.pending))
	for _, p := range s.pending {
		ps = append(ps, p)
	}
	s.mu.Unlock()
	for _, p := range ps {
		p.mu.Lock()
		listener := p.resumeF.Listener
		if p.resume == nil {
			listener = p.port
		}
		send := (p.resume != nil || p.peerDone) && !p.stood && !p.adopted && listener == port && s.replay.acceptTurn(port, p.id)
		if send {
			p.stood = true
		}
		p.mu.Unlock()
		if send {
			go p.standIn(port)
		}
	}
}

// listening reports whether the app listens on port.
func (s *safeSockets) listening(port uint16) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.listeners {
		if p == port {
			return true
		}
	}
	return false
}

// ackNothing keeps a held control channel alive until the app accepts.
func (p *pendingConn) ackNothing(nc net.Conn) {
	t := time.NewTicker(heartbeat)
	defer t.Stop()
	for range t.C {
		p.mu.Lock()
		if p.adopted || p.ctl != nc {
			p.mu.Unlock()
			return
		}
		err := writeFrame(nc, frame{Type: wire.Ack, ID: p.id, V1: 0, V2: math.MaxUint64})
		p.mu.Unlock()
		if err != nil {
			return // the initiator went away; a resume may still come
		}
	}
}

// adopt gives what was held to c, the connection the app just accepted.
func (p *pendingConn) adopt(c *conn) {
	p.mu.Lock()
	p.adopted = true
	ctl, ctlF, resume, resumeF := p.ctl, p.ctlF, p.resume, p.resumeF
	p.mu.Unlock()
	if ctl != nil {
		c.attachCtl(ctl, ctlF.Attempt)
	}
	if resume != nil {
		go c.acceptResume(resume, resumeF)
	}
}

// takePending removes and returns what is held for connection id.
func (s *safeSockets) takePending(id uint64) *pendingConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pending[id]
	delete(s.pending, id)
	return p
}

// resumeOf finds a held resume of the data stream the app accepted from
// peer, which never brought its hello: the resume names the initiator's
// port, and comes from the same node.
func (s *safeSockets) resumeOf(peer netip.AddrPort) (id uint64, from netip.Addr, ok bool) {
	node := s.loc.logical(peer.Addr())
	s.mu.Lock()
	var cands []*pendingConn
	for _, p := range s.pending {
		cands = append(cands, p)
	}
	s.mu.Unlock()
	for _, p := range cands {
		p.mu.Lock()
		nc, f := p.resume, p.resumeF
		p.mu.Unlock()
		if nc == nil || f.Port != peer.Port() {
			continue
		}
		src := nc.RemoteAddr().(*net.TCPAddr).AddrPort().Addr()
		if s.loc.logical(src) == node {
			return p.id, s.loc.logical(src), true
		}
	}
	return 0, netip.Addr{}, false
}

// A stand-in is a connection the shim makes to the app's own listener, over
// loopback, for a connection whose initiator is resuming it but whose data
// stream never reached the backlog: the handshake's last ACK was lost to a
// move, so the acceptor's kernel holds it in SYN_RECV, answering an address
// that is gone, until it gives up. The initiator's connect had returned,
// so the resume comes, but without a stand-in the app's accept never would.
// The app accepts the stand-in as the connection, the held resume is
// swapped in under it at once, and the stand-in's own stream is never read.
// Should the original reach the backlog after all (a slow app had it
// there, unaccepted, all along), whichever of the two the app accepts
// second is not shown to it.
type standIn struct {
	id   uint64
	fd   int       // our end, until the app accepts the other
	held *heldConn // the connection it stands in for was accepted out of turn (replay.go)
}

// errNoListener: the app does not listen on the port a stand-in is for.
var errNoListener = errors.New("no listener")

// sendStandIn connects a stand-in for connection id, or for held, to the
// app's listener on port. Errors other than errNoListener are logged here.
func (s *safeSockets) sendStandIn(id uint64, port uint16, held *heldConn) error {
	s.mu.Lock()
	lfd := -1
	for fd, p := range s.listeners {
		if p == port {
			lfd = fd
			break
		}
	}
	s.mu.Unlock()
	if lfd < 0 || port == 0 {
		debugf("connection %d:%d: no listener on port %d for a stand-in: its resume waits", id>>32, uint32(id), port)
		return errNoListener
	}
	ln, err := sockName(lfd, false)
	if err != nil {
		return err
	}
	to := ln.Addr()
	if to.IsUnspecified() {
		to = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	var from C.uint16_t
	fd := int(C.radic_sock_bound(ip4(to), &from))
	if fd < 0 {
		logf("connection %d:%d: cannot make a stand-in: %v", id>>32, uint32(id), syscall.Errno(-fd))
		return syscall.Errno(-fd)
	}
	// Known before it can be accepted: the app may take it at once.
	s.mu.Lock()
	s.stand[netip.AddrPortFrom(to, uint16(from))] = &standIn{id: id, fd: fd, held: held}
	s.mu.Unlock()
	if e := C.radic_sock_connect(C.int(fd), ip4(to), C.uint16_t(port), C.int(dialTimeout.Milliseconds())); e < 0 {
		if s.takeStandIn(netip.AddrPortFrom(to, uint16(from))) == nil {
			// The app accepted it before our connect returned, and its
			// accept closed our end (hence the error): the fd number is
			// no longer ours to close.
			debugf("connection %d:%d: stand-in accepted at once", id>>32, uint32(id))
			return nil
		}
		logf("connection %d:%d: stand-in to %s:%d: %v", id>>32, uint32(id), to, port, syscall.Errno(-e))
		C.radic_sock_close(C.int(fd))
		return syscall.Errno(-e)
	}
	if held != nil {
		debugf("connection %d:%d: its turn to be accepted; stand-in %s:%d sent to the app's listener", id>>32, uint32(id), to, from)
	} else {
		logf("connection %d:%d: never reached the backlog; stand-in %s:%d sent to the app's listener", id>>32, uint32(id), to, from)
	}
	return nil
}

// nextAccept: the app accepted connection id on port. During a replay,
// the next logged connection's stand-in can go, or, after the last, the
// connections held meanwhile.
func (s *safeSockets) nextAccept(port uint16, id uint64) {
	held := s.replay.acceptDone(port, id)
	s.standInsFor(port)
	if len(held) == 0 {
		return
	}
	go func() {
		for _, h := range held {
			if s.sendStandIn(h.id, port, h) != nil {
				logf("connection %d:%d: accepted while the logged accepts were made again, and the listener is gone now: closed", h.id>>32, uint32(h.id))
				C.radic_sock_close(C.int(h.fd))
			}
		}
	}()
}

// acceptHeld makes fd, a stand-in the app accepted, the held connection it
// stands in for: the held socket takes fd's place.
func (s *safeSockets) acceptHeld(fd int, st *standIn) bool {
	if st.fd >= 0 {
		C.radic_sock_close(C.int(st.fd))
	}
	h := st.held
	if s.known(h.id) {
		C.radic_sock_close(C.int(h.fd))
		return false
	}
	if e := C.radic_sock_graft(C.int(h.fd), C.int(fd)); e < 0 {
		logf("connection %d:%d: cannot put it under fd %d: %v; its peer sees it fail", h.id>>32, uint32(h.id), fd, syscall.Errno(-e))
		return false
	}
	return s.acceptAs(fd, h)
}

func (s *safeSockets) takeStandIn(peer netip.AddrPort) *standIn {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stand[peer]
	delete(s.stand, peer)
	return st
}

// acceptStandIn makes fd, a stand-in the app accepted, its connection, and
// swaps the held resume in under it.
func (s *safeSockets) acceptStandIn(fd int, st *standIn) bool {
	if st.fd >= 0 {
		// Our end is not needed: the stand-in's stream is never read, and
		// its end of stream only marks it broken sooner.
		C.radic_sock_close(C.int(st.fd))
	}
	s.mu.Lock()
	p := s.pending[st.id]
	s.mu.Unlock()
	if p == nil || s.known(st.id) {
		debugf("fd %d: stand-in for connection %d:%d, which the app has already: not shown to it", fd, st.id>>32, uint32(st.id))
		return false
	}
	p.mu.Lock()
	resume, f, peerDone, paddr := p.resume, p.resumeF, p.peerDone, p.paddr
	p.mu.Unlock()
	if resume != nil {
		src := resume.RemoteAddr().(*net.TCPAddr).AddrPort().Addr()
		paddr = netip.AddrPortFrom(s.loc.logical(src), f.Port)
	}
	c := s.newConn(fd, st.id, false, s.acceptedName(fd), paddr)
	if c == nil {
		return true
	}
	debugf("connection %s: accepted through a stand-in", c)
	// Taken only now that frames for the connection find it.
	if p := s.takePending(st.id); p != nil {
		p.adopt(c)
	}
	if resume == nil && peerDone {
		c.peerGone()
	}
	return true
}

// retireStandIns closes our end of any stand-in for connection id, which
// the app has accepted as itself (the stand-in is dropped when accepted).
func (s *safeSockets) retireStandIns(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.stand {
		if st.id == id && st.fd >= 0 {
			C.radic_sock_close(C.int(st.fd))
			st.fd = -1
		}
	}
}

// ---- a connection -------------------------------------------------------------

type sockopt struct {
	level, name int
	val         []byte
}

// conn is the Go side of one safe socket.
type conn struct {
	s         *safeSockets
	c         *C.struct_radic_conn
	id        uint64
	initiator bool
	replayed  bool           // set before use: the connection has a log to replay (a restarted process)
	laddr     netip.AddrPort // what the app sees as its address
	paddr     netip.AddrPort // and as its peer's (logical)
	peerLpid  string         // the listener's process, for a replayed connect (replayConnect)
	kick      chan struct{}  // acknowledge now
	room      chan struct{}  // an acknowledgement came: the ring has room

	eofPending atomic.Bool
	lastHeard  atomic.Int64 // unix ns of the last control frame (or swap)
	heardDone  atomic.Bool  // the peer's acks say it reads no more
	peerHeard  atomic.Bool  // the peer's acks say it heard that we read no more
	resumeMu   sync.Mutex   // one resume at a time

	mu          sync.Mutex
	fds         []int          // the fds naming the socket (the app's, or our lingering dup)
	gen         uint32         // which socket (mirrors C's)
	ctl         net.Conn       // the current control channel
	ctlAddr     netip.AddrPort // where the peer process's control listener was last seen
	attempt     uint32         // the last resume attempt (initiator) or accepted (acceptor)
	brokenAt    time.Time
	breaks      int
	why         string
	err         int
	failed      bool
	closed      bool // the app closed its last fd
	end         uint64
	opts        []sockopt
	lingerStart sync.Once
}

func (c *conn) String() string {
	return fmt.Sprintf("%d:%d (%s -> %s)", c.id>>32, uint32(c.id), c.laddr, c.paddr)
}

func (c *conn) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *conn) fd0() int {
	if len(c.fds) == 0 {
		return -1
	}
	return c.fds[0]
}

// recordOpt keeps the socket options the app sets, for the sockets that
// replace this one.
func (c *conn) recordOpt(level, name int, val unsafe.Pointer, n int) {
	if val == nil || n <= 0 || n > 64 {
		return
	}
	b := C.GoBytes(val, C.int(n))
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.opts {
		if c.opts[i].level == level && c.opts[i].name == name {
			c.opts[i].val = b
			return
		}
	}
	c.opts = append(c.opts, sockopt{level, name, b})
}

// ---- the control channel ---------------------------------------------------

// openCtl dials the peer's control listener (initiator).
func (c *conn) openCtl(attempt uint32) {
	c.mu.Lock()
	addr := c.ctlAddr
	c.mu.Unlock()
	nc, err := net.DialTimeout("tcp4", addr.String(), dialTimeout)
	if err == nil {
		if err = writeFrame(nc, frame{Type: wire.Open, Attempt: attempt, ID: c.id, Listener: c.paddr.Port()}); err != nil {
			nc.Close()
		}
	}
	if err != nil {
		debugf("connection %s: control channel to %s: %v", c, addr, err)
		// Without one, nothing acknowledges: a break and resume sorts it
		// out, and the sooner the better: the acceptor may still be
		// waiting for a hello that was lost with the old stream.
		c.mu.Lock()
		gen := c.gen
		c.mu.Unlock()
		c.breakOn(gen, int(syscall.ETIMEDOUT), "no control channel: "+err.Error())
		return
	}
	c.attachCtl(nc, attempt)
}

// attachCtl makes nc the connection's control channel and serves it.
func (c *conn) attachCtl(nc net.Conn, attempt uint32) {
	c.mu.Lock()
	if c.failed || attempt < c.attempt {
		c.mu.Unlock()
		nc.Close()
		return
	}
	if c.ctl != nil {
		c.ctl.Close()
	}
	c.ctl = nc
	c.mu.Unlock()
	go c.sendAcks(nc)
	go c.readCtl(nc)
}

func (c *conn) ackFrame() frame {
	c.mu.Lock()
	closed, end := c.closed, c.end
	c.mu.Unlock()
	// With recovery, only what is stable in the log (min(delivered,
	// logged)): the sender frees its ring up to what we acknowledge.
	v1 := uint64(C.radic_conn_ackable(c.c))
	if closed && v1 == uint64(C.radic_conn_recvd(c.c)) {
		v1 = math.MaxUint64
	}
	f := frame{Type: wire.Ack, ID: c.id, V1: v1, V2: end}
	if c.heardDone.Load() {
		f.Flags = wire.HeardDone
	}
	return f
}

// sendAcks sends the delivered offset every heartbeat, and at once when
// the data path asks: it is the acknowledgement and the liveness signal.
func (c *conn) sendAcks(nc net.Conn) {
	t := time.NewTicker(heartbeat)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-c.kick:
		}
		c.flushLogFor()
		if writeFrame(nc, c.ackFrame()) != nil {
			return
		}
	}
}

// readCtl reads the peer's acknowledgements; its silence breaks whatever
// socket the connection runs on by then (the channel may have been
// attached just before a resume's swap).
func (c *conn) readCtl(nc net.Conn) {
	for {
		f, err := readFrame(nc, deadAfter)
		if err != nil {
			c.mu.Lock()
			current := c.ctl == nc
			closed, end := c.closed, c.end
			gen := c.gen
			c.mu.Unlock()
			if !current {
				return
			}
			// After our own close the channel's end is ours to ignore only
			// once the peer has everything we sent: a channel that breaks
			// before (a cut, a move) is a failure to resume from.
			delivered := closed && uint64(C.radic_conn_acked(c.c)) >= end && (!c.initiator || c.peerHeard.Load())
			if delivered || c.peerFinished() {
				c.finishQuietly()
				return
			}
			why := "the control channel went silent for " + deadAfter.String()
			e := int(syscall.ETIMEDOUT)
			if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
				why, e = "the control channel failed: "+err.Error(), int(syscall.ECONNRESET)
			}
			c.breakOn(gen, e, why)
			return
		}
		c.lastHeard.Store(time.Now().UnixNano())
		if f.Type != wire.Ack {
			continue
		}
		if f.Flags&wire.HeardDone != 0 {
			c.peerHeard.Store(true)
		}
		if f.V1 == math.MaxUint64 {
			C.radic_conn_ack_all(c.c)
			if !c.heardDone.Swap(true) {
				c.poke() // the peer may be waiting for this to go
			}
		} else {
			C.radic_conn_set_acked(c.c, C.uint64_t(f.V1))
		}
		if f.V2 != math.MaxUint64 {
			C.radic_conn_set_peer_end(c.c, C.uint64_t(f.V2))
		}
		select {
		case c.room <- struct{}{}:
		default:
		}
	}
}

// peerFinished: the peer has closed and we have everything it sent (read,
// or in the log a restarted process replays), and it acknowledged
// everything we sent (a replay's acknowledged offset is the peer's, ahead
// of what it has regenerated): its control channel going away is the
// end, not a failure.
func (c *conn) peerFinished() bool {
	end := uint64(C.radic_conn_peer_end(c.c))
	return end != math.MaxUint64 && uint64(C.radic_conn_resume_point(c.c)) >= end &&
		uint64(C.radic_conn_acked(c.c)) >= uint64(C.radic_conn_sent(c.c))
}

// finishQuietly: the peer is gone after a clean close; later writes get
// EPIPE. In a replay they are dropped instead (radic_conn_peer_gone): the
// process regenerates sends its first run made while the peer was there.
func (c *conn) finishQuietly() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed {
		return
	}
	c.failed = true
	if c.replayed {
		C.radic_conn_peer_gone(c.c, C.radic_conn_peer_end(c.c), C.int(c.fd0()))
		return
	}
	C.radic_conn_fail(c.c, C.int(syscall.EPIPE), C.int(c.fd0()))
}

// awaitMarker waits a little for the close marker after an end of stream.
func (c *conn) awaitMarker() bool {
	deadline := time.Now().Add(markerWait)
	for time.Now().Before(deadline) {
		if uint64(C.radic_conn_peer_end(c.c)) == uint64(C.radic_conn_recvd(c.c)) {
			return true
		}
		time.Sleep(2 * time.Millisecond)
	}
	return false
}

// ---- failure and resumption -------------------------------------------------

// monitor breaks any connection that has heard no control frame for a
// while, whatever the reason: it backs up the control channel's own read
// deadline, which cannot fire while no channel is attached at all.
//
// It also breaks a connection whose data stream lives on an address this
// node no longer has. Such a stream is dead for good, yet nothing else
// would notice while the control channel is alive: a channel opened just
// after the node moved runs on the new address, and it is that channel
// which carries the acknowledgements and the heartbeat.
func (s *safeSockets) monitor() {
	const grace = deadAfter + 4*heartbeat
	for range time.Tick(heartbeat * 2) {
		s.mu.Lock()
		conns := make([]*conn, 0, len(s.byID))
		for _, c := range s.byID {
			conns = append(conns, c)
		}
		s.mu.Unlock()
		now := time.Now().UnixNano()
		local := map[netip.Addr]bool{} // this tick's answers
		for _, c := range conns {
			if C.radic_conn_state(c.c) != C.RADIC_CONN_UP {
				continue
			}
			c.mu.Lock()
			gen, ctl, fd := c.gen, c.ctl != nil, c.fd0()
			c.mu.Unlock()
			if now-c.lastHeard.Load() >= int64(grace) {
				c.breakOn(gen, int(syscall.ETIMEDOUT), fmt.Sprintf("no control frame for %v (channel attached: %v)", grace, ctl))
				continue
			}
			ap, err := sockName(fd, false)
			if err != nil || !ap.Addr().Is4() || ap.Addr().IsUnspecified() {
				continue
			}
			here, seen := local[ap.Addr()]
			if !seen {
				here = C.radic_addr_is_local(ip4(ap.Addr())) != 0 // an error counts as here
				local[ap.Addr()] = here
			}
			if !here {
				c.breakOn(gen, int(syscall.ENETUNREACH), fmt.Sprintf("its stream runs on %s, which this node no longer has", ap.Addr()))
				continue
			}
			if gone, why := s.peerMoved(c, fd); gone {
				c.breakOn(gen, int(syscall.ENETUNREACH), why)
			}
		}
	}
}

// peerMoved reports whether the peer's node has moved away from the
// address the data stream runs to. Its own side usually sees the move
// first and breaks the stream, but not always: an acceptor that never saw
// the stream (it was still in the handshake when it moved) has nothing to
// break, and the held control channel answers every probe, so this side
// would wait on a dead stream for ever. Only an address the node is known
// to have given up counts: a host reached on an address the node list
// does not name (another interface) is not a move.
func (s *safeSockets) peerMoved(c *conn, fd int) (bool, string) {
	remote, err := sockName(fd, true)
	if err != nil || !remote.Addr().Is4() || !s.loc.movedFrom(c.paddr.Addr(), remote.Addr(), time.Second) {
		return false, ""
	}
	return true, fmt.Sprintf("its stream runs to %s, which its peer's node no longer has", remote.Addr())
}

// breakOn marks the connection broken if it still runs on socket gen.
func (c *conn) breakOn(gen uint32, e int, why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed || gen != c.gen || len(c.fds) == 0 {
		return
	}
	if C.radic_conn_break(c.c, C.uint32_t(gen), C.int(c.fd0())) == 0 {
		return
	}
	c.brokenAt, c.why, c.err = time.Now(), why, e
	c.breaks++
	if c.ctl != nil {
		c.ctl.Close()
		c.ctl = nil
	}
	logf("connection %s broken: %s; %s", c, why, map[bool]string{true: "reconnecting", false: "waiting for the peer to reconnect"}[c.initiator])
	if c.initiator {
		go c.reconnect(gen)
	}
	go c.watchdog(c.breaks)
}

// watchdog gives up on a break that lasts past the deadline.
func (c *conn) watchdog(breaks int) {
	time.Sleep(c.s.deadline)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed || c.breaks != breaks || C.radic_conn_state(c.c) != C.RADIC_CONN_BROKEN {
		return
	}
	c.failLocked(c.err, fmt.Sprintf("not resumed within %v of a break (%s)", c.s.deadline, c.why))
}

func (c *conn) failLocked(e int, why string) {
	c.failed = true
	C.radic_conn_fail(c.c, C.int(e), C.int(c.fd0()))
	if c.ctl != nil {
		c.ctl.Close()
		c.ctl = nil
	}
	logf("connection %s failed: %s; the application now gets %s", c, why, errnoName(e))
}

// peerGone settles a replayed connection whose peer rank has finished
// (replay.go, settleFinished): it never resumes; the app reads the log,
// then an end of stream, and what it sends is dropped.
func (c *conn) peerGone() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed {
		return
	}
	c.failed = true
	C.radic_conn_peer_gone(c.c, C.radic_conn_resume_point(c.c), C.int(c.fd0()))
	if c.ctl != nil {
		c.ctl.Close()
		c.ctl = nil
	}
	logf("connection %s: the peer rank has finished: no resume; the app reads what the log holds and an end of stream, and what it sends is dropped", c)
}

// reconnect is the initiator's side of a resume: dial the peer process's
// control listener wherever its node is now, agree on offsets, swap the new
// stream in and resend what the peer has not delivered.
//
// Dials overlap: a new one starts every dialEvery while earlier ones still
// wait, because a SYN lost to a cut is sent again by TCP only a second
// later. Data flows again within about one dialEvery of the link's return.
func (c *conn) reconnect(gen uint32) {
	C.radic_conn_barrier(c.c)
	dialed := make(chan int, maxDials)
	inFlight := 0
	defer func() {
		go func(n int) { // late dials: close what they bring
			for ; n > 0; n-- {
				if fd := <-dialed; fd >= 0 {
					C.radic_sock_close(C.int(fd))
				}
			}
		}(inFlight)
	}()
	tick := time.NewTicker(dialEvery)
	defer tick.Stop()
	var last time.Time // the last dial's start: one every dialEvery, failed or not
	for {
		c.mu.Lock()
		done := c.failed || c.gen != gen
		c.mu.Unlock()
		if done {
			return
		}
		if inFlight < maxDials && time.Since(last) >= dialEvery {
			last = time.Now()
			inFlight++
			go func() {
				// Where to dial is looked up here, not in the loop: a
				// lookup can take a radicd's timeout (the listener's
				// node is dead and radicd asks it first), and a dialed
				// stream waiting that long for its handshake is dropped
				// by the peer's control listener: no resume ever got
				// through (TestReplayBothNodesInTurn).
				ctl := c.peerCtl()
				fd := int(C.radic_sock_dial(ip4(ctl.Addr()), C.uint16_t(ctl.Port()), C.int(dialTimeout.Milliseconds())))
				if fd < 0 {
					debugf("connection %s: dial %s: %v", c, ctl, syscall.Errno(-fd))
				}
				dialed <- fd
			}()
		}
		select {
		case fd := <-dialed:
			inFlight--
			if fd >= 0 && c.handshake(fd, gen) {
				return
			}
		case <-tick.C:
		}
	}
}

// peerCtl is where the peer process's control listener is now: on its
// node's current address (the app may have closed its listener long ago:
// only the node table matters).
func (c *conn) peerCtl() netip.AddrPort {
	c.mu.Lock()
	ctl := c.ctlAddr
	c.mu.Unlock()
	if c.initiator && recoveryOn() {
		// The peer process may have been restarted (recovery): its new
		// control listener is on another port, registered with its
		// listener (paddr). The listener may be closed by now (an app
		// that closes it once its peers are in, as Jacobi does, and a
		// restarted one that replays the close): its last process is
		// still the peer, found on the host it was restarted on. (With
		// a lookup among open listeners only, the peer of a process
		// restarted on a spare was looked for at its dead node's
		// address for ever: the reconnect phase timed out.) While the
		// peer's node is down its daemon may not answer: its last
		// control address is as good a guess as any, and the next
		// dial asks again.
		loc, err := c.s.loc.lookupAny(c.paddr)
		if err != nil {
			debugf("connection %s: where the peer listens now is not known yet: %v", c, err)
		} else if loc.Managed || loc.Closed {
			if a, err := netip.ParseAddrPort(loc.Ctl); err == nil && a != ctl && (loc.Moved || a.Port() != ctl.Port()) {
				debugf("connection %s: the peer's control listener is now at %s", c, a)
				if !loc.Moved {
					a = netip.AddrPortFrom(ctl.Addr(), a.Port())
				}
				ctl = a
				c.mu.Lock()
				c.ctlAddr = ctl
				c.mu.Unlock()
			}
			if loc.Moved {
				// On another node than its own, whose address is
				// no guide any more.
				return ctl
			}
		}
	}
	if _, a, ok := c.s.loc.current(c.paddr.Addr(), 100*time.Millisecond); ok && a != ctl.Addr() {
		ctl = netip.AddrPortFrom(a, ctl.Port())
		c.mu.Lock()
		c.ctlAddr = ctl
		c.mu.Unlock()
		debugf("connection %s: the peer's node is now at %s", c, a)
	}
	return ctl
}

// handshake runs the resume on a dialed stream; true when the connection
// is settled (resumed, or failed for good). It closes fd.
func (c *conn) handshake(fd int, gen uint32) bool {
	defer C.radic_sock_close(C.int(fd))
	c.mu.Lock()
	c.attempt++
	attempt, end := c.attempt, c.end
	c.mu.Unlock()
	// Where the peer resumes: our delivered offset, or a restarted
	// process's logged end (it delivers [recvd, end) from its log).
	recvd := uint64(C.radic_conn_resume_point(c.c))
	if err := writeFrameFd(fd, frame{Type: wire.Resume, Port: c.laddr.Port(), Attempt: attempt, ID: c.id, V1: recvd, V2: end, Listener: c.paddr.Port()}); err != nil {
		return false
	}
	if err := writeFrameFd(fd, c.digest()); err != nil {
		return false
	}
	f, err := readFrameFd(fd)
	if err != nil {
		debugf("connection %s: resume %d: %v", c, attempt, err)
		return false
	}
	if f.Type == wire.Resumed {
		g, err := readFrameFd(fd)
		if err != nil || !c.takeDigest(f, g) {
			debugf("connection %s: resume %d: no digest: %v", c, attempt, err)
			return false
		}
	}
	if f.Type == wire.Refuse {
		c.mu.Lock()
		if !c.failed {
			c.failLocked(int(syscall.ECONNRESET), "the peer process no longer knows the connection")
		}
		c.mu.Unlock()
		return true
	}
	if f.Type != wire.Resumed || writeFrameFd(fd, frame{Type: wire.Go, Attempt: attempt, ID: c.id}) != nil {
		return false
	}
	c.commit(fd, gen, f.V1, f.V2)
	go c.openCtl(attempt)
	return true
}

// digest is our Digest frame: what we received, [0, recvd), hashed (the
// same offset as our Resume or Resumed).
func (c *conn) digest() frame {
	return frame{Type: wire.Digest, ID: c.id, V1: uint64(C.radic_conn_resume_point(c.c)), V2: uint64(C.radic_conn_rx_hash(c.c))}
}

// takeDigest: the peer's Resumed or Resume f and its Digest g. A
// connection replaying its log learns what the peer received of its
// stream: its regenerated sends are checked against it (C).
func (c *conn) takeDigest(f, g frame) bool {
	if g.Type != wire.Digest || g.V1 != f.V1 {
		return false
	}
	if c.replayed {
		C.radic_conn_set_verify(c.c, C.uint64_t(g.V1), C.uint32_t(g.V2))
	}
	return true
}

// acceptResume is the acceptor's side: the initiator came back on nc.
func (c *conn) acceptResume(nc net.Conn, f frame) {
	c.resumeMu.Lock()
	defer c.resumeMu.Unlock()
	defer nc.Close()
	c.mu.Lock()
	stale := f.Attempt <= c.attempt || c.failed
	gen := c.gen
	c.mu.Unlock()
	if stale {
		return
	}
	dg, err := readFrame(nc, handshakeWait)
	if err != nil || dg.Type != wire.Digest || dg.V1 != f.V1 {
		debugf("connection %s: a resume without its digest: %v", c, err)
		return
	}
	c.breakOn(gen, int(syscall.ECONNRESET), "the peer is reconnecting")
	C.radic_conn_barrier(c.c)
	c.mu.Lock()
	gen, end := c.gen, c.end
	c.mu.Unlock()
	recvd := uint64(C.radic_conn_resume_point(c.c))
	if writeFrame(nc, frame{Type: wire.Resumed, Attempt: f.Attempt, ID: c.id, V1: recvd, V2: end}) != nil {
		return
	}
	if writeFrame(nc, c.digest()) != nil || !c.takeDigest(f, dg) {
		return
	}
	if g, err := readFrame(nc, handshakeWait); err != nil || g.Type != wire.Go {
		return
	}
	raw, err := nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		return
	}
	fd := -1
	raw.Control(func(s uintptr) { fd = int(C.radic_sock_dup(C.int(s))) })
	if fd < 0 {
		return
	}
	c.mu.Lock()
	c.attempt = f.Attempt
	c.ctlAddr = netip.AddrPortFrom(nc.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(), c.ctlAddr.Port())
	c.mu.Unlock()
	c.commit(fd, gen, f.V1, f.V2)
	C.radic_sock_close(C.int(fd))
}

// commit swaps the resumed stream in under the app's fds and resends from
// the peer's delivered offset.
func (c *conn) commit(fd int, gen uint32, peerRecvd, peerEnd uint64) {
	c.mu.Lock()
	if c.failed || c.gen != gen {
		c.mu.Unlock()
		return
	}
	for _, o := range c.opts {
		C.radic_sock_setopt(C.int(fd), C.int(o.level), C.int(o.name), unsafe.Pointer(&o.val[0]), C.socklen_t(len(o.val)))
	}
	sent := uint64(C.radic_conn_sent(c.c))
	at := peerRecvd
	if c.s.noRetx {
		at = sent // the broken build of the test: what was in flight is lost
	}
	fds := make([]C.int, len(c.fds))
	for i, f := range c.fds {
		fds[i] = C.int(f)
	}
	if len(fds) == 0 {
		c.mu.Unlock()
		return
	}
	if r, err := C.radic_conn_swap(c.c, C.int(fd), &fds[0], C.int(len(fds)), C.uint64_t(at)); r < 0 {
		if err == syscall.EPROTO || err == syscall.ENODATA {
			// The peer's offset cannot be served: resuming would lose
			// or repeat bytes (C has logged which). Never silently.
			c.failLocked(int(syscall.ECONNRESET), fmt.Sprintf("cannot resume at the peer's offset %d (sent %d, acknowledged %d): %v", at, sent, uint64(C.radic_conn_acked(c.c)), err))
		}
		c.mu.Unlock()
		return
	}
	if c.replayed {
		c.s.replay.resumedConn(c.id)
	}
	c.gen++
	c.lastHeard.Store(time.Now().UnixNano())
	if peerEnd != math.MaxUint64 {
		C.radic_conn_set_peer_end(c.c, C.uint64_t(peerEnd))
	}
	newGen, target := c.gen, c.fd0()
	logf("connection %s resumed after %v: resending %d bytes from offset %d",
		c, time.Since(c.brokenAt).Round(time.Millisecond), sent-min(at, sent), at)
	c.mu.Unlock()
	go c.pump(newGen, target)
}

// pump sends the ring's backlog on the new socket.
func (c *conn) pump(gen uint32, fd int) {
	for {
		switch r := C.radic_conn_pump(c.c, C.int(fd), 1000); {
		case r == 0:
			return
		case r < 0:
			c.breakOn(gen, int(syscall.ECONNRESET), "resending failed")
			return
		default:
			c.mu.Lock()
			moved := c.gen != gen || c.failed
			c.mu.Unlock()
			if moved || C.radic_conn_state(c.c) != C.RADIC_CONN_UP {
				return
			}
		}
	}
}

// ---- closing ---------------------------------------------------------------------

// shutdown(SHUT_WR) becomes the close marker; the real shutdown follows
// once the peer has every byte.
func (c *conn) shutdown(how int, call *C.struct_radic_call) C.int {
	if how == syscall.SHUT_RD {
		return C.RADIC_PASS
	}
	end := uint64(C.radic_conn_shut_wr(c.c))
	c.mu.Lock()
	c.end = end
	c.mu.Unlock()
	c.poke()
	go func() {
		if c.waitAcked(end) {
			c.mu.Lock()
			if fd := c.fd0(); fd >= 0 {
				C.radic_sock_shutdown(C.int(fd), C.int(how))
			}
			c.mu.Unlock()
		}
	}()
	call.ret = 0
	return C.RADIC_DONE
}

// waitAcked waits until the peer has delivered up to end, the connection
// failed, or the deadline passed.
func (c *conn) waitAcked(end uint64) bool {
	deadline := time.Now().Add(c.s.deadline)
	for time.Now().Before(deadline) {
		if uint64(C.radic_conn_acked(c.c)) >= end {
			return true
		}
		c.mu.Lock()
		failed := c.failed
		c.mu.Unlock()
		if failed {
			return false
		}
		select {
		case <-c.room:
		case <-time.After(heartbeat):
		}
	}
	return false
}

// waitPeerHeard waits until the acceptor has heard that we read no more
// (or the connection is over): only then may the initiator let go of a
// closed connection. Its last ack may be lost to a move; the acceptor
// cannot reconnect and would wait for it until its deadline, so the
// initiator stays, resuming if it must, until the acceptor says so.
func (c *conn) waitPeerHeard() {
	deadline := time.Now().Add(c.s.deadline)
	for !c.peerHeard.Load() && time.Now().Before(deadline) {
		c.mu.Lock()
		failed := c.failed
		c.mu.Unlock()
		if failed {
			return
		}
		select {
		case <-c.room:
		case <-time.After(heartbeat / 5):
		}
	}
}

// close: the app let go of the connection. Send the marker, keep the socket
// until the peer has everything, then let it go.
func (c *conn) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()
	end := uint64(C.radic_conn_shut_wr(c.c))
	c.mu.Lock()
	c.end = end
	c.mu.Unlock()
	c.poke()
	c.s.lingering.Add(1)
	go func() {
		defer c.s.lingering.Done()
		if c.waitAcked(end) && c.initiator {
			c.waitPeerHeard()
		} else {
			time.Sleep(heartbeat) // let the peer hear our last acknowledgement
		}
		c.mu.Lock()
		c.failed = true
		if c.ctl != nil {
			c.ctl.Close()
			c.ctl = nil
		}
		for _, fd := range c.fds {
			C.radic_sock_close(C.int(fd))
		}
		c.fds = nil
		c.mu.Unlock()
		c.s.mu.Lock()
		delete(c.s.byID, c.id)
		delete(c.s.byPtr, c.c)
		c.s.gone[c.id] = true
		c.s.mu.Unlock()
		C.radic_conn_release(c.c)
	}()
}
