// Package shim_test is the system suite of the preload library (issue 2):
// real programs — the C programs of test/progs, MPI jobs of test/mpi,
// iperf3, Python, dash and bash — run bare and under LD_PRELOAD, and must
// behave the same. A deliberately broken library must make them fail.
//
// Every test needs `make` (lib/libradic.so, build/progs/*, build/mpi/*);
// TestBrokenShimIsCaught also needs lib/libradic-broken.so (`make test`
// builds both). RADIC_TEST_LIB=path runs the whole suite against another
// library, e.g. RADIC_TEST_LIB=lib/libradic-broken.so to see every test
// notice the fault.
package shim_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

// shimLib is the library under test: lib/libradic.so, or RADIC_TEST_LIB.
func shimLib(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("RADIC_TEST_LIB"); p != "" {
		if !filepath.IsAbs(p) {
			p = filepath.Join(testenv.Root(t), p)
		}
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("RADIC_TEST_LIB: %v", err)
		}
		return p
	}
	return testenv.Lib(t)
}

// prog is the path of a built C test program (build/progs/NAME).
func prog(t testing.TB, name string) string {
	t.Helper()
	return testenv.Artifact(t, filepath.Join("build", "progs", name))
}

// result is what one run of a command did.
type result struct {
	cmd      string
	stdout   string
	stderr   string
	code     int // exit status; -1 when killed by a signal or not started
	timedOut bool
	dur      time.Duration
	stacks   map[string]string // on a timeout: the backtraces of the process tree, by "comm[pid]"
}

func (r result) ok() bool { return r.code == 0 && !r.timedOut }

// String describes the run for failure messages: command, status, the tail
// of stderr.
func (r result) String() string {
	st := fmt.Sprintf("exit %d", r.code)
	if r.timedOut {
		st = "TIMED OUT (killed)"
	}
	return fmt.Sprintf("%s\n  -> %s after %v\n  stderr: %s", r.cmd, st,
		r.dur.Round(time.Millisecond), tail(r.stderr, 1500))
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	if s == "" {
		return "(empty)"
	}
	return s
}

// baseEnv is the test's environment without anything that would put a
// child under radic or in radic's test mode.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "LD_PRELOAD=") || strings.HasPrefix(kv, "RADIC_TEST_MANAGE=") ||
			strings.HasPrefix(kv, "RADIC_TEST_COUNTS=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// preloadEnv is the environment line that puts a process under the library.
func preloadEnv(lib string) string { return "LD_PRELOAD=" + lib }

// run runs argv with the base environment plus env, in a process group of
// its own that is killed as a whole when timeout expires (launchers leave
// children behind otherwise). A run that times out is backtraced before
// it is killed, and the kill waits for the backtraces: with a Context and
// cmd.Cancel, Wait gave up WaitDelay after the deadline while gdb was
// still attached to the ranks (slow with Go's threads in them), so a
// known upstream hang came back with no stacks and was taken for ours.
func run(t testing.TB, timeout time.Duration, env []string, argv ...string) result {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(baseEnv(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second // an orphan that holds the output pipes
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	r := result{cmd: describe(env, argv)}
	start := time.Now()
	err := cmd.Start()
	if err == nil {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		timer := time.NewTimer(timeout)
		select {
		case err = <-done:
			timer.Stop()
		case <-timer.C:
			r.timedOut = true
			r.stacks = testenv.TreeStacks(cmd.Process.Pid, 16)
			// Where the bytes are: queued at a receiver, a sender, or nowhere.
			if ss, serr := exec.Command("ss", "-tnpi").CombinedOutput(); serr == nil {
				r.stacks["(sockets: ss -tnpi)"] = string(ss)
			}
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			err = <-done
		}
	}
	r.dur = time.Since(start)
	r.stdout, r.stderr = so.String(), se.String()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		r.code = -1
		r.stderr += "\n" + err.Error()
	}
	if cmd.Process != nil {
		// Whatever the command left in its group goes too.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	return r
}

// describe is the command line for messages, long arguments (scripts)
// shortened to their first line.
func describe(env, argv []string) string {
	var parts []string
	for _, a := range append(append([]string{}, env...), argv...) {
		if i := strings.IndexByte(a, '\n'); i >= 0 || len(a) > 120 {
			if i < 0 || i > 120 {
				i = 120
			}
			a = fmt.Sprintf("%q...", a[:i])
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

// diffLines shows the first lines where two transcripts differ.
func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	shown := 0
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "  line %d:\n    -bare    %q\n    +preload %q\n", i+1, wl, gl)
			if shown++; shown == 5 {
				b.WriteString("  ...\n")
				break
			}
		}
	}
	return b.String()
}

// sameAsBare runs argv bare and with extra (preload) environment, and
// fails unless both exit 0 and print the same stdout byte for byte.
// It returns the preloaded run.
func sameAsBare(t *testing.T, timeout time.Duration, extra []string, argv ...string) result {
	t.Helper()
	bare := run(t, timeout, nil, argv...)
	if !bare.ok() {
		t.Fatalf("bare run failed (the test program or the machine is broken, not the shim):\n%v", bare)
	}
	pre := run(t, timeout, extra, argv...)
	checkSame(t, bare, pre)
	return pre
}

func checkSame(t *testing.T, bare, pre result) {
	t.Helper()
	if !pre.ok() {
		t.Fatalf("preloaded run failed:\n%v", pre)
	}
	if pre.stdout != bare.stdout {
		t.Fatalf("preloaded output differs from the bare run:\n%v\n%s", pre.cmd, diffLines(bare.stdout, pre.stdout))
	}
}

// execLookPath is exec.LookPath, named for the benchmark's skip check.
var execLookPath = exec.LookPath

// TestRunBacktracesATimeout: a run that times out comes back with the
// backtraces of its process tree, taken before it was killed (the MPI
// tests tell an upstream hang from ours by them).
func TestRunBacktracesATimeout(t *testing.T) {
	testenv.RequireCommand(t, "gdb")
	r := run(t, time.Second, nil, "sh", "-c", "sleep 30; true")
	if !r.timedOut {
		t.Fatalf("sleep 30 with a 1 s timeout: not timed out (%v)", r)
	}
	found := false
	for name, bt := range r.stacks {
		if strings.HasPrefix(name, "sleep[") && strings.Contains(bt, "nanosleep") {
			found = true
		}
	}
	if !found {
		t.Errorf("no backtrace of sleep in nanosleep among %d stacks: %v", len(r.stacks), formatStacks(r.stacks))
	}
}
