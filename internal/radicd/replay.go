package radicd

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/internal/launch"
	"github.com/radic-project/radic/msglog"
	"github.com/radic-project/radic/msglog/record"
	"github.com/radic-project/radic/observer"
	"github.com/radic-project/radic/observer/logring"
	"github.com/radic-project/radic/protector"
)

// Replay, radicd's half (ARCHITECTURE.md, "Replay"). restartHere fetches
// each restarted rank's log (every stream of its owner in the store of
// the dead node's group, from the protector that holds it) before the
// rank is created, and keeps it here; the rank's shim asks for it with
// GET /v1/replay/{owner} (RADIC_REPLAY=<epoch> in its environment tells
// it to) before main(), and reports its progress with POST
// /v1/replay/{owner}/{reconnected|live}, which become the protector
// machine's Reconnected and Live once every restarted rank of the group
// has reported them.
//
// Why served over HTTP from radicd rather than a file or a memfd: the
// shim already speaks HTTP to its radicd (RADIC_DAEMON) before main(),
// the body is the msglog record encoding both sides already have (with
// its CRCs and decoder), and nothing is left behind if either side dies.

// replayTable holds the logs of the ranks restarted here, and which
// restarted groups still wait for their ranks' stages.
type replayTable struct {
	mu sync.Mutex
	// +checklocks:mu
	logs map[uint64]*replayLog
	// +checklocks:mu
	groups map[groupEpoch]*groupReplay
}

type replayLog struct {
	body   []byte // msglog record encodings of every stream of the owner
	detLen uint64 // where the restarted process's determinants continue
	ge     groupEpoch
}

// groupReplay: the owners that have not reported each stage yet.
type groupReplay struct {
	pending map[string]map[uint64]bool
}

func newReplayTable() *replayTable {
	return &replayTable{logs: map[uint64]*replayLog{}, groups: map[groupEpoch]*groupReplay{}}
}

// rankOwner is the msglog owner of rank's log (shim/logring.go: the job's
// hash folded to 32 bits, and the logical process id, the rank).
func rankOwner(job string, rank int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(job))
	return logring.Owner(h.Sum64(), uint32(rank))
}

// detOffset is where a restarted owner's determinant stream continues.
func (t *replayTable) detOffset(owner uint64) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.logs[owner]; l != nil {
		return l.detLen
	}
	return 0
}

// fetchLog reads every stream of owner in group's store held on node
// from, as record encodings, and the determinant stream's length.
func (d *Daemon) fetchLog(ctx context.Context, from, group int, owner uint64) ([]byte, uint64, error) {
	var infos []msglog.StreamInfo
	if from == d.cfg.Node {
		if err := d.settleLog(ctx, heartbeat.NodeID(group)); err != nil {
			return nil, 0, err
		}
		st := d.stores.lookup(heartbeat.NodeID(group))
		if st == nil {
			return nil, 0, nil // nothing was ever logged for the group here
		}
		infos = st.Streams(owner)
	} else {
		all, err := d.remoteStreams(ctx, heartbeat.NodeID(from), heartbeat.NodeID(group))
		if err != nil {
			return nil, 0, fmt.Errorf("streams of node %d's group on node %d: %w", group, from, err)
		}
		for k, si := range all {
			if k.Owner == owner {
				infos = append(infos, si)
			}
		}
	}
	// One buffer for the whole log, sized from the listing (payload bytes,
	// plus room for the records' headers): growing it, and copying each
	// stream into it, touched fresh pages several times over, which this
	// VM pays for per page (a restart's fetch ran at ~60 MB/s).
	var payload uint64
	for _, si := range infos {
		payload += si.End - si.Low
	}
	body := make([]byte, 0, payload+payload/16+64<<10)
	var detLen uint64
	for _, si := range infos {
		if si.Low > 0 {
			return nil, 0, fmt.Errorf("stream %d of owner %x was truncated below %d: the exec backend replays from 0", si.Stream, owner, si.Low)
		}
		var err error
		if body, err = d.readReplica(ctx, from, group, owner, si.Stream, body); err != nil {
			return nil, 0, err
		}
		if si.Stream == observer.DeterminantStream {
			detLen = si.End
		}
	}
	return body, detLen, nil
}

// readReplica appends one stream, from offset 0, as record encodings, to
// dst.
func (d *Daemon) readReplica(ctx context.Context, from, group int, owner, stream uint64, dst []byte) ([]byte, error) {
	if from == d.cfg.Node {
		st := d.stores.lookup(heartbeat.NodeID(group))
		if st == nil {
			return nil, fmt.Errorf("no store of node %d here", group)
		}
		c := st.Read(owner, stream, 0)
		for {
			rec, err := c.Next()
			if err == io.EOF {
				return dst, nil
			}
			if err != nil {
				return nil, err
			}
			dst = record.AppendRecord(dst, &rec)
		}
	}
	addr, ok := d.loc.peerAddr(from)
	if !ok {
		return nil, fmt.Errorf("no address for node %d", from)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, http.MethodGet, fmt.Sprintf("http://%s/v1/replica/read?node=%d&owner=%d&stream=%d&from=0", addr, group, owner, stream), nil)
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	start := len(dst)
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)] // grow
		}
		n, err := resp.Body.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	b := dst[start:]
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("stream %d of owner %x on node %d: %s: %s", stream, owner, from, resp.Status, strings.TrimSpace(string(b)))
	}
	// Check it decodes whole: a short body is an error, never a short log.
	for off := 0; off < len(b); {
		_, n, err := record.Decode(b[off:])
		if err != nil {
			return nil, fmt.Errorf("stream %d of owner %x on node %d: %w", stream, owner, from, err)
		}
		off += n
	}
	return dst, nil
}

// prepareReplay fetches the log of (job, rank), keeps it for the rank's
// shim and returns the environment to restart it with.
func (e *recoveryEdge) prepareReplay(ctx context.Context, req restartReq, job string, rank int, env []string) ([]string, error) {
	d := e.d
	owner := rankOwner(job, rank)
	if req.Group == d.cfg.Node {
		// A rank killed alone: its ring here may still be shipping
		// what it had appended; the log is whole once that is done.
		d.logs.waitOwner(owner, 10*time.Second)
	}
	start := time.Now()
	body, detLen, err := d.fetchLog(ctx, req.From, req.Group, owner)
	fetched := time.Now()
	if err != nil {
		return nil, fmt.Errorf("log of rank %d of job %s: %w", rank, job, err)
	}
	if req.Group != d.cfg.Node && len(body) > 0 {
		// The rank's new records go to this node's protectors, under
		// this node: they continue its streams, so those must be there.
		prots, err := d.ringProtectors(ctx)
		if err != nil {
			return nil, err
		}
		for _, p := range prots {
			if err := d.pushLog(ctx, p, heartbeat.NodeID(d.cfg.Node), body); err != nil {
				return nil, fmt.Errorf("log of rank %d of job %s to protector %d: %w", rank, job, p, err)
			}
		}
	}
	ge := groupEpoch{req.Group, req.Epoch}
	t := e.replays
	t.mu.Lock()
	t.logs[owner] = &replayLog{body: body, detLen: detLen, ge: ge}
	if len(body) > 0 {
		// Its shim reports its stages. (With nothing logged there is
		// nothing to wait for, and maybe no shim: radic run --no-radic.)
		g := t.groups[ge]
		if g == nil {
			g = &groupReplay{pending: map[string]map[uint64]bool{"reconnected": {}, "live": {}}}
			t.groups[ge] = g
		}
		g.pending["reconnected"][owner] = true
		g.pending["live"][owner] = true
	}
	t.mu.Unlock()
	d.log.Info("replay prepared", "job", job, "rank", rank, "owner", fmt.Sprintf("%x", owner), "log_bytes", len(body), "determinant_bytes", detLen, "from", req.From,
		"fetch", fetched.Sub(start), "reprotect", time.Since(fetched))
	env = restartEnv(env, req.Epoch, d.cfg.Node != req.Group, d.cfg.Listen.String())
	if d.cfg.StateDir != "" {
		// Its stderr is compared with the first run's: the shim's own
		// lines go to a file.
		f := filepath.Join(d.cfg.StateDir, fmt.Sprintf("replay-%s-%d-%d.log", job, rank, req.Epoch))
		env = append(env, "RADIC_LOG_FILE="+f)
		d.log.Info("a restarted rank's shim logs to a file", "job", job, "rank", rank, "file", f)
	}
	return env, nil
}

// pushChunk bounds one request of pushLog: half of what a protector takes.
const pushChunk = maxBody / 2

// pushLog stores a restarted rank's log (whole record encodings, as
// fetchLog checked them) on peer p under node of, in requests of at most
// pushChunk bytes cut at record boundaries: a protector takes at most
// maxBody per request, and a log can be many times that (a 1 GiB two-way
// stream killed mid-way: "http: request body too large", no restart).
func (d *Daemon) pushLog(ctx context.Context, p, of heartbeat.NodeID, body []byte) error {
	for len(body) > 0 {
		n := 0
		for n < len(body) {
			l := record.HeaderLen + int(record.Header(body[n:n+record.HeaderLen]).Length())
			if n > 0 && n+l > pushChunk {
				break
			}
			n += l
		}
		if err := d.pushTo(ctx, p, of, body[:n]); err != nil {
			return err
		}
		body = body[n:]
	}
	return nil
}

// restartEnv is a restarted rank's environment: RADIC_REPLAY=<epoch>, and
// on another node than its first, launch.HostedEnv's (RADIC_NODE stays:
// the app's own address is its logical node's, contract 3).
func restartEnv(env []string, epoch uint64, moved bool, daemon string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, "RADIC_REPLAY=") && !strings.HasPrefix(kv, "RADIC_LOG_FILE=") {
			out = append(out, kv)
		}
	}
	if moved {
		out = launch.HostedEnv(out, daemon)
	}
	return append(out, "RADIC_REPLAY="+strconv.FormatUint(epoch, 10))
}

// stagesIfEmpty: a restarted group none of whose ranks has a log to
// replay has reached Reconnected and Live already.
func (e *recoveryEdge) stagesIfEmpty(ge groupEpoch) {
	t := e.replays
	t.mu.Lock()
	g := t.groups[ge]
	t.mu.Unlock()
	if g == nil {
		e.stage(ge, "reconnected")
		e.stage(ge, "live")
	}
}

// stage tells the machine a restarted group reached stage.
func (e *recoveryEdge) stage(ge groupEpoch, stage string) {
	d := e.d
	g := protector.GroupID(ge.group)
	e.input(func(m *protector.Machine, now time.Time) {
		f := m.Reconnected
		if stage == "live" {
			f = m.Live
		}
		if err := f(now, g, ge.epoch); err != nil {
			d.log.Warn("protector refused a stage of a restarted group", "group", g, "epoch", ge.epoch, "stage", stage, "err", err)
		}
	})
}

func (d *Daemon) replayRoutes(mux *http.ServeMux) {
	owner := func(w http.ResponseWriter, r *http.Request) (uint64, bool) {
		o, err := strconv.ParseUint(r.PathValue("owner"), 10, 64)
		if err != nil {
			http.Error(w, "owner: "+err.Error(), http.StatusBadRequest)
		}
		return o, err == nil && d.rec != nil
	}
	mux.HandleFunc("GET /v1/replay/{owner}", func(w http.ResponseWriter, r *http.Request) {
		o, ok := owner(w, r)
		if !ok {
			return
		}
		t := d.rec.replays
		t.mu.Lock()
		l := t.logs[o]
		t.mu.Unlock()
		if l == nil {
			http.Error(w, fmt.Sprintf("no log of owner %x is kept here", o), http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(l.body))) // the shim reads it into one buffer
		_, _ = w.Write(l.body)
	})
	mux.HandleFunc("POST /v1/replay/{owner}/{stage}", func(w http.ResponseWriter, r *http.Request) {
		o, ok := owner(w, r)
		if !ok {
			return
		}
		stage := r.PathValue("stage")
		if stage != "reconnected" && stage != "live" {
			http.Error(w, "stage: reconnected or live", http.StatusBadRequest)
			return
		}
		e := d.rec
		t := e.replays
		t.mu.Lock()
		l := t.logs[o]
		var done bool
		var ge groupEpoch
		if l != nil {
			ge = l.ge
			if g := t.groups[ge]; g != nil && g.pending[stage][o] {
				delete(g.pending[stage], o)
				done = len(g.pending[stage]) == 0
			}
		}
		t.mu.Unlock()
		if l == nil {
			http.Error(w, fmt.Sprintf("owner %x is not replaying here", o), http.StatusNotFound)
			return
		}
		d.log.Info("replay progress", "owner", fmt.Sprintf("%x", o), "group", ge.group, "epoch", ge.epoch, "stage", stage)
		if stage == "live" {
			// Its whole log has been served and consumed
			// (radic_replay_bytes_total, radic status, radic run).
			d.noteReplay(ge.group, ge.epoch, uint64(len(l.body)), 0, done)
		}
		if done {
			e.stage(ge, stage)
		}
		w.WriteHeader(http.StatusNoContent)
	})
}
