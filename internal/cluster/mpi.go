package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/internal/cluster/proc"
)

// MPI launchers `radic mpirun` and `radic mpiexec` know.
const (
	OpenMPI = "openmpi" // mpirun (orterun): orted per node, started over the rsh agent
	MPICH   = "mpich"   // mpiexec.hydra: hydra_pmi_proxy per node, started over "ssh"
)

// MPIOptions are the settings of `radic mpirun` / `radic mpiexec`.
type MPIOptions struct {
	Dir      string   // state directory
	Kind     string   // OpenMPI or MPICH
	Launcher string   // the launcher program (default mpirun / mpiexec.mpich)
	Args     []string // the launcher's own arguments, as the user gave them
	Nodes    []int    // nodes of the hostfile (nil = every live compute node); the launcher runs on the first
	PerNode  int      // slots per node in the hostfile (default 1)
	Preload  string   // libradic.so ("" = bare: no preload, no job)
	Radic    string   // this radic binary (the rsh agent is `RADIC exec-on`)
	Logf     func(format string, args ...any)
	// Env is the launcher's environment before radic's additions (nil =
	// os.Environ()).
	Env []string
}

// MPICommand is what RunMPI runs: the launcher, its argv and its
// environment, on the node Node, with the hostfile and agent written
// under Tmp (removed by the caller).
type MPICommand struct {
	Node  *Node
	Nodes []int // the hostfile's nodes
	Path  string
	Argv  []string
	Env   []string
	Tmp   string
}

// BuildMPI prepares the launcher's command line: the hostfile naming the
// nodes, the rsh agent (`radic exec-on`), the nodes' interface, TCP-only
// transports, and, under radic, the preload and the job's RADIC_*
// variables, which every process the launcher starts inherits (through
// `radic exec-on`, which sets RADIC_NODE and RADIC_DAEMON for its node).
// job is the job id ("" = bare).
func BuildMPI(s *State, o MPIOptions, job string) (*MPICommand, error) {
	nodes := o.Nodes
	if nodes == nil {
		nodes = s.Workers()
	}
	if len(nodes) == 0 {
		return nil, errors.New("no node to run on")
	}
	per := o.PerNode
	if per <= 0 {
		per = 1
	}
	var names []string
	for _, id := range nodes {
		n, err := s.Node(id)
		if err != nil {
			return nil, err
		}
		if n.Dead {
			return nil, fmt.Errorf("node %d is dead (kill-node); choose others with --nodes", id)
		}
		if n.Frozen {
			return nil, fmt.Errorf("node %d is frozen; heal it or choose others with --nodes", id)
		}
		names = append(names, n.Name)
	}
	first, _ := s.Node(nodes[0])
	tmp, err := os.MkdirTemp("", "radic-mpi-")
	if err != nil {
		return nil, err
	}
	c := &MPICommand{Node: first, Nodes: nodes, Tmp: tmp}
	iface := NodeIface(s)
	hostfile := filepath.Join(tmp, "hostfile")
	var hf strings.Builder
	for _, name := range names {
		if o.Kind == OpenMPI {
			fmt.Fprintf(&hf, "%s slots=%d\n", name, per)
		} else {
			fmt.Fprintf(&hf, "%s:%d\n", name, per)
		}
	}
	if err := os.WriteFile(hostfile, []byte(hf.String()), 0o644); err != nil {
		return nil, err
	}
	env := o.Env
	if env == nil {
		env = os.Environ()
	}
	env = filterEnv(env, "RADIC_RANK", "RADIC_SIZE", "RADIC_NODE", "RADIC_PEERS", "RADIC_JOB",
		"RADIC_STATE_DIR", "RADIC_DAEMON", "RADIC_LPID", "NOTIFY_SOCKET", "LD_PRELOAD")
	launcher := o.Launcher
	switch o.Kind {
	case OpenMPI:
		if launcher == "" {
			launcher = "mpirun"
		}
		c.Argv = []string{launcher,
			"--hostfile", hostfile,
			"--mca", "plm_rsh_agent", o.Radic + " exec-on",
			"--mca", "btl", "tcp,self", "--mca", "pml", "ob1",
			"--mca", "btl_tcp_if_include", iface, "--mca", "oob_tcp_if_include", iface}
		if os.Geteuid() == 0 {
			env = append(env, "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
		}
		// hwloc's X11 probe: ~60 refused connects per process.
		env = append(env, "HWLOC_COMPONENTS=-gl")
	case MPICH:
		if launcher == "" {
			launcher = "mpiexec.mpich"
		}
		// hydra's -launcher-exec takes one executable.
		agent := filepath.Join(tmp, "exec-on")
		script := "#!/bin/sh\nexec " + shellQuote(o.Radic) + " exec-on \"$@\"\n"
		if err := os.WriteFile(agent, []byte(script), 0o755); err != nil {
			return nil, err
		}
		c.Argv = []string{launcher,
			"-f", hostfile,
			"-launcher", "ssh", "-launcher-exec", agent,
			"-iface", iface,
			// hydra would give every rank mpiexec's environment, and
			// with it the first node's RADIC_NODE: the ranks inherit
			// their proxy's instead, which exec-on set for its node.
			"-genvnone"}
		env = append(env, "UCX_TLS=tcp,self", "UCX_NET_DEVICES="+iface, "HWLOC_COMPONENTS=-gl")
	default:
		return nil, fmt.Errorf("unknown MPI %q", o.Kind)
	}
	c.Argv = append(c.Argv, o.Args...)
	if job != "" {
		env = append(env,
			"RADIC_JOB="+job,
			"RADIC_RANK=0",
			"RADIC_SIZE=1",
			"RADIC_NODE="+strconv.Itoa(first.ID),
			"LD_PRELOAD="+o.Preload)
		// orterun and orted catch SIGURG (and forward it to the job): the
		// shim's Go runtime must not preempt with it.
		env = appendGodebug(env, "asyncpreemptoff=1")
		if d := DaemonAddr(s, first); d != "" {
			env = append(env, "RADIC_DAEMON="+d)
		}
	}
	// exec-on finds the cluster through it, bare or not.
	c.Env = append(env, "RADIC_STATE_DIR="+s.Dir)
	return c, nil
}

// appendGodebug adds setting to GODEBUG in env.
func appendGodebug(env []string, setting string) []string {
	for i, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			if v != "" {
				setting = v + "," + setting
			}
			env = append(env[:i:i], env[i+1:]...)
			break
		}
	}
	return append(env, "GODEBUG="+setting)
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// RunMPI runs an MPI launcher on the first of the job's nodes (its own
// host name, network namespace and job cgroup) and returns its exit
// status. Under radic the job is recorded in the cluster state with the
// launcher as its rank 0 (so `cluster down` and `fault kill-rank 0` reach
// it); SIGINT, SIGTERM and SIGHUP are forwarded to the launcher, which
// stops its job as it does under ssh.
func RunMPI(o MPIOptions) (int, error) {
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	var job Job
	var c *MPICommand
	err := Update(o.Dir, func(st *State) error {
		if st.Phase != "up" {
			return fmt.Errorf("cluster %s is %s, not up", st.Name, st.Phase)
		}
		if st.Mode != ModeNetns {
			return fmt.Errorf("cluster %s is in %s mode: MPI jobs need a node per network namespace (netns mode, as root)", st.Name, st.Mode)
		}
		st.pruneJobs()
		id := ""
		if o.Preload != "" {
			seq := st.NextJob
			st.NextJob++
			id = fmt.Sprintf("%s-%d", st.Name, seq)
		}
		var err error
		if c, err = BuildMPI(st, o, id); err != nil {
			return err
		}
		if id != "" {
			job = Job{ID: id, Launcher: proc.Of(os.Getpid()), Started: time.Now().UTC(), Argv: c.Argv,
				Ranks: []Rank{{Rank: 0, Node: c.Node.ID}}}
			st.Jobs = append(st.Jobs, job)
		}
		return nil
	})
	if c != nil {
		defer os.RemoveAll(c.Tmp)
	}
	if err != nil {
		return 0, err
	}
	if job.ID != "" {
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
	}
	s, err := Load(o.Dir)
	if err != nil {
		return 0, err
	}
	cwd, _ := os.Getwd()
	path, err := exec.LookPath(c.Argv[0])
	if err != nil {
		return 0, err
	}
	if path, err = filepath.Abs(path); err != nil {
		return 0, err
	}
	cmd, err := proc.Start(proc.Spec{
		Path: path, Args: c.Argv, Env: c.Env, Dir: cwd,
		Netns: netnsPath(c.Node), Cgroup: c.Node.JobCg, Hostname: c.Node.Name,
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
	}, func(id proc.ID) error {
		if job.ID == "" {
			return nil
		}
		return Update(s.Dir, func(st *State) error {
			for i := range st.Jobs {
				if st.Jobs[i].ID == job.ID {
					st.Jobs[i].Ranks[0].Proc = id
					return nil
				}
			}
			return errors.New("the job is no longer in the cluster state (cluster down?)")
		})
	})
	if err != nil {
		return 0, err
	}
	done := make(chan struct{})
	if job.ID != "" {
		go watchNodeLoss(done, c.Node.MetricsAddr, c.Nodes, filepath.Base(c.Argv[0]), logf)
	}
	go func() {
		for {
			select {
			case sig := <-sigs:
				logf("radic: %v: passed on to %s (pid %d)", sig, filepath.Base(c.Argv[0]), cmd.Process.Pid)
				_ = cmd.Process.Signal(sig)
			case <-done:
				return
			}
		}
	}()
	_ = cmd.Wait()
	close(done)
	return exitCode(cmd.ProcessState), nil
}

// watchNodeLoss says, once per node, when the ring (asked through the
// launcher's node's radicd) declares a node of the job dead. radic does
// not restart the processes of MPI jobs yet: unless the node comes back
// (a partition heals, a freeze thaws), the safe sockets to it fail after
// RADIC_DEADLINE and the MPI stops the job with its own error, which
// alone would not say why the job waited.
func watchNodeLoss(done <-chan struct{}, statusAddr string, nodes []int, launcher string, logf func(string, ...any)) {
	hc := &http.Client{Timeout: time.Second}
	told := map[int]bool{}
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		var st struct {
			Ring heartbeat.Status `json:"ring"` // radicd.NodeStatus's
		}
		resp, err := hc.Get("http://" + statusAddr + "/status")
		if err != nil {
			continue
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			continue
		}
		for _, m := range st.Ring.Members {
			id := int(m.ID)
			if m.State != "dead" || told[id] || !slices.Contains(nodes, id) {
				continue
			}
			told[id] = true
			why := ""
			if m.Cause != "" {
				why = " (" + m.Cause + ")"
			}
			logf("radic: node %d of the job was declared dead at %s%s; radic does not restart the processes of MPI jobs yet: unless the node comes back within RADIC_DEADLINE (default 60s), the connections to it fail and %s stops the job with its own error",
				id, m.DeclaredAt.Local().Format("15:04:05.000"), why, launcher)
		}
	}
}
