package radicd

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/radic-project/radic/checkpoint"
	"github.com/radic-project/radic/checkpoint/criu"
	"github.com/radic-project/radic/checkpoint/reexec"
	"github.com/radic-project/radic/internal/launch"
)

// checkpoints takes this node's checkpoints (issue 13, first step): on
// demand, one image of a job's ranks on this node, as one group, kept
// under STATE/ckpt/JOB/SEQ, each image incremental against the job's
// previous one. Not yet: periodic checkpoints, shipping images to the
// protectors, log truncation, restore from an image (ARCHITECTURE.md,
// "Checkpoints").
type checkpoints struct {
	once    sync.Once
	backend checkpoint.Backend

	total, failures atomic.Uint64
	lastBytes       atomic.Int64
	seconds         prometheus.Histogram

	// mu serializes the node's checkpoints: one group at a time.
	mu sync.Mutex
	// +checklocks:mu
	last map[string]*checkpoint.Image // per job: its newest image
	// +checklocks:mu
	seq map[string]int
}

// CheckpointBuckets are radic_checkpoint_seconds' buckets.
var CheckpointBuckets = []float64{0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60}

func (c *checkpoints) collectors() []prometheus.Collector {
	c.seconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "radic_checkpoint_seconds",
		Help: "Time of one checkpoint of a job's ranks on this node: the group stopped or frozen and dumped, then packed into its image.", Buckets: CheckpointBuckets})
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "radic_checkpoints_total", Help: "Checkpoints of a job's ranks on this node that produced a complete image."},
			func() float64 { return float64(c.total.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "radic_checkpoint_failures_total", Help: "Checkpoints that failed (the previous image stays the newest)."},
			func() float64 { return float64(c.failures.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "radic_checkpoint_bytes", Help: "Bytes the newest checkpoint stored: its new data, compressed (an incremental image stores what changed)."},
			func() float64 { return float64(c.lastBytes.Load()) }),
		c.seconds,
	}
}

// CheckpointReply is radicd's answer to POST /v1/jobs/{job}/checkpoint.
type CheckpointReply struct {
	Node    int    `json:"node"`
	Job     string `json:"job"`
	Backend string `json:"backend"`
	// Dir is the image (criu); "" for exec.
	Dir       string  `json:"dir,omitempty"`
	Parent    string  `json:"parent,omitempty"`
	Ranks     []int   `json:"ranks"`
	Pids      []int   `json:"pids"`
	DumpMs    float64 `json:"dump_ms"`
	PackMs    float64 `json:"pack_ms"`
	Bytes     int64   `json:"bytes"`
	PackBytes int64   `json:"pack_bytes"`
	Chunks    int     `json:"chunks"`
	NewChunks int     `json:"new_chunks"`
	// NotCriu says why the criu backend was passed over, if it was.
	NotCriu string `json:"not_criu,omitempty"`
}

// checkpointBackend picks the node's backend once: criu where it works, else exec,
// saying why.
func (d *Daemon) checkpointBackend() (checkpoint.Backend, string) {
	c := &d.ckpt
	why := ""
	c.once.Do(func() {
		cb := criu.New(criu.Config{
			WorkDir: filepath.Join(d.cfg.StateDir, "ckpt-work"),
			Logf:    func(f string, a ...any) { d.log.Info(fmt.Sprintf(f, a...)) },
		})
		os.MkdirAll(filepath.Join(d.cfg.StateDir, "ckpt-work"), 0o700)
		b, reasons := checkpoint.Choose(cb, reexec.Backend{})
		for _, r := range reasons {
			d.log.Warn("checkpoint backend passed over; re-execution (exec) instead", "why", r)
		}
		c.backend = b
	})
	if c.backend.Name() != criu.Name {
		why = "criu backend unusable on this node (radicd's log says why)"
	}
	return c.backend, why
}

// handleCheckpoint takes one checkpoint of the job's ranks on this node,
// all together, leaving them running.
func (d *Daemon) handleCheckpoint(w http.ResponseWriter, r *http.Request) {
	job := r.PathValue("job")
	if err := launch.CheckJob(job); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var group checkpoint.Group
	group.Node = d.cfg.Node
	type member struct {
		rank int
		pid  int
		rec  launch.Record
	}
	var members []member
	d.ranks.mu.Lock()
	for k, p := range d.ranks.ranks {
		if k.job != job {
			continue
		}
		p.mu.Lock()
		state := p.state
		p.mu.Unlock()
		if state == launch.StateExited {
			continue // it needs no image: it ended
		}
		if state != launch.StateRunning {
			d.ranks.mu.Unlock()
			http.Error(w, fmt.Sprintf("rank %d of job %s on node %d is %s, not running: no checkpoint", k.rank, job, d.cfg.Node, state), http.StatusConflict)
			return
		}
		members = append(members, member{k.rank, p.id.Pid, p.rec})
	}
	d.ranks.mu.Unlock()
	if len(members) == 0 {
		http.Error(w, fmt.Sprintf("node %d runs no rank of job %q", d.cfg.Node, job), http.StatusNotFound)
		return
	}
	slices.SortFunc(members, func(a, b member) int { return a.rank - b.rank })
	reply := CheckpointReply{Node: d.cfg.Node, Job: job}
	for _, m := range members {
		group.Roots = append(group.Roots, m.pid)
		group.Launch = append(group.Launch, m.rec)
		reply.Ranks = append(reply.Ranks, m.rank)
	}
	reply.Pids = group.Roots
	b, why := d.checkpointBackend()
	reply.Backend, reply.NotCriu = b.Name(), why

	c := &d.ckpt
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last, c.seq = map[string]*checkpoint.Image{}, map[string]int{}
	}
	c.seq[job]++
	jobDir := filepath.Join(d.cfg.StateDir, "ckpt", job)
	if err := os.MkdirAll(jobDir, 0o700); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	req := checkpoint.Request{Group: group, Dir: filepath.Join(jobDir, fmt.Sprintf("%08d", c.seq[job])),
		Parent: c.last[job], LeaveRunning: true}
	start := time.Now()
	img, err := b.Checkpoint(r.Context(), req)
	if err != nil {
		c.failures.Add(1)
		d.log.Error("checkpoint failed", "job", job, "backend", b.Name(), "err", err)
		http.Error(w, fmt.Sprintf("checkpoint of job %s on node %d (%s): %v", job, d.cfg.Node, b.Name(), err), http.StatusInternalServerError)
		return
	}
	c.last[job] = img
	c.total.Add(1)
	c.lastBytes.Store(img.Stats.PackBytes)
	if c.seconds != nil {
		c.seconds.Observe((img.Stats.Dump + img.Stats.Pack).Seconds())
	}
	if img.Manifest != nil {
		reply.Dir, reply.Parent = img.Dir, img.Manifest.Parent
		reply.Chunks, reply.NewChunks = img.Manifest.Chunks, img.Manifest.NewChunks
	}
	reply.DumpMs = float64(img.Stats.Dump.Microseconds()) / 1000
	reply.PackMs = float64(img.Stats.Pack.Microseconds()) / 1000
	reply.Bytes, reply.PackBytes = img.Stats.Bytes, img.Stats.PackBytes
	d.log.Info("checkpoint", "job", job, "backend", b.Name(), "ranks", reply.Ranks, "dir", reply.Dir,
		"bytes", reply.Bytes, "stored", reply.PackBytes, "took", time.Since(start))
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(reply)
}
