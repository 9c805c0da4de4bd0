package radicd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/reconfigure"
)

// Timing of the location table's traffic between daemons.
const (
	// locPeerTimeout bounds one request to another daemon: a push, an
	// announcement, a remote lookup.
	locPeerTimeout = 500 * time.Millisecond
	// announceFor is how long a node keeps announcing a move to a peer
	// that did not take it.
	announceFor = 10 * time.Second
	// syncEvery is how often a daemon compares its node list with one
	// other daemon (round robin), to learn moves it missed.
	syncEvery = 2 * time.Second
	// sourceRecheck is how long a peer's unexpected heartbeat source is
	// not asked about again once it was.
	sourceRecheck = 5 * time.Second
)

// Results of a lookup: the result label of radic_location_lookups_total.
const (
	lookupHit        = "hit"         // in this daemon's table
	lookupMiss       = "miss"        // a cluster node's address, no such listener (answered from here)
	lookupOutside    = "outside"     // not a cluster node's address: answered at once
	lookupRemoteHit  = "remote_hit"  // asked the node's daemon, which has it (now cached)
	lookupRemoteMiss = "remote_miss" // asked the node's daemon, which has not
	lookupError      = "error"       // the node's daemon could not be asked (503)
)

var lookupResults = []string{lookupHit, lookupMiss, lookupOutside, lookupRemoteHit, lookupRemoteMiss, lookupError}

// How a move was learnt: the via label of radic_location_moves_total.
const (
	viaSelf      = "self"      // this node's own address changed
	viaAnnounce  = "announce"  // the node announced it (POST /v1/nodes/moved)
	viaHeartbeat = "heartbeat" // its heartbeats came from a new address; its daemon confirmed
	viaSync      = "sync"      // another daemon's node list was newer
	viaLocate    = "locate"    // a remote lookup's answer was newer
)

var moveVias = []string{viaSelf, viaAnnounce, viaHeartbeat, viaSync, viaLocate}

// locator is radicd's part of the location table: the table itself, its
// HTTP API, the pushes of registrations, lookups that ask the node's
// daemon, and the moves of nodes (announced, learnt, synchronised). There is
// no central component: every daemon holds the whole table, and each
// node's daemon is the authority on its own listeners and address.
type locator struct {
	self   int
	table  *reconfigure.Table
	ports  map[int]uint16 // every node's daemon port (its --peers entry)
	client *http.Client
	log    *slog.Logger

	// setPeer, when set, redirects the heartbeats to a moved node.
	setPeer func(id int, addr netip.AddrPort)
	// persist, when set, records this node's address and generation.
	persist func(addrState) error
	// selfMoved, when set, is called after this node moved, before the
	// move is announced (the daemon turns on its heartbeat beacon).
	selfMoved func()
	// dead, when set, says whether the ring has declared node id dead:
	// its daemon is neither pushed to nor asked (each try cost a
	// registration or a lookup locPeerTimeout; a restarted rank's
	// listen() waited that long for the push to its dead node).
	dead func(id int) bool

	lookups    *prometheus.CounterVec
	moves      *prometheus.CounterVec
	pushErrors atomic.Uint64

	selfMu sync.Mutex // serialises changes of this node's own entry

	sources chan sourceNote
	askMu   sync.Mutex
	// +checklocks:askMu
	asked map[sourceNote]time.Time

	bg    sync.WaitGroup // announcements under way
	bgCtx context.Context
}

type sourceNote struct {
	id int
	ip netip.Addr
}

// addrState is this node's address and generation, kept in the state
// directory so that a restarted daemon does not reuse a generation.
type addrState struct {
	Addr string `json:"addr"`
	Gen  uint64 `json:"gen"`
}

func newLocator(self int, peers map[heartbeat.NodeID]netip.AddrPort, client *http.Client, log *slog.Logger) (*locator, error) {
	l := &locator{
		self: self, table: reconfigure.NewTable(), ports: map[int]uint16{}, client: client, log: log,
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "radic_location_lookups_total",
			Help: "Lookups in the location table (GET /v1/locate), by result: hit, miss, outside (not a cluster address), remote_hit and remote_miss (asked the node's daemon), error (it could not be asked).",
		}, []string{"result"}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "radic_location_moves_total",
			Help: "Node address changes applied to the location table, by how they were learnt: self, announce, heartbeat, sync, locate.",
		}, []string{"via"}),
		sources: make(chan sourceNote, 16),
		asked:   map[sourceNote]time.Time{},
		bgCtx:   context.Background(),
	}
	for _, r := range lookupResults {
		l.lookups.WithLabelValues(r)
	}
	for _, v := range moveVias {
		l.moves.WithLabelValues(v)
	}
	ips := map[netip.Addr]heartbeat.NodeID{}
	for _, id := range slices.Sorted(maps.Keys(peers)) {
		a := peers[id]
		if other, dup := ips[a.Addr().Unmap()]; dup {
			log.Warn("two nodes share an IP address: the location table cannot tell them apart", "node", id, "other", other, "ip", a.Addr())
		}
		ips[a.Addr().Unmap()] = id
		if err := l.table.AddNode(int(id), a.Addr()); err != nil {
			return nil, err
		}
		l.ports[int(id)] = a.Port()
	}
	return l, nil
}

func (l *locator) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		l.lookups, l.moves,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "radic_location_push_errors_total",
			Help: "Registrations and move announcements that did not reach a daemon (at the first try).",
		}, func() float64 { return float64(l.pushErrors.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "radic_location_listeners",
			Help: "Radic listeners in this daemon's location table (every node's, pushed or cached).",
		}, func() float64 { return float64(len(l.table.Listeners())) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "radic_location_generation",
			Help: "This node's address generation: how many times its address changed.",
		}, func() float64 {
			n, _ := l.table.Node(l.self)
			return float64(n.Gen)
		}),
	}
}

func (l *locator) routes(mux *http.ServeMux) {
	mux.HandleFunc("GET "+reconfigure.PathNodes, l.handleNodes)
	mux.HandleFunc("POST "+reconfigure.PathMoved, l.handleMoved)
	mux.HandleFunc("POST "+reconfigure.PathListeners, l.handleListeners)
	mux.HandleFunc("DELETE "+reconfigure.PathListeners, l.handleListeners)
	mux.HandleFunc("GET "+reconfigure.PathLocate, l.handleLocate)
}

// peerURL is the base URL of node id's daemon at its current address.
func (l *locator) peerURL(id int) (string, bool) {
	ap, ok := l.peerAddr(id)
	if !ok {
		return "", false
	}
	return "http://" + ap.String(), true
}

// peerAddr is node id's daemon address: its current IP, its daemon port.
// nodeAt is the node whose daemon is at ap now.
func (l *locator) nodeAt(ap netip.AddrPort) (heartbeat.NodeID, bool) {
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	for id := range l.ports {
		if a, ok := l.peerAddr(id); ok && a == ap {
			return heartbeat.NodeID(id), true
		}
	}
	return 0, false
}

func (l *locator) peerAddr(id int) (netip.AddrPort, bool) {
	n, ok := l.table.Node(id)
	port, pok := l.ports[id]
	if !ok || !pok {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(n.Addr, port), true
}

func (l *locator) others() []int {
	var ids []int
	for _, n := range l.table.Nodes() {
		if n.ID != l.self {
			ids = append(ids, n.ID)
		}
	}
	return ids
}

// reachable is others() less the nodes the ring has declared dead.
func (l *locator) reachable() []int {
	ids := l.others()
	if l.dead == nil {
		return ids
	}
	return slices.DeleteFunc(ids, l.dead)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// decodeBody reads one JSON object of at most 64 KiB.
func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("bad JSON: empty body")
		}
		return fmt.Errorf("bad JSON: %v", err)
	}
	return nil
}

func (l *locator) handleNodes(w http.ResponseWriter, _ *http.Request) {
	rep := reconfigure.NodesReply{Nodes: []reconfigure.NodeInfo{}}
	for _, n := range l.table.Nodes() {
		info := n.Info()
		for _, a := range l.table.Earlier(n.ID) {
			info.Earlier = append(info.Earlier, a.String())
		}
		rep.Nodes = append(rep.Nodes, info)
	}
	writeJSON(w, rep)
}

func (l *locator) handleMoved(w http.ResponseWriter, r *http.Request) {
	var m reconfigure.MoveRequest
	if err := decodeBody(r, &m); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	addr, err := m.Parse()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if m.ID == l.self {
		http.Error(w, fmt.Sprintf("field \"id\": node %d is this node, which learns its address from its own interfaces", m.ID), http.StatusConflict)
		return
	}
	if _, ok := l.table.Node(m.ID); !ok {
		http.Error(w, fmt.Sprintf("field \"id\": node %d is not a node of this cluster", m.ID), http.StatusBadRequest)
		return
	}
	l.applyMove(m.ID, addr, m.Gen, viaAnnounce)
	w.WriteHeader(http.StatusNoContent)
}

// applyMove records that node id is at addr since generation gen, unless
// that is not newer than what the table knows; heartbeats follow the node.
func (l *locator) applyMove(id int, addr netip.Addr, gen uint64, via string) bool {
	if id == l.self {
		return false
	}
	old, _ := l.table.Node(id)
	moved, err := l.table.Move(id, addr, gen)
	if err != nil {
		l.log.Warn("ignoring a move", "moved_node", id, "addr", addr, "gen", gen, "via", via, "err", err)
		return false
	}
	if !moved {
		return false
	}
	if ap, ok := l.peerAddr(id); ok && l.setPeer != nil {
		l.setPeer(id, ap)
	}
	l.moves.WithLabelValues(via).Inc()
	l.log.Info("node moved", "moved_node", id, "from", old.Addr, "addr", addr, "gen", gen, "logical", old.Logical, "via", via)
	return true
}

// handleListeners registers (POST) or unregisters (DELETE) a radic
// listener: of this node, then pushed to every other daemon before the
// answer; or, with ?from=N, one of node N pushed by N's daemon.
func (l *locator) handleListeners(w http.ResponseWriter, r *http.Request) {
	unregister := r.Method == http.MethodDelete
	node, pushed := l.self, false
	if f := r.URL.Query().Get("from"); f != "" || r.URL.Query().Has("from") {
		n, err := strconv.Atoi(f)
		if err != nil {
			http.Error(w, fmt.Sprintf("parameter \"from\": not a node id: %q", f), http.StatusBadRequest)
			return
		}
		if _, ok := l.table.Node(n); !ok || n == l.self {
			http.Error(w, fmt.Sprintf("parameter \"from\": node %d is not another node of this cluster", n), http.StatusBadRequest)
			return
		}
		node, pushed = n, true
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	var req reconfigure.ListenerRequest
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, "bad JSON: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := req.Check(unregister); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	via := "local"
	if pushed {
		via = "push"
	}
	if req.Node != nil {
		if _, ok := l.table.Node(*req.Node); !ok {
			http.Error(w, fmt.Sprintf("field \"node\": %d is not a node of this cluster", *req.Node), http.StatusBadRequest)
			return
		}
	}
	if unregister {
		if l.table.Unregister(req.Job, req.LogicalNode(node), req.Port, req.LPID) {
			l.log.Info("listener unregistered", "job", req.Job, "listener_node", req.LogicalNode(node), "host", node, "port", req.Port, "lpid", req.LPID, "via", via)
		}
	} else {
		changed, err := l.table.Register(req.Listener(node))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if changed {
			l.log.Info("listener registered", "job", req.Job, "listener_node", req.LogicalNode(node), "host", node, "port", req.Port, "lpid", req.LPID, "ctl_port", req.CtlPort, "via", via)
		}
	}
	if !pushed {
		l.push(r.Context(), r.Method, body)
	}
	w.WriteHeader(http.StatusNoContent)
}

// push sends a registration of this node to every other daemon, in
// parallel, each with locPeerTimeout, and returns when all have answered or
// timed out. Failures are logged and counted: a daemon that missed it asks
// this one when it needs it.
func (l *locator) push(ctx context.Context, method string, body []byte) {
	ids := l.reachable()
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			errs[i] = l.send(ctx, id, method, reconfigure.PathListeners+"?from="+strconv.Itoa(l.self), body)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			l.pushErrors.Add(1)
			l.log.Warn("could not push a listener registration", "to", ids[i], "method", method, "err", err)
		}
	}
}

// send makes one request to node id's daemon and wants a 2xx answer.
func (l *locator) send(ctx context.Context, id int, method, path string, body []byte) error {
	base, ok := l.peerURL(id)
	if !ok {
		return fmt.Errorf("no address for node %d", id)
	}
	ctx, cancel := context.WithTimeout(ctx, locPeerTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("node %d: %s: %s", id, resp.Status, strings.TrimSpace(string(msg)))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return nil
}

// get fetches JSON from node id's daemon (at ip when valid, else at its
// current address).
func (l *locator) get(ctx context.Context, id int, ip netip.Addr, path string, v any) error {
	ap, ok := l.peerAddr(id)
	if !ok {
		return fmt.Errorf("no address for node %d", id)
	}
	if ip.IsValid() {
		ap = netip.AddrPortFrom(ip, ap.Port())
	}
	ctx, cancel := context.WithTimeout(ctx, locPeerTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ap.String()+path, nil)
	if err != nil {
		return err
	}
	resp, err := l.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("node %d: %s: %s", id, resp.Status, strings.TrimSpace(string(msg)))
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(v)
}

// handleLocate answers GET /v1/locate?job=J&addr=IP:PORT[&local=1].
func (l *locator) handleLocate(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	job := q.Get("job")
	if job == "" {
		http.Error(w, `missing parameter "job"`, http.StatusBadRequest)
		return
	}
	as := q.Get("addr")
	if as == "" {
		http.Error(w, `missing parameter "addr"`, http.StatusBadRequest)
		return
	}
	ap, err := netip.ParseAddrPort(as)
	if err != nil {
		http.Error(w, fmt.Sprintf("parameter \"addr\": want IP:PORT: %v", err), http.StatusBadRequest)
		return
	}
	local := false
	if v := q.Get("local"); v != "" {
		if local, err = strconv.ParseBool(v); err != nil {
			http.Error(w, fmt.Sprintf("parameter \"local\": want 1 or 0, not %q", v), http.StatusBadRequest)
			return
		}
	}
	loc, found := l.table.Locate(job, ap)
	switch {
	case loc.Managed, loc.Closed && local:
		l.lookups.WithLabelValues(lookupHit).Inc()
		writeJSON(w, loc.Reply())
		return
	case !found:
		l.lookups.WithLabelValues(lookupOutside).Inc()
		writeJSON(w, reconfigure.LocateReply{})
		return
	case local || loc.Node == l.self:
		// This daemon is the authority on its own node's listeners.
		l.lookups.WithLabelValues(lookupMiss).Inc()
		writeJSON(w, reconfigure.LocateReply{})
		return
	}
	rep, err := l.askOwner(r.Context(), job, loc.Node, ap.Port())
	if err != nil {
		l.lookups.WithLabelValues(lookupError).Inc()
		l.log.Warn("lookup: the node's daemon could not be asked", "job", job, "addr", ap, "owner", loc.Node, "err", err)
		http.Error(w, fmt.Sprintf("%v belongs to node %d, whose daemon could not be asked: %v", ap, loc.Node, err), http.StatusServiceUnavailable)
		return
	}
	if !rep.Managed {
		l.lookups.WithLabelValues(lookupRemoteMiss).Inc()
		writeJSON(w, reconfigure.LocateReply{})
		return
	}
	l.lookups.WithLabelValues(lookupRemoteHit).Inc()
	writeJSON(w, rep.Reply())
}

// askOwner asks node id's daemon, from its table only, whether (job, id,
// port) is a radic listener, and caches a hit (and any newer address of
// the node it carries).
func (l *locator) askOwner(ctx context.Context, job string, id int, port uint16) (reconfigure.Location, error) {
	if l.dead != nil && l.dead(id) {
		return reconfigure.Location{}, fmt.Errorf("node %d has been declared dead", id)
	}
	n, _ := l.table.Node(id)
	q := url.Values{"job": {job}, "addr": {netip.AddrPortFrom(n.Logical, port).String()}, "local": {"1"}}
	var rep reconfigure.LocateReply
	if err := l.get(ctx, id, netip.Addr{}, reconfigure.PathLocate+"?"+q.Encode(), &rep); err != nil {
		return reconfigure.Location{}, err
	}
	loc, err := rep.Location()
	if err != nil || !loc.Managed {
		return loc, err
	}
	if loc.Node != id || loc.Addr.Port() != port {
		return reconfigure.Location{}, fmt.Errorf("node %d answered for node %d port %d", id, loc.Node, loc.Addr.Port())
	}
	if !loc.Moved { // else the address is the host's, not the node's
		l.applyMove(id, loc.Addr.Addr(), loc.Gen, viaLocate)
	}
	changed, err := l.table.Register(reconfigure.Listener{Job: job, Node: id, Port: port, LPID: loc.LPID, CtlPort: loc.Ctl.Port(), Moved: loc.Moved, Host: loc.Host})
	if err != nil {
		return reconfigure.Location{}, err
	}
	if changed {
		l.log.Info("listener registered", "job", job, "listener_node", id, "port", port, "lpid", loc.LPID, "ctl_port", loc.Ctl.Port(), "via", "lookup")
	}
	if cur, _ := l.table.Locate(job, netip.AddrPortFrom(n.Logical, port)); cur.Managed {
		return cur, nil
	}
	return loc, nil
}

// moveSelf records that this node is now at addr, with the next
// generation (at least minGen), persists it, and announces it to every
// other daemon. It returns the new generation.
func (l *locator) moveSelf(addr netip.Addr, minGen uint64, why string) uint64 {
	l.selfMu.Lock()
	defer l.selfMu.Unlock()
	old, _ := l.table.Node(l.self)
	gen := max(old.Gen+1, minGen)
	if _, err := l.table.Move(l.self, addr, gen); err != nil {
		l.log.Error("cannot record this node's new address", "addr", addr, "err", err)
		return old.Gen
	}
	if l.persist != nil {
		if err := l.persist(addrState{Addr: addr.String(), Gen: gen}); err != nil {
			l.log.Error("cannot persist this node's address generation", "gen", gen, "err", err)
		}
	}
	// Pooled connections to the peers carry the old source address.
	l.client.CloseIdleConnections()
	if l.selfMoved != nil {
		l.selfMoved()
	}
	l.moves.WithLabelValues(viaSelf).Inc()
	l.log.Warn("this node's address changed: announcing it", "from", old.Addr, "addr", addr, "gen", gen, "logical", old.Logical, "why", why)
	l.announce(moveOf(l.self, addr, gen))
	return gen
}

func moveOf(id int, addr netip.Addr, gen uint64) reconfigure.MoveRequest {
	return reconfigure.MoveRequest{ID: id, Addr: addr.String(), Gen: gen}
}

// announce tells every other daemon where this node is now, in the
// background; a daemon that does not take it is retried for announceFor.
func (l *locator) announce(m reconfigure.MoveRequest) {
	body, _ := json.Marshal(m)
	ids := l.others()
	var ok atomic.Int32
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			deadline := time.Now().Add(announceFor)
			wait := 100 * time.Millisecond
			for try := 0; ; try++ {
				if cur, _ := l.table.Node(l.self); cur.Gen != m.Gen {
					return // superseded by a newer move
				}
				err := l.send(l.bgCtx, id, http.MethodPost, reconfigure.PathMoved, body)
				if err == nil {
					ok.Add(1)
					return
				}
				if try == 0 {
					l.pushErrors.Add(1)
				}
				if time.Now().Add(wait).After(deadline) || l.bgCtx.Err() != nil {
					l.log.Warn("could not announce this node's new address", "to", id, "gen", m.Gen, "err", err)
					return
				}
				select {
				case <-time.After(wait):
				case <-l.bgCtx.Done():
					return
				}
				wait = min(2*wait, 2*time.Second)
			}
		})
	}
	l.bg.Go(func() {
		start := time.Now()
		wg.Wait()
		l.log.Info("move announced", "addr", m.Addr, "gen", m.Gen, "peers", len(ids), "took", int(ok.Load()), "elapsed", time.Since(start).Round(time.Millisecond))
	})
}

// noteSource is hbudp's OnNewSource: node id's heartbeats come from ip,
// which is not where they are sent. It must not block.
func (l *locator) noteSource(id heartbeat.NodeID, src netip.AddrPort) {
	select {
	case l.sources <- sourceNote{id: int(id), ip: src.Addr().Unmap()}:
	default:
	}
}

// routineSources asks a node whose heartbeats come from a new address for
// its own entry: a move this daemon missed is learnt within a heartbeat
// period.
func (l *locator) routineSources(ctx context.Context) {
	l.log.Info("RoutineSources starting")
	defer l.log.Info("RoutineSources stopped")
	for {
		var note sourceNote
		select {
		case <-ctx.Done():
			return
		case note = <-l.sources:
		}
		if n, ok := l.table.Node(note.id); !ok || n.Addr == note.ip {
			continue
		}
		l.askMu.Lock()
		last, seen := l.asked[note]
		if !seen || time.Since(last) >= sourceRecheck {
			l.asked[note] = time.Now()
		}
		l.askMu.Unlock()
		if seen && time.Since(last) < sourceRecheck {
			continue
		}
		var rep reconfigure.NodesReply
		if err := l.get(ctx, note.id, note.ip, reconfigure.PathNodes, &rep); err != nil {
			l.log.Debug("a node's heartbeats come from a new address, but its daemon there did not answer", "src_node", note.id, "src", note.ip, "err", err)
			// Ask again at the next note (hbudp makes one a second):
			// the source may be all this node will ever hear of the move.
			l.askMu.Lock()
			delete(l.asked, note)
			l.askMu.Unlock()
			continue
		}
		for _, e := range rep.Nodes {
			if e.ID != note.id {
				continue
			}
			if a, err := netip.ParseAddr(e.Addr); err == nil {
				l.applyMove(e.ID, a, e.Gen, viaHeartbeat)
			}
		}
	}
}

// routineSync compares this daemon's node list with another daemon's every
// syncEvery, round robin, and takes every newer entry: moves reach daemons
// that missed both the announcement and the move's heartbeats.
func (l *locator) routineSync(ctx context.Context) {
	l.log.Info("RoutineLocationSync starting")
	defer l.log.Info("RoutineLocationSync stopped")
	t := time.NewTicker(syncEvery)
	defer t.Stop()
	next := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ids := l.others()
		if len(ids) == 0 {
			continue
		}
		id := ids[next%len(ids)]
		next++
		var rep reconfigure.NodesReply
		if err := l.get(ctx, id, netip.Addr{}, reconfigure.PathNodes, &rep); err != nil {
			continue
		}
		l.merge(rep.Nodes, viaSync)
	}
}

// merge takes the newer entries of another daemon's node list. An entry
// for this node newer than this node's own (its generation was lost with
// its state directory) makes it move to its current address again with a
// higher generation, so that everybody converges on where it is.
func (l *locator) merge(nodes []reconfigure.NodeInfo, via string) {
	for _, e := range nodes {
		a, err := netip.ParseAddr(e.Addr)
		if err != nil {
			continue
		}
		if e.ID == l.self {
			me, _ := l.table.Node(l.self)
			if e.Gen > me.Gen {
				l.moveSelf(me.Addr, e.Gen+1, fmt.Sprintf("another daemon knows this node at generation %d, above its own %d (%s)", e.Gen, me.Gen, via))
			}
			continue
		}
		l.applyMove(e.ID, a, e.Gen, via)
	}
}
