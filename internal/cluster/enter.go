package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/radic-project/radic/internal/cluster/proc"
)

// NodeNamed finds a node by what a hostfile or an ssh command line calls
// it: its name (n2), its id (2), or its logical or current address.
func (s *State) NodeNamed(name string) (*Node, error) {
	name = strings.TrimSpace(name)
	if at := strings.LastIndexByte(name, '@'); at >= 0 { // user@host, as ssh takes it
		name = name[at+1:]
	}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		if name == n.Name || name == strconv.Itoa(n.ID) || name == n.LogicalAddr || name == n.Addr {
			return n, nil
		}
	}
	names := make([]string, len(s.Nodes))
	for i, n := range s.Nodes {
		names[i] = n.Name
	}
	return nil, fmt.Errorf("no node %q in cluster %s (nodes: %s)", name, s.Name, strings.Join(names, " "))
}

// NodeEnv is the environment of a process that enters node n from a job
// process elsewhere (an MPI launcher's remote shell): env itself, with
// RADIC_NODE and RADIC_DAEMON those of n when env belongs to a radic job
// (RADIC_JOB set). Outside a job, env is returned as it is.
func NodeEnv(s *State, n *Node, env []string) []string {
	inJob := false
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "RADIC_JOB="); ok && v != "" {
			inJob = true
		}
	}
	if !inJob {
		return env
	}
	out := filterEnv(env, "RADIC_NODE", "RADIC_DAEMON")
	out = append(out, "RADIC_NODE="+strconv.Itoa(n.ID))
	if d := DaemonAddr(s, n); d != "" {
		out = append(out, "RADIC_DAEMON="+d)
	}
	return out
}

// EnterNode moves the calling process into node n, for an exec that
// follows: its job cgroup (so that kill-node, freeze and cluster down
// reach what runs there), its network namespace and a UTS namespace named
// after the node. It locks the calling goroutine to its thread, since
// namespaces are per thread and execve keeps the calling thread's; the
// caller must exec from this goroutine. Every descriptor above 2 is made
// close-on-exec, so nothing of the caller's leaks into the program. In
// loopback mode there is no namespace to enter: only the descriptors and
// the process group are dealt with.
func EnterNode(s *State, n *Node) error {
	runtime.LockOSThread()
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("close-on-exec: %w", err)
	}
	if n.Dead {
		return fmt.Errorf("node %d (%s) is dead (kill-node)", n.ID, n.Name)
	}
	if s.Mode != ModeNetns {
		return nil
	}
	if n.JobCg != "" {
		if err := os.WriteFile(filepath.Join(n.JobCg, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			return fmt.Errorf("join node %s's job cgroup %s: %w", n.Name, n.JobCg, err)
		}
	}
	f, err := os.Open(netnsPath(n))
	if err != nil {
		return fmt.Errorf("enter node %s: %w", n.Name, err)
	}
	defer f.Close()
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter node %s: setns %s: %w", n.Name, netnsPath(n), err)
	}
	return proc.SetHostname(n.Name)
}

// NodeIface is the network interface the nodes talk to each other on,
// as seen from inside a node (eth0 in netns mode, lo in loopback mode).
func NodeIface(s *State) string {
	if s.Mode == ModeNetns {
		return "eth0"
	}
	return "lo"
}
