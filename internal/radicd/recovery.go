package radicd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/internal/launch"
	"github.com/radic-project/radic/msglog/record"
	"github.com/radic-project/radic/protector"
)

// The recovery edge: radicd runs its node's protector.Machine (package
// protector holds the pure core) on one goroutine, RoutineRecovery, feeds
// it the ring's View and events, exchanges placements with the other
// daemons, and executes its actions. A group is the ranks one node
// launched (GroupID = that node's id), whatever their job; only ranks of
// jobs launched with recovery on (RADIC_RECOVERY=1) are restarted, and
// only on clusters whose radicds kill a fenced node's job (--fence-kill):
// otherwise a frozen node's ranks could still run when they are
// restarted elsewhere. Restart = re-execute the launch records, read from
// the stores of the group's protectors, with the same job, rank and
// environment, and replay their logs (replay.go).
//
// Endpoints (on --listen):
//
//	POST   /v1/recovery/learn            a Placement announced by another daemon's machine, with its replay report
//	POST   /v1/recovery/restart          {"group","epoch","from"}: start the group here; 204 once started
//	POST   /v1/recovery/abort            {"group","epoch"}: do not start it (stop it if it was)
//	POST   /v1/recovery/ranks            []RankLoc: where recovery ranks run (pushed to every daemon)
//	DELETE /v1/recovery/jobs/{job}       the job ended: forget its ranks (never restart them)
//	GET    /v1/recovery/jobs/{job}       JobRecovery: where each rank runs now, and the recovery events
//	POST   /v1/recovery/events           a RecoveryEvent, pushed to every daemon

// The wire types of the rank directory are package launch's.
type (
	RankLoc       = launch.RankLoc
	RecoveryEvent = launch.RecoveryEvent
	JobRecovery   = launch.JobRecovery
)

// announcement is a Placement announced by a machine, with its host's
// replay report of the group at that epoch: the recoverer records the
// recovery's event (how much was replayed) as it learns the stage Live,
// and the report's own push may come after this one.
type announcement struct {
	protector.Placement
	Replay *replayReport `json:"replay,omitempty"`
}

func (d *Daemon) announcementOf(p protector.Placement) announcement {
	return announcement{p, d.prog.replayReportOf(int(p.Group), p.Epoch)}
}

type restartReq struct {
	Group int    `json:"group"`
	Epoch uint64 `json:"epoch"`
	From  int    `json:"from"`
}

// directory is every daemon's copy of where the recovery ranks run.
type directory struct {
	mu sync.Mutex
	// +checklocks:mu
	ranks map[rankKey]RankLoc
	// +checklocks:mu
	events []RecoveryEvent
	// +checklocks:mu
	aborted map[restartReq]bool // group+epoch told to abort (From 0)
}

func newDirectory() *directory {
	return &directory{ranks: map[rankKey]RankLoc{}, aborted: map[restartReq]bool{}}
}

// put merges l: a newer epoch wins; at the same epoch, a finished
// instance stays finished (pushes cross: its launch's may come last).
func (dir *directory) put(l RankLoc) {
	dir.mu.Lock()
	defer dir.mu.Unlock()
	k := rankKey{l.Job, l.Rank}
	old, ok := dir.ranks[k]
	if !ok || l.Epoch > old.Epoch || (l.Epoch == old.Epoch && !old.Finished) {
		dir.ranks[k] = l
	}
}

// finishedGroup reports whether every rank of job in group g has
// finished (RankLoc.Finished): a restart of the group has nothing of that
// job to bring back. Ranks of one group and job restart together or not
// at all, since the traffic between them is not logged: one that has
// finished is re-executed beside one that has not.
func (dir *directory) finishedGroup(g int, job string) bool {
	dir.mu.Lock()
	defer dir.mu.Unlock()
	n := 0
	for k, l := range dir.ranks {
		if k.job == job && l.Group == g {
			if !l.Finished {
				return false
			}
			n++
		}
	}
	return n > 0
}

// has reports whether rank k is in the directory (at any epoch).
func (dir *directory) has(k rankKey) bool {
	dir.mu.Lock()
	defer dir.mu.Unlock()
	_, ok := dir.ranks[k]
	return ok
}

func (dir *directory) forget(job string) {
	dir.mu.Lock()
	defer dir.mu.Unlock()
	for k := range dir.ranks {
		if k.job == job {
			delete(dir.ranks, k)
		}
	}
}

func (dir *directory) group(g int) []RankLoc {
	dir.mu.Lock()
	defer dir.mu.Unlock()
	var out []RankLoc
	for _, l := range dir.ranks {
		if l.Group == g {
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b RankLoc) int {
		if c := strings.Compare(a.Job, b.Job); c != 0 {
			return c
		}
		return a.Rank - b.Rank
	})
	return out
}

func (dir *directory) job(job string) JobRecovery {
	dir.mu.Lock()
	defer dir.mu.Unlock()
	jr := JobRecovery{Job: job, Ranks: []RankLoc{}, Events: []RecoveryEvent{}}
	groups := map[int]bool{}
	for k, l := range dir.ranks {
		if k.job == job {
			jr.Ranks = append(jr.Ranks, l)
			groups[l.Group] = true
		}
	}
	slices.SortFunc(jr.Ranks, func(a, b RankLoc) int { return a.Rank - b.Rank })
	for _, e := range dir.events {
		if groups[e.Group] {
			jr.Events = append(jr.Events, e)
		}
	}
	return jr
}

// recoveryEdge owns this node's Machine: every input goes through in.
type recoveryEdge struct {
	d     *Daemon
	in    chan func(m *protector.Machine, now time.Time)
	stats protector.Stats
	met   *recoveryMetrics
	// fatal: the groups the current Ready reported failed (ActFailed),
	// for their Records' events (progress.go); recovery goroutine only.
	fatal map[protector.GroupID]bool
	// replays: the logs of ranks restarted here (replay.go)
	replays *replayTable
}

// recoveryEnabled says whether this node restarts lost ranks, and why not.
func (d *Daemon) recoveryEnabled() (bool, string) {
	switch {
	case !d.cfg.FenceKill:
		return false, "fence-kill is off: a node cut off from the ring keeps its ranks running, so restarting them elsewhere could run a rank twice; jobs launched with --recovery fail on a node loss as without it"
	case len(d.cfg.Peers) <= 1:
		return false, "this node is alone in its ring"
	}
	return true, ""
}

// input hands fn to the machine's goroutine (dropped when it is gone).
func (e *recoveryEdge) input(fn func(m *protector.Machine, now time.Time)) {
	select {
	case e.in <- fn:
	default:
		e.d.log.Error("recovery input dropped: the protector's queue is full")
	}
}

// machineConfig waits until the ring knows every member's role.
func (e *recoveryEdge) machineConfig(ctx context.Context) (protector.Config, bool) {
	for {
		st, ok := e.d.runner.Status(ctx)
		joined := ok && len(st.Members) == len(e.d.cfg.Peers)
		for _, m := range st.Members {
			// A member's role is known once it was heard from.
			joined = joined && (m.ID == e.d.self || m.State == "alive")
		}
		if joined {
			c := protector.Config{Self: e.d.self, Protectors: max(e.d.cfg.Protectors, 1)}
			for _, m := range st.Members {
				if m.Role == "spare" {
					c.Spares = append(c.Spares, m.ID)
				} else {
					c.Nodes = append(c.Nodes, m.ID)
					c.Groups = append(c.Groups, protector.GroupSpec{ID: protector.GroupID(m.ID), Node: m.ID})
				}
			}
			// A radicd stalled this long is taken as frozen and fences:
			// leave room for a loaded machine beyond the ring's timers.
			c.FenceTimeout = e.d.settle()
			c.FenceMargin = 500 * time.Millisecond
			c.DeclareTimeout = c.FenceTimeout + c.FenceMargin
			return c, true
		}
		select {
		case <-ctx.Done():
			return protector.Config{}, false
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// routineRecovery runs the machine until ctx ends or the node fences.
func (e *recoveryEdge) routineRecovery(ctx context.Context) {
	d := e.d
	d.log.Info("RoutineRecovery starting")
	defer d.log.Info("RoutineRecovery stopped")
	cfg, ok := e.machineConfig(ctx)
	if !ok {
		return
	}
	m, err := protector.New(cfg, &e.stats, time.Now())
	if err != nil {
		d.log.Error("recovery off: bad protector config", "err", err)
		return
	}
	d.log.Info("protector running", "nodes", cfg.Nodes, "spares", cfg.Spares, "fence_timeout", cfg.FenceTimeout, "declare_timeout", cfg.DeclareTimeout)
	view := time.NewTicker(50 * time.Millisecond)
	defer view.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		rd := m.Ready()
		e.noteReady(rd, now)
		for _, a := range rd.Actions {
			e.execute(ctx, a)
		}
		for _, r := range rd.Records {
			e.record(r)
		}
		d.publishProgress(m.Recoveries(), now)
		if m.Fenced() {
			d.log.Warn("protector fenced: no more recoveries from this node until radicd restarts")
			return
		}
		if !rd.NextTick.IsZero() {
			timer.Reset(max(time.Until(rd.NextTick), time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return
		case fn := <-e.in:
			fn(m, time.Now())
		case <-view.C:
			st, ok := d.runner.Status(ctx)
			if !ok {
				continue
			}
			var reach []protector.NodeID
			for _, mb := range st.Members {
				if mb.State == "alive" || mb.State == "suspect" {
					reach = append(reach, mb.ID)
				}
			}
			m.View(time.Now(), reach)
		case <-timer.C:
			m.Tick(now)
		}
	}
}

// onRingEvent feeds the machine (called on the ring's goroutine).
func (e *recoveryEdge) onRingEvent(ev heartbeat.Event) {
	switch ev.Kind {
	case heartbeat.EventSuspect:
		e.input(func(m *protector.Machine, now time.Time) { m.Suspect(now, ev.Node) })
	case heartbeat.EventRefuted:
		e.input(func(m *protector.Machine, now time.Time) { m.Refuted(now, ev.Node) })
	case heartbeat.EventJoined:
		e.input(func(m *protector.Machine, now time.Time) { m.Rejoined(now, ev.Node) })
	case heartbeat.EventDeclared:
		fenced := ev.Cause == heartbeat.CauseFenced || ev.Cause == heartbeat.CauseRestarted
		e.input(func(m *protector.Machine, now time.Time) { m.Declared(now, ev.Node, fenced) })
	}
}

func (e *recoveryEdge) record(r protector.Record) {
	d := e.d
	e.met.observe(r)
	ev := eventOf(r, e.fatal[r.Group], d.prog.replayed(int(r.Group), r.Epoch))
	phases := map[string]string{}
	for ph := range protector.NumPhases {
		phases[ph.String()] = r.Phases[ph].String()
	}
	d.log.Info("recovery finished", "group", r.Group, "cause", r.Cause, "from", r.From, "to", r.To, "epoch", r.Epoch, "total", r.Total, "phases", phases, "err", r.Err)
	e.publishEvent(ev)
}

func (e *recoveryEdge) publishEvent(ev RecoveryEvent) {
	d := e.d
	d.dir.mu.Lock()
	d.dir.events = append(d.dir.events, ev)
	d.dir.mu.Unlock()
	go d.pushAll("/v1/recovery/events", ev)
}

// execute runs one action; acknowledgments come back through input.
func (e *recoveryEdge) execute(ctx context.Context, a protector.Action) {
	d := e.d
	switch a.Kind {
	case protector.ActFence:
		d.log.Warn("protector: fencing this node", "why", a.Err, "groups", a.Groups)
		d.fenced.Store(true)
		n, err := killCgroup(d.cfg.JobCgroup, 5*time.Second)
		d.log.Warn("protector fence: job processes stopped", "killed", n, "err", err)
	case protector.ActAnnounce:
		go d.pushAll("/v1/recovery/learn", d.announcementOf(a.Placement))
	case protector.ActRepairRing:
		d.log.Info("ring repaired", "ring", a.Ring, "pred", a.Pred, "succ", a.Succ)
	case protector.ActFailed:
		if errors.Is(a.Err, protector.ErrUnprotected) || errors.Is(a.Err, protector.ErrNoProtector) {
			d.log.Warn("group runs on unprotected: a further failure of its node is fatal", "group", a.Group, "phase", a.Phase, "err", a.Err)
			return
		}
		d.log.Error("recovery failed", "group", a.Group, "phase", a.Phase, "err", a.Err)
	case protector.ActStop:
		go func() {
			e.stopGroup(int(a.Group))
			e.input(func(m *protector.Machine, now time.Time) {
				if err := m.Stopped(now, a.Group, a.Epoch); err != nil {
					d.log.Warn("protector: stopped", "group", a.Group, "err", err)
				}
			})
		}()
	case protector.ActRestart:
		d.log.Info("protector: restarting group", "group", a.Group, "epoch", a.Epoch, "on", a.Node, "from", a.From)
		req := restartReq{Group: int(a.Group), Epoch: a.Epoch, From: int(a.From)}
		go func() {
			var err error
			if a.Node == d.self {
				err = e.restartHere(ctx, req)
			} else {
				err = d.postJSON(ctx, a.Node, "/v1/recovery/restart", req, 30*time.Second)
			}
			if err != nil {
				d.log.Warn("restart failed", "group", a.Group, "epoch", a.Epoch, "on", a.Node, "err", err)
				e.input(func(m *protector.Machine, now time.Time) { _ = m.RestartFailed(now, a.Group, a.Epoch, err) })
			}
		}()
	case protector.ActAbort:
		go func() {
			req := restartReq{Group: int(a.Group), Epoch: a.Epoch}
			err := d.postJSON(ctx, a.Node, "/v1/recovery/abort", req, 5*time.Second)
			if err != nil {
				d.log.Warn("abort of a restart not acknowledged: waiting for its target to be declared dead", "group", a.Group, "target", a.Node, "err", err)
				return
			}
			e.input(func(m *protector.Machine, now time.Time) { _ = m.Aborted(now, a.Group, a.Epoch) })
		}()
	case protector.ActReprotect:
		go func() {
			var errs []error
			for _, q := range a.To {
				var err error
				if a.Checkpoint {
					// The exec backend's checkpoint of a group is its
					// launch records, which its host keeps.
					err = e.storeLaunchRecords(ctx, int(a.Group), q)
				} else {
					_, err = d.catchUp(ctx, heartbeat.NodeID(a.Group), q)
				}
				if err != nil {
					errs = append(errs, err)
				}
			}
			if err := errors.Join(errs...); err != nil {
				e.input(func(m *protector.Machine, now time.Time) { _ = m.ReprotectFailed(now, a.Group, err) })
				return
			}
			e.input(func(m *protector.Machine, now time.Time) { _ = m.Reprotected(now, a.Group, a.To) })
		}()
	}
}

// stopGroup kills the group's recovery ranks on this node (kill-rank: the
// group restarts as a whole) and waits for them.
func (e *recoveryEdge) stopGroup(g int) {
	d := e.d
	var ps []*rankProc
	d.ranks.mu.Lock()
	for _, p := range d.ranks.ranks {
		if p.rec.Node == g && p.recovery {
			ps = append(ps, p)
		}
	}
	d.ranks.mu.Unlock()
	for _, p := range ps {
		p.mu.Lock()
		p.restarting = p.restarting || p.state != launch.StateExited
		p.mu.Unlock()
		_ = p.id.Signal(syscall.SIGKILL, true)
	}
	for _, p := range ps {
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			d.log.Error("rank did not die for a group stop", "job", p.rec.Job, "rank", p.rec.Rank, "pid", p.id.Pid)
		}
	}
}

// storeLaunchRecords stores the launch records of the group's recovery
// ranks running here on node q (as the group's data: node group's store).
func (e *recoveryEdge) storeLaunchRecords(ctx context.Context, group int, q heartbeat.NodeID) error {
	d := e.d
	var body []byte
	d.ranks.mu.Lock()
	for _, p := range d.ranks.ranks {
		if p.rec.Node == group && p.recovery {
			mr, err := launch.Encode(&p.rec)
			if err != nil {
				d.ranks.mu.Unlock()
				return err
			}
			body = record.AppendRecord(body, &mr)
		}
	}
	d.ranks.mu.Unlock()
	if len(body) == 0 {
		return nil
	}
	return d.pushTo(ctx, q, heartbeat.NodeID(group), body)
}

// restartHere starts group req.Group at req.Epoch on this node from the
// launch records held by req.From, then tells this node's machine.
func (e *recoveryEdge) restartHere(ctx context.Context, req restartReq) error {
	d := e.d
	d.dir.mu.Lock()
	aborted := d.dir.aborted[restartReq{Group: req.Group, Epoch: req.Epoch}]
	d.dir.mu.Unlock()
	if aborted {
		return fmt.Errorf("restart of group %d at epoch %d was aborted", req.Group, req.Epoch)
	}
	locs := d.dir.group(req.Group)
	var started []RankLoc
	for _, l := range locs {
		k := rankKey{l.Job, l.Rank}
		if d.dir.finishedGroup(req.Group, l.Job) {
			continue // nothing left to regenerate: the launcher has all of it
		}
		if old := d.ranks.get(k); old != nil {
			old.mu.Lock()
			final := old.state == launch.StateExited && !old.restarting
			old.mu.Unlock()
			if final {
				continue // it ended on its own here: its status is kept for the launcher
			}
		}
		rec, err := d.fetchLaunch(ctx, req.From, req.Group, l.Job, l.Rank)
		if err != nil {
			return err
		}
		if rec.Env, err = e.prepareReplay(ctx, req, l.Job, l.Rank, rec.Env); err != nil {
			return err
		}
		path, err := lookPath(rec.Path, rec.Env)
		if err != nil {
			return err
		}
		p, err := d.createRank(rec, path)
		if err != nil {
			return fmt.Errorf("relaunch rank %d of job %s: %w", l.Rank, l.Job, err)
		}
		p.recovery, p.epoch = true, req.Epoch
		p.mu.Lock()
		pend := p.pending
		p.pending = nil
		p.state = launch.StateRunning
		p.mu.Unlock()
		cmd, err := pend.Go()
		if err != nil {
			return fmt.Errorf("relaunch rank %d of job %s: %w", l.Rank, l.Job, err)
		}
		d.ranks.mu.Lock()
		if old := d.ranks.ranks[k]; old != nil {
			old.discard()
			old.cancel()
		}
		d.ranks.ranks[k] = p
		d.ranks.mu.Unlock()
		go d.waitRank(k, p, cmd)
		d.log.Info("rank restarted", "job", l.Job, "rank", l.Rank, "group", req.Group, "epoch", req.Epoch, "pid", p.id.Pid)
		l.Node, l.Epoch = d.cfg.Node, req.Epoch
		d.dir.put(l)
		started = append(started, l)
	}
	if len(started) > 0 {
		go d.pushAll("/v1/recovery/ranks", started)
	}
	g := protector.GroupID(req.Group)
	e.input(func(m *protector.Machine, now time.Time) {
		if err := m.Started(now, g, req.Epoch); err != nil {
			d.log.Warn("protector refused a stage of a restarted group", "group", g, "epoch", req.Epoch, "stage", "started", "err", err)
		}
	})
	// Reconnected and Live come from the ranks' shims as they replay
	// (replay.go); a group with no rank to replay has reached both.
	e.stagesIfEmpty(groupEpoch{req.Group, req.Epoch})
	return nil
}

// fetchLaunch reads a rank's launch record from the store of group's
// node held on node from.
func (d *Daemon) fetchLaunch(ctx context.Context, from, group int, job string, rank int) (*launch.Record, error) {
	stream := launch.StreamOf(job, rank)
	var body []byte
	if from == d.cfg.Node {
		st := d.stores.lookup(heartbeat.NodeID(group))
		if st == nil {
			return nil, fmt.Errorf("no store of node %d here", group)
		}
		rec, err := st.Read(launch.StoreOwner, stream, 0).Next()
		if err != nil {
			return nil, fmt.Errorf("launch record of rank %d of job %s: %w", rank, job, err)
		}
		return launch.Decode(rec)
	}
	addr, ok := d.loc.peerAddr(from)
	if !ok {
		return nil, fmt.Errorf("no address for node %d", from)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, http.MethodGet, fmt.Sprintf("http://%s/v1/replica/read?node=%d&owner=%d&stream=%d&from=0", addr, group, launch.StoreOwner, stream), nil)
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("launch record of rank %d of job %s on node %d: %s: %s", rank, job, from, resp.Status, bytes.TrimSpace(body))
	}
	rec, _, err := record.Decode(body)
	if err != nil {
		return nil, fmt.Errorf("launch record of rank %d of job %s on node %d: %w", rank, job, from, err)
	}
	return launch.Decode(rec)
}

// postJSON posts v to node's path and wants a 2xx.
func (d *Daemon) postJSON(ctx context.Context, node heartbeat.NodeID, path string, v any, timeout time.Duration) error {
	return d.sendJSON(ctx, http.MethodPost, node, path, v, timeout)
}

func (d *Daemon) sendJSON(ctx context.Context, method string, node heartbeat.NodeID, path string, v any, timeout time.Duration) error {
	addr, ok := d.loc.peerAddr(int(node))
	if !ok {
		return fmt.Errorf("no address for node %d", node)
	}
	var body io.Reader
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, "http://"+addr.String()+path, body)
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("node %d %s: %s: %s", node, path, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

// pushAll posts v to every other daemon, best effort (a daemon that
// misses it learns it again from the next announcement).
func (d *Daemon) pushAll(path string, v any) {
	d.sendAll(http.MethodPost, path, v)
}

func (d *Daemon) sendAll(method, path string, v any) {
	var wg sync.WaitGroup
	for id := range d.cfg.Peers {
		if id == d.self {
			continue
		}
		wg.Go(func() {
			if err := d.sendJSON(context.Background(), method, id, path, v, 2*time.Second); err != nil {
				d.log.Debug("push failed", "to", id, "path", path, "err", err)
			}
		})
	}
	wg.Wait()
}

func (d *Daemon) recoveryRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/recovery/learn", func(w http.ResponseWriter, r *http.Request) {
		var a announcement
		if !decodeJSON(w, r, &a) {
			return
		}
		if a.Replay != nil {
			d.prog.learnReplay(*a.Replay, time.Now())
		}
		if d.rec != nil {
			p := a.Placement
			d.rec.input(func(m *protector.Machine, now time.Time) { m.Learn(now, p) })
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/recovery/restart", func(w http.ResponseWriter, r *http.Request) {
		var req restartReq
		if !decodeJSON(w, r, &req) {
			return
		}
		if d.rec == nil {
			http.Error(w, fmt.Sprintf("node %d does not restart ranks (recovery off)", d.cfg.Node), http.StatusServiceUnavailable)
			return
		}
		if err := d.rec.restartHere(r.Context(), req); err != nil {
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/recovery/abort", func(w http.ResponseWriter, r *http.Request) {
		var req restartReq
		if !decodeJSON(w, r, &req) {
			return
		}
		d.dir.mu.Lock()
		d.dir.aborted[restartReq{Group: req.Group, Epoch: req.Epoch}] = true
		d.dir.mu.Unlock()
		// A restart already done at that epoch is stopped.
		d.ranks.mu.Lock()
		var ps []*rankProc
		for _, p := range d.ranks.ranks {
			if p.rec.Node == req.Group && p.epoch == req.Epoch && req.Epoch > 0 {
				ps = append(ps, p)
			}
		}
		d.ranks.mu.Unlock()
		for _, p := range ps {
			_ = p.id.Signal(syscall.SIGKILL, true)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/recovery/ranks", func(w http.ResponseWriter, r *http.Request) {
		var ls []RankLoc
		if !decodeJSON(w, r, &ls) {
			return
		}
		for _, l := range ls {
			d.dir.put(l)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("DELETE /v1/recovery/jobs/{job}", func(w http.ResponseWriter, r *http.Request) {
		d.dir.forget(r.PathValue("job"))
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/recovery/jobs/{job}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(d.dir.job(r.PathValue("job")))
	})
	mux.HandleFunc("POST /v1/recovery/events", func(w http.ResponseWriter, r *http.Request) {
		var ev RecoveryEvent
		if !decodeJSON(w, r, &ev) {
			return
		}
		d.dir.mu.Lock()
		d.dir.events = append(d.dir.events, ev)
		d.dir.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
}

func decodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(v); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

// recoveryOf says whether a launch record asks for recovery.
func recoveryOf(rec *launch.Record) bool {
	return slices.Contains(rec.Env, "RADIC_RECOVERY=1")
}
