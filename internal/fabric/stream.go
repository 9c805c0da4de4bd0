package fabric

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/radic-project/radic/bulktransport"
	"github.com/radic-project/radic/heartbeat"
)

// Streams: a byte stream between two daemons over delta-t (net.Conn), so
// that radicd's critical data (the message log's replication streams)
// travels on the fabric as its TCP streams do on IP. A stream is a
// sequence of delta-t messages between the two nodes, whose 24 bytes of
// metadata (bulk messaging's application data) name it:
//
//	0  'S'           1
//	1  kind          1   1 open, 2 data, 3 close, 4 refused
//	2  service       1   what the opener wants (ServiceReplica)
//	3  from dialer   1   1: sent by the side that opened it
//	4  stream id     8   chosen at random by the opener
//	12 seq           8   the message's number in its direction, from 0
//
// The endpoint delivers a pair's messages reliably but not in order
// across protocols (a bulk message is delivered once its data is pulled,
// a later short one at once), so the receiver puts a stream's messages
// back in seq order.
//
// There is no handshake, as delta-t has none: the open carries the
// opener's first bytes (its request, up to maxHello), and data may
// follow at once. The
// other side answers refused if nothing accepts the service. Delta-t
// delivers the messages of one pair of nodes reliably and in order, so a
// stream's bytes arrive in order; a message that delta-t gives up on
// (after R, deltat.DefaultR) breaks the stream, as a reset breaks a TCP
// connection, and both ends see an error. Messages up to streamChunk
// bytes go by the protocol the endpoint picks for their size (a large
// one by bulk remote get); a writer has at most streamWindow of them in
// flight.

// Services a stream can ask for.
const (
	ServiceReplica = 1 // a node's log stream to its protector (radicd repl.go)
	ServiceHTTP    = 2 // radicd's HTTP API between daemons (Listener)
	numServices    = 3
)

// ServiceName names a service for metrics and logs.
func ServiceName(service byte) string {
	switch service {
	case ServiceReplica:
		return "replica"
	case ServiceHTTP:
		return "http"
	}
	return fmt.Sprintf("service-%d", service)
}

// StreamBytes is what this node's streams of service have received and
// written.
func (f *Fabric) StreamBytes(service byte) (in, out uint64) {
	if int(service) >= numServices {
		return 0, 0
	}
	return f.streamIn[service].Load(), f.streamOut[service].Load()
}

const (
	streamOpen      = 1
	streamData      = 2
	streamClose     = 3
	streamRefused   = 4
	streamChunk     = 64 << 10 // bytes per message
	streamWindow    = 32       // messages a writer has in flight
	streamAcceptQ   = 16       // opened streams waiting for Accept
	streamMetaMagic = 'S'
	// maxHello keeps the open below the bulk threshold: it travels on
	// delta-t itself, so no later message of the stream overtakes it.
	maxHello = 4 << 10
)

// ErrRefused: nothing on the other node accepts the service.
var ErrRefused = errors.New("fabric: stream refused: nothing accepts the service on that node")

type streamKey struct {
	peer    heartbeat.NodeID
	id      uint64
	dialled bool // this side opened it
}

type early struct {
	kind byte
	data []byte
}

// Stream is one end of a stream; it implements net.Conn.
type Stream struct {
	f       *Fabric
	key     streamKey
	service byte

	mu sync.Mutex
	// +checklocks:mu
	in [][]byte // received bytes not yet read
	// +checklocks:mu
	sendSeq uint64 // the next message's seq
	// +checklocks:mu
	recvSeq uint64 // the seq of the message to take next
	// +checklocks:mu
	early map[uint64]early // messages that came before their turn
	// +checklocks:mu
	eof bool // the other side closed
	// +checklocks:mu
	err error // broken (refused, delta-t gave up, closed here)
	// +checklocks:mu
	inflight int // this side's messages without a result
	// +checklocks:mu
	readDL, writeDL time.Time
	// changed is closed, and replaced, at every change: a reader and a
	// writer may both wait, and both must see it.
	// +checklocks:mu
	changed chan struct{}
}

// Dial opens a stream to node peer for service, its first bytes hello
// (a request; may be empty). It returns at once, as delta-t has no
// handshake: a refusal comes as the first read's error.
func (f *Fabric) Dial(peer heartbeat.NodeID, service byte, hello []byte) (*Stream, error) {
	if _, ok := f.torusID[peer]; !ok {
		return nil, fmt.Errorf("fabric: no node %d on the torus", peer)
	}
	f.streamMu.Lock()
	dead := f.down[peer]
	f.streamMu.Unlock()
	if dead {
		return nil, fmt.Errorf("fabric: node %d was declared dead", peer)
	}
	if len(hello) > maxHello {
		return nil, fmt.Errorf("fabric: a %d-byte hello (at most %d)", len(hello), maxHello)
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	s := f.newStream(streamKey{peer: peer, id: binary.BigEndian.Uint64(id[:]), dialled: true}, service)
	f.streamMu.Lock()
	f.streams[s.key] = s
	f.streamMu.Unlock()
	if err := s.send(streamOpen, append([]byte(nil), hello...)); err != nil {
		s.forget()
		return nil, err
	}
	return s, nil
}

// Listen makes service accept streams; they come on the channel with
// their opener's hello.
func (f *Fabric) Listen(service byte) <-chan Accepted {
	f.streamMu.Lock()
	defer f.streamMu.Unlock()
	ch, ok := f.listeners[service]
	if !ok {
		ch = make(chan Accepted, streamAcceptQ)
		f.listeners[service] = ch
	}
	return ch
}

// Accepted is a stream another node opened, with its hello.
type Accepted struct {
	Stream *Stream
	Hello  []byte
}

func (f *Fabric) newStream(k streamKey, service byte) *Stream {
	return &Stream{f: f, key: k, service: service, changed: make(chan struct{})}
}

// Peer is the node at the other end.
func (s *Stream) Peer() heartbeat.NodeID { return s.key.peer }

func (s *Stream) meta(kind byte, seq uint64) (m [24]byte) {
	m[0], m[1], m[2] = streamMetaMagic, kind, s.service
	if s.key.dialled {
		m[3] = 1
	}
	binary.BigEndian.PutUint64(m[4:], s.key.id)
	binary.BigEndian.PutUint64(m[12:], seq)
	return m
}

// send hands one message to the endpoint; data must not change until
// its result (bulk reads it in place).
func (s *Stream) send(kind byte, data []byte) error {
	f := s.f
	f.epMu.Lock()
	s.mu.Lock()
	seq := s.sendSeq
	s.mu.Unlock()
	id, err := f.ep.WriteMsg(time.Now(), bulktransport.Msg{Peer: f.torusID[s.key.peer], Meta: s.meta(kind, seq), Data: data})
	if err == nil {
		f.writes[id] = s
		s.mu.Lock()
		s.sendSeq++
		s.inflight++ // before the result can come
		s.mu.Unlock()
	}
	f.epMu.Unlock()
	if err != nil {
		return fmt.Errorf("fabric: stream to node %d: %w", s.key.peer, err)
	}
	f.flush()
	return nil
}

// poke wakes every waiter. The caller must not hold s.mu.
func (s *Stream) poke() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// wait sleeps until changed is closed, dl passes or the fabric closes.
func (s *Stream) wait(changed <-chan struct{}, dl time.Time) error {
	var timeout <-chan time.Time
	if !dl.IsZero() {
		d := time.Until(dl)
		if d <= 0 {
			return os.ErrDeadlineExceeded
		}
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-changed:
		return nil
	case <-timeout:
		return os.ErrDeadlineExceeded
	case <-s.f.done:
		return net.ErrClosed
	}
}

// Read implements net.Conn.
func (s *Stream) Read(b []byte) (int, error) {
	for {
		s.mu.Lock()
		if len(s.in) > 0 {
			n := copy(b, s.in[0])
			if s.in[0] = s.in[0][n:]; len(s.in[0]) == 0 {
				s.in = s.in[1:]
			}
			s.mu.Unlock()
			return n, nil
		}
		err, eof, dl, changed := s.err, s.eof, s.readDL, s.changed
		s.mu.Unlock()
		switch {
		case err != nil:
			return 0, err
		case eof:
			return 0, io.EOF
		}
		if err := s.wait(changed, dl); err != nil {
			return 0, err
		}
	}
}

// Write implements net.Conn: the bytes are copied into messages of up to
// streamChunk, with at most streamWindow in flight.
func (s *Stream) Write(b []byte) (int, error) {
	done := 0
	for done < len(b) {
		s.mu.Lock()
		err, full, dl, changed := s.err, s.inflight >= streamWindow, s.writeDL, s.changed
		s.mu.Unlock()
		if err != nil {
			return done, err
		}
		if full {
			if err := s.wait(changed, dl); err != nil {
				return done, err
			}
			continue
		}
		n := min(len(b)-done, streamChunk)
		if err := s.send(streamData, append([]byte(nil), b[done:done+n]...)); err != nil {
			s.fail(err)
			return done, err
		}
		if int(s.service) < numServices {
			s.f.streamOut[s.service].Add(uint64(n))
		}
		done += n
	}
	return done, nil
}

// Close implements net.Conn: the other side reads EOF once it has the
// bytes sent before.
func (s *Stream) Close() error {
	s.mu.Lock()
	open := s.err == nil
	if open {
		s.err = net.ErrClosed
	}
	s.mu.Unlock()
	if open {
		_ = s.send(streamClose, nil)
	}
	s.forget()
	s.poke()
	return nil
}

func (s *Stream) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.forget()
	s.poke()
}

// Streams is the number of streams open on this node.
func (f *Fabric) Streams() int {
	f.streamMu.Lock()
	defer f.streamMu.Unlock()
	return len(f.streams)
}

func (s *Stream) forget() {
	s.f.streamMu.Lock()
	if s.f.streams[s.key] == s {
		delete(s.f.streams, s.key)
	}
	s.f.streamMu.Unlock()
}

// result is delta-t's word on one of this side's messages.
func (s *Stream) result(err error) {
	s.mu.Lock()
	s.inflight--
	s.mu.Unlock()
	if err != nil {
		s.fail(fmt.Errorf("fabric: stream to node %d broken: %w", s.key.peer, err))
		return
	}
	s.poke()
}

// LocalAddr implements net.Conn.
func (s *Stream) LocalAddr() net.Addr { return Addr(s.f.self) }

// RemoteAddr implements net.Conn.
func (s *Stream) RemoteAddr() net.Addr { return Addr(s.key.peer) }

// SetDeadline implements net.Conn.
func (s *Stream) SetDeadline(t time.Time) error {
	s.mu.Lock()
	s.readDL, s.writeDL = t, t
	s.mu.Unlock()
	s.poke()
	return nil
}

// SetReadDeadline implements net.Conn.
func (s *Stream) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	s.readDL = t
	s.mu.Unlock()
	s.poke()
	return nil
}

// SetWriteDeadline implements net.Conn.
func (s *Stream) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	s.writeDL = t
	s.mu.Unlock()
	s.poke()
	return nil
}

// Addr is a node on the fabric as a net.Addr.
type Addr heartbeat.NodeID

// Network implements net.Addr.
func (a Addr) Network() string { return "radic-bg" }

func (a Addr) String() string { return fmt.Sprintf("node %d", heartbeat.NodeID(a)) }

// deliverStream takes a received message that belongs to a stream.
func (f *Fabric) deliverStream(from heartbeat.NodeID, meta [24]byte, data []byte) {
	if meta[0] != streamMetaMagic {
		f.log.Debug("fabric: a message that is not a stream's", "from", from)
		return
	}
	kind, service := meta[1], meta[2]
	// The key as this side knows it: the opener's messages carry 1.
	k := streamKey{peer: from, id: binary.BigEndian.Uint64(meta[4:]), dialled: meta[3] == 0}
	f.streamMu.Lock()
	s := f.streams[k]
	var accept chan Accepted
	if s == nil && kind == streamOpen {
		if accept = f.listeners[service]; accept != nil {
			s = f.newStream(k, service)
			s.recvSeq = 1 // the open was message 0
			f.streams[k] = s
		}
	}
	f.streamMu.Unlock()
	switch {
	case kind == streamOpen && accept != nil:
		select {
		case accept <- Accepted{Stream: s, Hello: data}:
		default:
			s.forget()
			f.refuse(k, service)
		}
		return
	case kind == streamOpen:
		f.refuse(k, service)
		return
	case s == nil:
		return // a stream this side closed or never knew: its tail
	}
	seq := binary.BigEndian.Uint64(meta[12:])
	s.mu.Lock()
	refused := false
	if seq != s.recvSeq {
		if s.early == nil {
			s.early = map[uint64]early{}
		}
		s.early[seq] = early{kind, data}
	} else {
		for {
			switch kind {
			case streamData:
				if len(data) > 0 {
					s.in = append(s.in, data)
					if int(service) < numServices {
						f.streamIn[service].Add(uint64(len(data)))
					}
				}
			case streamClose:
				s.eof = true
			case streamRefused:
				refused = true
				if s.err == nil {
					s.err = fmt.Errorf("%w (node %d, service %d)", ErrRefused, from, service)
				}
			}
			s.recvSeq++
			e, ok := s.early[s.recvSeq]
			if !ok {
				break
			}
			delete(s.early, s.recvSeq)
			kind, data = e.kind, e.data
		}
	}
	s.mu.Unlock()
	if refused {
		s.forget()
	}
	s.poke()
}

// refuse answers an open that nothing takes.
func (f *Fabric) refuse(k streamKey, service byte) {
	s := f.newStream(streamKey{peer: k.peer, id: k.id, dialled: k.dialled}, service)
	_ = s.send(streamRefused, nil) // its result finds no stream: fine
}

// Listener is a net.Listener of the streams other nodes open for one
// service: radicd serves its HTTP API to the other daemons on the fabric
// with it. A stream's hello is the first bytes it reads.
type Listener struct {
	f         *Fabric
	service   byte
	accepted  <-chan Accepted
	done      chan struct{}
	closeOnce sync.Once
}

var _ net.Listener = (*Listener)(nil)

// Listener accepts service's streams until Close.
func (f *Fabric) Listener(service byte) *Listener {
	return &Listener{f: f, service: service, accepted: f.Listen(service), done: make(chan struct{})}
}

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case a := <-l.accepted:
		if len(a.Hello) > 0 {
			a.Stream.mu.Lock()
			a.Stream.in = append([][]byte{a.Hello}, a.Stream.in...)
			a.Stream.mu.Unlock()
		}
		return a.Stream, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-l.f.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener: no more streams are accepted (those
// opened meanwhile are refused).
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.done)
		l.f.streamMu.Lock()
		delete(l.f.listeners, l.service)
		l.f.streamMu.Unlock()
	})
	return nil
}

// Addr implements net.Listener.
func (l *Listener) Addr() net.Addr { return Addr(l.f.self) }
