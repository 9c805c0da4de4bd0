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
//	      ◀──────── RGet(tag, off, n) ────┘ (a window of chunks per
//	Data(tag, off) ───────────────────▶     sending peer; missing ones
//	                                         re-requested)
//	      ◀──────── Ack(tag) ───────────── all chunks: deliver
//	Done(tag), release the buffer
package bulk

import (
	"errors"
	"fmt"
	"time"

	"github.com/radic-project/radic/bulktransport/internal/timerq"
)

// Defaults.
const (
	DefaultMaxMessage      = 64 << 20
	DefaultMaxBuffered     = 256 << 20
	DefaultWindow          = 64 // chunks in flight per sending peer, over all its transfers
	DefaultRGetTimeout     = 20 * time.Millisecond
	DefaultTransferTimeout = 2 * time.Second
	DefaultRegionTimeout   = 10 * time.Second
)

// Config holds the limits and timers; zero fields take the defaults.
type Config struct {
	Self        uint16
	MaxMessage  int // largest message the receiver takes
	MaxBuffered int // bytes received and not yet released by the reader
	// Window is the chunks a receiver has asked one peer for and not yet
	// received, over all the transfers from that peer: what the peer
	// may put in the receiver's socket buffer at once.
	Window          int
	RGetTimeout     time.Duration // silence before missing chunks are asked again
	TransferTimeout time.Duration // silence of a sending peer (no new data for any of its transfers) before its transfers are abandoned
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
	timer    time.Time // earliest timer entry
}

type xferKey struct {
	from uint16
	tag  uint32
}

type transfer struct {
	src     *sender // its peer's window
	meta    [MetaLen]byte
	buf     []byte
	have    []uint64
	chunks  int
	missing int
	nextReq int // chunks below this have been requested
	// front: every chunk below it has arrived or been asked for again.
	// Chunks are first asked for in order and the sender answers in
	// order, so a chunk arriving beyond front means the ones it skipped
	// are lost.
	front    int
	inflight int       // chunks asked for and not arrived (counted in the peer's window)
	lastData time.Time // last new chunk
	lastAsk  time.Time // last request: RGetTimeout runs from the later of the two
	timer    time.Time // earliest timer entry
}

// sender is what a receiver keeps per sending peer while it has
// transfers from it: the window shared by them.
type sender struct {
	inflight int      // chunks asked for and not arrived, over the transfers
	xfers    int      // transfers from the peer
	waiting  []uint32 // tags of transfers with chunks not yet asked for, oldest first
	// lastData is the peer's last new chunk or Get: TransferTimeout
	// runs from here, for all its transfers, as one waiting for the
	// window behind the others gets no data of its own.
	lastData time.Time
}

// timerKey names a region (by tag) or a transfer.
type timerKey struct {
	xferKey
	region bool
}

// Node is the bulk core of one node, both sending and receiving.
type Node struct {
	cfg       Config
	regions   map[uint32]*region
	transfers map[xferKey]*transfer
	senders   map[uint16]*sender
	timers    timerq.Queue[timerKey]
	nextTag   uint32
	buffered  int
	out       Ready
	Stats     Stats
	// visits counts transfers and regions looked at to find deadlines or
	// run timers: a test checks that Ready and the data path look at none
	// and Tick only at those due.
	visits uint64
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
	r.NextTick = n.timers.Next()
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
	r := &region{to: dst, data: data, lastUsed: now}
	n.regions[tag] = r
	n.timers.Schedule(now.Add(n.cfg.RegionTimeout), timerKey{xferKey{tag: tag}, true}, &r.timer)
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
		n.dropTransfer(now, xferKey{from, c.Param})
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
	if n.senders == nil {
		n.senders = map[uint16]*sender{}
	}
	p := n.senders[k.from]
	if p == nil {
		p = &sender{}
		n.senders[k.from] = p
	}
	t := &transfer{src: p, meta: c.Meta, buf: make([]byte, size), have: make([]uint64, (chunks+63)/64),
		chunks: chunks, missing: chunks, lastData: now}
	n.buffered += size
	if n.transfers == nil {
		n.transfers = map[xferKey]*transfer{}
	}
	n.transfers[k] = t
	p.xfers++
	p.lastData = now
	if chunks == 0 {
		n.complete(k, t)
		return
	}
	p.waiting = append(p.waiting, k.tag)
	n.request(now, k.from, p)
	n.schedule(k, t)
}

// request asks peer from for the next chunks of its transfers, oldest
// transfer first, keeping at most Window chunks in flight from the peer
// over all of them. It waits until half the window is free, so that one
// remote get asks for many chunks.
func (n *Node) request(now time.Time, from uint16, p *sender) {
	if p.inflight > n.cfg.Window/2 {
		return
	}
	for len(p.waiting) > 0 && p.inflight < n.cfg.Window {
		k := xferKey{from, p.waiting[0]}
		t := n.transfers[k]
		if t != nil && t.nextReq < t.chunks {
			c := min(n.cfg.Window-p.inflight, t.chunks-t.nextReq)
			t.lastAsk = now
			n.rget(k, t, t.nextReq, c)
			t.nextReq += c
			t.inflight += c
			p.inflight += c
			n.schedule(k, t) // its re-request timer may start now
			if t.nextReq < t.chunks {
				return
			}
		}
		p.waiting = p.waiting[1:]
	}
	if len(p.waiting) == 0 {
		p.waiting = nil
	}
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
			n.dropTransfer(now, xferKey{from, p.Tag})
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
	start := uint64(p.Offset) - uint64(p.Offset)%ChunkData
	if start >= end {
		return
	}
	// One buffer for the headers of all the chunks asked for.
	heads := make([]byte, 0, (end-start+ChunkData-1)/ChunkData*DataHeaderLen)
	for off := start; off < end; off += ChunkData {
		e := min(off+ChunkData, uint64(len(r.data)))
		n.Stats.DataSent++
		h := len(heads)
		heads = AppendDataHeader(heads, OpData, p.Tag, uint32(off))
		n.out.Packets = append(n.out.Packets, PacketOut{To: from, Head: heads[h:len(heads):len(heads)], Body: r.data[off:e]})
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
	s := t.src
	if t.inflight > 0 {
		t.inflight--
		s.inflight--
	}
	t.lastData, s.lastData = now, now
	if t.missing == 0 {
		n.complete(k, t)
		if s.xfers > 0 {
			n.request(now, k.from, s) // its share of the window is free
		}
		return
	}
	if i > t.front {
		// Chunks are first asked for in order, the sender answers
		// remote gets in order and the route keeps their order, so the
		// chunks between front and this one that have not come are
		// lost: ask again now rather than after RGetTimeout. Each chunk
		// is skipped over once at most, so this asks for it once; a
		// re-request that is lost too waits for RGetTimeout. (If the
		// network reordered them instead, the extra copies are dropped
		// as duplicates.) They stay counted in the window.
		if n.askRuns(k, t, t.front, i, n.cfg.Window) > 0 {
			n.Stats.FastRerequests++
		}
	}
	t.front = max(t.front, i+1)
	n.request(now, k.from, s)
}

// askRuns asks again for the missing chunks in [from, to), as runs of
// consecutive chunks, at most limit of them; it returns how many.
func (n *Node) askRuns(k xferKey, t *transfer, from, to, limit int) (asked int) {
	for i := from; i < to && asked < limit; {
		if i%64 == 0 && t.have[i/64] == ^uint64(0) {
			i += 64 // 64 chunks all here
			continue
		}
		if t.have[i/64]&(1<<(i%64)) != 0 {
			i++
			continue
		}
		j := i
		for j < to && j-i < limit-asked && t.have[j/64]&(1<<(j%64)) == 0 {
			j++
		}
		n.Stats.Rerequests++
		n.rget(k, t, i, j-i)
		asked += j - i
		i = j
	}
	return asked
}

func (n *Node) complete(k xferKey, t *transfer) {
	n.control(k.from, OpAck, k.tag, t.meta, 0)
	n.forget(k, t)
	n.Stats.Delivered++
	n.out.Messages = append(n.out.Messages, Message{From: k.from, Meta: t.meta, Data: t.buf})
}

func (n *Node) dropTransfer(now time.Time, k xferKey) {
	t := n.transfers[k]
	if t == nil {
		return
	}
	n.buffered -= len(t.buf)
	n.forget(k, t)
	if s := n.senders[k.from]; s != nil {
		n.request(now, k.from, s) // its share of the window is free
	}
}

// forget removes a transfer and its share of its peer's window.
func (n *Node) forget(k xferKey, t *transfer) {
	delete(n.transfers, k)
	if len(n.transfers) == 0 {
		n.transfers = nil
	}
	n.clearIfIdle()
	s := t.src
	s.inflight -= t.inflight
	if s.xfers--; s.xfers == 0 {
		delete(n.senders, k.from)
		if len(n.senders) == 0 {
			n.senders = nil
		}
	}
}

func (n *Node) dropRegion(tag uint32) {
	delete(n.regions, tag)
	if len(n.regions) == 0 {
		n.regions = nil
	}
	n.clearIfIdle()
}

// clearIfIdle drops the timer entries of a node with nothing active: they
// are all stale, and an idle node holds no memory and needs no Tick.
func (n *Node) clearIfIdle() {
	if len(n.regions)+len(n.transfers) == 0 {
		n.timers.Clear()
	}
}

// Tick re-requests missing chunks after RGetTimeout of silence, abandons
// transfers whose peer has been silent for TransferTimeout and regions
// unused for RegionTimeout. Timers are in a heap: it visits only the
// transfers and regions whose timer entry is due.
func (n *Node) Tick(now time.Time) {
	for {
		k, at, ok := n.timers.PopDue(now)
		if !ok {
			break
		}
		if k.region {
			if r := n.regions[k.tag]; r != nil && r.timer.Equal(at) {
				n.visits++
				r.timer = time.Time{}
				n.tickRegion(now, k.tag, r)
			}
		} else if t := n.transfers[k.xferKey]; t != nil && t.timer.Equal(at) {
			n.visits++
			t.timer = time.Time{}
			n.tickTransfer(now, k.xferKey, t)
		}
	}
}

func (n *Node) tickRegion(now time.Time, tag uint32, r *region) {
	exp := r.lastUsed.Add(n.cfg.RegionTimeout)
	if now.Before(exp) {
		n.timers.Schedule(exp, timerKey{xferKey{tag: tag}, true}, &r.timer)
		return
	}
	n.Stats.TimedOut++
	n.out.Results = append(n.out.Results, Result{Tag: tag, To: r.to, Err: ErrTimeout})
	n.dropRegion(tag)
}

func (n *Node) tickTransfer(now time.Time, k xferKey, t *transfer) {
	if !now.Before(t.src.lastData.Add(n.cfg.TransferTimeout)) {
		n.Stats.TimedOut++
		n.dropTransfer(now, k)
		return
	}
	if at, ok := n.rgetDue(t); ok && !now.Before(at) {
		n.rerequest(now, k, t)
		t.lastAsk = now
	}
	n.schedule(k, t)
}

// rerequest asks again for the missing chunks already requested, as runs
// of consecutive chunks, within the window: the chunks the transfer had
// in flight are taken as lost, and it may use them and whatever the
// peer's other transfers leave free.
func (n *Node) rerequest(now time.Time, k xferKey, t *transfer) {
	s := t.src
	s.inflight -= t.inflight
	t.inflight = n.askRuns(k, t, 0, t.nextReq, max(0, n.cfg.Window-s.inflight))
	s.inflight += t.inflight
	t.front = t.nextReq // each chunk asked for again
	n.request(now, k.from, s)
}

// rgetDue is when the transfer's missing chunks are asked for again, if
// any of those asked for are missing.
func (n *Node) rgetDue(t *transfer) (time.Time, bool) {
	if t.missing <= t.chunks-t.nextReq {
		return time.Time{}, false // all asked for have come: waiting for the window
	}
	return later(t.lastData, t.lastAsk).Add(n.cfg.RGetTimeout), true
}

// schedule makes sure the transfer has a timer entry at or before its
// deadline. The deadline only moves later with new data, so this pushes
// only when the transfer starts asking for chunks.
func (n *Node) schedule(k xferKey, t *transfer) {
	d := t.src.lastData.Add(n.cfg.TransferTimeout)
	if at, ok := n.rgetDue(t); ok && at.Before(d) {
		d = at
	}
	n.timers.Schedule(d, timerKey{k, false}, &t.timer)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// NextTick is when Tick has work next (zero: nothing active).
func (n *Node) NextTick() time.Time { return n.timers.Next() }
