package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// TreeStacks returns gdb's backtraces of every thread of pid and its
// descendants (at most max processes), by "comm[pid]", so that a stalled
// run says where it stands. Descendants, not the process group: MPI
// launchers put their proxies in groups of their own. Empty without gdb.
func TreeStacks(pid, max int) map[string]string {
	out := map[string]string{}
	gdb, err := exec.LookPath("gdb")
	if err != nil {
		return out
	}
	type proc struct{ comm, ppid string }
	procs := map[string]proc{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parens.
		open, close := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if open < 0 || close < open {
			continue
		}
		if f := strings.Fields(string(b[close+1:])); len(f) >= 2 {
			procs[strings.TrimSpace(string(b[:open]))] = proc{string(b[open+1 : close]), f[1]}
		}
	}
	tree := map[string]bool{strconv.Itoa(pid): true}
	for grew := true; grew; {
		grew = false
		for p, pr := range procs {
			if !tree[p] && tree[pr.ppid] {
				tree[p], grew = true, true
			}
		}
	}
	for p := range tree {
		if len(out) == max {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		bt, _ := exec.CommandContext(ctx, gdb, "-batch", "-nx", "-p", p, "-ex", "thread apply all bt").CombinedOutput()
		cancel()
		out[fmt.Sprintf("%s[%s]", procs[p].comm, p)] = string(bt)
	}
	return out
}
