package radicd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/radic-project/radic/internal/cluster/proc"
	"github.com/radic-project/radic/internal/launch"
	"github.com/radic-project/radic/internal/launch/outbuf"
	"github.com/radic-project/radic/msglog/record"
	"github.com/radic-project/radic/protector"
)

// Limits of the launch API.
const (
	// outputWindow bounds the output kept per stream of a rank that the
	// launcher has not fetched yet; beyond it the rank waits on its pipe.
	// 4 MiB rides out a launcher cut off for seconds from a chatty rank.
	outputWindow = 4 << 20
	// outputChunk bounds one output reply.
	outputChunk = 1 << 20
	// gateTimeout ends a rank created but never started (its launcher
	// died between the two calls).
	gateTimeout = 30 * time.Second
	// keepExited is how long an exited rank's status and output stay for
	// a launcher that never came back for them.
	keepExited = 10 * time.Minute
	// maxWait bounds a long poll (?wait=).
	maxWait = 30 * time.Second
	// protectorWait is how long a launch waits for the ring to name a
	// protector that stores its record (a ring just started has none for
	// a moment; one whose protector just died names the next after
	// detection), storeAttempt how long one try may take.
	protectorWait = 10 * time.Second
	storeAttempt  = 2 * time.Second
)

// rankKey names a rank on this node.
type rankKey struct {
	job  string
	rank int
}

// rankProc is one rank launched by this daemon.
type rankProc struct {
	rec     launch.Record
	id      proc.ID
	out     *outbuf.Buffer
	errb    *outbuf.Buffer
	shim    *outbuf.Buffer // launch.Radic: its shim's lines, from the file radicd named
	pending *proc.Pending  // until Start
	stdinW  *os.File       // the rank's stdin, when rec.Stdin
	done    chan struct{}  // closed when exit is set
	ctx     context.Context
	cancel  context.CancelFunc // ends the output copiers' waits
	// recovery: launched with RADIC_RECOVERY=1; epoch: 0 as launched,
	// the group's epoch once restarted (recovery.go). Set before the
	// rank is in the table.
	recovery bool
	epoch    uint64

	mu sync.Mutex
	// +checklocks:mu
	state string
	// +checklocks:mu
	exit launch.Exit
	// +checklocks:mu
	stdinBusy bool
	// stopAsked: the launcher signalled it; its death is the job's, not
	// a fault to recover from.
	// +checklocks:mu
	stopAsked bool
	// restarting: it died of a fault and its group is being restarted;
	// its status says so instead of its exit.
	// +checklocks:mu
	restarting bool
	// outRead, errRead: the launcher was served stdout, stderr to its
	// end; finished: then pushed as finished (RankLoc.Finished).
	// +checklocks:mu
	outRead, errRead, finished bool
}

// rankTable is the ranks of this node. Lock order: rankTable.mu, then
// rankProc.mu.
type rankTable struct {
	mu sync.Mutex
	// +checklocks:mu
	ranks map[rankKey]*rankProc
}

func newRankTable() *rankTable { return &rankTable{ranks: map[rankKey]*rankProc{}} }

func (t *rankTable) get(k rankKey) *rankProc {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ranks[k]
}

// remove forgets k if it is still p.
func (t *rankTable) remove(k rankKey, p *rankProc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ranks[k] == p {
		delete(t.ranks, k)
	}
}

func (d *Daemon) rankRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/jobs", d.handleJobs)
	mux.HandleFunc("GET /v1/jobs/{job}/guests", d.handleGuests)
	mux.HandleFunc("POST /v1/jobs/{job}/ranks", d.handleLaunch)
	mux.HandleFunc("POST /v1/jobs/{job}/ranks/{rank}/start", d.handleStart)
	mux.HandleFunc("GET /v1/jobs/{job}/ranks/{rank}", d.handleRankStatus)
	mux.HandleFunc("GET /v1/jobs/{job}/ranks/{rank}/output", d.handleOutput)
	mux.HandleFunc("POST /v1/jobs/{job}/ranks/{rank}/signal", d.handleSignal)
	mux.HandleFunc("POST /v1/jobs/{job}/ranks/{rank}/stdin", d.handleStdin)
	mux.HandleFunc("DELETE /v1/jobs/{job}", d.handleForgetJob)
	mux.HandleFunc("POST /v1/jobs/{job}/checkpoint", d.handleCheckpoint)
}

// rankOf finds the rank a request names, or answers 404 and returns nil.
func (d *Daemon) rankOf(w http.ResponseWriter, r *http.Request) (rankKey, *rankProc) {
	job := r.PathValue("job")
	n, err := strconv.Atoi(r.PathValue("rank"))
	if err != nil || n < 0 {
		http.Error(w, fmt.Sprintf("bad rank %q", r.PathValue("rank")), http.StatusBadRequest)
		return rankKey{}, nil
	}
	k := rankKey{job, n}
	p := d.ranks.get(k)
	if p == nil {
		http.Error(w, fmt.Sprintf("node %d runs no rank %d of job %q", d.cfg.Node, n, job), http.StatusNotFound)
	}
	return k, p
}

// handleLaunch creates a rank held at its gate: the launch record is
// stored with the protectors first, then the process is created in the
// job cgroup; the reply carries its pid. Start lets it run.
func (d *Daemon) handleLaunch(w http.ResponseWriter, r *http.Request) {
	var rec launch.Record
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&rec); err != nil {
		http.Error(w, "launch record: "+err.Error(), http.StatusBadRequest)
		return
	}
	if rec.Job != r.PathValue("job") {
		http.Error(w, fmt.Sprintf("launch record of job %q posted to job %q", rec.Job, r.PathValue("job")), http.StatusBadRequest)
		return
	}
	if err := rec.Validate(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if rec.Node != d.cfg.Node {
		http.Error(w, fmt.Sprintf("rank %d of job %s is placed on node %d, but this is node %d", rec.Rank, rec.Job, rec.Node, d.cfg.Node), http.StatusBadRequest)
		return
	}
	k := rankKey{rec.Job, rec.Rank}
	if p := d.ranks.get(k); p != nil {
		http.Error(w, fmt.Sprintf("rank %d of job %s is already launched on node %d (pid %d)", rec.Rank, rec.Job, d.cfg.Node, p.id.Pid), http.StatusConflict)
		return
	}
	if v := r.URL.Query().Get("instead-of"); v != "" {
		lost, err := strconv.Atoi(v)
		if err != nil {
			http.Error(w, fmt.Sprintf("instead-of=%q: want a node id", v), http.StatusBadRequest)
			return
		}
		st, ok := d.runner.Status(r.Context())
		if !ok {
			http.Error(w, "daemon stopping", http.StatusServiceUnavailable)
			return
		}
		if code, err := insteadOf(st, lost, d.dir.has(k)); err != nil {
			http.Error(w, fmt.Sprintf("launch rank %d of job %s in place of node %d: %v", rec.Rank, rec.Job, lost, err), code)
			return
		}
		d.log.Warn("launching a rank in place of a node lost during the launch", "job", rec.Job, "rank", rec.Rank, "lost", lost)
	}
	path, err := lookPath(rec.Path, rec.Env)
	if err != nil {
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
		return
	}
	prots, err := d.storeLaunch(r.Context(), &rec)
	if err != nil {
		code := http.StatusServiceUnavailable
		var he *httpError
		if errors.As(err, &he) && he.code == http.StatusConflict {
			code = http.StatusConflict
		}
		http.Error(w, fmt.Sprintf("store the launch record of rank %d of job %s with its protectors: %v", rec.Rank, rec.Job, err), code)
		return
	}
	p, err := d.createRank(&rec, path)
	if err != nil {
		http.Error(w, fmt.Sprintf("launch rank %d of job %s on node %d: %v", rec.Rank, rec.Job, d.cfg.Node, err), http.StatusInternalServerError)
		return
	}
	d.ranks.mu.Lock()
	if d.ranks.ranks[k] != nil { // a concurrent twin won
		d.ranks.mu.Unlock()
		p.abort()
		http.Error(w, fmt.Sprintf("rank %d of job %s is already launched on node %d", rec.Rank, rec.Job, d.cfg.Node), http.StatusConflict)
		return
	}
	p.recovery = recoveryOf(&rec)
	d.ranks.ranks[k] = p
	d.ranks.mu.Unlock()
	if p.recovery {
		if d.rec == nil {
			_, why := d.recoveryEnabled()
			d.log.Warn("rank launched with recovery, but this node will not restart it", "job", rec.Job, "rank", rec.Rank, "why", why)
		} else {
			l := RankLoc{Job: rec.Job, Rank: rec.Rank, Group: rec.Node, Node: d.cfg.Node}
			d.dir.put(l)
			d.pushAll("/v1/recovery/ranks", []RankLoc{l})
		}
	}
	// The pushes wait up to 2 s on a peer out of reach: a node cut off
	// meanwhile may have fenced, killing the held process (launchGate).
	if _, wait, err := d.gate(r.Context()); err != nil && !wait {
		d.ranks.remove(k, p)
		p.abort()
		http.Error(w, fmt.Sprintf("launch rank %d of job %s: %v", rec.Rank, rec.Job, err), http.StatusServiceUnavailable)
		return
	}
	time.AfterFunc(gateTimeout, func() {
		p.mu.Lock()
		held := p.state == launch.StateHeld
		p.mu.Unlock()
		if held {
			d.log.Warn("rank never started: its launcher is gone; ending it", "job", rec.Job, "rank", rec.Rank, "pid", p.id.Pid)
			d.ranks.remove(k, p)
			p.abort()
		}
	})
	d.log.Info("rank created", "job", rec.Job, "rank", rec.Rank, "pid", p.id.Pid, "path", path, "protectors", prots)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(launch.Started{Pid: p.id.Pid, Start: p.id.Start, Protectors: prots})
}

// handleGuests answers which logical nodes other than this one have ranks
// of the job running here (restarted here, or launched in place of a lost
// node). A rank's shim asks before it takes a connection from its own
// node for plain TCP: a guest's connections to it are managed (the guest
// sends a radic hello), though they come from this node's address.
func (d *Daemon) handleGuests(w http.ResponseWriter, r *http.Request) {
	job := r.PathValue("job")
	guests := []int{}
	d.ranks.mu.Lock()
	for k, p := range d.ranks.ranks {
		n, err := strconv.Atoi(envValue(p.rec.Env, "RADIC_NODE"))
		if k.job == job && err == nil && n != d.cfg.Node && !slices.Contains(guests, n) {
			guests = append(guests, n)
		}
	}
	d.ranks.mu.Unlock()
	slices.Sort(guests)
	writeJSON(w, map[string][]int{"guests": guests})
}

// storeLaunch stores rec with this node's protectors. A ring that names
// no protector yet (just started) is waited for a little; a node alone in
// its ring (one node, no peers) has none, and launches unprotected.
func (d *Daemon) storeLaunch(ctx context.Context, rec *launch.Record) ([]int, error) {
	mr, err := launch.Encode(rec)
	if err != nil {
		return nil, err
	}
	body := record.AppendRecord(nil, &mr)
	deadline := time.Now().Add(protectorWait)
	d.waitRingFormed(ctx, deadline)
	for {
		before, wait, err := d.gate(ctx)
		if err != nil {
			if !wait || time.Now().After(deadline) || ctx.Err() != nil {
				return nil, err
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		// A protector that just died holds a push until the ring
		// declares it (under a second); then the ring names another.
		actx, cancel := context.WithTimeout(ctx, storeAttempt)
		prots, err := d.replicate(actx, body)
		cancel()
		ids := make([]int, len(prots))
		for i, p := range prots {
			ids[i] = int(p)
		}
		if err == nil {
			// The protectors stored to are the ring's only if the
			// ring did not change meanwhile (launchGate's doc); else
			// store again with the protectors it names now.
			if after, _, err := d.gate(ctx); err == nil && after == before {
				return ids, nil
			}
			continue
		}
		var he *httpError
		noProt := errors.As(err, &he) && he.msg == "no protector alive"
		if noProt && len(d.cfg.Peers) <= 1 {
			d.log.Warn("launching unprotected: this node is alone in its ring", "job", rec.Job, "rank", rec.Rank)
			return nil, nil
		}
		if errors.As(err, &he) && he.code == http.StatusConflict {
			return ids, &httpError{http.StatusConflict, "a different launch record of this rank is stored already: " + err.Error()}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return ids, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitRingFormed waits (until deadline) for every member of the ring to
// have been heard from or declared. A node's protectors are the next k
// alive members after it in the ring as it knows it, and while the ring
// is still forming (radicd just started) that set grows: a rank launched
// then would have the start of its log on one protector and the rest on
// another, which holds nothing before its first batch, and nothing moves
// the start to it (TestRecoveryLogsWhatPeersSent, 1 run in 6: "stream
// starts at 240106, want 0").
func (d *Daemon) waitRingFormed(ctx context.Context, deadline time.Time) {
	for {
		st, ok := d.runner.Status(ctx)
		forming := !ok
		for _, m := range st.Members {
			if m.State == "unknown" && m.ID != d.self {
				forming = true
			}
		}
		if !forming {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			d.log.Warn("launching before the ring has formed: a rank's protectors may change under it", "members", st.Members)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// createRank creates rec's process held at its gate (package proc: the
// helper is this binary's `nsexec`), in the job cgroup, with pipes for
// its output. radicd already runs in the node's network namespace.
func (d *Daemon) createRank(rec *launch.Record, path string) (*rankProc, error) {
	ctx, cancel := context.WithCancel(context.Background())
	p := &rankProc{rec: *rec, out: outbuf.New(outputWindow), errb: outbuf.New(outputWindow), shim: outbuf.New(outputWindow),
		done: make(chan struct{}), ctx: ctx, cancel: cancel, state: launch.StateHeld}
	var closeAfter []*os.File
	defer func() {
		for _, f := range closeAfter {
			f.Close()
		}
	}()
	spec := proc.Spec{Path: path, Args: rec.Argv, Env: rec.Env, Dir: rec.Cwd, Cgroup: d.cfg.JobCgroup}
	shimLog := d.shimLogFile(rec)
	if shimLog != "" && envValue(rec.Env, "RADIC_LOG_FILE") == "" {
		spec.Env = append(slices.Clip(rec.Env), "RADIC_LOG_FILE="+shimLog)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		cancel()
		return nil, err
	}
	closeAfter = append(closeAfter, outW)
	spec.Stdout, spec.Stderr = outW, outW
	var errR *os.File
	if !rec.MergeStderr {
		var errW *os.File
		errR, errW, err = os.Pipe()
		if err != nil {
			outR.Close()
			cancel()
			return nil, err
		}
		closeAfter = append(closeAfter, errW)
		spec.Stderr = errW
	}
	if rec.Stdin {
		inR, inW, err := os.Pipe()
		if err != nil {
			outR.Close()
			if errR != nil {
				errR.Close()
			}
			cancel()
			return nil, err
		}
		closeAfter = append(closeAfter, inR)
		spec.Stdin, p.stdinW = inR, inW
	}
	pend, err := proc.Launch(spec)
	if err != nil {
		outR.Close()
		if errR != nil {
			errR.Close()
		}
		if p.stdinW != nil {
			p.stdinW.Close()
		}
		cancel()
		return nil, err
	}
	p.pending, p.id = pend, pend.ID
	go p.copyOut(outR, p.out)
	if errR != nil {
		go p.copyOut(errR, p.errb)
	} else {
		p.errb.Close() // fd 2 is stdout's pipe
	}
	if shimLog != "" {
		go p.tailShimLog(shimLog)
	} else {
		p.shim.Close()
	}
	return p, nil
}

// copyOut moves a rank's pipe into its output window until the last
// writer (the rank, or a child that outlived it) closes it.
func (p *rankProc) copyOut(r *os.File, b *outbuf.Buffer) {
	defer r.Close()
	defer b.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := b.Write(p.ctx, buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// abort ends a rank that never ran.
func (p *rankProc) abort() {
	p.mu.Lock()
	pend := p.pending
	p.pending = nil
	p.state = launch.StateExited
	p.exit = launch.Exit{Signal: int(syscall.SIGKILL)}
	p.mu.Unlock()
	if pend != nil {
		pend.Abort()
	}
	p.discard()
	select {
	case <-p.done:
	default:
		close(p.done)
	}
}

// discard drops the rank's output: nobody will read it.
func (p *rankProc) discard() {
	p.out.Discard()
	p.errb.Discard()
	p.shim.Discard()
	if p.stdinW != nil {
		p.stdinW.Close()
	}
}

// handleStart opens the rank's gate: it enters the program, or the reply
// says why it could not (422: exec failed; the rank is then forgotten).
func (d *Daemon) handleStart(w http.ResponseWriter, r *http.Request) {
	k, p := d.rankOf(w, r)
	if p == nil {
		return
	}
	p.mu.Lock()
	pend := p.pending
	p.pending = nil
	if pend != nil {
		p.state = launch.StateRunning
	}
	p.mu.Unlock()
	if pend == nil {
		http.Error(w, fmt.Sprintf("rank %d of job %s was started already", k.rank, k.job), http.StatusConflict)
		return
	}
	cmd, err := pend.Go()
	if err != nil {
		d.ranks.remove(k, p)
		p.mu.Lock()
		p.state = launch.StateExited
		p.exit = launch.Exit{Code: 127}
		p.mu.Unlock()
		close(p.done)
		p.discard()
		d.log.Warn("rank could not start", "job", k.job, "rank", k.rank, "err", err)
		http.Error(w, fmt.Sprintf("start rank %d of job %s on node %d: %v", k.rank, k.job, d.cfg.Node, err), http.StatusUnprocessableEntity)
		return
	}
	go d.waitRank(k, p, cmd)
	w.WriteHeader(http.StatusNoContent)
}

// waitRank reaps the rank and keeps its exit status for the launcher.
func (d *Daemon) waitRank(k rankKey, p *rankProc, cmd *exec.Cmd) {
	_ = cmd.Wait()
	e := launch.Exit{Code: 1}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		e = launch.ExitOf(ws)
	}
	p.mu.Lock()
	p.state = launch.StateExited
	p.exit = e
	fault := p.recovery && d.rec != nil && e.Signal != 0 && !p.stopAsked
	if fault {
		p.restarting = true
	}
	p.mu.Unlock()
	close(p.done)
	d.finishIfRead(p)
	d.log.Info("rank exited", "job", k.job, "rank", k.rank, "pid", p.id.Pid, "how", e.String(), "restart", fault)
	if p.epoch > 0 && e.Signal == 0 && e.Code == launch.ExitDiverged {
		d.log.Error("a restarted rank diverged from its first run while replaying its log: the job cannot be recovered", "job", k.job, "rank", k.rank, "epoch", p.epoch, "shim_log", envValue(p.rec.Env, "RADIC_LOG_FILE"))
	}
	if fault {
		g, proc := protector.GroupID(p.rec.Node), protector.ProcID(p.rec.Rank)
		d.rec.input(func(m *protector.Machine, now time.Time) {
			if err := m.Exited(now, g, proc); err != nil {
				d.log.Warn("rank died but its group is not restarted here", "job", k.job, "rank", k.rank, "err", err)
				p.mu.Lock()
				p.restarting = false
				p.mu.Unlock()
			}
		})
	}
	time.AfterFunc(keepExited, func() {
		d.ranks.remove(k, p)
		p.discard()
		p.cancel()
	})
}

func waitParam(r *http.Request) (time.Duration, error) {
	s := r.URL.Query().Get("wait")
	if s == "" {
		return 0, nil
	}
	t, err := time.ParseDuration(s)
	if err != nil || t < 0 {
		return 0, fmt.Errorf("bad wait=%q: want a duration like 5s", s)
	}
	return min(t, maxWait), nil
}

func (p *rankProc) status() launch.RankStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := launch.RankStatus{Job: p.rec.Job, Rank: p.rec.Rank, Pid: p.id.Pid, Start: p.id.Start, State: p.state, Epoch: p.epoch}
	if p.restarting {
		st.State = launch.StateRestarting
	} else if p.state == launch.StateExited {
		e := p.exit
		st.Exit = &e
	}
	_, st.Stdout, _ = p.out.Window()
	_, st.Stderr, _ = p.errb.Window()
	return st
}

// handleRankStatus answers the rank's state; with wait=D, once it has
// exited or D has passed.
func (d *Daemon) handleRankStatus(w http.ResponseWriter, r *http.Request) {
	_, p := d.rankOf(w, r)
	if p == nil {
		return
	}
	wait, err := waitParam(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-p.done:
		case <-t.C:
		case <-r.Context().Done():
		}
		t.Stop()
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(p.status())
}

// handleOutput serves a rank's stdout or stderr from offset from=F,
// releasing what precedes F (the launcher has it). With nothing at F yet
// it waits up to wait=D. Headers: X-Radic-Offset (F), X-Radic-Eof (1 when
// the body ends the stream).
func (d *Daemon) handleOutput(w http.ResponseWriter, r *http.Request) {
	_, p := d.rankOf(w, r)
	if p == nil {
		return
	}
	q := r.URL.Query()
	var b *outbuf.Buffer
	switch q.Get("stream") {
	case launch.Stdout:
		b = p.out
	case launch.Stderr:
		b = p.errb
	case launch.Radic:
		b = p.shim
	default:
		http.Error(w, fmt.Sprintf("stream=%q: want stdout, stderr or radic", q.Get("stream")), http.StatusBadRequest)
		return
	}
	from, err := strconv.ParseUint(q.Get("from"), 10, 64)
	if err != nil {
		http.Error(w, fmt.Sprintf("from=%q: want a byte offset", q.Get("from")), http.StatusBadRequest)
		return
	}
	wait, err := waitParam(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if e := q.Get("epoch"); e != "" && e != strconv.FormatUint(p.epoch, 10) {
		http.Error(w, fmt.Sprintf("rank %d of job %s on node %d is at epoch %d, not %s", p.rec.Rank, p.rec.Job, d.cfg.Node, p.epoch, e), http.StatusConflict)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	data, eof, err := b.Read(ctx, from, outputChunk)
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestedRangeNotSatisfiable)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set(launch.HeaderOffset, strconv.FormatUint(from, 10))
	w.Header().Set(launch.HeaderEpoch, strconv.FormatUint(p.epoch, 10))
	if eof {
		w.Header().Set(launch.HeaderEOF, "1")
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	_, err = w.Write(data)
	if eof && err == nil {
		p.mu.Lock()
		if b == p.out {
			p.outRead = true
		} else {
			p.errRead = true
		}
		p.mu.Unlock()
		d.finishIfRead(p)
	}
}

// finishIfRead tells every daemon that a recovery rank has finished
// (RankLoc.Finished) once it exited on its own and the launcher has read
// both its streams to their ends: nothing of it is left that a restart
// would have to regenerate, so the death of its node does not restart it,
// and peers that replay their connections with it know it is gone.
func (d *Daemon) finishIfRead(p *rankProc) {
	if !p.recovery || d.rec == nil {
		return
	}
	p.mu.Lock()
	ready := p.state == launch.StateExited && p.exit.Signal == 0 && !p.restarting && p.outRead && p.errRead && !p.finished
	if ready {
		p.finished = true
	}
	exit := p.exit
	p.mu.Unlock()
	if !ready {
		return
	}
	l := RankLoc{Job: p.rec.Job, Rank: p.rec.Rank, Group: p.rec.Node, Node: d.cfg.Node, Epoch: p.epoch, Finished: true, Exit: &exit}
	d.dir.put(l)
	go d.pushAll("/v1/recovery/ranks", []RankLoc{l})
}

// handleSignal signals the rank's process group (the rank and what it
// started), as radic run always has.
func (d *Daemon) handleSignal(w http.ResponseWriter, r *http.Request) {
	k, p := d.rankOf(w, r)
	if p == nil {
		return
	}
	name := strings.TrimPrefix(strings.ToUpper(r.URL.Query().Get("sig")), "SIG")
	sig, ok := launch.Signals[name]
	if !ok {
		http.Error(w, fmt.Sprintf("sig=%q: want one of TERM, KILL, INT, HUP, CONT, STOP", r.URL.Query().Get("sig")), http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.stopAsked = true
	p.mu.Unlock()
	if err := p.id.Signal(sig, true); err != nil {
		http.Error(w, fmt.Sprintf("signal rank %d of job %s (pid %d): %v", k.rank, k.job, p.id.Pid, err), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleStdin copies the request body into the rank's stdin and closes it
// at the body's end: one writer, once.
func (d *Daemon) handleStdin(w http.ResponseWriter, r *http.Request) {
	k, p := d.rankOf(w, r)
	if p == nil {
		return
	}
	p.mu.Lock()
	in, busy := p.stdinW, p.stdinBusy
	p.stdinBusy = true
	p.mu.Unlock()
	switch {
	case in == nil:
		http.Error(w, fmt.Sprintf("rank %d of job %s was launched without stdin", k.rank, k.job), http.StatusConflict)
		return
	case busy:
		http.Error(w, fmt.Sprintf("the stdin of rank %d of job %s is fed already", k.rank, k.job), http.StatusConflict)
		return
	}
	_, err := io.Copy(in, r.Body)
	in.Close()
	if err != nil && !errors.Is(err, syscall.EPIPE) {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleForgetJob is the launcher's goodbye: ranks still running are
// killed, and every rank of the job is forgotten.
func (d *Daemon) handleForgetJob(w http.ResponseWriter, r *http.Request) {
	job := r.PathValue("job")
	if d.rec != nil {
		d.rec.replays.releaseAll(job)
	}
	if d.dir.job(job).Ranks != nil {
		d.dir.forget(job)
		go d.sendAll(http.MethodDelete, "/v1/recovery/jobs/"+job, nil)
	}
	d.ranks.mu.Lock()
	var mine []*rankProc
	for k, p := range d.ranks.ranks {
		if k.job == job {
			mine = append(mine, p)
			delete(d.ranks.ranks, k)
		}
	}
	d.ranks.mu.Unlock()
	for _, p := range mine {
		p.mu.Lock()
		state := p.state
		p.mu.Unlock()
		switch state {
		case launch.StateHeld:
			p.abort()
			continue
		case launch.StateRunning:
			_ = p.id.Signal(syscall.SIGKILL, true)
		}
		p.discard()
		p.cancel()
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleJobs lists the ranks this node runs.
func (d *Daemon) handleJobs(w http.ResponseWriter, r *http.Request) {
	d.ranks.mu.Lock()
	ps := make([]*rankProc, 0, len(d.ranks.ranks))
	for _, p := range d.ranks.ranks {
		ps = append(ps, p)
	}
	d.ranks.mu.Unlock()
	out := make([]launch.RankStatus, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.status())
	}
	slices.SortFunc(out, func(a, b launch.RankStatus) int {
		if c := strings.Compare(a.Job, b.Job); c != 0 {
			return c
		}
		return a.Rank - b.Rank
	})
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// lookPath finds the program of a launch record on this node: a path
// with a '/' as it is, else the first executable of that name in the
// rank's own PATH.
func lookPath(path string, env []string) (string, error) {
	check := func(p string) error {
		fi, err := os.Stat(p)
		switch {
		case err != nil:
			return err
		case fi.IsDir():
			return fmt.Errorf("%s is a directory", p)
		case fi.Mode()&0o111 == 0:
			return fmt.Errorf("%s is not executable", p)
		}
		return nil
	}
	if strings.Contains(path, "/") {
		if err := check(path); err != nil {
			return "", fmt.Errorf("program %s: %w", path, err)
		}
		return path, nil
	}
	dirs := "/usr/local/bin:/usr/bin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			dirs = v
		}
	}
	for _, dir := range filepath.SplitList(dirs) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		if p := filepath.Join(dir, path); check(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("program %q not found in the rank's PATH (%s)", path, dirs)
}

// envValue is the value of name in env, or "".
func envValue(env []string, name string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}
