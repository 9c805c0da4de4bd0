// Package safebench_test holds the benchmarks of safe sockets (issue 4),
// run by `make bench` (RADIC_BENCH=1); without it, or without root and
// network namespaces, they skip and say why.
//
// Each benchmark brings up a two-node netns cluster of its own (its own
// state directory, name and subnet; radicd tolerant of the faults, as in
// test/safesock, so that no cut gets a node fenced), runs
// build/apps/netbench (test/apps/netbench.c) as a two-rank job, rank 0 on
// node 0 and rank 1 on node 1, and removes the cluster in b.Cleanup even
// when it fails.
//
//   - BenchmarkSafeSocketOverhead: managed connections without faults
//     against bare TCP (`radic run --no-radic`), alternating runs: the
//     median 8 B round trip and the 1 MiB-write bandwidth; goals: round
//     trip <= 1.10x, bandwidth >= 0.95x.
//   - BenchmarkSafeSocketHeal: a steady two-way flow, the link of node 1
//     cut for 2 s and healed, 20 times: the time from the heal to data
//     flowing again, median and max; goal: under 100 ms plus the backoff
//     step (see healGoal).
//   - BenchmarkRecoveryOverhead (recovery_test.go): pessimistic logging
//     against safe sockets without it and bare TCP.
//   - BenchmarkRecoveryTimes (recoverytime_test.go): kill-node of a
//     stream's rank, 20 times, and of a sink's receiver (netbench bw), 5
//     times, each on a fresh cluster with a spare and radicd as `radic
//     cluster up --fence-kill` runs it: detection, restart, reconnection
//     and replay times, and the log's fetch and replay rates.
//
// Timing is reported (a markdown table on stdout, the runs in the log),
// never failed on; a run that breaks (a rank fails, a managed run was not
// managed) fails the benchmark.
//
// Settings, from the environment:
//
//	RADIC_BENCH=1                 run at all (`make bench` sets it)
//	RADIC_BENCH_RUNS=N            bare and managed runs per overhead row (default 9, >= 5)
//	RADIC_BENCH_HEAL_TRIALS=N     cuts per heal row (default 20, >= 3)
//	RADIC_BENCH_RECOVERY_TRIALS=N kill-node trials (default 20, >= 3)
package safebench_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/cluster"
	"github.com/radic-project/radic/internal/clustertest"
	"github.com/radic-project/radic/internal/testenv"
)

// requireBench skips b unless benchmarks were asked for and netns
// clusters can be built here.
func requireBench(b *testing.B) {
	b.Helper()
	if !testenv.Bench() {
		b.Skip("benchmarks run with `make bench` (RADIC_BENCH=1)")
	}
	testenv.RequireRoot(b)
	testenv.RequireCommand(b, "ip")
	testenv.RequireCommand(b, "nft")
	name := fmt.Sprintf("rbenchprobe%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		b.Skipf("network namespaces are not available: ip netns add: %v: %s", err, bytes.TrimSpace(out))
	}
	exec.Command("ip", "netns", "del", name).Run()
}

// bc is one benchmark's cluster.
type bc struct {
	b     *testing.B
	dir   string // RADIC_STATE_DIR
	name  string
	radic string
	prog  string // build/apps/netbench
	lib   string // which libradic.so the managed runs preload
	env   []string
	down  sync.Once
}

// newCluster brings up a two-node netns cluster for b, with radicd
// tolerant of link cuts, and removes it when b ends.
func newCluster(b *testing.B) *bc {
	b.Helper()
	// No cut may get a node declared dead or fenced (a node cut off from
	// the ring fences itself after 400 ms by default): these benchmarks
	// are about the connections. Fence timeout: 30 s + 5 s - 2 periods.
	return newClusterWith(b, 0, []string{"--heartbeat-timeout", "30s", "--probe-timeout", "5s"})
}

// newClusterWith brings up a two-node netns cluster with spares spare
// nodes, radicd run with radicdArgs, more arguments to `radic cluster up`;
// it is removed when b ends, or sooner by c.takeDown.
func newClusterWith(b *testing.B, spares int, radicdArgs []string, upArgs ...string) *bc {
	b.Helper()
	c := &bc{b: b, radic: testenv.Artifact(b, "bin/radic"), prog: testenv.Artifact(b, "build/apps/netbench")}
	radicd := testenv.Artifact(b, "bin/radicd")
	// A short directory: radicd's notify socket path must fit in 107 bytes.
	dir, err := os.MkdirTemp("", "rb")
	if err != nil {
		b.Fatal(err)
	}
	c.dir = dir
	c.name = fmt.Sprintf("b%05x", rand.IntN(1<<20))
	b.Cleanup(c.takeDown)
	// Every managed run of the benchmark preloads one and the same
	// library: a copy of lib/libradic.so and of its Go half,
	// lib/libradic-go.so (loaded from beside it), as they are now (a
	// rebuild while the benchmark runs must not mix two versions into one
	// table).
	lib, err := os.ReadFile(testenv.Lib(b))
	if err != nil {
		b.Fatal(err)
	}
	goLib, err := os.ReadFile(testenv.GoLib(b))
	if err != nil {
		b.Fatal(err)
	}
	var libTime time.Time
	if fi, err := os.Stat(testenv.GoLib(b)); err == nil {
		libTime = fi.ModTime()
	}
	libCopy := filepath.Join(dir, "libradic.so")
	if err := os.WriteFile(libCopy, lib, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "libradic-go.so"), goLib, 0o755); err != nil {
		b.Fatal(err)
	}
	sum := sha256.Sum256(append(lib, goLib...))
	c.lib = fmt.Sprintf("lib/libradic.so + libradic-go.so of %s, sha256 %x...", libTime.Format("15:04:05"), sum[:6])
	c.env = append(os.Environ(), "RADIC_STATE_DIR="+dir, "RADIC_LIB="+libCopy)
	b.Logf("managed runs preload a copy of %s", c.lib)
	w := filepath.Join(dir, "radicd-wrapped")
	script := fmt.Sprintf("#!/bin/sh\nexec %s %s \"$@\"\n", radicd, strings.Join(radicdArgs, " "))
	if err := os.WriteFile(w, []byte(script), 0o755); err != nil {
		b.Fatal(err)
	}
	args := append([]string{"cluster", "up", "--mode", cluster.ModeNetns, "--name", c.name, "--nodes", "2", "--spares", strconv.Itoa(spares), "--radicd", w}, upArgs...)
	for try := 0; ; try++ {
		sub := fmt.Sprintf("10.%d.0.0/16", 100+rand.IntN(150))
		out, err := c.radicErr(append(args, "--subnet", sub)...)
		if err == nil {
			b.Logf("cluster up (%s): %s", c.name, lastLine(out))
			return c
		}
		if try < 5 && strings.Contains(out, "overlaps a route") {
			continue
		}
		b.Fatalf("radic cluster up: %v\n%s", err, out)
	}
}

// takeDown removes the cluster (once; b's cleanup calls it too).
func (c *bc) takeDown() {
	c.down.Do(func() {
		if c.b.Failed() {
			c.dumpLogs()
		}
		if out, err := c.radicErr("cluster", "down"); err != nil {
			c.b.Errorf("cleanup: radic cluster down: %v\n%s", err, out)
		}
		os.RemoveAll(c.dir)
	})
}

func lastLine(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[len(l)-1]
}

func (c *bc) dumpLogs() {
	s, err := cluster.Load(c.dir)
	if err != nil {
		c.b.Logf("no cluster state to dump: %v", err)
		return
	}
	j, _ := json.MarshalIndent(s, "", "  ")
	c.b.Logf("cluster state at failure:\n%s", j)
	for _, n := range s.Nodes {
		if out, err := os.ReadFile(filepath.Join(n.StateDir, "radicd.log")); err == nil && len(out) > 0 {
			c.b.Logf("radicd.log of node %d:\n%s", n.ID, tail(string(out), 5000))
		}
	}
	if out, err := os.ReadFile(filepath.Join(c.dir, "faults.log")); err == nil {
		c.b.Logf("faults.log:\n%s", out)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}

func (c *bc) state() *cluster.State {
	c.b.Helper()
	s, err := cluster.Load(c.dir)
	if err != nil {
		c.b.Fatal(err)
	}
	return s
}

// radicErr runs radic and returns its combined output.
func (c *bc) radicErr(args ...string) (string, error) {
	return clustertest.Radic(c.radic, c.env, args...)
}

// must runs radic and fails the benchmark if it fails.
func (c *bc) must(args ...string) string {
	c.b.Helper()
	return clustertest.Must(c.b, c.radic, c.env, args...)
}

// runArgs is `radic run` of netbench ARGS on nodes 0 and 1, bare or not.
// Every run logs at debug level: the shim's lines show that a managed run
// is managed (they are printed at set-up only, never on the data path).
func (c *bc) runArgs(managed bool, args ...string) []string {
	a := []string{"run", "--np", "2", "--nodes", "0,1", "--tag-output"}
	if !managed {
		a = append(a, "--no-radic")
	}
	return append(append(a, "--", c.prog), args...)
}

// runRaw runs radic with args to its end and returns its output.
func (c *bc) runRaw(args ...string) string {
	c.b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.radic, args...)
	cmd.Env = c.env
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.b.Fatalf("radic %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// run runs netbench to its end and returns its output (both ranks, tagged).
func (c *bc) run(managed bool, args ...string) string {
	c.b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.radic, c.runArgs(managed, args...)...)
	cmd.Env = append(append([]string(nil), c.env...), "RADIC_LOG=debug")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.b.Fatalf("radic %s: %v\n%s", strings.Join(c.runArgs(managed, args...), " "), err, out)
	}
	return string(out)
}

var (
	connectedRE = regexp.MustCompile(`\[rank 1\] radic\[\d+\]: connection \S+ \(.*\): connected to `)
	acceptedRE  = regexp.MustCompile(`\[rank 0\] radic\[\d+\]: connection \S+ \(.*\): accepted from `)
	shimLineRE  = regexp.MustCompile(`radic\[\d+\]: `)
)

// checkManaged says what is wrong with a run's output for its kind: a
// managed run must show the shim's "connected to" (rank 1) and "accepted
// from" (rank 0) lines, a bare one no shim line at all.
func checkManaged(out string, managed bool) error {
	if managed {
		if !connectedRE.MatchString(out) || !acceptedRE.MatchString(out) {
			return errors.New(`the managed run's connection was not managed (no shim "connected to"/"accepted from" lines with RADIC_LOG=debug)`)
		}
		return nil
	}
	if shimLineRE.MatchString(out) {
		return errors.New("the bare run has shim lines: libradic.so was preloaded")
	}
	return nil
}

// ---- background jobs ----

// job is a `radic run` in the background.
type job struct {
	b    *testing.B
	cmd  *exec.Cmd
	out  *testenv.Buffer
	done chan struct{}
	err  error
}

// start launches netbench ARGS in the background; the job is stopped when
// b ends, if it has not ended by then.
func (c *bc) start(managed bool, args ...string) *job {
	c.b.Helper()
	return c.startRaw([]string{"RADIC_LOG=debug"}, c.runArgs(managed, args...)...)
}

// startRaw starts radic with args and env added to c's in the background;
// the job is stopped when b ends, if it has not ended by then.
func (c *bc) startRaw(env []string, args ...string) *job {
	c.b.Helper()
	cmd := exec.Command(c.radic, args...)
	cmd.Env = append(append([]string(nil), c.env...), env...)
	cmd.WaitDelay = time.Second // ranks orphaned by a killed radic keep its output pipe
	j := &job{b: c.b, cmd: cmd, out: new(testenv.Buffer), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = j.out, j.out
	if err := cmd.Start(); err != nil {
		c.b.Fatal(err)
	}
	go func() { j.err = cmd.Wait(); close(j.done) }()
	c.b.Cleanup(func() {
		if !j.ended() {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-j.done:
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				<-j.done
			}
		}
		if c.b.Failed() {
			c.b.Logf("output of radic %s (%v):\n%s", strings.Join(args, " "), j.err, tail(j.out.String(), 20000))
		}
	})
	return j
}

func (j *job) ended() bool {
	select {
	case <-j.done:
		return true
	default:
		return false
	}
}

// waitFor waits until cond holds for the job's output; it fails the
// benchmark when the job ends first or after timeout.
func (j *job) waitFor(what string, timeout time.Duration, cond func(out string) bool) {
	j.b.Helper()
	deadline := time.Now().Add(timeout)
	for !cond(j.out.String()) {
		if j.ended() {
			j.b.Fatalf("the job ended (%v) before %s", j.err, what)
		}
		if time.Now().After(deadline) {
			j.b.Fatalf("no %s within %v", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// wait waits for the job's end and fails the benchmark unless it exits 0.
func (j *job) wait(timeout time.Duration) {
	j.b.Helper()
	select {
	case <-j.done:
	case <-time.After(timeout):
		j.b.Fatalf("the job did not end within %v", timeout)
	}
	if j.err != nil {
		j.b.Fatalf("the job failed: %v", j.err)
	}
}

// ---- numbers ----

// unixSecs is t as the seconds since the epoch that netbench prints.
func unixSecs(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// loadAvg is the 1-minute load average (the machine may be busy with more
// than this benchmark), or "?".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}
