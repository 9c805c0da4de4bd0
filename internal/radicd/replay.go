package radicd

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/internal/launch"
	"github.com/radic-project/radic/msglog/record"
	"github.com/radic-project/radic/observer"
	"github.com/radic-project/radic/observer/logring"
	"github.com/radic-project/radic/observer/replayfile"
	"github.com/radic-project/radic/protector"
)

// Replay, radicd's half (ARCHITECTURE.md, "Replay"). restartHere gets
// each restarted rank's log (every stream of its owner in the store of
// the dead node's group, from the protector that holds it) before the
// rank is created, and lays it out in a file (observer/replayfile: each
// connection's bytes contiguous and page-aligned) under /dev/shm, named
// in the rank's environment (RADIC_REPLAY_LOG, with RADIC_REPLAY=<epoch>);
// the rank's shim maps it before main() and serves receives from the
// mapping, and reports its progress with POST
// /v1/replay/{owner}/{reconnected|live}, which become the protector
// machine's Reconnected and Live once every restarted rank of the group
// has reported them.
//
// Why a file and not the HTTP body it used to be: the body went through
// three buffers of the log's size (radicd's, the shim's, each
// connection's), and on a VM that charges for every fresh page that cost
// seconds per few hundred MB; a tmpfs file is written by the kernel
// (~5 GB/s here) and mapped once. The file is unlinked once the rank has
// reconnected (it has long mapped it), a newer restart replaces it, the
// job ends or radicd stops; a radicd that died leaves files that the next
// one on the host removes (sweepReplayFiles).

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
	path   string // the file (empty: nothing was logged, or released)
	size   uint64 // its bytes of log: the determinants' and the connections'
	detLen uint64 // where the restarted process's determinants continue
	job    string
	ge     groupEpoch
}

// release unlinks l's file (the rank mapped it, or will never).
// +checklocks:t.mu
func (t *replayTable) release(l *replayLog) {
	if l.path != "" {
		os.Remove(l.path)
		l.path = ""
	}
}

// releaseAll unlinks the files of job's ranks (every rank's if job is
// empty: radicd stops).
func (t *replayTable) releaseAll(job string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, l := range t.logs {
		if job == "" || l.job == job {
			t.release(l)
		}
	}
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

// replayFilePrefix names radicd's replay files in /dev/shm: the pid of
// the radicd that made them follows (sweepReplayFiles).
const replayFilePrefix = "radic-replay-"

// replayFetchTimeout bounds a restarted rank's log's fetch (and its
// adoption by the new host's protectors): a GB at the few hundred MB/s
// of this VM takes seconds, a holder that stalls must not stall the
// recovery for ever.
const replayFetchTimeout = 2 * time.Minute

// replayDir is where replay files go: tmpfs, which the kernel fills
// without a page fault per page.
var replayDir = "/dev/shm"

// writeReplayFile lays out owner's log, every stream of owner in group's
// store held on node from, in a new file at path. It returns the file's
// header, or nil (and no file) when nothing was logged.
func (d *Daemon) writeReplayFile(ctx context.Context, path string, from, group heartbeat.NodeID, owner uint64) (h *replayfile.Header, err error) {
	ctx, cancel := context.WithTimeout(ctx, replayFetchTimeout)
	defer cancel()
	infos, err := d.ownerStreams(ctx, from, group, owner)
	if err != nil || len(infos) == 0 {
		return nil, err
	}
	var detLen uint64
	conns := map[uint64]uint64{}
	for _, si := range infos {
		if si.Low > 0 {
			return nil, fmt.Errorf("stream %d of owner %x was truncated below %d: the exec backend replays from 0", si.Stream, owner, si.Low)
		}
		if si.Stream == observer.DeterminantStream {
			detLen = si.End
		} else {
			conns[si.Stream] = si.End
		}
	}
	h = replayfile.Plan(detLen, conns)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
		}
	}()
	if err := f.Truncate(int64(h.Size)); err != nil {
		return nil, err
	}
	if _, err := f.WriteAt(h.Encode(), 0); err != nil {
		return nil, err
	}
	p := h.NewPlacer()
	for _, si := range infos {
		err := d.eachRecord(ctx, from, group, owner, si.Stream, 0, func(r record.Record) error {
			off, b, err := p.Place(r)
			if err == nil && len(b) > 0 {
				_, err = f.WriteAt(b, int64(off))
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("stream %d of owner %x from node %d: %w", si.Stream, owner, from, err)
		}
	}
	return h, p.Done()
}

// replayDirs are where replay files may go, in order of preference:
// tmpfs, then the state dir (on disk).
func (d *Daemon) replayDirs() []string {
	if d.cfg.StateDir == "" {
		return []string{replayDir}
	}
	return []string{replayDir, d.cfg.StateDir}
}

// placeReplayFile writes owner's replay file (writeReplayFile) in the
// first of dirs where that works: a full or missing tmpfs must not cost a
// recovery, only its speed (the state dir, on disk, comes next). It
// returns the file's path and header (nil and "": nothing was logged).
func (d *Daemon) placeReplayFile(ctx context.Context, dirs []string, name string, from, group heartbeat.NodeID, owner uint64) (string, *replayfile.Header, error) {
	var errs []error
	for _, dir := range dirs {
		path := filepath.Join(dir, name)
		os.Remove(path) // an attempt of this epoch that failed
		h, err := d.writeReplayFile(ctx, path, from, group, owner)
		if err == nil {
			if h == nil {
				path = ""
			}
			return path, h, nil
		}
		errs = append(errs, err)
		if !placeError(err) {
			break // the fetch failed, not the place
		}
		d.log.Warn("cannot write a restarted rank's replay file there; trying the next place", "file", path, "err", err)
	}
	return "", nil, errors.Join(errs...)
}

// placeError: err is about where a file goes (full, missing, read-only,
// not ours), not about what went into it.
func placeError(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EROFS) ||
		errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission)
}

// sweepReplayFiles removes, from dirs, the replay files of radicds
// that are gone and the log rings of processes that are gone (the shim
// makes a ring and radicd unlinks it once registered: a process killed in
// between leaves it behind). Files of live processes stay: another node's
// radicd on the same host, a rank about to register.
func sweepReplayFiles(log *slog.Logger, dirs ...string) {
	for _, dir := range dirs {
		sweepDir(log, dir)
	}
}

func sweepDir(log *slog.Logger, dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		var field string
		if rest, ok := strings.CutPrefix(e.Name(), replayFilePrefix); ok {
			field, _, _ = strings.Cut(rest, "-") // radic-replay-PID-OWNER-EPOCH
		} else if rest, ok := strings.CutPrefix(e.Name(), "radic-log."); ok {
			field = rest[strings.LastIndexByte(rest, '.')+1:] // radic-log.JOB.LPID.PID
		} else {
			continue
		}
		pid, err := strconv.Atoi(field)
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		if os.Remove(filepath.Join(dir, e.Name())) == nil {
			log.Info("removed a file of a process that is gone", "file", filepath.Join(dir, e.Name()))
		}
	}
}

// prepareReplay fetches the log of (job, rank) into its replay file, has
// this node's protectors adopt it, and returns the environment to restart
// the rank with.
func (e *recoveryEdge) prepareReplay(ctx context.Context, req restartReq, job string, rank int, env []string) ([]string, error) {
	d := e.d
	owner := rankOwner(job, rank)
	if req.Group == d.cfg.Node {
		// A rank killed alone: its ring here may still be shipping
		// what it had appended; the log is whole once that is done.
		d.logs.waitOwner(owner, 10*time.Second)
	}
	// The log comes here for the rank, and goes to this node's
	// protectors under this node (the rank's new records continue its
	// streams there, so those must be there first): both at once, each
	// protector copying it from its holder itself.
	var prots []heartbeat.NodeID
	if req.Group != d.cfg.Node {
		var err error
		if prots, err = d.ringProtectors(ctx); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	adopted := make(chan error, len(prots))
	for _, p := range prots {
		go func() {
			err := d.adoptOn(ctx, p, req.From, req.Group, owner)
			if err != nil {
				err = fmt.Errorf("log of rank %d of job %s to protector %d: %w", rank, job, p, err)
			}
			adopted <- err
		}()
	}
	name := fmt.Sprintf("%s%d-%x-%d", replayFilePrefix, os.Getpid(), owner, req.Epoch)
	path, h, err := d.placeReplayFile(ctx, d.replayDirs(), name, heartbeat.NodeID(req.From), heartbeat.NodeID(req.Group), owner)
	fetched := time.Now()
	for range prots {
		err = errors.Join(err, <-adopted)
	}
	if err != nil {
		if path != "" {
			os.Remove(path)
		}
		return nil, fmt.Errorf("log of rank %d of job %s: %w", rank, job, err)
	}
	ge := groupEpoch{req.Group, req.Epoch}
	l := &replayLog{job: job, ge: ge}
	if h != nil {
		l.path, l.size, l.detLen = path, h.Dets.Len, h.Dets.Len
		for _, c := range h.Conns {
			l.size += c.Len
		}
	}
	t := e.replays
	t.mu.Lock()
	if old := t.logs[owner]; old != nil && old.path != l.path {
		t.release(old) // (a retry of the same epoch wrote over the same file)
	}
	t.logs[owner] = l
	if h != nil {
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
	d.log.Info("replay prepared", "job", job, "rank", rank, "owner", fmt.Sprintf("%x", owner), "log_bytes", l.size, "determinant_bytes", l.detLen, "from", req.From,
		"file", l.path, "fetch", fetched.Sub(start), "prepare", time.Since(start))
	env = restartEnv(env, req.Epoch, d.cfg.Node != req.Group, d.cfg.Listen.String(), l.path)
	if d.cfg.StateDir != "" {
		// Its stderr is compared with the first run's: the shim's own
		// lines go to a file.
		f := filepath.Join(d.cfg.StateDir, fmt.Sprintf("replay-%s-%d-%d.log", job, rank, req.Epoch))
		env = append(env, "RADIC_LOG_FILE="+f)
		d.log.Info("a restarted rank's shim logs to a file", "job", job, "rank", rank, "file", f)
	}
	return env, nil
}

// restartEnv is a restarted rank's environment: RADIC_REPLAY=<epoch>,
// RADIC_REPLAY_LOG=<its log's file> if anything was logged, and on
// another node than its first, launch.HostedEnv's (RADIC_NODE stays: the
// app's own address is its logical node's, contract 3).
func restartEnv(env []string, epoch uint64, moved bool, daemon, logFile string) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		if !strings.HasPrefix(kv, "RADIC_REPLAY=") && !strings.HasPrefix(kv, "RADIC_REPLAY_LOG=") && !strings.HasPrefix(kv, "RADIC_LOG_FILE=") {
			out = append(out, kv)
		}
	}
	if moved {
		out = launch.HostedEnv(out, daemon)
	}
	if logFile != "" {
		out = append(out, "RADIC_REPLAY_LOG="+logFile)
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
			t.release(l) // mapped long ago: hundreds of MB of tmpfs, maybe
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
			d.noteReplay(ge.group, ge.epoch, l.size, 0, done)
		}
		if done {
			e.stage(ge, stage)
		}
		w.WriteHeader(http.StatusNoContent)
	})
}
