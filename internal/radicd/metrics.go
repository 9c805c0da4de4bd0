package radicd

import (
	"context"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/internal/fabric"
	"github.com/radic-project/radic/internal/launch"
	"github.com/radic-project/radic/msglog"
	"github.com/radic-project/radic/netsim/udplink"
	"github.com/radic-project/radic/protector"
)

// DetectionBuckets are radic_detection_seconds' buckets: fine around the
// default 0.4-0.7 s, up to the slow cases.
var DetectionBuckets = []float64{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.5, 2, 5, 10}

// MetricNames lists every radic_* metric radicd exports (for tests and the
// dashboard check).
var MetricNames = []string{
	"radic_heartbeats_sent_total", "radic_heartbeats_received_total", "radic_heartbeats_missed_total",
	"radic_failures_detected_total", "radic_detection_seconds",
	"radic_probes_sent_total", "radic_suspicions_refuted_total", "radic_indirect_saves_total",
	"radic_stale_rejected_total", "radic_stalls_total", "radic_fences_total", "radic_fenced",
	"radic_ring_size", "radic_incarnation", "radic_peer_up", "radic_peer_last_heartbeat_seconds",
	"radic_store_bytes", "radic_store_records_total", "radic_store_full_errors_total",
	"radic_store_quota_bytes", "radic_store_fs_size_bytes", "radic_store_fs_avail_bytes", "radic_store_nodes",
	"radic_replication_errors_total", "radic_reprotected_records_total",
	"radic_location_lookups_total", "radic_location_moves_total", "radic_location_push_errors_total",
	"radic_location_listeners", "radic_location_generation",
	"radic_log_bytes", "radic_log_records", "radic_log_shipped_bytes_total", "radic_log_shipped_records_total",
	"radic_log_rings", "radic_log_stuck_rings",
	"radic_recoveries_total", "radic_recovery_seconds", "radic_recovery_phase_seconds",
	"radic_replay_bytes_total", "radic_divergences_total",
	"radic_checkpoints_total", "radic_checkpoint_failures_total", "radic_checkpoint_seconds", "radic_checkpoint_bytes",
	"radic_fabric_packets_total", "radic_fabric_frames_total", "radic_fabric_streams", "radic_fabric_stream_bytes_total",
}

// registerMetrics puts radicd's collectors on reg (never the global one).
func (d *Daemon) registerMetrics(reg *prometheus.Registry) {
	s := &d.stats
	counter := func(name, help string, f func() uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f()) })
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		counter("radic_heartbeats_sent_total", "Heartbeats sent to ring neighbours (and, for discovery, to members not yet heard from).", s.HeartbeatsSent.Load),
		counter("radic_heartbeats_received_total", "Heartbeats received.", s.HeartbeatsReceived.Load),
		counter("radic_heartbeats_missed_total", "Watchdog deadlines missed by the watched ring predecessor (each starts probes).", s.HeartbeatsMissed.Load),
		counter("radic_probes_sent_total", "Direct probes and indirect probe requests sent.", s.ProbesSent.Load),
		counter("radic_suspicions_refuted_total", "Suspicions cleared because the suspect answered.", s.Refuted.Load),
		counter("radic_indirect_saves_total", "Suspicions cleared by an answer through another ring member (a cut link, not a dead node).", s.IndirectSaves.Load),
		counter("radic_stale_rejected_total", "Datagrams rejected because they came from a dead or older incarnation.", s.StaleRejected.Load),
		counter("radic_stalls_total", "Times this daemon was not scheduled for more than two heartbeat periods.", s.Stalls.Load),
		counter("radic_fences_total", "Times this node fenced itself (stopped its managed processes).", s.Fences.Load),
		counter("radic_replication_errors_total", "Critical-data writes that did not reach every protector.", d.replErrors.Load),
		counter("radic_reprotected_records_total", "Records copied to a new protector after a ring change (re-protection).", d.reprotected.Load),
		d.detection,
	)
	d.registerFabricMetrics(reg)
	for _, kind := range heartbeat.Causes {
		var f func() uint64
		switch kind {
		case heartbeat.CauseUnreachable:
			f = s.Unreachable.Load
		case heartbeat.CauseFenced:
			f = s.Fenced.Load
		case heartbeat.CauseRestarted:
			f = s.Restarted.Load
		}
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "radic_failures_detected_total", Help: "Nodes declared dead by this node (as their watchdog), by cause.",
			ConstLabels: prometheus.Labels{"kind": kind},
		}, func() float64 { return float64(f()) }))
	}
	reg.MustRegister(
		gauge("radic_store_bytes", "Bytes of the critical-data store's files (all protected nodes).", func() float64 {
			b, _, _ := d.stores.totals()
			return float64(b)
		}),
		counter("radic_store_records_total", "Records stored in the critical-data store (duplicates excluded).", func() uint64 {
			_, r, _ := d.stores.totals()
			return r
		}),
		counter("radic_store_full_errors_total", "Appends refused because the store or its disk is full (back-pressure).", func() uint64 {
			_, _, f := d.stores.totals()
			return f
		}),
		gauge("radic_store_nodes", "Protected nodes whose critical data this node holds.", func() float64 {
			return float64(len(d.stores.nodes()))
		}),
		gauge("radic_store_quota_bytes", "The store's quota (--store-max-bytes); 0 when the disk is the only limit.", func() float64 {
			return float64(d.cfg.StoreMax)
		}),
		gauge("radic_store_fs_size_bytes", "Size of the store's file system.", func() float64 {
			size, _ := fsSpace(d.stores.dir)
			return float64(size)
		}),
		gauge("radic_store_fs_avail_bytes", "Bytes available to radicd on the store's file system.", func() float64 {
			_, avail := fsSpace(d.stores.dir)
			return float64(avail)
		}),
		&ringCollector{d: d},
		counter("radic_log_shipped_bytes_total", "Bytes received by this node's processes (with recovery on) and stored on all their protectors.", d.logs.bytes.Load),
		counter("radic_log_shipped_records_total", "Log ring records (receives and their determinants) of this node's processes stored on all their protectors.", d.logs.records.Load),
		gauge("radic_log_bytes", "Bytes of other nodes' processes' logs (received bytes and determinants, launch records excluded) this node's protector holds, from each stream's truncation point to its end.", func() float64 {
			b, _ := d.stores.logTotals()
			return float64(b)
		}),
		gauge("radic_log_records", "Log records of other nodes' processes this node's protector holds in its segment files (launch records excluded; truncated ones count until their segment is dropped).", func() float64 {
			_, r := d.stores.logTotals()
			return float64(r)
		}),
		gauge("radic_log_rings", "Processes of this node whose log rings radicd drains.", func() float64 { return float64(d.logs.active.Load()) }),
		gauge("radic_log_stuck_rings", "Log rings whose last shipment to the protectors failed: their processes' sends wait.", func() float64 { return float64(d.logs.stuck.Load()) }),
	)
	reg.MustRegister(d.loc.collectors()...)
	reg.MustRegister(d.ckpt.collectors()...)
}

// logTotals is what the stores hold of the protected processes' logs:
// the bytes of every log stream from its truncation point to its end, and
// the records in the segment files less the launch records (one per rank,
// duplicates are not stored).
func (s *stores) logTotals() (bytes, records int64) {
	s.mu.Lock()
	sts := make([]*msglog.Store, 0, len(s.byNode))
	for _, st := range s.byNode {
		sts = append(sts, st)
	}
	s.mu.Unlock()
	for _, st := range sts {
		launches := 0
		for _, o := range st.Owners() {
			ss := st.Streams(o)
			if o == launch.StoreOwner {
				launches = len(ss)
				continue
			}
			for _, x := range ss {
				bytes += int64(x.End - x.Low)
			}
		}
		records += max(st.Stats().Records.Load()-int64(launches), 0)
	}
	return bytes, records
}

// recoveryMetrics are the recovery series: radic_recoveries_total,
// radic_recovery_seconds and the per-phase histograms (fed from the
// protector's Records on the node that drove each recovery),
// radic_replay_bytes_total (fed by the replay step, see noteReplay) and
// radic_divergences_total (see noteDivergence).
type recoveryMetrics struct {
	total       *prometheus.CounterVec // cause, result
	seconds     prometheus.Histogram
	phases      *prometheus.HistogramVec // phase
	replayBytes prometheus.Counter
	divergences *prometheus.CounterVec // where
}

// RecoveryBuckets are the buckets of the recovery histograms (seconds).
var RecoveryBuckets = []float64{0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 300}

// Divergence kinds (the where label of radic_divergences_total).
const (
	DivergedOutput     = "output"     // a restarted rank's stdout/stderr (radic run compares it)
	DivergedConnection = "connection" // a restarted process's sends on a managed connection (the replay's check)
)

// Recovery results (the result label of radic_recoveries_total).
const (
	ResultOK     = "ok"     // the group is live again and protected
	ResultFailed = "failed" // the recovery failed, or left the group unprotected
)

func newRecoveryMetrics(reg *prometheus.Registry) *recoveryMetrics {
	m := &recoveryMetrics{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "radic_recoveries_total",
			Help: "Recoveries this node drove to their end, by cause (node: its node died; process: one of its processes exited) and result (ok: live and protected again; failed: failed, or live but unprotected)."},
			[]string{"cause", "result"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "radic_recovery_seconds",
			Help: "Successful recoveries: first suspicion (or the process exit) to the group live and re-protected.", Buckets: RecoveryBuckets}),
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "radic_recovery_phase_seconds",
			Help: "Duration of each phase a recovery completed (detect, confirm, restart, reconnect, replay, reprotect), failed recoveries included.", Buckets: RecoveryBuckets}, []string{"phase"}),
		replayBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "radic_replay_bytes_total",
			Help: "Logged bytes replayed to processes restarted on this node."}),
		divergences: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "radic_divergences_total",
			Help: "Restarted processes whose regenerated bytes differed from what was already delivered, by where (output: stdout/stderr, connection: a managed connection); each stops its job."},
			[]string{"where"}),
	}
	// Every series exists from the start, so that rates and alerts see
	// the first event.
	for _, c := range []string{protector.CauseNode, protector.CauseProcess} {
		for _, r := range []string{ResultOK, ResultFailed} {
			m.total.WithLabelValues(c, r)
		}
	}
	for ph := range protector.NumPhases {
		m.phases.WithLabelValues(ph.String())
	}
	m.divergences.WithLabelValues(DivergedOutput)
	m.divergences.WithLabelValues(DivergedConnection)
	reg.MustRegister(m.total, m.seconds, m.phases, m.replayBytes, m.divergences)
	return m
}

// observe counts one finished recovery.
func (m *recoveryMetrics) observe(r protector.Record) {
	result := ResultOK
	if r.Err != nil {
		result = ResultFailed
	} else {
		m.seconds.Observe(r.Total.Seconds())
	}
	m.total.WithLabelValues(r.Cause, result).Inc()
	for ph := range protector.NumPhases {
		if d := r.Phases[ph]; d > 0 {
			m.phases.WithLabelValues(ph.String()).Observe(d.Seconds())
		}
	}
}

// noteDivergence counts a divergence (where: DivergedOutput or
// DivergedConnection) and logs it. The replay's output check calls it with
// DivergedConnection when a restarted process's send differs from what its
// peer already has (observer.ErrDiverged), before stopping the job;
// radic run reports output divergences (POST /v1/recovery/divergence).
func (d *Daemon) noteDivergence(where string, err error) {
	d.recMetrics.divergences.WithLabelValues(where).Inc()
	d.log.Error("divergence: a restarted process regenerated different bytes; its job stops", "where", where, "err", err)
}

func fsSpace(dir string) (size, avail uint64) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0
	}
	return st.Blocks * uint64(st.Bsize), st.Bavail * uint64(st.Bsize)
}

// ringCollector exports the ring view, asked of the run loop at scrape time.
type ringCollector struct{ d *Daemon }

var (
	descRingSize = prometheus.NewDesc("radic_ring_size", "Alive members in this node's view of the ring (spares included).", nil, nil)
	descFenced   = prometheus.NewDesc("radic_fenced", "1 while this node is fenced.", nil, nil)
	descInc      = prometheus.NewDesc("radic_incarnation", "This node's incarnation number.", nil, nil)
	descPeerUp   = prometheus.NewDesc("radic_peer_up", "1 when the peer is alive in this node's view, 0 when dead, suspect or never heard from.", []string{"peer", "role"}, nil)
	descPeerAge  = prometheus.NewDesc("radic_peer_last_heartbeat_seconds", "Age of the last datagram (or indirect proof of life) from a peer this node hears from.", []string{"peer"}, nil)
)

func (c *ringCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRingSize
	ch <- descFenced
	ch <- descInc
	ch <- descPeerUp
	ch <- descPeerAge
}

func (c *ringCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, ok := c.d.runner.Status(ctx)
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(descRingSize, prometheus.GaugeValue, float64(len(st.Ring)))
	fenced := 0.0
	if st.Fenced {
		fenced = 1
	}
	ch <- prometheus.MustNewConstMetric(descFenced, prometheus.GaugeValue, fenced)
	ch <- prometheus.MustNewConstMetric(descInc, prometheus.GaugeValue, float64(st.Inc))
	for _, m := range st.Members {
		if m.ID == st.Self {
			continue
		}
		up := 0.0
		if m.State == "alive" {
			up = 1
		}
		peer := strconv.Itoa(int(m.ID))
		ch <- prometheus.MustNewConstMetric(descPeerUp, prometheus.GaugeValue, up, peer, m.Role)
		if slices.Contains(st.Neighbours, m.ID) && m.LastHeard >= 0 {
			ch <- prometheus.MustNewConstMetric(descPeerAge, prometheus.GaugeValue, m.LastHeard.Seconds(), peer)
		}
	}
}

// registerFabricMetrics exports the Blue Gene fabric's counters (all zero
// with --fabric ip): torus packets by what happened to them here, the
// link frames written, and the streams (the log's replication).
func (d *Daemon) registerFabricMetrics(reg *prometheus.Registry) {
	stat := func(f func(*udplink.Stats) uint64) func() float64 {
		return func() float64 {
			if d.fab == nil {
				return 0
			}
			return float64(f(d.fab.Stats()))
		}
	}
	for event, f := range map[string]func(*udplink.Stats) uint64{
		"sent":      func(s *udplink.Stats) uint64 { return s.Sent.Load() },
		"received":  func(s *udplink.Stats) uint64 { return s.Received.Load() },
		"forwarded": func(s *udplink.Stats) uint64 { return s.Forwarded.Load() },
		"delivered": func(s *udplink.Stats) uint64 { return s.Delivered.Load() },
		"dropped": func(s *udplink.Stats) uint64 {
			return s.LinkDownDrops.Load() + s.NoRoute.Load() + s.Malformed.Load()
		},
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "radic_fabric_packets_total", Help: "Torus packets this node put on the fabric, read from it, forwarded for others, delivered to itself, or dropped (no route, link down, malformed); zero with --fabric ip.",
			ConstLabels: prometheus.Labels{"event": event}}, stat(f)))
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "radic_fabric_frames_total", Help: "Link frames (UDP datagrams of torus packets for one next hop) this node wrote."},
		stat(func(s *udplink.Stats) uint64 { return s.Frames.Load() })))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "radic_fabric_streams", Help: "Streams open on the fabric (with --fabric bg: the message log's replication and the daemons' HTTP API)."},
		func() float64 {
			if d.fab == nil {
				return 0
			}
			return float64(d.fab.Streams())
		}))
	for _, service := range []byte{fabric.ServiceReplica, fabric.ServiceHTTP} {
		for _, dir := range []string{"in", "out"} {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "radic_fabric_stream_bytes_total", Help: "Bytes this node's fabric streams received (in) and wrote (out), by service: the log's replication, and the daemons' HTTP API.",
				ConstLabels: prometheus.Labels{"dir": dir, "service": fabric.ServiceName(service)}}, func() float64 {
				if d.fab == nil {
					return 0
				}
				in, out := d.fab.StreamBytes(service)
				if dir == "in" {
					return float64(in)
				}
				return float64(out)
			}))
		}
	}
}
