// Package clustertest holds what the system test suites share to drive a
// virtual cluster through the radic command: running it with a cluster's
// environment, and waiting for a job's ranks to be up.
package clustertest

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/cluster"
)

// Radic runs the radic binary with env (the cluster's RADIC_STATE_DIR and
// the like) and returns its combined output; no run lasts over 2 minutes.
func Radic(radic string, env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, radic, args...)
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Must is Radic that fails the test (or benchmark) when radic fails.
func Must(tb testing.TB, radic string, env []string, args ...string) string {
	tb.Helper()
	out, err := Radic(radic, env, args...)
	if err != nil {
		tb.Fatalf("radic %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// WaitRanks waits until the newest job recorded in the cluster state dir
// has n running ranks, and returns it.
func WaitRanks(tb testing.TB, dir string, n int) cluster.Job {
	tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		s, err := cluster.Load(dir)
		if err == nil && len(s.Jobs) > 0 {
			j := s.Jobs[len(s.Jobs)-1]
			alive := 0
			for _, r := range j.Ranks {
				if r.Proc.Alive() {
					alive++
				}
			}
			if alive == n {
				return j
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.Fatalf("no job with %d running ranks after 15 s", n)
	return cluster.Job{}
}
