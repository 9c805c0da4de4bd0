package bulktransport

import (
	"errors"
	"fmt"
	"time"

	"github.com/radic-project/radic/bulktransport/bulk"
	"github.com/radic-project/radic/bulktransport/deltat"
	"github.com/radic-project/radic/bulktransport/frag"
	"github.com/radic-project/radic/netsim"
)

// Protocol is how a message travels, chosen by size as UCX chooses
// between short, buffered-copy and zero-copy (seed 002).
type Protocol uint8

// Protocols, cheapest first for their size range.
const (
	// Short: one delta-t segment, one torus packet, delivered by
	// reference to the packet.
	Short Protocol = iota + 1
	// Copy: a fragmented copy, the message copied into consecutive
	// delta-t segments and reassembled in order.
	Copy
	// Bulk: a 32-byte Get over delta-t, then the receiver pulls the data
	// from the sender's buffer with remote gets; no copy at the sender.
	Bulk
)

func (p Protocol) String() string {
	switch p {
	case Short:
		return "short"
	case Copy:
		return "copy"
	case Bulk:
		return "bulk"
	}
	return fmt.Sprintf("Protocol(%d)", uint8(p))
}

// Message kinds: the first byte of every delta-t message this layer
// sends (exported for trace decoders).
const (
	KindApp     = 1 // application data follows
	KindAppMeta = 2 // 24 bytes of metadata, then application data
	KindBulk    = 3 // a bulk control message follows
)

// DefaultBulkMin is the size from which messages go by bulk remote get.
// BenchmarkProtocols measures the crossover on the pure cores: below a
// few KiB the Get/RGet/Ack round trips cost more than copying the data
// into delta-t segments.
const DefaultBulkMin = 8 << 10

// Config configures an Endpoint.
type Config struct {
	Shape netsim.Shape
	Self  netsim.NodeID
	// ShortMax is the largest message sent Short; default: what fits one
	// segment after the kind byte.
	ShortMax int
	// BulkMin is the smallest message sent Bulk (default DefaultBulkMin);
	// in between, Copy.
	BulkMin int
	DeltaT  deltat.Config // Headroom is set to the torus header's length
	Bulk    bulk.Config   // Self is set from Self
}

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	if c.ShortMax == 0 {
		c.ShortMax = deltat.SegData - 1
	}
	if c.BulkMin == 0 {
		c.BulkMin = DefaultBulkMin
	}
	c.Bulk.Self = uint16(c.Self)
	// Delta-t builds each segment with room for the torus header in
	// front, and the packet goes out without another copy.
	c.DeltaT.Headroom = netsim.TorusHeaderLen
}

// Select is the protocol for an n-byte message with or without metadata.
func (c *Config) Select(n int, meta bool) Protocol {
	switch {
	case n >= c.BulkMin:
		return Bulk
	case meta && n+bulk.MetaLen <= c.ShortMax, !meta && n <= c.ShortMax:
		return Short
	}
	return Copy
}

// Msg is a message handed between layers by reference (seed 001,
// readmsg/writemsg): a Bulk WriteMsg keeps Data without copying until the
// receiver's Ack (the remote gets read it in place), and ReadMsg returns
// Data pointing into the packet (Short) or the reassembly or remote-get
// buffer, never a copy made for the reader.
type Msg struct {
	Peer  netsim.NodeID
	Meta  [bulk.MetaLen]byte // application data carried beside the message
	Data  []byte
	Proto Protocol // on ReadMsg, how it came
}

// Result is the end of a WriteMsg: Err nil when the receiver has it.
type Result struct {
	ID   uint64
	Peer netsim.NodeID
	Err  error
}

// Errors.
var (
	ErrNotForMe = errors.New("bulktransport: packet for another node")
	ErrGaveUp   = errors.New("bulktransport: delta-t gave up after R")
)

// Ready is what the endpoint wants done: whole torus packets to put on
// the link, finished writes, and when to call Tick.
//
// The link owns the packets, and may change their torus header (it counts
// hops), but not their payload: the first transmission of a delta-t
// segment is the buffer the endpoint keeps, and copies from, to
// retransmit it.
type Ready struct {
	Packets  [][]byte
	Results  []Result
	NextTick time.Time
}

// peer is what is resolved once per peer rather than per packet: the
// torus header with both coordinates. It lives only while the peer has
// protocol state.
type peer struct {
	hdr [netsim.TorusHeaderLen]byte
}

// Endpoint is one node's transport stack over the torus: delta-t, bulk
// messaging and fragmentation behind WriteMsg/ReadMsg and datagrams. It
// is a pure core like the layers it composes.
type Endpoint struct {
	cfg       Config
	self      netsim.Coord
	dt        *deltat.Endpoint
	bk        *bulk.Node
	fr        *frag.Reassembler
	fs        frag.Sender
	peers     map[netsim.NodeID]*peer
	bulkIDs   map[uint32]uint64 // bulk tag -> WriteMsg id
	nextID    uint64
	inbox     []Msg
	datagrams []Msg
	out       Ready
}

// New makes an endpoint.
func New(cfg Config) (*Endpoint, error) {
	cfg.SetDefaults()
	if err := cfg.Shape.Validate(); err != nil {
		return nil, err
	}
	if int(cfg.Self) >= cfg.Shape.Nodes() || cfg.Self > bulk.MaxNode {
		return nil, fmt.Errorf("%w: node %d", bulk.ErrNode, cfg.Self)
	}
	dt, err := deltat.New(cfg.DeltaT)
	if err != nil {
		return nil, err
	}
	return &Endpoint{cfg: cfg, self: cfg.Shape.Coord(cfg.Self), dt: dt, bk: bulk.New(cfg.Bulk), fr: frag.NewReassembler()}, nil
}

// Config returns the defaulted configuration.
func (e *Endpoint) Config() Config { return e.cfg }

// State is the number of protocol records held (delta-t records, bulk
// transfers and regions, partial datagrams, resolved peers). Zero once
// every peer has been quiet for the timers.
func (e *Endpoint) State() int {
	return e.dt.Records() + e.bk.Active() + e.fr.Pending() + len(e.peers) + len(e.bulkIDs)
}

// Stats of the layers.
func (e *Endpoint) Stats() (deltat.Stats, bulk.Stats, frag.Stats) {
	return e.dt.Stats, e.bk.Stats, e.fr.Stats
}

func (e *Endpoint) peer(id netsim.NodeID) *peer {
	p := e.peers[id]
	if p == nil {
		p = new(peer)
		netsim.AppendTorus(p.hdr[:0], netsim.TorusHeader{Src: e.self, Dst: e.cfg.Shape.Coord(id)}, nil)
		if e.peers == nil {
			e.peers = map[netsim.NodeID]*peer{}
		}
		e.peers[id] = p
	}
	return p
}

// packet builds a torus packet to id from a bulk data-path packet: the
// single copy of the payload onto the wire (a Data packet's body is a
// slice of the writer's buffer). With cache, the header comes from the
// resolved peer; a packet that leaves no protocol state behind (an RNak)
// must not resolve one, as no timer would forget it.
func (e *Endpoint) packet(id netsim.NodeID, proto netsim.Proto, head, body []byte, cache bool) {
	b := make([]byte, 0, netsim.TorusHeaderLen+len(head)+len(body))
	if cache {
		b = append(b, e.peer(id).hdr[:]...)
	} else {
		b = netsim.AppendTorus(b, netsim.TorusHeader{Src: e.self, Dst: e.cfg.Shape.Coord(id)}, nil)
	}
	b = append(append(b, head...), body...)
	b[1], b[3] = byte(proto), byte(len(head)+len(body))
	e.out.Packets = append(e.out.Packets, b)
}

// WriteMsg sends m.Data (and m.Meta) to m.Peer reliably, by the protocol
// Select picks. Short and Copy copy the data into delta-t segments before
// returning; Bulk keeps m.Data by reference until the Result with the
// returned id, and the caller must not change it before.
func (e *Endpoint) WriteMsg(now time.Time, m Msg) (uint64, error) {
	if int(m.Peer) >= e.cfg.Shape.Nodes() {
		return 0, fmt.Errorf("%w: node %d", bulk.ErrNode, m.Peer)
	}
	e.nextID++
	id := e.nextID
	meta := m.Meta != [bulk.MetaLen]byte{}
	var err error
	switch e.cfg.Select(len(m.Data), meta) {
	case Bulk:
		var tag uint32
		if tag, err = e.bk.Write(now, uint16(m.Peer), m.Meta, m.Data); err == nil {
			if e.bulkIDs == nil {
				e.bulkIDs = map[uint32]uint64{}
			}
			e.bulkIDs[tag] = id
		}
	default:
		var prefix [1 + bulk.MetaLen]byte
		prefix[0] = KindApp
		p := prefix[:1]
		if meta {
			prefix[0] = KindAppMeta
			copy(prefix[1:], m.Meta[:])
			p = prefix[:]
		}
		err = e.dt.SendPrefixed(now, deltat.Peer(m.Peer), p, m.Data, id)
	}
	if err != nil {
		return 0, err
	}
	e.drain(now)
	return id, nil
}

// ReadMsg returns the next received message, if any. A Bulk message's
// buffer counts against the receive budget until Release.
func (e *Endpoint) ReadMsg() (Msg, bool) {
	if len(e.inbox) == 0 {
		return Msg{}, false
	}
	m := e.inbox[0]
	e.inbox[0] = Msg{}
	e.inbox = e.inbox[1:]
	if len(e.inbox) == 0 {
		e.inbox = nil
	}
	return m, true
}

// Release returns a read Bulk message's buffer to the receive budget.
func (e *Endpoint) Release(m Msg) {
	if m.Proto == Bulk {
		e.bk.Release(len(m.Data))
	}
}

// SendDatagram sends data (up to 64 KiB) unreliably, fragmented; for
// traffic that is repeated anyway, like heartbeats. It keeps no state for
// dst (the torus header is built here, not cached: no timer would forget
// it).
func (e *Endpoint) SendDatagram(dst netsim.NodeID, data []byte) error {
	if int(dst) >= e.cfg.Shape.Nodes() {
		return fmt.Errorf("%w: node %d", bulk.ErrNode, dst)
	}
	h := netsim.TorusHeader{Proto: netsim.ProtoFrag, Src: e.self, Dst: e.cfg.Shape.Coord(dst)}
	return e.fs.Split(data, func(f []byte) {
		e.out.Packets = append(e.out.Packets, netsim.AppendTorus(make([]byte, 0, netsim.TorusHeaderLen+len(f)), h, f))
	})
}

// ReadDatagram returns the next received datagram, if any.
func (e *Endpoint) ReadDatagram() (Msg, bool) {
	if len(e.datagrams) == 0 {
		return Msg{}, false
	}
	m := e.datagrams[0]
	e.datagrams = e.datagrams[1:]
	if len(e.datagrams) == 0 {
		e.datagrams = nil
	}
	return m, true
}

// Step handles a torus packet addressed to this node; the endpoint keeps
// references into pkt.
func (e *Endpoint) Step(now time.Time, pkt []byte) error {
	h, payload, err := netsim.DecodeTorus(pkt)
	if err != nil {
		return err
	}
	if h.Dst != e.self || !e.cfg.Shape.Contains(h.Src) {
		return ErrNotForMe
	}
	src := e.cfg.Shape.ID(h.Src)
	switch h.Proto {
	case netsim.ProtoDeltaT:
		err = e.dt.Step(now, deltat.Peer(src), payload)
	case netsim.ProtoBulk:
		if src > bulk.MaxNode {
			return bulk.ErrNode
		}
		err = e.bk.StepData(now, uint16(src), payload)
	case netsim.ProtoFrag:
		var msg []byte
		var done bool
		if msg, done, err = e.fr.Step(now, uint32(src), payload); done {
			e.datagrams = append(e.datagrams, Msg{Peer: src, Data: msg})
		}
	default:
		return fmt.Errorf("bulktransport: protocol %v", h.Proto)
	}
	e.drain(now)
	return err
}

// Tick runs the layers' timers.
func (e *Endpoint) Tick(now time.Time) {
	e.dt.Tick(now)
	e.bk.Tick(now)
	e.fr.Tick(now)
	e.drain(now)
	e.forgetIdlePeers()
}

// forgetIdlePeers drops resolved peers that no longer have protocol
// state, so that an idle endpoint holds nothing per peer.
func (e *Endpoint) forgetIdlePeers() {
	if len(e.peers) == 0 {
		return
	}
	if e.dt.Records() == 0 && e.bk.Active() == 0 {
		e.peers = nil
		return
	}
	if e.bk.Active() == 0 && e.dt.Records() < len(e.peers)/2 {
		for id := range e.peers {
			if !e.dt.Has(deltat.Peer(id)) {
				delete(e.peers, id)
			}
		}
	}
}

// drain moves the layers' output: delta-t packets to the wire, delta-t
// messages to the inbox or the bulk core, bulk control into delta-t and
// bulk data to the wire, completions to Results.
func (e *Endpoint) drain(now time.Time) {
	for {
		// Bulk control goes into delta-t, and delta-t delivers bulk
		// control to the bulk core, which may answer: loop until both
		// are empty. Each round only answers messages delivered in the
		// previous one, so it ends.
		b := e.bk.Ready()
		for _, c := range b.Control {
			e.dt.SendPrefixed(now, deltat.Peer(c.To), []byte{KindBulk}, c.B, 0)
		}
		for _, p := range b.Packets {
			e.packet(netsim.NodeID(p.To), netsim.ProtoBulk, p.Head, p.Body, p.Head[0] != byte(bulk.OpRNak))
		}
		for _, m := range b.Messages {
			e.inbox = append(e.inbox, Msg{Peer: netsim.NodeID(m.From), Meta: m.Meta, Data: m.Data, Proto: Bulk})
		}
		for _, r := range b.Results {
			id := e.bulkIDs[r.Tag]
			delete(e.bulkIDs, r.Tag)
			if len(e.bulkIDs) == 0 {
				e.bulkIDs = nil
			}
			e.out.Results = append(e.out.Results, Result{ID: id, Peer: netsim.NodeID(r.To), Err: r.Err})
		}
		d := e.dt.Ready()
		for _, p := range d.Packets {
			// Delta-t left room for the torus header in front of the
			// segment: no copy.
			f := p.Frame
			copy(f, e.peer(netsim.NodeID(p.To)).hdr[:])
			f[1], f[3] = byte(netsim.ProtoDeltaT), byte(len(p.B))
			e.out.Packets = append(e.out.Packets, f)
		}
		for _, a := range d.Acked {
			if a.Tag != 0 {
				e.out.Results = append(e.out.Results, Result{ID: a.Tag, Peer: netsim.NodeID(a.Peer)})
			}
		}
		for _, f := range d.Failures {
			for _, tag := range f.Tags {
				if tag != 0 {
					e.out.Results = append(e.out.Results, Result{ID: tag, Peer: netsim.NodeID(f.Peer), Err: ErrGaveUp})
				}
			}
		}
		control := false
		for _, m := range d.Messages {
			control = e.deliver(now, m) || control
		}
		if !control && len(b.Control) == 0 {
			return
		}
	}
}

// deliver handles one delta-t message; it reports whether it went to the
// bulk core (which may then have output).
func (e *Endpoint) deliver(now time.Time, m deltat.Message) bool {
	if len(m.Data) == 0 {
		return false
	}
	from := netsim.NodeID(m.From)
	switch m.Data[0] {
	case KindApp:
		proto := Short
		if len(m.Data) > deltat.SegData {
			proto = Copy
		}
		e.inbox = append(e.inbox, Msg{Peer: from, Data: m.Data[1:], Proto: proto})
	case KindAppMeta:
		if len(m.Data) < 1+bulk.MetaLen {
			return false
		}
		msg := Msg{Peer: from, Data: m.Data[1+bulk.MetaLen:], Proto: Short}
		if len(m.Data) > deltat.SegData {
			msg.Proto = Copy
		}
		copy(msg.Meta[:], m.Data[1:])
		e.inbox = append(e.inbox, msg)
	case KindBulk:
		if from <= bulk.MaxNode {
			e.bk.StepControl(now, uint16(from), m.Data[1:])
			return true
		}
	}
	return false
}

// Ready drains the output.
func (e *Endpoint) Ready() Ready {
	r := e.out
	e.out = Ready{}
	// Resolved peers need no timer of their own: they exist only beside
	// delta-t records or bulk transfers, whose timers bring the Tick that
	// forgets them.
	r.NextTick = earliest(earliest(e.dt.NextTick(), e.bk.NextTick()), e.fr.NextTick())
	return r
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
