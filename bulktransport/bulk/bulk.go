// Package bulk is bulk messaging (seed 001, "Bulk messaging"): a sender
// announces a message with a 32-byte header in a Get control message; the
// receiver, if it can take it, pulls the data with remote gets, and
// acknowledges when it has all of it; if it cannot, it answers Nak. Tags
// in the control messages let a transfer be cancelled, acknowledged or
// nak'd.
//
// Remote get rather than put, for the seed's reasons: the receiver finds
// the memory and paces the transfer (flow control), and a sender that
// fails or restarts can at worst answer RNak, never write into memory the
// receiver has reused.
//
// The core is pure. Control messages (Get, Nak, Ack, Cancel) are handed
// out to be carried reliably (by delta-t); data-path packets (RGet, Data,
// RNak) are raw torus payloads, and the receiver re-requests whatever
// did not arrive. The sender never copies the message: Data packets refer
// to slices of the buffer passed to Write until the receiver's Ack.
//
//	sender                              receiver
//	Write ── Get(tag, len, meta) ─────▶ room? ── no ──▶ Nak(tag) ──▶ Failed
//	                                      │ yes: allocate len
//	      ◀──────── RGet(tag, off, n) ────┘ (a window of chunks;
//	Data(tag, off) ───────────────────▶     missing ones re-requested)
//	      ◀──────── Ack(tag) ───────────── all chunks: deliver
//	Done(tag), release the buffer
package bulk

import (
	"errors"
	"fmt"
	"time"
)

// Defaults.
const (
	DefaultMaxMessage      = 64 << 20
	DefaultMaxBuffered     = 256 << 20
	DefaultWindow          = 64 // chunks in flight per transfer
	DefaultRGetTimeout     = 20 * time.Millisecond
	DefaultTransferTimeout = 2 * time.Second
	DefaultRegionTimeout   = 10 * time.Second
)

// Config holds the limits and timers; zero fields take the defaults.
type Config struct {
	Self            uint16
	MaxMessage      int // largest message the receiver takes
	MaxBuffered     int // bytes received and not yet released by the reader
	Window          int
	RGetTimeout     time.Duration // silence before missing chunks are asked again
	TransferTimeout time.Duration // silence before a transfer is abandoned
	RegionTimeout   time.Duration // the sender keeps an unacknowledged region this long after the last request
}

func (c *Config) setDefaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defd := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.MaxMessage, DefaultMaxMessage)
	def(&c.MaxBuffered, DefaultMaxBuffered)
	def(&c.Window, DefaultWindow)
	defd(&c.RGetTimeout, DefaultRGetTimeout)
	defd(&c.TransferTimeout, DefaultTransferTimeout)
	defd(&c.RegionTimeout, DefaultRegionTimeout)
}

// Errors.
var (
	ErrTooLarge = errors.New("bulk: message too large")
	ErrNoTags   = errors.New("bulk: all tags in use")
	ErrNode     = errors.New("bulk: node id beyond 16 bits")
)

// ControlOut is a control message for To, to be carried reliably.
type ControlOut struct {
	To uint16
	B  []byte
}

// PacketOut is a data-path packet for To: Head then Body, to be sent as
// one torus payload. Body aliases the buffer given to Write.
type PacketOut struct {
	To   uint16
	Head []byte
	Body []byte
}

// Message is a received bulk message. Data is the buffer the remote gets
// filled; the reader owns it and calls Release(len(Data)) when done, which
// returns the bytes to the receive budget.
type Message struct {
	From uint16
	Meta [MetaLen]byte
	Data []byte
}

// Result reports the end of a transfer this node sent.
type Result struct {
	Tag    uint32
	To     uint16
	Err    error // nil: acknowledged
	Reason uint32
}

// ErrNak is the error of a Result the receiver refused.
var ErrNak = errors.New("bulk: receiver answered nak")

// ErrTimeout is the error of a Result nobody acknowledged.
var ErrTimeout = errors.New("bulk: transfer timed out")

// Ready is what the core wants done.
type Ready struct {
	Control  []ControlOut
	Packets  []PacketOut
	Messages []Message
	Results  []Result
	NextTick time.Time
}

// Stats count the core's decisions.
type Stats struct {
	Writes, Delivered, Naks, Cancels, RGets, Rerequests  uint64
	DataSent, DataReceived, Duplicates, Malformed, RNaks uint64
	TimedOut, FastRerequests                             uint64
}

type region struct {
	to       uint16
	data     []byte
	lastUsed time.Time
}

type xferKey struct {
	from uint16
	tag  uint32
}

type transfer struct {
	meta     [MetaLen]byte
	buf      []byte
	have     []uint64
	chunks   int
	missing  int
	nextReq  int // chunks below this have been requested
	inflight int
	lastData time.Time // last new chunk: TransferTimeout runs from here
	lastAsk  time.Time // last re-request: RGetTimeout runs from the later of the two
}

// Node is the bulk core of one node, both sending and receiving.
type Node struct {
	cfg       Config
	regions   map[uint32]*region
	transfers map[xferKey]*transfer
	nextTag   uint32
	buffered  int
	out       Ready
	Stats     Stats
}

// New makes the bulk core of node cfg.Self.
func New(cfg Config) *Node {
	cfg.setDefaults()
	return &Node{cfg: cfg}
}

// Active is the number of regions and transfers held; an idle node holds
// none.
func (n *Node) Active() int { return len(n.regions) + len(n.transfers) }

// Buffered is the bytes received and not yet released.
func (n *Node) Buffered() int { return n.buffered }

// Ready drains the output.
func (n *Node) Ready() Ready {
	r := n.out
	n.out = Ready{}
	r.NextTick = n.nextDeadline()
	return r
}

// Write sends data to dst by reference: data must not change until the
// tag's Result. meta travels in the header.
func (n *Node) Write(now time.Time, dst uint16, meta [MetaLen]byte, data []byte) (uint32, error) {
	if len(data) > n.cfg.MaxMessage || uint64(len(data)) > 1<<32-1 {
		return 0, ErrTooLarge
	}
	tag, ok := n.allocTag()
	if !ok {
		return 0, ErrNoTags
	}
	if n.regions == nil {
		n.regions = map[uint32]*region{}
	}
	n.regions[tag] = &region{to: dst, data: data, lastUsed: now}
	n.Stats.Writes++
	n.control(dst, OpGet, tag, meta, uint32(len(data)))
	return tag, nil
}

func (n *Node) allocTag() (uint32, bool) {
	for range MaxTag {
		n.nextTag = n.nextTag%MaxTag + 1 // 1..MaxTag; 0 is never a tag
		if _, used := n.regions[n.nextTag]; !used {
			return n.nextTag, true
		}
	}
	return 0, false
}

// Cancel abandons a transfer this node sent; the receiver forgets it.
func (n *Node) Cancel(tag uint32) {
	r := n.regions[tag]
	if r == nil {
		return
	}
	n.Stats.Cancels++
	n.control(r.to, OpCancel, tag, [MetaLen]byte{}, 0)
	n.dropRegion(tag)
}

// Release returns bytes of delivered messages to the receive budget.
func (n *Node) Release(bytes int) { n.buffered = max(0, n.buffered-bytes) }

func (n *Node) control(to uint16, op Op, tag uint32, meta [MetaLen]byte, word uint32) {
	c := Control{Header: Header{Src: n.cfg.Self, Dst: to, Op: op, Param: tag, Meta: meta}, Word: word}
	n.out.Control = append(n.out.Control, ControlOut{to, AppendControl(make([]byte, 0, ControlLen), c)})
}

// StepControl handles a control message from a peer (delivered by the
// reliable transport, so exactly once and in order).
func (n *Node) StepControl(now time.Time, from uint16, b []byte) error {
	c, err := DecodeControl(b)
	if err != nil {
		n.Stats.Malformed++
		return err
	}
	if c.Src != from {
		n.Stats.Malformed++
		return fmt.Errorf("%w: control from %d claims source %d", ErrBadPacket, from, c.Src)
	}
	switch c.Op {
	case OpGet:
		n.get(now, c)
	case OpNak:
		if r := n.regions[c.Param]; r != nil && r.to == from {
			n.Stats.Naks++
			n.out.Results = append(n.out.Results, Result{Tag: c.Param, To: from, Err: ErrNak, Reason: c.Word})
			n.dropRegion(c.Param)
		}
	case OpAck:
		if r := n.regions[c.Param]; r != nil && r.to == from {
			n.out.Results = append(n.out.Results, Result{Tag: c.Param, To: from})
			n.dropRegion(c.Param)
		}
	case OpCancel:
		n.dropTransfer(xferKey{from, c.Param})
	}
	return nil
}

// get answers a Get: Nak when the message cannot be taken, otherwise
// allocate it and start pulling.
func (n *Node) get(now time.Time, c Control) {
	k := xferKey{c.Src, c.Param}
	size := int(c.Word)
	switch {
	case n.transfers[k] != nil:
		n.control(c.Src, OpNak, c.Param, c.Meta, ReasonDuplicate)
		return
	case size > n.cfg.MaxMessage:
		n.control(c.Src, OpNak, c.Param, c.Meta, ReasonTooLarge)
		return
	case n.buffered+size > n.cfg.MaxBuffered:
		n.control(c.Src, OpNak, c.Param, c.Meta, ReasonNoBuffer)
		return
	}
	chunks := max(1, (size+ChunkData-1)/ChunkData)
	if size == 0 {
		chunks = 0
	}
	t := &transfer{meta: c.Meta, buf: make([]byte, size), have: make([]uint64, (chunks+63)/64),
		chunks: chunks, missing: chunks, lastData: now}
	n.buffered += size
	if n.transfers == nil {
		n.transfers = map[xferKey]*transfer{}
	}
	n.transfers[k] = t
	if chunks == 0 {
		n.complete(k, t)
		return
	}
	n.request(k, t)
}

// request asks for the next chunks, keeping at most Window in flight.
func (n *Node) request(k xferKey, t *transfer) {
	if t.nextReq >= t.chunks || t.inflight > n.cfg.Window/2 {
		return
	}
	c := min(n.cfg.Window-t.inflight, t.chunks-t.nextReq)
	n.rget(k, t, t.nextReq, c)
	t.nextReq += c
	t.inflight += c
}

func (n *Node) rget(k xferKey, t *transfer, first, count int) {
	off := first * ChunkData
	end := min(len(t.buf), (first+count)*ChunkData)
	n.Stats.RGets++
	n.out.Packets = append(n.out.Packets, PacketOut{To: k.from, Head: AppendRGet(make([]byte, 0, RGetLen), k.tag, uint32(off), uint32(end-off))})
}

// StepData handles a data-path packet from a peer.
func (n *Node) StepData(now time.Time, from uint16, b []byte) error {
	p, err := DecodeDataPath(b)
	if err != nil {
		n.Stats.Malformed++
		return err
	}
	switch p.Op {
	case OpRGet:
		n.serve(now, from, p)
	case OpData:
		n.data(now, xferKey{from, p.Tag}, p)
	case OpRNak:
		if n.transfers[xferKey{from, p.Tag}] != nil {
			n.Stats.RNaks++
			n.dropTransfer(xferKey{from, p.Tag})
		}
	}
	return nil
}

// serve answers a remote get from the region, by reference.
func (n *Node) serve(now time.Time, from uint16, p DataPath) {
	r := n.regions[p.Tag]
	if r == nil || r.to != from {
		n.out.Packets = append(n.out.Packets, PacketOut{To: from, Head: AppendDataHeader(nil, OpRNak, p.Tag, 0)})
		return
	}
	r.lastUsed = now
	end := min(uint64(len(r.data)), uint64(p.Offset)+uint64(p.Length))
	for off := uint64(p.Offset) - uint64(p.Offset)%ChunkData; off < end; off += ChunkData {
		e := min(off+ChunkData, uint64(len(r.data)))
		n.Stats.DataSent++
		n.out.Packets = append(n.out.Packets, PacketOut{To: from,
			Head: AppendDataHeader(make([]byte, 0, DataHeaderLen), OpData, p.Tag, uint32(off)), Body: r.data[off:e]})
	}
}

func (n *Node) data(now time.Time, k xferKey, p DataPath) {
	t := n.transfers[k]
	if t == nil {
		n.Stats.Duplicates++ // late data of a finished or cancelled transfer
		return
	}
	i := int(p.Offset / ChunkData)
	if p.Offset%ChunkData != 0 || i >= t.chunks || len(p.Data) != min(ChunkData, len(t.buf)-i*ChunkData) {
		n.Stats.Malformed++
		return
	}
	w, bit := i/64, uint64(1)<<(i%64)
	if t.have[w]&bit != 0 {
		n.Stats.Duplicates++
		return
	}
	t.have[w] |= bit
	copy(t.buf[p.Offset:], p.Data) // the "DMA" into the receiver's memory
	n.Stats.DataReceived++
	t.missing--
	t.inflight = max(0, t.inflight-1)
	t.lastData = now
	if t.missing == 0 {
		n.complete(k, t)
		return
	}
	if i == t.nextReq-1 && t.missing > t.chunks-t.nextReq {
		// The last chunk asked for has come and some before it have
		// not. The sender answers remote gets in order and the route
		// keeps their order, so those are lost: ask again now rather
		// than after RGetTimeout. (If the network reordered them
		// instead, the extra copies are dropped as duplicates.)
		n.Stats.FastRerequests++
		n.rerequest(k, t)
		t.lastAsk = now
		return
	}
	n.request(k, t)
}

func (n *Node) complete(k xferKey, t *transfer) {
	n.control(k.from, OpAck, k.tag, t.meta, 0)
	delete(n.transfers, k)
	if len(n.transfers) == 0 {
		n.transfers = nil
	}
	n.Stats.Delivered++
	n.out.Messages = append(n.out.Messages, Message{From: k.from, Meta: t.meta, Data: t.buf})
}

func (n *Node) dropTransfer(k xferKey) {
	t := n.transfers[k]
	if t == nil {
		return
	}
	n.buffered -= len(t.buf)
	delete(n.transfers, k)
	if len(n.transfers) == 0 {
		n.transfers = nil
	}
}

func (n *Node) dropRegion(tag uint32) {
	delete(n.regions, tag)
	if len(n.regions) == 0 {
		n.regions = nil
	}
}

// Tick re-requests missing chunks after RGetTimeout of silence, abandons
// transfers silent for TransferTimeout and regions unused for
// RegionTimeout. It visits only active transfers and regions.
func (n *Node) Tick(now time.Time) {
	for k, t := range n.transfers {
		switch {
		case now.Sub(t.lastData) >= n.cfg.TransferTimeout:
			n.Stats.TimedOut++
			n.dropTransfer(k)
		case now.Sub(later(t.lastData, t.lastAsk)) >= n.cfg.RGetTimeout:
			n.rerequest(k, t)
			t.lastAsk = now
		}
	}
	for tag, r := range n.regions {
		if now.Sub(r.lastUsed) >= n.cfg.RegionTimeout {
			n.Stats.TimedOut++
			n.out.Results = append(n.out.Results, Result{Tag: tag, To: r.to, Err: ErrTimeout})
			n.dropRegion(tag)
		}
	}
}

// rerequest asks again for the missing chunks already requested, as runs
// of consecutive chunks, at most Window chunks in all.
func (n *Node) rerequest(k xferKey, t *transfer) {
	asked := 0
	for i := 0; i < t.nextReq && asked < n.cfg.Window; {
		if t.have[i/64]&(1<<(i%64)) != 0 {
			i++
			continue
		}
		j := i
		for j < t.nextReq && j-i < n.cfg.Window-asked && t.have[j/64]&(1<<(j%64)) == 0 {
			j++
		}
		n.Stats.Rerequests++
		n.rget(k, t, i, j-i)
		asked += j - i
		i = j
	}
	t.inflight = asked
	if asked == 0 {
		n.request(k, t)
	}
}

func (n *Node) nextDeadline() time.Time {
	var d time.Time
	first := func(t time.Time) {
		if d.IsZero() || t.Before(d) {
			d = t
		}
	}
	for _, t := range n.transfers {
		first(later(t.lastData, t.lastAsk).Add(n.cfg.RGetTimeout))
		first(t.lastData.Add(n.cfg.TransferTimeout))
	}
	for _, r := range n.regions {
		first(r.lastUsed.Add(n.cfg.RegionTimeout))
	}
	return d
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// NextTick is when Tick has work next (zero: nothing active).
func (n *Node) NextTick() time.Time { return n.nextDeadline() }
