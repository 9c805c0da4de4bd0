// Package cgroup drives the few cgroup v2 features the virtual cluster uses:
// creating a directory per node, placing a process in it at clone time,
// freezing it (cgroup.freeze), killing everything in it at once (cgroup.kill)
// and removing it. No controller is enabled, so the "no internal processes"
// rule does not apply and any directory may hold processes.
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Mount returns the mount point of the cgroup v2 hierarchy: /sys/fs/cgroup
// on a pure v2 system, /sys/fs/cgroup/unified on a hybrid one.
func Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("find cgroup2 mount: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - cgroup2 cgroup2 rw
		line := sc.Text()
		sep := strings.Index(line, " - ")
		if sep < 0 {
			continue
		}
		post := strings.Fields(line[sep+3:])
		pre := strings.Fields(line[:sep])
		if len(post) > 0 && post[0] == "cgroup2" && len(pre) > 4 {
			return pre[4], nil
		}
	}
	return "", errors.New("find cgroup2 mount: no cgroup2 file system is mounted")
}

// Create makes dir (and its parents) as cgroups.
func Create(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create cgroup: %w", err)
	}
	return nil
}

// Exists reports whether dir is a cgroup directory.
func Exists(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "cgroup.procs"))
	return err == nil
}

func write(dir, file, val string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(val), 0); err != nil {
		return fmt.Errorf("write %s: %w", file, err)
	}
	return nil
}

// events reads cgroup.events into a map ("populated", "frozen").
func events(dir string) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok {
			m[k] = v
		}
	}
	return m, nil
}

// Populated reports whether any process lives in dir or below.
func Populated(dir string) (bool, error) {
	ev, err := events(dir)
	if err != nil {
		return false, err
	}
	return ev["populated"] == "1", nil
}

// Procs lists the pids directly in dir.
func Procs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// AllProcs lists the pids in dir and every cgroup below it.
func AllProcs(dir string) ([]int, error) {
	var all []int
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		pids, err := Procs(p)
		if err != nil {
			return err
		}
		all = append(all, pids...)
		return nil
	})
	return all, err
}

// wait polls cgroup.events until key has value want, or the timeout.
func wait(dir, key, want string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ev, err := events(dir)
		if err != nil {
			return err
		}
		if ev[key] == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: %s is still %q after %v", dir, key, ev[key], timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Kill sends SIGKILL to every process in dir and below (cgroup.kill) and
// waits until the cgroup is empty.
func Kill(dir string, timeout time.Duration) error {
	if err := write(dir, "cgroup.kill", "1"); err != nil {
		return err
	}
	// A frozen task dies of SIGKILL too, but thaw so that nothing that
	// escaped the kill (a fork in flight) stays stopped.
	if Frozen(dir) {
		_ = Thaw(dir)
	}
	return wait(dir, "populated", "0", timeout)
}

// Freeze stops every process in dir and below and waits until the kernel
// reports the cgroup frozen.
func Freeze(dir string, timeout time.Duration) error {
	if err := write(dir, "cgroup.freeze", "1"); err != nil {
		return err
	}
	return wait(dir, "frozen", "1", timeout)
}

// Thaw resumes a frozen cgroup.
func Thaw(dir string) error { return write(dir, "cgroup.freeze", "0") }

// Frozen reports whether dir is frozen.
func Frozen(dir string) bool {
	ev, err := events(dir)
	return err == nil && ev["frozen"] == "1"
}

// Remove kills what is left in dir, then removes it and every cgroup below
// it, deepest first. A missing dir is not an error.
func Remove(dir string, timeout time.Duration) error {
	if !Exists(dir) {
		return nil
	}
	_ = Thaw(dir)
	if err := Kill(dir, timeout); err != nil {
		return err
	}
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove cgroup: %w", err)
		}
	}
	return nil
}
