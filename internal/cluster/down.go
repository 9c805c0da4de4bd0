package cluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/radic-project/radic/internal/cluster/cgroup"
	"github.com/radic-project/radic/internal/cluster/netns"
	"github.com/radic-project/radic/internal/cluster/nft"
	"github.com/radic-project/radic/internal/cluster/proc"
)

const killTimeout = 5 * time.Second

// Down removes the cluster recorded in dir: it ends its fault timers, its
// processes (radicd and every job's ranks), and removes its nft table,
// links, namespaces, cgroups and node directories. A directory without a
// cluster is not an error (Down is idempotent); ok reports whether there was
// one.
func Down(dir string, logf func(string, ...any)) (ok bool, err error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if _, err := os.Stat(filepath.Join(dir, StateFile)); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	unlock, err := lock(dir)
	if err != nil {
		return false, err
	}
	defer unlock()
	s, err := Load(dir)
	if errors.Is(err, ErrNoCluster) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	s.Dir = dir
	if err := down(s, logf); err != nil {
		_ = save(dir, s)
		return true, err
	}
	removeStateFiles(dir)
	return true, nil
}

// removeStateFiles removes the state directory's own files, and the
// directory if that leaves it empty (it may be the user's).
func removeStateFiles(dir string) {
	for _, f := range []string{StateFile, StateFile + ".tmp", "faults.log", "lock"} {
		os.Remove(filepath.Join(dir, f))
	}
	os.Remove(dir)
}

// down does the work of Down with the lock held. It keeps going after an
// error and leaves in s.Resources what it could not remove.
func down(s *State, logf func(string, ...any)) error {
	var errs []error
	// 1. Fault timers first, so that none fires half-way.
	for i := range s.Faults {
		f := &s.Faults[i]
		if f.Timer != nil && strings.Contains(proc.Cmdline(f.Timer.Pid), "fault-timer") {
			_ = f.Timer.Signal(syscall.SIGKILL, false)
		}
	}
	// 2. Processes. Thaw first so that nothing stays stopped.
	var procs []proc.ID
	for _, r := range s.Resources {
		if r.Kind == ResProc && r.Proc != nil {
			procs = append(procs, *r.Proc)
		}
	}
	for _, j := range s.Jobs {
		for _, r := range j.Ranks {
			if r.Proc.Pid > 0 {
				procs = append(procs, r.Proc)
			}
		}
	}
	killed := 0
	for _, p := range procs {
		if p.Alive() {
			killed++
		}
		_ = p.Signal(syscall.SIGKILL, true)
		_ = p.Signal(syscall.SIGCONT, true)
	}
	if s.Mode == ModeNetns {
		for _, n := range s.Nodes {
			if cgroup.Exists(n.Cgroup) {
				_ = cgroup.Thaw(n.Cgroup)
				if pids, _ := cgroup.AllProcs(n.Cgroup); len(pids) > 0 {
					killed += len(pids)
					if err := cgroup.Kill(n.Cgroup, killTimeout); err != nil {
						errs = append(errs, err)
					}
				}
			}
			// Anything else living in the node's namespace (a shell
			// someone entered with `ip netns exec`) goes too.
			pids, _ := netns.Pids(n.Netns)
			for _, pid := range pids {
				if pid == os.Getpid() {
					continue // never ourselves
				}
				id := proc.Of(pid)
				if id.Alive() {
					killed++
					_ = id.Signal(syscall.SIGKILL, false)
				}
			}
			for _, pid := range pids {
				proc.Of(pid).WaitGone(killTimeout)
			}
		}
	}
	for _, p := range procs {
		if !p.WaitGone(killTimeout) {
			errs = append(errs, fmt.Errorf("process %d did not end after SIGKILL", p.Pid))
		}
	}
	for i := range s.Faults {
		if t := s.Faults[i].Timer; t != nil && strings.Contains(proc.Cmdline(t.Pid), "fault-timer") {
			t.WaitGone(killTimeout)
		}
	}
	s.Faults = nil
	s.Jobs = nil

	// 3. Resources, newest first. Links and namespaces go in one `ip`
	// process first (it carries on past errors); the loop below checks each
	// and retries what is left.
	var batch []string
	counts := map[string]int{}
	for i := len(s.Resources) - 1; i >= 0; i-- {
		r := s.Resources[i]
		switch {
		case r.Kind == ResLink && netns.LinkExists(r.Name):
			batch = append(batch, "link delete "+r.Name)
			counts["links"]++
		case r.Kind == ResNetns && netns.Exists(r.Name):
			batch = append(batch, "netns delete "+r.Name)
			counts["namespaces"]++
		}
	}
	if len(batch) > 0 {
		_ = netns.ForceBatch(batch)
	}
	var left []Resource
	for i := len(s.Resources) - 1; i >= 0; i-- {
		r := s.Resources[i]
		var err error
		switch r.Kind {
		case ResLink:
			err = netns.DeleteLink(r.Name)
		case ResNetns:
			err = netns.Delete(r.Name)
		case ResNft:
			if nft.TableExists(r.Name) {
				counts["nft tables"]++
			}
			err = nft.DeleteTable(r.Name)
		case ResCgroup:
			if cgroup.Exists(r.Name) {
				counts["cgroup trees"]++
			}
			err = cgroup.Remove(r.Name, killTimeout)
			// The shared parent (.../radic) goes when the last
			// cluster does.
			os.Remove(filepath.Dir(r.Name))
		case ResDir:
			err = os.RemoveAll(r.Name)
		case ResProc:
			if r.Proc != nil && r.Proc.Alive() {
				err = fmt.Errorf("%s (pid %d) is still running", r.What, r.Proc.Pid)
			}
		}
		if err != nil {
			errs = append(errs, err)
			left = append([]Resource{r}, left...)
		}
	}
	s.Resources = left
	var parts []string
	for _, k := range []string{"namespaces", "links", "nft tables", "cgroup trees"} {
		if counts[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[k], k))
		}
	}
	if killed > 0 {
		parts = append([]string{fmt.Sprintf("%d processes killed", killed)}, parts...)
	}
	if len(parts) == 0 {
		parts = []string{"nothing was left to remove"}
	}
	logf("cluster %s down: %s", s.Name, strings.Join(parts, ", "))
	return errors.Join(errs...)
}
