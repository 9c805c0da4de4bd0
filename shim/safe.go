package main

/*
#include "shim.h"
#include "conn.h"
#include "logring.h"
#include "sockio.h"
#include <fcntl.h>
#include <netinet/in.h>
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/radic-project/radic/observer/logring"
	"github.com/radic-project/radic/shim/wire"
)

// Tunables. The heartbeat doubles as the acknowledgement of delivered
// bytes; a control channel silent for deadAfter means the link is gone.
const (
	heartbeat      = 50 * time.Millisecond
	deadAfter      = 400 * time.Millisecond
	helloWait      = time.Second            // acceptor: wait this long for a radic hello
	strangerWait   = 20 * time.Millisecond  // and this long from a peer on no known node
	markerWait     = 200 * time.Millisecond // an EOF may arrive just before the close marker
	dialEvery      = 50 * time.Millisecond  // reconnecting: a new dial this often
	dialTimeout    = 500 * time.Millisecond // how long each dial may wait
	maxDials       = 10                     // dials waiting at once
	handshakeWait  = time.Second
	defaultTimeout = 60 * time.Second // RADIC_DEADLINE
)

// safeSockets is the process's control plane for its managed connections.
type safeSockets struct {
	job      string
	jobHash  uint64
	lpid     uint32 // the top half of every connection id
	lpidName string // as radicd knows it
	deadline time.Duration
	noRetx   bool // RADIC_TEST_NO_RETX: resume without resending (tests prove they see the loss)
	loc      *locator
	replay   *replayState // a restarted process's log (RADIC_REPLAY), or nil

	ctlLn   net.Listener
	ctlPort uint16
	seq     atomic.Uint32

	mu         sync.Mutex
	byFd       map[int]*conn
	byID       map[uint64]*conn
	byPtr      map[*C.struct_radic_conn]*conn
	pending    map[uint64]*pendingConn     // control streams of connections not accepted yet
	stand      map[netip.AddrPort]*standIn // stand-ins on their way to the app's accept, by their local end
	gone       map[uint64]bool             // connections closed and forgotten: a resume of one is refused
	listeners  map[int]uint16
	bound      map[int]netip.Addr // fds bound to the node's logical address (really the wildcard)
	lingering  sync.WaitGroup
	guests     atomic.Bool // ranks of other logical nodes run on this node (hostsGuests)
	monitoring sync.Once   // the monitor starts with the first connection
}

var safe *safeSockets

var debug = os.Getenv("RADIC_LOG") == "debug"

func logf(format string, args ...any) {
	cs := C.CString(fmt.Sprintf(format, args...))
	C.radic_log(cs)
	C.free(unsafe.Pointer(cs))
}

func debugf(format string, args ...any) {
	if debug {
		logf(format, args...)
	}
}

// newSafeSockets sets up the control plane from the launch environment, or
// returns nil (with a reason logged) when the process cannot have safe
// sockets.
func newSafeSockets() *safeSockets {
	job, daemon := os.Getenv("RADIC_JOB"), os.Getenv("RADIC_DAEMON")
	if daemon == "" {
		logf("job %s has no radicd on this node (RADIC_DAEMON is unset): its connections are plain TCP", job)
		return nil
	}
	rank, err1 := strconv.Atoi(os.Getenv("RADIC_RANK"))
	node, err2 := strconv.Atoi(os.Getenv("RADIC_NODE"))
	if err1 != nil || err2 != nil || rank < 0 {
		logf("RADIC_RANK=%q RADIC_NODE=%q: not a rank of a radic job; connections are plain TCP",
			os.Getenv("RADIC_RANK"), os.Getenv("RADIC_NODE"))
		return nil
	}
	// The logical process id: the rank, or for a program a rank started,
	// the rank and its place among its ancestors' children ("3.1.2", set by
	// the exec and spawn wrappers). Connection ids are built from it.
	lpid, lpidNum := strconv.Itoa(rank), uint32(rank)
	if v := os.Getenv("RADIC_LPID"); v != "" && strings.HasPrefix(v, lpid+".") && len(v) < 60 {
		h := fnv.New32a()
		h.Write([]byte(v))
		lpid, lpidNum = v, h.Sum32()|1<<31
	}
	cs := C.CString(lpid)
	C.radic_set_lpid(cs)
	C.free(unsafe.Pointer(cs))
	s := &safeSockets{
		job: job, lpid: lpidNum, lpidName: lpid, deadline: defaultTimeout,
		noRetx: os.Getenv("RADIC_TEST_NO_RETX") == "1",
		loc:    newLocator(daemon, job, node),
		byFd:   map[int]*conn{}, byID: map[uint64]*conn{}, byPtr: map[*C.struct_radic_conn]*conn{},
		pending: map[uint64]*pendingConn{}, stand: map[netip.AddrPort]*standIn{}, gone: map[uint64]bool{}, listeners: map[int]uint16{}, bound: map[int]netip.Addr{},
	}
	h := fnv.New64a()
	h.Write([]byte(job))
	s.jobHash = h.Sum64()
	if v := os.Getenv("RADIC_DEADLINE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			logf("RADIC_DEADLINE=%q: want a duration such as 30s; using %v", v, defaultTimeout)
		} else {
			s.deadline = d
		}
	}
	if v := os.Getenv("RADIC_REPLAY"); v != "" {
		r, err := s.fetchReplay(v, os.Getenv("RADIC_REPLAY_LOG"))
		if err != nil {
			// Without its log the process cannot take the path its
			// peers saw: running on would corrupt the job.
			logf("restarted with RADIC_REPLAY=%s but cannot get its log: %v; stopping", v, err)
			os.Exit(1)
		}
		s.replay = r
	}
	if recoveryOn() {
		if err := s.setupLog(daemon); err != nil {
			// Recovery was asked for: running without the log would
			// make a failure unrecoverable without anyone knowing.
			logf("recovery is on (RADIC_RECOVERY=1) but this process cannot log what it receives: %v; stopping (radic run --no-recovery runs without)", err)
			os.Exit(1)
		}
	}
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		logf("cannot open the control listener (%v): connections are plain TCP", err)
		return nil
	}
	s.ctlLn = ln
	s.ctlPort = uint16(ln.Addr().(*net.TCPAddr).Port)
	debugf("process %s: control listener on port %d", lpid, s.ctlPort)
	go s.serveCtl()
	if s.replay != nil {
		go s.routineProgress()
		go s.routineFinishedPeers()
	}
	return s
}

// ---- small helpers ----------------------------------------------------------

func ip4(a netip.Addr) C.uint32_t {
	b := a.As4()
	return C.uint32_t(binary.NativeEndian.Uint32(b[:])) // network order in memory
}

func fromIP4(v C.uint32_t) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], uint32(v))
	return netip.AddrFrom4(b)
}

func sockName(fd int, peer bool) (netip.AddrPort, error) {
	var ip C.uint32_t
	var port C.uint16_t
	p := C.int(0)
	if peer {
		p = 1
	}
	if e := C.radic_sock_name(C.int(fd), p, &ip, &port); e < 0 {
		return netip.AddrPort{}, syscall.Errno(-e)
	}
	return netip.AddrPortFrom(fromIP4(ip), uint16(port)), nil
}

func sockaddrIn(p unsafe.Pointer, n int) (netip.AddrPort, bool) {
	if p == nil || n < int(unsafe.Sizeof(C.struct_sockaddr_in{})) {
		return netip.AddrPort{}, false
	}
	sa := (*C.struct_sockaddr_in)(p)
	if sa.sin_family != C.AF_INET {
		return netip.AddrPort{}, false
	}
	port := uint16(sa.sin_port>>8) | uint16(sa.sin_port&0xff)<<8
	return netip.AddrPortFrom(fromIP4(C.uint32_t(sa.sin_addr.s_addr)), port), true
}

func errnoName(e int) string {
	if e == 0 {
		return "end of stream"
	}
	return fmt.Sprintf("%s (%s)", errnoSym[e], syscall.Errno(e).Error())
}

var errnoSym = map[int]string{
	int(syscall.ETIMEDOUT): "ETIMEDOUT", int(syscall.ECONNRESET): "ECONNRESET",
	int(syscall.EPIPE): "EPIPE", int(syscall.ECONNREFUSED): "ECONNREFUSED",
	int(syscall.EHOSTUNREACH): "EHOSTUNREACH", int(syscall.ENETUNREACH): "ENETUNREACH",
	int(syscall.ECONNABORTED): "ECONNABORTED",
}

// ---- connect, listen, accept ------------------------------------------------

// connect decides whether the app's connect is managed: only when radicd
// knows the destination as a listener of this job. Then the connection is
// made (blocking, whatever the socket's mode: it completes or fails before
// the app sees it), the radic hello goes first on the stream, and the
// connection gets its state. Returns ok=false to have C make the real call.
func (s *safeSockets) connect(fd int, sa unsafe.Pointer, salen int) (ret int, errno int, ok bool) {
	ap, isIn := sockaddrIn(sa, salen)
	if !isIn {
		C.radic_fd_clear(C.int(fd), C.RADIC_FD_CANDIDATE)
		return 0, 0, false
	}
	logical, cur, isNode := s.loc.current(ap.Addr(), time.Hour)
	if !isNode {
		C.radic_fd_clear(C.int(fd), C.RADIC_FD_CANDIDATE)
		return 0, 0, false // outside the cluster: untouched
	}
	if self, ok := s.loc.self(); ok && logical == self {
		// Inside this node: plain TCP, as any connection that never
		// crosses the network (a node's processes fail and restart
		// together). It goes to where the node is now.
		C.radic_fd_clear(C.int(fd), C.RADIC_FD_CANDIDATE)
		if cur == ap.Addr() {
			return 0, 0, false
		}
		debugf("fd %d: connect to %s inside this node goes to %s", fd, ap, cur)
		if e := C.radic_sock_connect(C.int(fd), ip4(cur), C.uint16_t(ap.Port()), 5000); e < 0 {
			return -1, int(-e), true
		}
		return 0, 0, true
	}
	logicalPeer := netip.AddrPortFrom(logical, ap.Port())
	if s.replay != nil {
		if e, ok := s.replay.failedConnect(logicalPeer, uint64(s.lpid)<<32|uint64(s.seq.Load())); ok {
			debugf("fd %d: connect to %s fails as it did in the first run: %s", fd, ap, syscall.Errno(e))
			return connectFailed(fd, e)
		}
		if ret, e, ok := s.replayConnect(fd, ap); ok {
			return ret, e, true
		}
	}
	// A node of the cluster: the connection goes to where the node is now,
	// and completes before the app sees it. A failed connect leaves the
	// socket a candidate, for the app's retry.
	peer, cur, loc, managed, e := s.dial(fd, ap)
	if e != 0 {
		// A determinant: the app's retries depend on it.
		C.radic_log_connect_failed(C.uint64_t(logring.PackPeer(logicalPeer)), C.int(e))
		return connectFailed(fd, e)
	}
	if !managed {
		// The listener may have registered since the lookup: it does so
		// before it listens, so a connect that succeeded sees it now.
		if loc, managed = s.loc.locate(ap); !managed {
			C.radic_fd_clear(C.int(fd), C.RADIC_FD_CANDIDATE)
			return 0, 0, true
		}
	}
	id := uint64(s.lpid)<<32 | uint64(s.seq.Add(1)-1)
	local, _ := sockName(fd, false)
	self, okSelf := s.loc.self()
	if !okSelf {
		self = local.Addr()
	}
	laddr := netip.AddrPortFrom(self, local.Port())
	// The connection is a determinant, stable before the peer can hear
	// of it: the peer keeps it until the end of the job, so a restarted
	// process must know to resume it, not open another under its id,
	// even if it died before anything was received on it.
	C.radic_log_conn(C.RADIC_LOG_CONNECT, C.uint64_t(id), C.uint64_t(logring.PackPeer(peer)), 1)
	hello := wire.Hello{Job: s.jobHash, ID: id, From: laddr, CtlPort: s.ctlPort}.Bytes()
	if e := C.radic_sock_write_full(C.int(fd), unsafe.Pointer(&hello[0]), wire.HelloLen, 5000); e < 0 {
		return -1, int(syscall.ECONNRESET), true
	}
	ctl, _ := netip.ParseAddrPort(loc.Ctl)
	c := s.newConn(fd, id, true, laddr, peer)
	c.ctlAddr = ctl
	C.radic_fd_clear(C.int(fd), C.RADIC_FD_CANDIDATE)
	debugf("connection %s: connected to %s (now %s), peer rank %s", c, ap, netip.AddrPortFrom(cur, ap.Port()), loc.Lpid)
	go c.openCtl(0)
	return 0, 0, true
}

// connectFailed answers the app's connect on fd, which failed with errno.
// The dial is made blocking, before the app hears of it; a non-blocking
// socket refused is then refused as the kernel refuses one: EINPROGRESS
// now, then POLLOUT|POLLERR and SO_ERROR ECONNREFUSED. A program that
// takes any other errno from a non-blocking connect for fatal retries then
// as it does bare.
func connectFailed(fd, errno int) (int, int, bool) {
	if errno == int(syscall.ECONNREFUSED) && C.radic_sock_getfl(C.int(fd))&C.O_NONBLOCK != 0 {
		if e := C.radic_sock_refuse(C.int(fd)); e != 0 {
			return -1, int(-e), true
		}
		return -1, errno, true // connected after all: cannot be, the port was ours
	}
	return -1, errno, true
}

// replayConnect: in a restarted process, a connect that made a logged
// connection in the earlier run (the next connection id has a log) makes
// no new connection: the peer still holds the old one, broken since the
// process died. The connection starts BROKEN, with its log, and resumes
// with the peer's control listener; the app's connect returns at once.
// ok=false: not a logged connection, connect as usual.
func (s *safeSockets) replayConnect(fd int, ap netip.AddrPort) (ret int, errno int, ok bool) {
	loc, managed := s.loc.locateAny(ap)
	id := uint64(s.lpid)<<32 | uint64(s.seq.Load())
	if !managed || !s.replay.logged(id) {
		return 0, 0, false
	}
	s.seq.Add(1)
	logical, _, _ := s.loc.current(ap.Addr(), time.Hour)
	peer := netip.AddrPortFrom(logical, ap.Port())
	self, okSelf := s.loc.self()
	if !okSelf {
		self = logical
	}
	c := s.newConn(fd, id, true, netip.AddrPortFrom(self, 0), peer)
	if c == nil {
		return -1, int(syscall.ENOMEM), true
	}
	c.ctlAddr, _ = netip.ParseAddrPort(loc.Ctl)
	c.peerLpid = loc.Lpid
	C.radic_fd_clear(C.int(fd), C.RADIC_FD_CANDIDATE)
	c.breakOn(0, int(syscall.ECONNRESET), "the process restarted: resuming with the peer")
	debugf("connection %s: replayed connect to %s (peer control %s)", c, ap, c.ctlAddr)
	return 0, 0, true
}

// Connect attempts to a node of the cluster: the first waits connectFirst,
// each later one twice as long up to connectMax, all within connectTimeout.
const (
	connectFirst   = 100 * time.Millisecond
	connectMax     = 2 * time.Second
	connectTimeout = 120 * time.Second
)

// dial connects fd to the listener ap names, at the current address of
// its node, and returns the peer's logical address, where it was reached
// and its location. A node can move while a connect is on its way, and a
// SYN to an address that is gone is lost without an answer: an attempt
// that has not completed in time is abandoned, the node looked up again,
// and the next attempt goes to where it is then. An error from an attempt
// is the app's unless the node has moved since.
func (s *safeSockets) dial(fd int, ap netip.AddrPort) (peer netip.AddrPort, cur netip.Addr, loc location, managed bool, errno int) {
	deadline := time.Now().Add(connectTimeout)
	wait, maxAge := connectFirst, time.Hour
	for {
		logical, at, ok := s.loc.current(ap.Addr(), maxAge)
		if !ok {
			return peer, cur, loc, false, int(syscall.EHOSTUNREACH)
		}
		peer = netip.AddrPortFrom(logical, ap.Port())
		if loc, managed = s.loc.locate(ap); managed {
			if target, err := netip.ParseAddrPort(loc.Addr); err == nil {
				at = target.Addr()
			}
		}
		moved := at != cur
		if !moved && errno != 0 && errno != int(syscall.ETIMEDOUT) {
			return peer, cur, loc, managed, errno
		}
		cur = at
		left := time.Until(deadline)
		if left <= 0 {
			return peer, cur, loc, managed, int(syscall.ETIMEDOUT)
		}
		e := C.radic_sock_connect(C.int(fd), ip4(cur), C.uint16_t(ap.Port()), C.int(min(wait, left).Milliseconds()))
		if e == 0 {
			return peer, cur, loc, managed, 0
		}
		errno = int(-e)
		if errno == int(syscall.ETIMEDOUT) {
			C.radic_sock_disconnect(C.int(fd)) // abandon the SYN, keep the socket
			debugf("fd %d: connect to %s (at %s) did not complete in %v: looking again", fd, ap, cur, min(wait, left))
			wait = min(2*wait, connectMax)
		}
		maxAge = 0 // the node list may be behind the move
	}
}

// bind keeps the app's logical address working when its node moves: a
// bind to the node's own logical address binds the wildcard address of the
// node's namespace instead, which follows any readdress, and the fd
// remembers the logical address for getsockname. (In loopback mode the
// nodes share one namespace and a readdress leaves the old address
// routable: binds there are left alone.)
func (s *safeSockets) bind(fd int, sa unsafe.Pointer, salen int) (int, int, bool) {
	ap, isIn := sockaddrIn(sa, salen)
	if !isIn {
		return 0, 0, false
	}
	self, ok := s.loc.self()
	if !ok || ap.Addr() != self || self.IsLoopback() {
		return 0, 0, false
	}
	if e := C.radic_sock_bind(C.int(fd), ip4(netip.IPv4Unspecified()), C.uint16_t(ap.Port())); e < 0 {
		return -1, int(-e), true
	}
	s.mu.Lock()
	s.bound[fd] = self
	s.mu.Unlock()
	debugf("fd %d: bind to logical %s binds 0.0.0.0:%d", fd, ap, ap.Port())
	return 0, 0, true
}

// inheritBinding: a plain connection accepted on a listener bound to the
// logical address (really the wildcard) is known by the logical address
// too, as it would be bare; a managed one answers from its own state.
// (Over loopback the kernel's answer stands: a bare listener on the
// logical address would never have accepted it.)
func (s *safeSockets) inheritBinding(lfd, fd int) {
	if C.radic_is_managed(C.int(fd)) != 0 {
		return
	}
	s.mu.Lock()
	ip, ok := s.bound[lfd]
	s.mu.Unlock()
	if !ok {
		return
	}
	if local, err := sockName(fd, false); err != nil || local.Addr().IsLoopback() {
		return
	}
	s.mu.Lock()
	s.bound[fd] = ip
	s.mu.Unlock()
	C.radic_fd_set(C.int(fd), C.RADIC_FD_CANDIDATE) // its getsockname comes here
}

// getsockname of a socket bound through bind: its logical address.
func (s *safeSockets) getsockname(fd int, sa unsafe.Pointer, salen unsafe.Pointer) (int, int, bool) {
	s.mu.Lock()
	ip, ok := s.bound[fd]
	s.mu.Unlock()
	if !ok {
		return 0, 0, false
	}
	real, err := sockName(fd, false)
	if err != nil {
		return 0, 0, false
	}
	if C.radic_sock_fill(sa, (*C.socklen_t)(salen), ip4(ip), C.uint16_t(real.Port())) < 0 {
		return -1, int(syscall.EFAULT), true
	}
	return 0, 0, true
}

// listen registers the listener with radicd before the app can tell
// anyone its address, so that connects to it are managed.
func (s *safeSockets) listen(fd, backlog int) (int, int) {
	// Register first when the port is known already, so that no peer can
	// connect before its radicd knows the listener (and go unmanaged).
	ap, err := sockName(fd, false)
	registered := false
	if err == nil && ap.Port() != 0 {
		registered = s.tryRegister(ap.Port())
	}
	if e := C.radic_sock_listen(C.int(fd), C.int(backlog)); e < 0 {
		if registered {
			go s.register("DELETE", ap.Port()) //nolint:errcheck // best effort
		}
		return -1, int(-e)
	}
	C.radic_fd_clear(C.int(fd), C.RADIC_FD_CANDIDATE)
	if !registered {
		if ap, err = sockName(fd, false); err != nil || !s.tryRegister(ap.Port()) {
			return 0, 0
		}
	}
	C.radic_fd_set(C.int(fd), C.RADIC_FD_LISTENER)
	s.mu.Lock()
	s.listeners[fd] = ap.Port()
	s.mu.Unlock()
	debugf("listener fd %d port %d registered", fd, ap.Port())
	s.standInsFor(ap.Port())
	return 0, 0
}

// accept classifies a connection the app accepted on a radic listener: it
// is managed when its first bytes are a radic hello of this job, when its
// initiator is already resuming it (the stream died before its hello came
// through), or when it is a stand-in for one that never reached the
// backlog. A peer on a cluster node gets helloWait for either; anyone else
// is plain at once. It returns false when the app must not see the
// connection at all: a second stream for a connection it already has (an
// original and its stand-in can both reach the backlog).
func (s *safeSockets) accept(lfd, fd int) bool {
	peer, err := sockName(fd, true)
	if err != nil {
		return true
	}
	if st := s.takeStandIn(peer); st != nil {
		if st.held != nil {
			return s.acceptHeld(fd, st)
		}
		return s.acceptStandIn(fd, st)
	}
	// A peer we do not know as a node may be one that moved a moment
	// ago: read the node list again (our radicd hears of a move within
	// milliseconds), and if it is still unknown give it only a short
	// while, so that a client from outside that waits for the server to
	// speak first is hardly delayed.
	wait := helloWait
	if self, ok := s.loc.self(); ok && s.loc.logical(peer.Addr()) == self && !s.hostsGuests() {
		debugf("fd %d from %s: inside this node: plain TCP", fd, peer)
		return true // connections inside a node are never managed (connect)
	}
	if _, ok := s.loc.nodeOf(peer.Addr()); !ok {
		s.loc.refresh(0)
		if _, ok := s.loc.nodeOf(peer.Addr()); !ok {
			wait = strangerWait
		}
	}
	var buf [wire.HelloLen]byte
	var id uint64
	var paddr netip.AddrPort
	var ctlPort uint16
	deadline := time.Now().Add(wait)
	fromNode := wait == helloWait
	part := 0 // bytes of a hello seen
	for {
		left := min(time.Until(deadline), 50*time.Millisecond)
		if left <= 0 && part > 0 && fromNode {
			// Half a hello from a node of the job, then nothing: a
			// managed connection whose initiator was cut off while it
			// sent it. Shown as plain TCP, the app would read radic's
			// bytes.
			logf("fd %d from %s: %d bytes of a radic hello, then nothing for %v: its initiator broke off; not shown to the app (it resumes the connection or makes it again)", fd, peer, part, wait)
			return false
		}
		if left <= 0 {
			debugf("fd %d from %s: no radic hello within %v: plain TCP", fd, peer, wait)
			return true
		}
		n := int(C.radic_sock_peek(C.int(fd), unsafe.Pointer(&buf[0]), wire.HelloLen, C.int(left.Milliseconds()+1)))
		ended := n < 0 && fromNode
		if n == 0 || ended {
			if rid, from, ok := s.resumeOf(peer); ok {
				id, paddr = rid, netip.AddrPortFrom(from, peer.Port())
				debugf("fd %d from %s: no hello, but its initiator resumes it as connection %d:%d", fd, peer, id>>32, uint32(id))
				break
			}
		}
		if ended {
			// From a node of the job, ended (or reset) before its
			// hello was whole: the initiator died or its node was
			// cut off after its connect returned. Its connection is
			// the app's only once the initiator (restarted, if it
			// must be) resumes it, through a stand-in, or makes it
			// again; shown now, it is an end of stream the app did
			// not have in a run without the failure.
			logf("fd %d from %s: ended (%v) after %d bytes of a radic hello: its initiator broke off; not shown to the app (it resumes the connection or makes it again)", fd, peer, syscall.Errno(-n), part)
			return false
		}
		if n < 0 {
			return true
		}
		if !wire.MayBeHello(buf[:n]) {
			return true // someone else's protocol
		}
		part = n
		if n == wire.HelloLen {
			h, err := wire.ParseHello(buf[:])
			if err != nil {
				return true
			}
			if h.Job != s.jobHash {
				logf("fd %d from %s: a radic hello from another job: plain TCP", fd, peer)
				return true
			}
			if e := C.radic_sock_read_full(C.int(fd), unsafe.Pointer(&buf[0]), wire.HelloLen, 1000); e < 0 {
				return true
			}
			id, paddr, ctlPort = h.ID, h.From, h.CtlPort
			break
		}
		time.Sleep(time.Millisecond) // part of a hello, or an end of stream
	}
	if s.known(id) {
		debugf("fd %d from %s: connection %d:%d is the app's already (through a stand-in): not shown to it", fd, peer, id>>32, uint32(id))
		return false
	}
	h := &heldConn{fd: -1, id: id, paddr: paddr, ctlAddr: netip.AddrPortFrom(peer.Addr(), ctlPort)}
	if local, _ := sockName(fd, false); !s.replay.acceptTurn(local.Port(), id) {
		// Our duplicate keeps it when the app's accept closes fd.
		if h.fd = int(C.radic_sock_dup(C.int(fd))); h.fd >= 0 && s.replay.holdUnlessTurn(local.Port(), h) {
			debugf("fd %d from %s: connection %d:%d came before the logged accepts on port %d: held until they are made again", fd, peer, id>>32, uint32(id), local.Port())
			return false
		}
		if h.fd >= 0 {
			C.radic_sock_close(C.int(h.fd))
		}
	}
	return s.acceptAs(fd, h)
}

// hostsGuests reports whether ranks of the job from other logical nodes
// run on this node (restarted here, or launched in place of a lost node:
// radicd's GET /v1/jobs/J/guests). A guest's connect to us comes from
// this node's address, yet it is managed (its logical node is not ours)
// and starts with a hello: a connection from our own node is then read
// for one, not taken for plain TCP at once (the app would read radic's
// bytes). Once true it stays true; radicd is asked again at every accept
// from our own node until then (a guest is known to it before it runs).
// Only recovery makes guests: without it nobody is asked.
func (s *safeSockets) hostsGuests() bool {
	if s.guests.Load() {
		return true
	}
	if !recoveryOn() {
		return false
	}
	var r struct {
		Guests []int `json:"guests"`
	}
	if err := s.loc.get("/v1/jobs/"+url.PathEscape(s.job)+"/guests", nil, &r); err != nil {
		logf("whether ranks of other nodes run here is not known (%v): a connection from this node is taken for plain TCP", err)
		return false
	}
	if len(r.Guests) > 0 {
		debugf("ranks of nodes %v run here: connections from this node are read for a radic hello", r.Guests)
		s.guests.Store(true)
	}
	return len(r.Guests) > 0
}

// acceptAs makes fd, which the app accepted, connection h.id.
func (s *safeSockets) acceptAs(fd int, h *heldConn) bool {
	c := s.newConn(fd, h.id, false, s.acceptedName(fd), h.paddr)
	if c == nil {
		return true
	}
	c.ctlAddr = h.ctlAddr
	debugf("connection %s: accepted from %s", c, h.paddr)
	if p := s.takePending(h.id); p != nil {
		p.adopt(c)
	}
	s.retireStandIns(h.id)
	return true
}

// acceptedName is the app's name for its end of an accepted connection:
// this node's logical address, never the address the connection came in
// on (that is the node's current one, and a node list read before a move
// would not know it, or the loopback address of a stand-in).
func (s *safeSockets) acceptedName(fd int) netip.AddrPort {
	local, _ := sockName(fd, false)
	self, ok := s.loc.self()
	if !ok {
		self = s.loc.logical(local.Addr())
	}
	return netip.AddrPortFrom(self, local.Port())
}

// known reports whether connection id is, or was, one of the app's.
func (s *safeSockets) known(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[id] != nil || s.gone[id]
}

func (s *safeSockets) tryRegister(port uint16) bool {
	if err := s.register("POST", port); err != nil {
		logf("cannot register listener port %d with radicd (%v): connections to it are plain TCP", port, err)
		return false
	}
	return true
}

func (s *safeSockets) register(method string, port uint16) error {
	// node: our logical node, which a rank restarted elsewhere keeps
	// listening on (its daemon is another node's).
	body := fmt.Sprintf(`{"job":%q,"port":%d,"lpid":%q,"ctl_port":%d,"node":%d}`, s.job, port, s.lpidName, s.ctlPort, s.loc.node)
	req, err := newRequest(method, "http://"+s.loc.daemon+"/v1/listeners", body)
	if err != nil {
		return err
	}
	resp, err := s.loc.hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("radicd said %s", resp.Status)
	}
	return nil
}

// ---- fds coming and going ---------------------------------------------------

func (s *safeSockets) newConn(fd int, id uint64, initiator bool, laddr, paddr netip.AddrPort) *conn {
	nb := C.radic_sock_getfl(C.int(fd))&C.O_NONBLOCK != 0
	cc := C.radic_conn_new(C.int(fd), C.uint64_t(id), boolInt(nb))
	if cc == nil {
		logf("out of memory for a connection: fd %d stays plain TCP", fd)
		return nil
	}
	C.radic_conn_set_names(cc, ip4(laddr.Addr()), C.uint16_t(laddr.Port()), ip4(paddr.Addr()), C.uint16_t(paddr.Port()))
	c := &conn{s: s, c: cc, id: id, initiator: initiator, laddr: laddr, paddr: paddr,
		fds: []int{fd}, kick: make(chan struct{}, 1), room: make(chan struct{}, 1),
		end: math.MaxUint64}
	c.lastHeard.Store(time.Now().UnixNano())
	switch {
	case s.replay.logged(id):
		s.replay.attach(c)
	case !initiator:
		// Accepted: a determinant too (the connect's is logged before its
		// hello). Not held: the app's first send on it holds the log.
		C.radic_log_conn(C.RADIC_LOG_ACCEPT, C.uint64_t(id), C.uint64_t(laddr.Port()), 0)
	}
	s.monitoring.Do(func() { go s.monitor() })
	s.mu.Lock()
	s.byFd[fd] = c
	s.byID[id] = c
	s.byPtr[cc] = c
	s.mu.Unlock()
	if !initiator && s.replay != nil {
		s.nextAccept(laddr.Port(), id)
	}
	return c
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

func (s *safeSockets) lookup(fd int) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byFd[fd]
}

func (s *safeSockets) dup(oldfd, newfd int) {
	s.mu.Lock()
	c := s.byFd[oldfd]
	if c != nil {
		s.byFd[newfd] = c
	}
	port, isListener := s.listeners[oldfd]
	if isListener {
		s.listeners[newfd] = port
	}
	if ip, ok := s.bound[oldfd]; ok {
		s.bound[newfd] = ip
	}
	s.mu.Unlock()
	switch {
	case c != nil:
		c.mu.Lock()
		c.fds = append(c.fds, newfd)
		c.mu.Unlock()
		C.radic_conn_attach(c.c, C.int(newfd))
	case isListener:
		C.radic_fd_set(C.int(newfd), C.RADIC_FD_LISTENER)
	default:
		C.radic_fd_set(C.int(newfd), C.RADIC_FD_CANDIDATE)
	}
}

// closeFd: the app is closing fd. The last fd of a connection hands the
// socket to a private duplicate that lingers until the peer has every byte.
func (s *safeSockets) closeFd(fd int) {
	s.mu.Lock()
	c := s.byFd[fd]
	delete(s.byFd, fd)
	port, isListener := s.listeners[fd]
	delete(s.listeners, fd)
	delete(s.bound, fd)
	stillListening := false
	for _, p := range s.listeners {
		stillListening = stillListening || p == port
	}
	s.mu.Unlock()
	if isListener && !stillListening {
		go s.register("DELETE", port) //nolint:errcheck // best effort: the listener is gone either way
	}
	if c == nil {
		return
	}
	c.mu.Lock()
	for i, f := range c.fds {
		if f == fd {
			c.fds = append(c.fds[:i], c.fds[i+1:]...)
			break
		}
	}
	last := len(c.fds) == 0
	if last {
		if d := int(C.radic_sock_dup(C.int(fd))); d >= 0 {
			c.fds = []int{d}
		}
	}
	c.mu.Unlock()
	if last {
		c.close()
	}
}

// ---- what C asks of Go ------------------------------------------------------

func (s *safeSockets) byConn(cc *C.struct_radic_conn) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byPtr[cc]
}

//export radic_go_broken
func radic_go_broken(cc *C.struct_radic_conn, gen C.uint32_t, err C.int, eof C.int, nonblock C.int) C.int {
	if safe == nil {
		return 0
	}
	c := safe.byConn(cc)
	if c == nil {
		return 0
	}
	if eof == 0 {
		c.breakOn(uint32(gen), int(err), "the socket failed: "+errnoName(int(err)))
		return 0
	}
	// An end of stream: fine if the close marker arrives, a failure if not.
	if nonblock != 0 {
		if c.eofPending.CompareAndSwap(false, true) {
			go func() {
				ended := c.awaitMarker()
				c.eofPending.Store(false)
				if !ended {
					c.breakOn(uint32(gen), 0, "the peer's end of stream came without a close marker")
				}
			}()
		}
		return 0
	}
	if c.awaitMarker() {
		return 1
	}
	c.breakOn(uint32(gen), 0, "the peer's end of stream came without a close marker")
	return 0
}

//export radic_go_wait_room
func radic_go_wait_room(cc *C.struct_radic_conn) {
	if safe == nil {
		return
	}
	if c := safe.byConn(cc); c != nil {
		select {
		case <-c.room:
		case <-time.After(heartbeat):
		}
	}
}

//export radic_go_ack_due
func radic_go_ack_due(cc *C.struct_radic_conn) {
	if safe == nil {
		return
	}
	if c := safe.byConn(cc); c != nil {
		c.poke()
	}
}

// dispatch handles a call C handed to Go under the job policy.
func (s *safeSockets) dispatch(c *C.struct_radic_call) C.int {
	fd := int(c.fd)
	switch int(c.op) {
	case C.RADIC_OP_connect:
		ret, e, ok := s.connect(fd, C.radic_arg_ptr(c.args[0]), int(c.args[1]))
		if !ok {
			return C.RADIC_PASS
		}
		c.ret, c.err = C.long(ret), C.int(e)
		return C.RADIC_DONE
	case C.RADIC_OP_bind:
		if ret, e, ok := s.bind(fd, C.radic_arg_ptr(c.args[0]), int(c.args[1])); ok {
			c.ret, c.err = C.long(ret), C.int(e)
			return C.RADIC_DONE
		}
	case C.RADIC_OP_getsockname:
		if ret, e, ok := s.getsockname(fd, C.radic_arg_ptr(c.args[0]), C.radic_arg_ptr(c.args[1])); ok {
			c.ret, c.err = C.long(ret), C.int(e)
			return C.RADIC_DONE
		}
	case C.RADIC_OP_listen:
		if C.radic_fd_get(c.fd)&C.RADIC_FD_CANDIDATE == 0 {
			return C.RADIC_PASS
		}
		ret, e := s.listen(fd, int(c.args[0]))
		c.ret, c.err = C.long(ret), C.int(e)
		return C.RADIC_DONE
	case C.RADIC_OP_accept:
		if C.radic_fd_get(c.fd)&C.RADIC_FD_LISTENER != 0 && !s.accept(fd, int(c.args[0])) {
			c.ret = C.RADIC_ACCEPT_HIDE
			return C.RADIC_DONE
		}
		s.inheritBinding(fd, int(c.args[0]))
	case C.RADIC_OP_dup:
		s.dup(fd, int(c.args[0]))
	case C.RADIC_OP_close:
		s.closeFd(fd)
	case C.RADIC_OP_shutdown:
		if conn := s.lookup(fd); conn != nil {
			return conn.shutdown(int(c.args[0]), c)
		}
	case C.RADIC_OP_setsockopt:
		if conn := s.lookup(fd); conn != nil {
			conn.recordOpt(int(c.args[0]), int(c.args[1]), C.radic_arg_ptr(c.args[2]), int(c.args[3]))
		}
	}
	return C.RADIC_PASS
}

// exit runs at process end: every connection still open gets its close
// marker, and the process waits (bounded) until the peers have every byte.
func (s *safeSockets) exit() {
	flushLogAtExit()
	s.mu.Lock()
	var open []*conn
	seen := map[*conn]bool{}
	for _, c := range s.byFd {
		if !seen[c] {
			seen[c] = true
			open = append(open, c)
		}
	}
	s.mu.Unlock()
	for _, c := range open {
		c.close()
	}
	done := make(chan struct{})
	go func() { s.lingering.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(min(s.deadline, 10*time.Second)):
		logf("exiting with connections whose last bytes the peer has not acknowledged")
	}
}
