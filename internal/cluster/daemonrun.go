package cluster

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/radic-project/radic/internal/cluster/proc"
	"github.com/radic-project/radic/internal/jobrun"
	"github.com/radic-project/radic/internal/launch"
)

// runThroughDaemons runs a placed job by asking each node's radicd to
// launch its ranks (package jobrun): radicd owns the processes, so that
// the protector can restart them. The ranks are the same processes as on
// the direct path (RankEnv, the node's netns and job cgroup, cwd,
// LD_PRELOAD), and their pids go into the state before any of them runs,
// for kill-rank and cluster down.
func runThroughDaemons(o RunOptions, s *State, job *Job, path, cwd string, sigs <-chan os.Signal) (int, error) {
	daemons := o.Daemons
	if daemons == nil {
		daemons = stateDaemons(o.Dir)
	}
	merge := !o.TagOutput && sameFile(o.Stdout, o.Stderr)
	recs := make([]launch.Record, o.NP)
	for r := range recs {
		n, err := s.Node(job.Ranks[r].Node)
		if err != nil {
			return 0, err
		}
		recs[r] = launch.Record{
			Version: launch.Version, Job: job.ID, Rank: r, Size: o.NP, Node: n.ID,
			Path: path, Argv: o.Argv, Cwd: cwd,
			Env:         RankEnv(os.Environ(), job, r, o.NP, s.Dir, DaemonAddr(s, n), o.Preload),
			Stdin:       r == 0 && o.Stdin,
			MergeStderr: merge,
		}
	}
	jo := jobrun.Options{
		Ranks: recs, Daemons: daemons, Alternates: alternates(s), TagOutput: o.TagOutput,
		Stdout: o.Stdout, Stderr: o.Stderr, Grace: o.Grace, Signals: sigs, Logf: o.Logf,
		Created: func(started []launch.Started) error {
			return Update(o.Dir, func(st *State) error {
				for i := range st.Jobs {
					if st.Jobs[i].ID == job.ID {
						for r, p := range started {
							st.Jobs[i].Ranks[r].Proc = proc.ID{Pid: p.Pid, Start: p.Start}
						}
						return nil
					}
				}
				return errors.New("the job is no longer in the cluster state (cluster down?)")
			})
		},
	}
	if o.Stdin {
		jo.Stdin = os.Stdin
	}
	return jobrun.Run(jo)
}

// alternates are the nodes that may take a rank whose node is lost while
// the job launches: the live spares, then the live compute nodes.
func alternates(s *State) []int {
	var spares, workers []int
	for _, n := range s.Nodes {
		switch {
		case n.Dead:
		case n.Spare:
			spares = append(spares, n.ID)
		default:
			workers = append(workers, n.ID)
		}
	}
	return append(spares, workers...)
}

// stateDaemons finds a node's radicd from the cluster state, read again
// on every call: a readdressed node is reached at its new address.
func stateDaemons(dir string) jobrun.Daemons {
	return func(node int) (string, error) {
		s, err := Load(dir)
		if err != nil {
			return "", err
		}
		n, err := s.Node(node)
		if err != nil {
			return "", err
		}
		a := NodeDaemon(s, n)
		if a == "" {
			return "", fmt.Errorf("node %d has no radicd", node)
		}
		return a, nil
	}
}

// NodeDaemon is where a program on this host (radic run, radic status)
// reaches node n's radicd now: in netns mode at the node's current
// address (radicd binds the wildcard address and follows a readdress), in
// loopback mode at the address it was started on (a readdress is only
// recorded there). It is empty without daemons.
func NodeDaemon(s *State, n *Node) string {
	if !s.Daemons || n.RadicdAddr == "" {
		return ""
	}
	if s.Mode != ModeNetns {
		return n.RadicdAddr
	}
	_, port, err := net.SplitHostPort(n.RadicdAddr)
	if err != nil {
		return n.RadicdAddr
	}
	return net.JoinHostPort(n.Addr, port)
}

// sameFile reports whether a and b are one open file (one terminal, one
// pipe): a rank's stdout and stderr then share its pipe, in order.
func sameFile(a, b any) bool {
	fa, ok1 := a.(*os.File)
	fb, ok2 := b.(*os.File)
	if !ok1 || !ok2 || fa == nil || fb == nil {
		return false
	}
	var sa, sb syscall.Stat_t
	if syscall.Fstat(int(fa.Fd()), &sa) != nil || syscall.Fstat(int(fb.Fd()), &sb) != nil {
		return false
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}
