package radicd

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// killCgroup stops every process in the cgroup v2 directory dir: with
// cgroup.kill where the kernel has it (5.14+), else by SIGKILLing
// cgroup.procs until it stays empty. It waits until the cgroup is
// unpopulated, so that when it returns no managed process runs.
func killCgroup(dir string, timeout time.Duration) (killed int, err error) {
	if dir == "" {
		return 0, nil
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
		return 0, fmt.Errorf("job cgroup %s: %w", dir, err)
	}
	pids, _ := readPids(dir)
	killed = len(pids)
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return killed, fmt.Errorf("cgroup.kill %s: %w", dir, err)
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		pids, err := readPids(dir)
		if err != nil {
			return killed, err
		}
		if len(pids) == 0 && !populated(dir) {
			return killed, nil
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return killed, fmt.Errorf("job cgroup %s: %d processes still there after %v", dir, len(pids), timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// readPids lists the processes of dir and of its descendants.
func readPids(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if p != dir && errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if n, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil {
				pids = append(pids, n)
			}
		}
		return nil
	})
	return pids, err
}

func populated(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		return false
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if l == "populated 1" {
			return true
		}
	}
	return false
}
