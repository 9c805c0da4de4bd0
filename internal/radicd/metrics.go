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
	"radic_log_bytes", "radic_log_records", "radic_log_rings", "radic_log_stuck_rings",
	"radic_checkpoints_total", "radic_checkpoint_failures_total", "radic_checkpoint_seconds", "radic_checkpoint_bytes",
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
		counter("radic_log_bytes", "Bytes received by this node's processes (with recovery on) and stored on all their protectors.", d.logs.bytes.Load),
		counter("radic_log_records", "Log ring records (receives and their determinants) of this node's processes stored on all their protectors.", d.logs.records.Load),
		gauge("radic_log_rings", "Processes of this node whose log rings radicd drains.", func() float64 { return float64(d.logs.active.Load()) }),
		gauge("radic_log_stuck_rings", "Log rings whose last shipment to the protectors failed: their processes' sends wait.", func() float64 { return float64(d.logs.stuck.Load()) }),
	)
	reg.MustRegister(d.loc.collectors()...)
	reg.MustRegister(d.ckpt.collectors()...)
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
