package radicd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/heartbeat/hbudp"
	"github.com/radic-project/radic/internal/fabric"
	"github.com/radic-project/radic/internal/launch"
	"github.com/radic-project/radic/msglog"
	"github.com/radic-project/radic/protector"
)

// Daemon is one radicd.
type Daemon struct {
	cfg     Config
	self    heartbeat.NodeID
	log     *slog.Logger
	inc     uint64
	started time.Time

	stats       heartbeat.Stats
	detection   prometheus.Histogram
	replErrors  atomic.Uint64
	reprotected atomic.Uint64
	runner      *heartbeat.Runner
	stores      *stores
	reg         *prometheus.Registry
	client      *http.Client
	notify      *notifier
	loc         *locator
	logs        *logRings     // the processes' log rings (logring.go)
	repl        *replicator   // this node's log streams to its protectors (repl.go)
	ranks       *rankTable    // the ranks this node launched (ranks.go)
	dir         *directory    // where the recovery ranks run (recovery.go)
	prog        *progressBook // the recoveries under way (progress.go)
	rec         *recoveryEdge // nil: this node restarts nothing (recovery.go)
	recMetrics  *recoveryMetrics
	writersMu   sync.Mutex
	// +checklocks:writersMu
	writers map[heartbeat.NodeID]*logWriter // protected nodes' log streams (repl.go)
	hb      *hbudp.Transport                // --fabric ip
	fab     *fabric.Fabric                  // --fabric bg
	// pcapFile is --pcap's trace, closed after the fabric.
	pcapFile *os.File
	// beaconIf is the index of the interface this node's address is on,
	// when radicd follows it (0: it does not).
	beaconIf atomic.Int32

	// OnEvent, if set before Run, sees every ring event after the daemon
	// handled it (the protector's recovery hooks in here).
	OnEvent func(heartbeat.Event)

	// fenced: this node's protector fenced it; it launches nothing more
	// until radicd restarts (launchgate.go; the ring's own fence is in
	// its status, and ends when the node rejoins).
	fenced  atomic.Bool
	fenceMu sync.Mutex
	// +checklocks:fenceMu
	lastFence FenceReport

	ckpt checkpoints // POST /v1/jobs/{job}/checkpoint (checkpoint.go)
}

// beacon makes this node's heartbeats also go out as broadcasts for as
// long as it announces a move: a peer that moved at about the same time
// has missed the announcement and sends to this node's old address, and
// only a datagram that needs no address can tell it where this node is
// now (package hbudp's doc).
func (d *Daemon) beacon() {
	i := d.beaconIf.Load()
	if i == 0 {
		return
	}
	var err error
	switch {
	case d.hb != nil:
		err = d.hb.Beacon(int(i), time.Now().Add(announceFor))
	case d.fab != nil:
		err = d.fab.Beacon(int(i), time.Now().Add(announceFor))
	}
	if err != nil {
		d.log.Warn("cannot broadcast this node's heartbeats after its move: a peer that moved at the same time may not find it", "err", err)
	}
}

// heartbeatTransport is where the ring's datagrams go: UDP straight to
// each peer (--fabric ip) or the emulated torus (--fabric bg).
type heartbeatTransport interface {
	heartbeat.Transport
	SetPeer(heartbeat.NodeID, netip.AddrPort)
	OnNewSource(func(heartbeat.NodeID, netip.AddrPort))
}

// listenHeartbeats opens the ring's transport on bind. Heartbeats follow
// a node that moves; one whose heartbeats come from a new address is
// asked where it is.
func (d *Daemon) listenHeartbeats(bind netip.AddrPort, peers map[heartbeat.NodeID]netip.AddrPort) (heartbeatTransport, error) {
	var tr heartbeatTransport
	if d.cfg.Fabric == "bg" {
		fcfg := fabric.Config{Shape: d.cfg.Torus, Self: d.self, Bind: bind, Peers: peers, Logger: d.log}
		var pcap *os.File
		if d.cfg.Pcap != "" {
			var err error
			if pcap, err = os.Create(d.cfg.Pcap); err != nil {
				return nil, fmt.Errorf("--pcap: %w", err)
			}
			fcfg.Pcap = pcap
		}
		f, err := fabric.Listen(fcfg)
		if err != nil {
			if pcap != nil {
				pcap.Close()
			}
			return nil, err
		}
		d.fab, d.pcapFile = f, pcap
		tr = f
	} else {
		h, err := hbudp.Listen(bind, peers)
		if err != nil {
			return nil, err
		}
		d.hb = h
		tr = h
	}
	d.loc.setPeer = func(id int, a netip.AddrPort) { tr.SetPeer(heartbeat.NodeID(id), a) }
	tr.OnNewSource(d.loc.noteSource)
	return tr, nil
}

// dialPeer is the dialer of radicd's HTTP client. With --fabric bg a
// request to another daemon travels on a fabric stream: launch records,
// log reads for a replay, re-protection, location pushes and lookups.
// Any other address (a daemon not yet at its new address, this one, a
// job's launcher) is dialled over TCP.
func (d *Daemon) dialPeer(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.fab != nil {
		if ap, err := netip.ParseAddrPort(addr); err == nil {
			if id, ok := d.loc.nodeAt(ap); ok && id != d.self {
				return d.fab.Dial(id, fabric.ServiceHTTP, nil)
			}
		}
	}
	var dl net.Dialer
	return dl.DialContext(ctx, network, addr)
}

// FenceReport says what the last self-fencing did.
type FenceReport struct {
	At      time.Time `json:"at,omitzero"`
	Cgroup  string    `json:"cgroup,omitempty"`
	Killed  int       `json:"killed"`
	Error   string    `json:"error,omitempty"`
	Elapsed float64   `json:"elapsed_ms"`
}

// NewLogger makes the slog logger the config asks for, on w.
func NewLogger(c Config, w *os.File) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(c.LogLevel))
	o := &slog.HandlerOptions{Level: lv}
	var h slog.Handler = slog.NewTextHandler(w, o)
	if c.LogFormat == "json" {
		h = slog.NewJSONHandler(w, o)
	}
	return slog.New(h).With("node", c.Node)
}

// New prepares a daemon: state directory, incarnation, store recovery.
func New(cfg Config, log *slog.Logger) (*Daemon, error) {
	spareProcs()
	d := &Daemon{
		cfg: cfg, self: heartbeat.NodeID(cfg.Node), log: log, started: time.Now(),
		reg:    prometheus.NewRegistry(),
		client: &http.Client{},
		notify: newNotifier(),
		ranks:  newRankTable(),
		dir:    newDirectory(),
		prog:   newProgressBook(),
		detection: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "radic_detection_seconds",
			Help:    "Silence of a node before this node (its watchdog) declared it unreachable: heartbeat timeout plus probe time.",
			Buckets: DetectionBuckets,
		}),
	}
	d.repl = newReplicator(d)
	d.logs = &logRings{log: log, submit: d.repl.submit, refresh: func(ctx context.Context) { _, _ = d.repl.protectors(ctx) }}
	d.stats.DetectionHook = func(t time.Duration) { d.detection.Observe(t.Seconds()) }
	d.client.Transport = &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second, DialContext: d.dialPeer}
	loc, err := newLocator(cfg.Node, cfg.Peers, d.client, log)
	if err != nil {
		return nil, err
	}
	loc.persist = func(st addrState) error { return saveAddrState(cfg.StateDir, st) }
	d.loc = loc
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	inc, err := nextIncarnation(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	d.inc = inc
	st, err := openStores(filepath.Join(cfg.StateDir, "store"), msglog.Options{
		Sync: cfg.StoreSync, MaxBytes: cfg.StoreMax, MemoryLimit: cfg.StoreMemory,
		// The protected nodes' logs are read back only after a failure.
		DropSynced: true,
	}, log)
	if err != nil {
		return nil, err
	}
	d.stores = st
	return d, nil
}

// nextIncarnation reads, bumps and durably writes the incarnation counter.
// It is also at least the wall clock in microseconds, so a node whose state
// directory was lost still comes back newer than before.
func nextIncarnation(dir string) (uint64, error) {
	p := filepath.Join(dir, "incarnation")
	var prev uint64
	if b, err := os.ReadFile(p); err == nil {
		prev, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	} else if !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("read incarnation: %w", err)
	}
	inc := max(prev+1, uint64(time.Now().UnixMicro()))
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, fmt.Errorf("write incarnation: %w", err)
	}
	_, err = fmt.Fprintf(f, "%d\n", inc)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		return 0, fmt.Errorf("write incarnation: %w", err)
	}
	return inc, nil
}

// Run serves until ctx ends or the node is superseded.
func (d *Daemon) Run(ctx context.Context) (err error) {
	defer func() {
		if cerr := d.stores.Close(); cerr != nil {
			d.log.Error("closing stores", "err", cerr)
		}
	}()
	peers := map[heartbeat.NodeID]netip.AddrPort{}
	for id, a := range d.cfg.Peers {
		peers[id] = a
	}
	bind := d.cfg.bindAddr()
	tr, err := d.listenHeartbeats(bind, peers)
	if err != nil {
		return err
	}
	d.loc.selfMoved = d.beacon
	d.loc.dead = d.declaredDead
	d.runner, err = heartbeat.NewRunner(heartbeat.RunnerConfig{
		Core: d.cfg.HeartbeatConfig(d.inc), Transport: tr, Stats: &d.stats,
		Logger: d.log, OnEvent: d.onEvent,
	})
	if err != nil {
		tr.Close()
		return err
	}
	d.registerMetrics(d.reg)
	d.recMetrics = newRecoveryMetrics(d.reg)
	if ok, why := d.recoveryEnabled(); ok {
		d.rec = &recoveryEdge{d: d, in: make(chan func(*protector.Machine, time.Time), 1024), met: d.recMetrics, replays: newReplayTable()}
	} else {
		d.log.Warn("recovery off: lost ranks are not restarted", "why", why)
	}

	tcpNet := "tcp"
	if bind.Addr().Is4() {
		tcpNet = "tcp4"
	}
	tcp, err := net.Listen(tcpNet, bind.String())
	if err != nil {
		tr.Close()
		return fmt.Errorf("listen %v: %w", bind, err)
	}
	var metricsLn net.Listener
	if mb, _ := d.cfg.metricsBind(); mb != "" {
		mnet := "tcp"
		if d.cfg.Bind.Is4() {
			mnet = "tcp4"
		}
		metricsLn, err = net.Listen(mnet, mb)
		if err != nil {
			tr.Close()
			tcp.Close()
			return fmt.Errorf("listen metrics %v: %w", mb, err)
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d.loc.bgCtx = ctx // announcements of this node's moves end with it
	d.logs.ctx = ctx
	d.repl.ctx = ctx
	ifi, watch := d.initAddress()
	var wg sync.WaitGroup
	runErr := make(chan error, 1)
	wg.Go(func() { runErr <- d.runner.Run(ctx) })

	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", d.handleStatus)
	mux.HandleFunc("GET /healthz", d.handleHealth)
	mux.HandleFunc("POST /v1/log", d.handleLog)
	mux.HandleFunc("POST /v1/logring", d.handleLogRing)
	mux.HandleFunc("POST /v1/suspect", d.handleSuspect)
	mux.HandleFunc("POST /v1/replica/append", d.handleReplicaAppend)
	mux.HandleFunc("POST /v1/replica/stream", d.handleReplicaStream)
	mux.HandleFunc("GET /v1/replica/streams", d.handleReplicaStreams)
	mux.HandleFunc("GET /v1/replica/read", d.handleReplicaRead)
	mux.HandleFunc("POST /v1/replica/adopt", d.handleReplicaAdopt)
	d.loc.routes(mux)
	d.rankRoutes(mux)
	d.recoveryRoutes(mux)
	d.progressRoutes(mux)
	d.replayRoutes(mux)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)}
	servers := []*http.Server{srv}
	wg.Go(func() { d.serve(srv, tcp, "store") })
	if d.fab != nil {
		// The same API for the other daemons, on the fabric (dialPeer).
		fl := d.fab.Listener(fabric.ServiceHTTP)
		wg.Go(func() { d.serve(srv, fl, "store on the fabric") })
	}
	if metricsLn != nil {
		mm := http.NewServeMux()
		mm.Handle("GET /metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{Registry: d.reg, ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)}))
		mm.HandleFunc("GET /status", d.handleStatus)
		mm.HandleFunc("GET /healthz", d.handleHealth)
		msrv := &http.Server{Handler: mm, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, msrv)
		wg.Go(func() { d.serve(msrv, metricsLn, "metrics") })
	}
	if d.cfg.Pprof != "" {
		if ln, err := net.Listen("tcp", d.cfg.Pprof); err != nil {
			d.log.Warn("cannot serve pprof", "addr", d.cfg.Pprof, "err", err)
		} else {
			pm := http.NewServeMux()
			pm.HandleFunc("/debug/pprof/", pprof.Index)
			pm.HandleFunc("/debug/pprof/profile", pprof.Profile)
			pm.HandleFunc("/debug/pprof/trace", pprof.Trace)
			psrv := &http.Server{Handler: pm, ReadHeaderTimeout: 10 * time.Second}
			servers = append(servers, psrv)
			wg.Go(func() { d.serve(psrv, ln, "pprof") })
		}
	}
	wg.Go(func() { d.routineReprotect(ctx) })
	if d.fab != nil {
		wg.Go(func() { d.routineFabricReplica(ctx) })
	}
	if d.rec != nil {
		sweepReplayFiles(d.log, d.replayDirs()...)
		wg.Go(func() { d.rec.routineRecovery(ctx) })
	}
	wg.Go(func() { d.loc.routineSources(ctx) })
	wg.Go(func() { d.loc.routineSync(ctx) })
	if watch {
		wg.Go(func() { d.routineAddrWatch(ctx, ifi) })
	}
	if wd := watchdogInterval(); wd > 0 {
		wg.Go(func() { d.routineWatchdog(ctx, wd) })
	}

	d.log.Info("radicd serving", "incarnation", d.inc, "listen", d.cfg.Listen.String(), "bind", bind.String(),
		"metrics", d.cfg.MetricsAddr, "fabric", d.cfg.Fabric, "peers", len(d.cfg.Peers), "spare", d.cfg.Spare,
		"protectors", d.cfg.Protectors, "job_cgroup", d.cfg.JobCgroup, "pid", os.Getpid())
	if err := d.notify.Notify(fmt.Sprintf("READY=1\nSTATUS=serving node %d incarnation %d\nMAINPID=%d", d.cfg.Node, d.inc, os.Getpid())); err != nil {
		d.log.Warn("sd_notify READY failed", "err", err)
	}

	select {
	case <-ctx.Done():
	case err = <-runErr:
		runErr <- nil
	}
	d.log.Info("radicd stopping", "err", err)
	if nerr := d.notify.Notify("STOPPING=1\nSTATUS=stopping"); nerr != nil {
		d.log.Warn("sd_notify STOPPING failed", "err", nerr)
	}
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	for _, s := range servers {
		_ = s.Shutdown(sctx)
	}
	wg.Wait()
	d.loc.bg.Wait()
	d.logs.wg.Wait()
	if d.rec != nil {
		d.rec.replays.releaseAll("")
	}
	if e := <-runErr; err == nil {
		err = e
	}
	if d.pcapFile != nil {
		// The runner closed the fabric, which flushed the trace.
		if cerr := d.pcapFile.Close(); cerr != nil {
			d.log.Warn("closing the pcap trace", "file", d.cfg.Pcap, "err", cerr)
		}
	}
	return err
}

func (d *Daemon) serve(srv *http.Server, ln net.Listener, what string) {
	d.log.Info("RoutineServe starting", "server", what, "addr", ln.Addr().String())
	defer d.log.Info("RoutineServe stopped", "server", what)
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		d.log.Error("server failed", "server", what, "err", err)
	}
}

func (d *Daemon) routineWatchdog(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// Only pet the watchdog while the ring loop answers.
			sctx, cancel := context.WithTimeout(ctx, every)
			_, ok := d.runner.Status(sctx)
			cancel()
			if ok {
				_ = d.notify.Notify("WATCHDOG=1")
			}
		}
	}
}

// onEvent runs on the ring's goroutine: fencing must be done when it
// returns.
// declaredDead says whether the ring has declared node id dead (false
// when the ring does not answer within 100 ms: then try the node).
func (d *Daemon) declaredDead(id int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	st, ok := d.runner.Status(ctx)
	if !ok {
		return false
	}
	for _, m := range st.Members {
		if int(m.ID) == id {
			return m.State == "dead"
		}
	}
	return false
}

func (d *Daemon) onEvent(e heartbeat.Event) {
	switch e.Kind {
	case heartbeat.EventDeclared, heartbeat.EventJoined:
		if d.fab != nil {
			d.fab.SetDown(e.Node, e.Kind == heartbeat.EventDeclared)
		}
	case heartbeat.EventFence:
		if d.rec != nil {
			// Before the kill: the machine takes its inputs in order, so
			// it is fenced before it hears of the exits the kill causes,
			// and restarts none of them here.
			d.rec.input(func(m *protector.Machine, now time.Time) {
				m.Fence(now, "the heartbeat ring fenced this node")
			})
		}
		if !d.cfg.FenceKill {
			d.fenceMu.Lock()
			d.lastFence = FenceReport{At: time.Now(), Cgroup: d.cfg.JobCgroup, Error: "fence-kill is off: processes left running"}
			d.fenceMu.Unlock()
			d.log.Warn("fenced: cut off from the ring; fence-kill is off, so the managed processes keep running", "cgroup", d.cfg.JobCgroup)
			_ = d.notify.Notify("STATUS=fenced: cut off from the ring (processes left running)")
			return
		}
		start := time.Now()
		n, err := killCgroup(d.cfg.JobCgroup, 5*time.Second)
		rep := FenceReport{At: start, Cgroup: d.cfg.JobCgroup, Killed: n, Elapsed: float64(time.Since(start)) / 1e6}
		if err != nil {
			rep.Error = err.Error()
			d.log.Error("fencing: could not stop the managed processes", "cgroup", d.cfg.JobCgroup, "err", err)
		} else {
			d.log.Warn("fenced: managed processes stopped", "cgroup", d.cfg.JobCgroup, "killed", n, "elapsed", time.Since(start))
		}
		d.fenceMu.Lock()
		d.lastFence = rep
		d.fenceMu.Unlock()
		_ = d.notify.Notify("STATUS=fenced: cut off from the ring")
	case heartbeat.EventRejoin:
		_ = d.notify.Notify(fmt.Sprintf("STATUS=serving node %d incarnation %d (rejoined)", d.cfg.Node, e.Inc))
	}
	if d.rec != nil {
		d.rec.onRingEvent(e)
	}
	if d.OnEvent != nil {
		d.OnEvent(e)
	}
}

// NodeStatus is radicd's /status document.
type NodeStatus struct {
	Node        int              `json:"node"`
	Listen      string           `json:"listen"`
	Addr        string           `json:"addr"`     // current address (Listen's IP until the node moves)
	AddrGen     uint64           `json:"addr_gen"` // how many times the node's address changed
	MetricsAddr string           `json:"metrics_addr,omitempty"`
	PID         int              `json:"pid"`
	Started     time.Time        `json:"started"`
	Now         time.Time        `json:"now"`
	Spare       bool             `json:"spare_configured"`
	Ring        heartbeat.Status `json:"ring"`
	Store       StoreStatus      `json:"store"`
	LastFence   *FenceReport     `json:"last_fence,omitempty"`
	// Recovery: the recoveries under way in the cluster and the last
	// finished ones, as this daemon knows them.
	Recovery *launch.RecoveryStatus `json:"recovery,omitempty"`
}

// StoreStatus summarises the critical-data store.
type StoreStatus struct {
	Bytes   int64              `json:"bytes"`
	Records uint64             `json:"records"`
	Holds   []heartbeat.NodeID `json:"holds"` // nodes whose data is here
	Sync    string             `json:"sync"`
}

func (d *Daemon) handleStatus(w http.ResponseWriter, r *http.Request) {
	st, ok := d.runner.Status(r.Context())
	if !ok {
		http.Error(w, "stopping", http.StatusServiceUnavailable)
		return
	}
	b, recs, _ := d.stores.totals()
	self, _ := d.loc.peerAddr(d.cfg.Node)
	me, _ := d.loc.table.Node(d.cfg.Node)
	ns := NodeStatus{
		Node: d.cfg.Node, Listen: d.cfg.Listen.String(), Addr: self.String(), AddrGen: me.Gen, MetricsAddr: d.cfg.MetricsAddr,
		PID: os.Getpid(), Started: d.started, Now: time.Now(), Spare: d.cfg.Spare, Ring: st,
		Store:    StoreStatus{Bytes: b, Records: recs, Holds: d.stores.nodes(), Sync: d.cfg.StoreSync.String()},
		Recovery: d.recoveryStatus(time.Now()),
	}
	d.fenceMu.Lock()
	if !d.lastFence.At.IsZero() {
		f := d.lastFence
		ns.LastFence = &f
	}
	d.fenceMu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(ns)
}

// handleSuspect lets an observer escalate a safe socket's error on a
// connection to node=N: diagnosis (direct and indirect probes) starts at
// once instead of at the next missed deadline.
func (d *Daemon) handleSuspect(w http.ResponseWriter, r *http.Request) {
	id, err := nodeParam(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	d.runner.Suspect(id)
	w.WriteHeader(http.StatusAccepted)
}

func (d *Daemon) handleHealth(w http.ResponseWriter, r *http.Request) {
	st, ok := d.runner.Status(r.Context())
	switch {
	case !ok:
		http.Error(w, "stopping", http.StatusServiceUnavailable)
	case st.Fenced:
		http.Error(w, "fenced", http.StatusServiceUnavailable)
	default:
		fmt.Fprintln(w, "ok")
	}
}
