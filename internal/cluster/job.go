package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/radic-project/radic/internal/cluster/proc"
	"github.com/radic-project/radic/internal/jobrun"
)

// RunOptions are the settings of `radic run`.
type RunOptions struct {
	Dir       string   // state directory
	NP        int      // number of ranks
	PerNode   int      // ranks per node, in blocks (0 = round robin)
	Nodes     []int    // nodes to use (nil = every live compute node)
	Argv      []string // the program and its arguments
	TagOutput bool     // prefix every output line with "[rank R] "
	PortBase  int      // rank r listens on PortBase+r (0 = chosen per job)
	Stdin     bool     // give rank 0 the launcher's stdin (else /dev/null)
	Grace     time.Duration

	// Preload, when set, is put in front of LD_PRELOAD in every rank's
	// environment (the shim, from issue 4 on).
	Preload string

	Stdout, Stderr io.Writer
	Logf           func(format string, args ...any) // radic's own messages

	// Daemons, on a cluster with daemons, says where a node's radicd
	// is; nil: from the cluster state (NodeDaemon).
	Daemons jobrun.Daemons
}

// placement computes which node each rank runs on.
func placement(np, perNode int, nodes []int) ([]int, error) {
	if len(nodes) == 0 {
		return nil, errors.New("no node to run on (every compute node is dead?)")
	}
	out := make([]int, np)
	for r := range np {
		if perNode > 0 {
			if r/perNode >= len(nodes) {
				return nil, fmt.Errorf("--np %d with --per-node %d needs %d nodes, have %d", np, perNode, (np+perNode-1)/perNode, len(nodes))
			}
			out[r] = nodes[r/perNode]
		} else {
			out[r] = nodes[r%len(nodes)]
		}
	}
	return out, nil
}

// RankEnv is the one place a rank's environment is built: the launcher's
// environment without radic's own variables, then RADIC_RANK, RADIC_SIZE,
// RADIC_NODE, RADIC_PEERS, RADIC_JOB, RADIC_STATE_DIR, RADIC_DAEMON when
// daemon is set (the node's radicd, see DaemonAddr) and, when preload is
// set, LD_PRELOAD with preload in front.
func RankEnv(base []string, job *Job, rank, size int, dir, daemon, preload string) []string {
	drop := []string{"RADIC_RANK", "RADIC_SIZE", "RADIC_NODE", "RADIC_PEERS", "RADIC_JOB", "RADIC_STATE_DIR", "RADIC_DAEMON", "NOTIFY_SOCKET"}
	oldPreload := ""
	if preload != "" {
		for _, kv := range base {
			if v, ok := strings.CutPrefix(kv, "LD_PRELOAD="); ok {
				oldPreload = v
			}
		}
		drop = append(drop, "LD_PRELOAD")
	}
	env := filterEnv(base, drop...)
	peers := make([]string, len(job.Ranks))
	for i, r := range job.Ranks {
		peers[i] = r.Addr
	}
	env = append(env,
		"RADIC_RANK="+strconv.Itoa(rank),
		"RADIC_SIZE="+strconv.Itoa(size),
		"RADIC_NODE="+strconv.Itoa(job.Ranks[rank].Node),
		"RADIC_PEERS="+strings.Join(peers, ","),
		"RADIC_JOB="+job.ID,
		"RADIC_STATE_DIR="+dir)
	if daemon != "" {
		env = append(env, "RADIC_DAEMON="+daemon)
	}
	if preload != "" {
		v := preload
		if oldPreload != "" {
			v += ":" + oldPreload
		}
		env = append(env, "LD_PRELOAD="+v)
	}
	return env
}

type rankExit struct {
	rank int
	err  error
	ps   *os.ProcessState
}

// Run runs a job on the cluster and returns its exit status: 0 when every
// rank exits 0, else the first failing rank's status (128+signal for a
// signal). SIGINT, SIGTERM and SIGHUP stop the job: SIGTERM to every rank,
// SIGKILL after the grace period.
func Run(o RunOptions) (int, error) {
	if o.NP < 1 {
		return 0, fmt.Errorf("--np %d: want at least one rank", o.NP)
	}
	if len(o.Argv) == 0 {
		return 0, errors.New("no program given (usage: radic run --np P -- CMD ARGS)")
	}
	if o.Grace == 0 {
		o.Grace = 3 * time.Second
	}
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	peek, err := Load(o.Dir)
	if err != nil {
		return 0, err
	}
	// With daemons, the node's radicd finds the program (in the rank's
	// PATH) and says so when it cannot; only a relative path is made
	// absolute here, against radic run's directory.
	viaDaemons := peek.Daemons
	path := o.Argv[0]
	if !strings.Contains(path, "/") && !viaDaemons {
		p, err := exec.LookPath(path)
		if err != nil {
			return 0, err
		}
		path = p
	}
	if strings.Contains(path, "/") {
		if path, err = filepath.Abs(path); err != nil {
			return 0, err
		}
	}
	if !viaDaemons {
		if _, err := os.Stat(path); err != nil {
			return 0, err
		}
	}
	cwd, _ := os.Getwd()

	// Catch signals before the first rank exists.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	var job Job
	var s *State
	err = Update(o.Dir, func(st *State) error {
		s = st
		if st.Phase != "up" {
			return fmt.Errorf("cluster %s is %s, not up", st.Name, st.Phase)
		}
		st.pruneJobs()
		nodes := o.Nodes
		if nodes == nil {
			nodes = st.Workers()
		}
		for _, id := range nodes {
			n, err := st.Node(id)
			if err != nil {
				return err
			}
			if n.Dead {
				return fmt.Errorf("node %d is dead (kill-node); choose others with --nodes", id)
			}
			if n.Frozen {
				return fmt.Errorf("node %d is frozen: its ranks could not start until it thaws; `radic fault heal` it or choose others with --nodes", id)
			}
		}
		where, err := placement(o.NP, o.PerNode, nodes)
		if err != nil {
			return err
		}
		seq := st.NextJob
		st.NextJob++
		base := o.PortBase
		if base == 0 {
			base = 20000 + (seq%100)*100
		}
		if base+o.NP > 65535 {
			return fmt.Errorf("--port-base %d: ports up to %d do not exist", base, base+o.NP-1)
		}
		job = Job{ID: fmt.Sprintf("%s-%d", st.Name, seq), Launcher: proc.Of(os.Getpid()),
			Started: time.Now().UTC(), Argv: o.Argv}
		for r, id := range where {
			n, _ := st.Node(id)
			// Under radic the ranks see only logical addresses (the shim
			// finds where a node is now); a bare job needs real ones.
			addr := n.Addr
			if o.Preload != "" && st.Daemons && n.LogicalAddr != "" {
				addr = n.LogicalAddr
			}
			job.Ranks = append(job.Ranks, Rank{Rank: r, Node: id,
				Addr: net.JoinHostPort(addr, strconv.Itoa(base+r))})
		}
		st.Jobs = append(st.Jobs, job)
		return nil
	})
	if err != nil {
		return 0, err
	}
	defer func() {
		_ = Update(o.Dir, func(st *State) error {
			for i, j := range st.Jobs {
				if j.ID == job.ID {
					st.Jobs = append(st.Jobs[:i], st.Jobs[i+1:]...)
					break
				}
			}
			return nil
		})
	}()

	if s.Daemons != viaDaemons {
		return 0, errors.New("the cluster was replaced while radic run started; run it again")
	}
	if s.Daemons {
		return runThroughDaemons(o, s, &job, path, cwd, sigs)
	}

	var outWG sync.WaitGroup
	var outMu sync.Mutex
	tag := func(r int, rd io.ReadCloser, w io.Writer) {
		defer outWG.Done()
		defer rd.Close()
		jobrun.Tag(r, rd, w, &outMu)
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer devnull.Close()
	fileOf := func(w io.Writer) *os.File {
		if f, ok := w.(*os.File); ok {
			return f
		}
		return nil
	}

	cmds := make([]*exec.Cmd, o.NP)
	ids := make([]proc.ID, o.NP)
	exits := make(chan rankExit, o.NP)
	stopAll := func(sig syscall.Signal) {
		for r := range cmds {
			if cmds[r] != nil {
				_ = ids[r].Signal(sig, true)
			}
		}
	}
	// Start in three steps, so that every pid is in the state before any
	// program runs: launch the helpers (held at their gates), record all
	// pids in one update, then open the gates.
	pending := make([]*proc.Pending, o.NP)
	launchErr := make([]error, o.NP)
	parallel(o.NP, func(r int) {
		n, _ := s.Node(job.Ranks[r].Node)
		spec := proc.Spec{
			Path: path, Args: o.Argv,
			Env:   RankEnv(os.Environ(), &job, r, o.NP, s.Dir, DaemonAddr(s, n), o.Preload),
			Dir:   cwd,
			Netns: netnsPath(n), Cgroup: n.JobCg, Hostname: nodeHostname(n),
			Stdin: devnull,
		}
		if r == 0 && o.Stdin {
			spec.Stdin = os.Stdin
		}
		var writeEnds []*os.File
		defer func() {
			for _, f := range writeEnds {
				f.Close()
			}
		}()
		if o.TagOutput || fileOf(o.Stdout) == nil || fileOf(o.Stderr) == nil {
			for _, w := range []io.Writer{o.Stdout, o.Stderr} {
				pr, pw, err := os.Pipe()
				if err != nil {
					launchErr[r] = err
					return
				}
				writeEnds = append(writeEnds, pw)
				outWG.Add(1)
				if o.TagOutput {
					go tag(r, pr, w)
				} else {
					go func() { defer outWG.Done(); io.Copy(w, pr); pr.Close() }()
				}
			}
			spec.Stdout, spec.Stderr = writeEnds[0], writeEnds[1]
		} else {
			spec.Stdout, spec.Stderr = fileOf(o.Stdout), fileOf(o.Stderr)
		}
		p, err := proc.Launch(spec)
		if err != nil {
			launchErr[r] = fmt.Errorf("rank %d on node %d: %w", r, n.ID, err)
			return
		}
		pending[r] = p
	})
	startErr := errors.Join(launchErr...)
	if startErr == nil {
		startErr = Update(o.Dir, func(st *State) error {
			for i := range st.Jobs {
				if st.Jobs[i].ID == job.ID {
					for r, p := range pending {
						st.Jobs[i].Ranks[r].Proc = p.ID
					}
					return nil
				}
			}
			return errors.New("the job is no longer in the cluster state (cluster down?)")
		})
	}
	if startErr != nil {
		for _, p := range pending {
			if p != nil {
				p.Abort()
			}
		}
		return 0, startErr
	}
	goErr := make([]error, o.NP)
	parallel(o.NP, func(r int) {
		ids[r] = pending[r].ID
		cmd, err := pending[r].Go()
		if err != nil {
			goErr[r] = fmt.Errorf("rank %d on node %d: %w", r, job.Ranks[r].Node, err)
			return
		}
		cmds[r] = cmd
	})
	startErr = errors.Join(goErr...)
	started := 0
	for r, cmd := range cmds {
		if cmd == nil {
			continue
		}
		started++
		go func() {
			err := cmd.Wait()
			exits <- rankExit{rank: r, err: err, ps: cmd.ProcessState}
		}()
	}
	if startErr != nil && started == 0 {
		return 0, startErr
	}

	code := 0
	failed := false
	var stopTimer <-chan time.Time
	interrupted := false
	stopping := func(sig syscall.Signal) {
		stopAll(sig)
		if stopTimer == nil {
			stopTimer = time.After(o.Grace)
		}
	}
	if startErr != nil {
		logf("radic run: %v; stopping the job", startErr)
		failed, code = true, 1
		stopping(syscall.SIGTERM)
	}
	for left := started; left > 0; {
		select {
		case e := <-exits:
			left--
			cmds[e.rank] = nil
			c := exitCode(e.ps)
			if c != 0 && !failed && !interrupted {
				failed, code = true, c
				logf("radic run: rank %d (node %d, pid %d) %s; stopping the job", e.rank, job.Ranks[e.rank].Node, ids[e.rank].Pid, describe(e.ps))
				stopping(syscall.SIGTERM)
			}
		case sig := <-sigs:
			if interrupted {
				logf("radic run: %v again: killing the job", sig)
				stopAll(syscall.SIGKILL)
				continue
			}
			interrupted = true
			if !failed {
				code = 128 + int(sig.(syscall.Signal))
			}
			logf("radic run: %v: stopping job %s (SIGTERM, SIGKILL after %v)", sig, job.ID, o.Grace)
			stopping(syscall.SIGTERM)
		case <-stopTimer:
			stopAll(syscall.SIGKILL)
		}
	}
	// Let the output drain, but do not hang on a rank's orphaned child that
	// keeps a pipe open.
	done := make(chan struct{})
	go func() { outWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
	return code, nil
}

// parallel runs fn(0..n-1) on a few goroutines at a time.
func parallel(n int, fn func(i int)) {
	const width = 8
	var wg sync.WaitGroup
	sem := make(chan struct{}, width)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fn(i)
		}()
	}
	wg.Wait()
}

func exitCode(ps *os.ProcessState) int {
	if ps == nil {
		return 1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

func describe(ps *os.ProcessState) string {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("was killed by signal %d (%v)", int(ws.Signal()), ws.Signal())
	}
	return fmt.Sprintf("exited with status %d", ps.ExitCode())
}
