// Package fabric attaches radicd to the emulated Blue Gene networks
// (`radicd --fabric bg`, issue 12): every radicd is one torus node on its
// UDP port (netsim/udplink), forwarding the other daemons' packets hop by
// hop, with the bulktransport endpoint (fragmentation, delta-t, bulk) on
// top of it.
//
// The ring's heartbeats and probes travel on the torus: a datagram that
// fits one packet (240 bytes: rings of up to 13 nodes) is one
// heartbeat-protocol torus packet, a larger one a fragmented datagram.
// Probes, their answers and the ring's notices go both ways round
// (netsim.Route), delivered once: a cut link or a silent node on one path
// must not stop the probe that asks whether a node is alive.
// By default the torus is a ring of all the nodes in id order (N x 1 x 1),
// so that the heartbeat ring's neighbours are torus neighbours and every
// heartbeat is one hop; a probe to a node further away is forwarded by the
// daemons in between. A node the ring declares dead is routed round
// (netsim.Detour) until it is back.
//
// The daemon addresses nodes by their radicd ids; the fabric maps them to
// torus ids by their position in the id-ordered node list that every
// daemon is given (--peers), so all daemons agree on the machine without
// talking.
//
// Streams (stream.go) carry byte streams between two daemons over delta-t
// and bulk messaging. With --fabric bg, radicd's replication of the
// message log to its protectors runs on them, and so does its HTTP API
// between daemons (a Listener; the client dials streams): launch records,
// log reads for a replay, re-protection, location pushes and lookups.
//
// Not yet on the fabric: membership and location broadcasts on the
// collective network (locations are pushed to each daemon in turn).
package fabric

import (
	"bufio"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/radic-project/radic/bulktransport"
	"github.com/radic-project/radic/bulktransport/bglayers"
	"github.com/radic-project/radic/bulktransport/bulk"
	"github.com/radic-project/radic/bulktransport/deltat"
	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/heartbeat/hbudp"
	"github.com/radic-project/radic/netsim"
	"github.com/radic-project/radic/netsim/udplink"
)

// Config configures a Fabric.
type Config struct {
	// Shape is the torus; its node count must equal len(Peers). Zero:
	// a ring of all the nodes (len(Peers) x 1 x 1).
	Shape netsim.Shape
	Self  heartbeat.NodeID
	// Bind is this node's UDP address (the daemon's --listen port).
	Bind netip.AddrPort
	// Peers is every node, this one included: radicd id -> UDP address.
	Peers map[heartbeat.NodeID]netip.AddrPort
	// Pcap, if set, receives a pcap trace of every packet this node reads
	// and writes (radicd --pcap FILE); Close flushes it.
	Pcap   io.Writer
	Logger *slog.Logger
}

// ParseShape reads a torus shape written XxYxZ ("4x2x2").
func ParseShape(s string) (netsim.Shape, error) {
	parts := strings.Split(s, "x")
	if len(parts) != 3 {
		return netsim.Shape{}, fmt.Errorf("torus shape %q: want XxYxZ, like 4x2x1", s)
	}
	var d [3]int
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return netsim.Shape{}, fmt.Errorf("torus shape %q: %q is not a dimension", s, p)
		}
		d[i] = n
	}
	sh := netsim.Shape{X: d[0], Y: d[1], Z: d[2]}
	return sh, sh.Validate()
}

// Fabric is one radicd's torus node and transport endpoint. Its methods
// are safe for concurrent use.
type Fabric struct {
	log     *slog.Logger
	shape   netsim.Shape
	self    heartbeat.NodeID
	torusID map[heartbeat.NodeID]netsim.NodeID
	radicID []heartbeat.NodeID // torus id -> radicd id
	link    *udplink.Node

	epMu sync.Mutex
	// +checklocks:epMu
	ep *bulktransport.Endpoint
	// +checklocks:epMu
	writes map[uint64]*Stream // the stream of each message in flight
	// +checklocks:epMu
	nextTick time.Time     // the endpoint's next deadline
	kick     chan struct{} // the timer routine must look at nextTick again

	streamMu sync.Mutex
	// +checklocks:streamMu
	streams map[streamKey]*Stream
	// +checklocks:streamMu
	listeners map[byte]chan Accepted
	// +checklocks:streamMu
	down map[heartbeat.NodeID]bool // declared dead: streams to them fail at once

	heartbeats chan []byte // received heartbeat datagrams, for Recv

	dupMu sync.Mutex
	// +checklocks:dupMu
	recent map[uint64]time.Time // datagrams sent both ways, by hash

	srcMu sync.Mutex
	// +checklocks:srcMu
	onSource func(heartbeat.NodeID, netip.AddrPort)
	// +checklocks:srcMu
	noted map[heartbeat.NodeID]sourceNote

	pcapMu sync.Mutex
	// +checklocks:pcapMu
	pcap *bglayers.PcapWriter
	// +checklocks:pcapMu
	pcapBuf *bufio.Writer

	// streamIn and streamOut count the bytes streams of each service
	// received and wrote (StreamBytes).
	streamIn, streamOut [numServices]atomic.Uint64

	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

type sourceNote struct {
	src netip.AddrPort
	at  time.Time
}

// The endpoint's windows: delta-t segments and bulk chunks in flight per
// peer (240 bytes each: 60 KiB and 240 KiB).
const (
	deltaTWindow = 256
	bulkWindow   = 1024
)

// EndpointConfig is the transport configuration of a daemon's endpoint:
// wider windows than the cores' defaults, as link frames make a burst of
// packets cheap and the log streams are the daemons' bulk traffic (the
// sockets' buffers are 4 MiB: udplink). test/fabricbench measures with
// it too.
func EndpointConfig(sh netsim.Shape, self netsim.NodeID) bulktransport.Config {
	return bulktransport.Config{Shape: sh, Self: self,
		DeltaT: deltat.Config{Window: deltaTWindow}, Bulk: bulk.Config{Window: bulkWindow}}
}

// sourceNoteEvery is how often one (node, source) mismatch is reported.
const sourceNoteEvery = time.Second

var _ heartbeat.Transport = (*Fabric)(nil)

// Listen binds the node's UDP socket and starts the fabric.
func Listen(cfg Config) (*Fabric, error) {
	ids := make([]heartbeat.NodeID, 0, len(cfg.Peers))
	for id := range cfg.Peers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	if cfg.Shape == (netsim.Shape{}) {
		cfg.Shape = netsim.Shape{X: len(ids), Y: 1, Z: 1}
	}
	if err := cfg.Shape.Validate(); err != nil {
		return nil, err
	}
	if cfg.Shape.Nodes() != len(ids) {
		return nil, fmt.Errorf("fabric: a %dx%dx%d torus has %d nodes, but --peers names %d",
			cfg.Shape.X, cfg.Shape.Y, cfg.Shape.Z, cfg.Shape.Nodes(), len(ids))
	}
	if _, ok := cfg.Peers[cfg.Self]; !ok {
		return nil, fmt.Errorf("fabric: node %d is not among the peers", cfg.Self)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Fabric{
		log: cfg.Logger, shape: cfg.Shape, self: cfg.Self, radicID: ids,
		torusID:    make(map[heartbeat.NodeID]netsim.NodeID, len(ids)),
		kick:       make(chan struct{}, 1),
		heartbeats: make(chan []byte, 256),
		noted:      map[heartbeat.NodeID]sourceNote{},
		recent:     map[uint64]time.Time{},
		writes:     map[uint64]*Stream{},
		streams:    map[streamKey]*Stream{},
		listeners:  map[byte]chan Accepted{},
		down:       map[heartbeat.NodeID]bool{},
		done:       make(chan struct{}),
	}
	for i, id := range ids {
		f.torusID[id] = netsim.NodeID(i)
	}
	self := f.torusID[cfg.Self]
	if cfg.Pcap != nil {
		f.pcapBuf = bufio.NewWriterSize(cfg.Pcap, 64<<10)
		pw, err := bglayers.NewPcapWriter(f.pcapBuf)
		if err != nil {
			return nil, err
		}
		f.pcap = pw
	}
	var err error
	f.ep, err = bulktransport.New(EndpointConfig(cfg.Shape, self))
	if err != nil {
		return nil, err
	}
	lcfg := udplink.Config{Shape: cfg.Shape, Self: self, Listen: cfg.Bind.String(), Handler: f.handle, OnNewSource: f.newSource}
	if cfg.Pcap != nil {
		lcfg.Trace = f.trace
	}
	f.link, err = udplink.Listen(lcfg)
	if err != nil {
		return nil, err
	}
	peers := make(map[netsim.NodeID]netip.AddrPort, len(ids))
	for id, a := range cfg.Peers {
		peers[f.torusID[id]] = unmap(a)
	}
	f.link.SetPeers(peers)
	f.wg.Go(f.routineEndpoint)
	if cfg.Pcap != nil {
		f.wg.Go(f.routinePcapFlush)
	}
	f.log.Info("fabric: on the Blue Gene torus", "shape", fmt.Sprintf("%dx%dx%d", cfg.Shape.X, cfg.Shape.Y, cfg.Shape.Z),
		"torus_node", self, "coord", cfg.Shape.Coord(self).String(), "udp", f.link.Addr().String())
	return f, nil
}

func unmap(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }

// LocalAddr is the bound UDP address.
func (f *Fabric) LocalAddr() netip.AddrPort { return f.link.Addr() }

// Shape is the torus.
func (f *Fabric) Shape() netsim.Shape { return f.shape }

// Stats are the torus node's packet counters.
func (f *Fabric) Stats() *udplink.Stats { return &f.link.Stats }

// SetPeer changes a node's address: it moved.
func (f *Fabric) SetPeer(id heartbeat.NodeID, a netip.AddrPort) {
	if t, ok := f.torusID[id]; ok {
		f.link.SetPeer(t, unmap(a))
		f.srcMu.Lock()
		delete(f.noted, id)
		f.srcMu.Unlock()
	}
}

// Beacon makes this node's own packets also go, for a while after its
// address changed, as broadcasts out of interface ifindex (udplink's
// Beacon): how neighbours that moved at the same time find it.
func (f *Fabric) Beacon(ifindex int, until time.Time) error {
	return f.link.Beacon(hbudp.PktinfoOOB(ifindex), until)
}

// SetDown tells the router that node id is dead (routes go round it) or
// back.
func (f *Fabric) SetDown(id heartbeat.NodeID, down bool) {
	if t, ok := f.torusID[id]; ok && id != f.self {
		f.link.SetNodeDown(t, down)
		f.streamMu.Lock()
		if down {
			f.down[id] = true
		} else {
			delete(f.down, id)
		}
		f.streamMu.Unlock()
	}
}

// OnNewSource sets fn to be told (at most once a second per node and
// source) when a neighbour's packets come from an address other than the
// one it is sent to: how the daemon learns of a move it missed. fn must
// not block.
func (f *Fabric) OnNewSource(fn func(heartbeat.NodeID, netip.AddrPort)) {
	f.srcMu.Lock()
	defer f.srcMu.Unlock()
	f.onSource = fn
}

func (f *Fabric) newSource(t netsim.NodeID, from netip.AddrPort) {
	if int(t) >= len(f.radicID) {
		return
	}
	id, now := f.radicID[t], time.Now()
	f.srcMu.Lock()
	fn, prev := f.onSource, f.noted[id]
	report := fn != nil && (prev.src != from || now.Sub(prev.at) >= sourceNoteEvery)
	if report {
		f.noted[id] = sourceNote{src: from, at: now}
	}
	f.srcMu.Unlock()
	if report {
		fn(id, from)
	}
}

// Send implements heartbeat.Transport: one heartbeat-protocol torus
// packet when b fits, else a fragmented datagram.
func (f *Fabric) Send(to heartbeat.NodeID, b []byte) error {
	t, ok := f.torusID[to]
	if !ok {
		return fmt.Errorf("fabric: no node %d on the torus", to)
	}
	if len(b) <= netsim.TorusPayload {
		// Losses are the protocol's to tolerate (heartbeat.Transport).
		if typ, _ := heartbeat.TypeOf(b); typ == heartbeat.MsgHeartbeat {
			_ = f.link.SendTorus(t, netsim.ProtoHeartbeat, b)
		} else {
			// Probes, their answers and notices go both ways round:
			// a probe is sent because heartbeats stopped coming, and
			// must not die on the link or node that stopped them.
			_ = f.link.SendTorusBothWays(t, netsim.ProtoHeartbeat, b)
		}
		return nil
	}
	f.epMu.Lock()
	err := f.ep.SendDatagram(t, b)
	f.epMu.Unlock()
	if err != nil {
		return err
	}
	f.flush()
	return nil
}

// Recv implements heartbeat.Transport.
func (f *Fabric) Recv(b []byte) (int, error) {
	select {
	case m := <-f.heartbeats:
		return copy(b, m), nil
	case <-f.done:
		return 0, fmt.Errorf("fabric: %w", net.ErrClosed)
	}
}

// handle takes a packet addressed to this node from the link's receive
// goroutine.
func (f *Fabric) handle(now time.Time, pkt []byte) {
	h, payload, err := netsim.DecodeTorus(pkt)
	if err != nil {
		return // a collective packet: nothing rides the tree yet
	}
	if h.Proto == netsim.ProtoHeartbeat {
		f.deliverHeartbeat(payload)
		return
	}
	type msg struct {
		from heartbeat.NodeID
		meta [24]byte
		data []byte
	}
	var dgrams [][]byte
	var msgs []msg
	f.epMu.Lock()
	err = f.ep.Step(now, pkt)
	for {
		m, ok := f.ep.ReadDatagram()
		if !ok {
			break
		}
		dgrams = append(dgrams, m.Data)
	}
	for {
		m, ok := f.ep.ReadMsg()
		if !ok {
			break
		}
		// The data points into the endpoint's buffers (a bulk message's
		// is returned to the receive budget by Release): the stream
		// keeps a copy.
		msgs = append(msgs, msg{from: f.radicID[m.Peer], meta: m.Meta, data: append([]byte(nil), m.Data...)})
		f.ep.Release(m)
	}
	f.epMu.Unlock()
	if err != nil {
		f.log.Debug("fabric: bad packet", "src", h.Src.String(), "proto", h.Proto.String(), "err", err)
	}
	for _, d := range dgrams {
		f.deliverHeartbeat(d)
	}
	for _, m := range msgs {
		f.deliverStream(m.from, m.meta, m.data)
	}
	f.flush()
}

func (f *Fabric) deliverHeartbeat(b []byte) {
	if typ, _ := heartbeat.TypeOf(b); typ != heartbeat.MsgHeartbeat && f.seen(b) {
		return // the copy that came the other way round
	}
	select {
	case f.heartbeats <- b:
	default: // the ring is not reading: a lost datagram
	}
}

// dupWindow is how long a datagram sent both ways is remembered: far
// longer than the two routes' difference, far shorter than the time
// between two probes with the same nonce (one per suspicion).
const dupWindow = 500 * time.Millisecond

// seen reports whether the same datagram arrived within dupWindow, and
// remembers this one.
func (f *Fabric) seen(b []byte) bool {
	h := fnv.New64a()
	h.Write(b)
	key, now := h.Sum64(), time.Now()
	f.dupMu.Lock()
	defer f.dupMu.Unlock()
	if at, ok := f.recent[key]; ok && now.Sub(at) < dupWindow {
		return true
	}
	if len(f.recent) >= 256 {
		for k, at := range f.recent {
			if now.Sub(at) >= dupWindow {
				delete(f.recent, k)
			}
		}
	}
	f.recent[key] = now
	return false
}

func (f *Fabric) poke() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// flush sends what the endpoint has ready and hands delta-t's results to
// the streams that wrote; whoever changed the endpoint calls it, so that
// an answer leaves from the goroutine that received its question.
// Concurrent flushes may put packets on the link out of order, which
// delta-t and bulk are made for.
func (f *Fabric) flush() {
	type result struct {
		s   *Stream
		err error
	}
	var results []result
	f.epMu.Lock()
	r := f.ep.Ready()
	for _, res := range r.Results {
		if s := f.writes[res.ID]; s != nil {
			delete(f.writes, res.ID)
			results = append(results, result{s, res.Err})
		}
	}
	if !r.NextTick.IsZero() && (f.nextTick.IsZero() || r.NextTick.Before(f.nextTick)) {
		f.nextTick = r.NextTick
		f.poke() // the timer routine has an earlier deadline
	}
	f.epMu.Unlock()
	if len(r.Packets) > 0 {
		if err := f.link.SendBatch(r.Packets); err != nil {
			f.log.Debug("fabric: send", "err", err)
		}
	}
	for _, x := range results {
		x.s.result(x.err)
	}
}

// routineEndpoint runs the endpoint's timers: it sleeps until the next
// deadline (none while every peer is idle: no progress work for idle
// peers), ticks and flushes.
func (f *Fabric) routineEndpoint() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		f.epMu.Lock()
		next := f.nextTick
		f.epMu.Unlock()
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		timer.Reset(wait)
		select {
		case <-f.done:
			return
		case <-f.kick:
			continue
		case <-timer.C:
		}
		f.epMu.Lock()
		f.nextTick = time.Time{}
		f.ep.Tick(time.Now())
		f.epMu.Unlock()
		f.flush()
	}
}

func (f *Fabric) trace(at time.Time, pkt []byte) {
	f.pcapMu.Lock()
	defer f.pcapMu.Unlock()
	if f.pcap == nil {
		return
	}
	if err := f.pcap.WritePacket(at, pkt); err != nil {
		f.log.Warn("fabric: pcap trace stopped", "err", err)
		f.pcap = nil
	}
}

// routinePcapFlush flushes the trace every second, so that a daemon that
// is killed leaves a trace readable up to its last second.
func (f *Fabric) routinePcapFlush() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-f.done:
			return
		case <-t.C:
			f.flushPcap()
		}
	}
}

func (f *Fabric) flushPcap() error {
	f.pcapMu.Lock()
	defer f.pcapMu.Unlock()
	if f.pcapBuf == nil {
		return nil
	}
	return f.pcapBuf.Flush()
}

// Close stops the node and flushes the trace.
func (f *Fabric) Close() error {
	var err error
	f.closeOnce.Do(func() {
		close(f.done)
		err = f.link.Close()
		f.wg.Wait()
		if ferr := f.flushPcap(); ferr != nil {
			err = errors.Join(err, fmt.Errorf("flush pcap: %w", ferr))
		}
	})
	return err
}
