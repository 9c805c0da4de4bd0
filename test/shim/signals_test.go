package shim_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

// Issue 9: the preload must not change how a program's signals and first
// fds behave. Go's threads (test mode, ranks of a job) must never take a
// signal the program blocked, and Go's init must not take or race for fd
// numbers the program uses. Every case runs bare, preloaded (plain
// LD_PRELOAD: Go is not loaded at all) and preloaded in test mode (Go
// loaded), with enough rounds to see a 1% rate, and must print what the
// bare run prints.

// preloadModes are the two ways a process runs under the library.
func preloadModes(lib string) []struct {
	name string
	env  []string
} {
	return []struct {
		name string
		env  []string
	}{
		{"passthrough", []string{preloadEnv(lib)}},
		{"managed", []string{preloadEnv(lib), "RADIC_TEST_MANAGE=1"}},
	}
}

// sameInModes runs argv bare, then in both preload modes, and fails unless
// every run exits 0 with the bare run's stdout. want, when set, is what
// the bare run must print.
func sameInModes(t *testing.T, timeout time.Duration, want string, env []string, argv ...string) {
	t.Helper()
	lib := shimLib(t)
	bare := run(t, timeout, env, argv...)
	if !bare.ok() || (want != "" && bare.stdout != want) {
		t.Fatalf("bare run failed (the test or the machine is broken, not the shim):\n%v\n%s",
			bare, diffLines(want, bare.stdout))
	}
	for _, m := range preloadModes(lib) {
		t.Run(m.name, func(t *testing.T) {
			checkSame(t, bare, run(t, timeout, append(append([]string{}, env...), m.env...), argv...))
		})
	}
}

// TestSignals runs test/progs/signals.c, one case at a time (see the
// program for what each checks).
func TestSignals(t *testing.T) {
	for _, c := range []struct {
		name   string
		rounds int
	}{
		{"chld-section", 150},
		{"signalfd", 200},
		{"runtime-sigs", 40},
		{"chld-signalfd", 200},
		{"chld-sigwait", 200},
		{"term-sigwait", 200},
		{"timer", 200},
		{"kinds", 100},
		{"sigpipe", 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sameInModes(t, time.Minute, "", nil, prog(t, "signals"), c.name, fmt.Sprint(c.rounds))
		})
	}
}

// startRuns is how many processes a start-time case starts in each mode.
const startRuns = 100

// TestSignalsAtStart covers what happens in a process's first moments, so
// every case starts many processes.
func TestSignalsAtStart(t *testing.T) {
	signals := prog(t, "signals")
	loop := func(body string) string {
		return fmt.Sprintf("i=0; while [ $i -lt %d ]; do %s; i=$((i+1)); done", startRuns, body)
	}
	t.Run("first-fds", func(t *testing.T) {
		t.Parallel()
		want := strings.Repeat("first-fds: first open 3, dup2 onto 3 ok, onto 4 ok, fd 4 is /dev/null\n", startRuns)
		sameInModes(t, time.Minute, want, nil, "sh", "-c", loop(signals+" first-fds"))
	})
	t.Run("bash-subshell-status", func(t *testing.T) {
		t.Parallel()
		bash := testenv.RequireCommand(t, "bash")
		// One bash running 300 subshells, and 100 bash processes.
		script := "for i in $(seq 300); do ( exit 3 ); echo $?; done; " +
			loop(bash+` -c '( exit 3 ); echo $?'`)
		sameInModes(t, time.Minute, strings.Repeat("3\n", 300+startRuns), nil, bash, "-c", script)
	})
	t.Run("timeout-true", func(t *testing.T) {
		t.Parallel()
		testenv.RequireCommand(t, "timeout")
		// timeout(1) waits for SIGCHLD with sigsuspend-like calls: one
		// taken by another thread leaves it waiting the full 3 s.
		script := loop(`s=$(date +%s%N); timeout 3 true; rc=$?; ` +
			`ms=$(( ($(date +%s%N) - s) / 1000000 )); ` +
			`if [ $rc -ne 0 ] || [ $ms -gt 1000 ]; then echo "run $i: exit $rc after $ms ms"; fi`)
		sameInModes(t, 5*time.Minute, "", nil, "bash", "-c", script)
	})
	t.Run("dash-redirect", func(t *testing.T) {
		t.Parallel()
		testenv.RequireCommand(t, "dash")
		// dash runs `cmd > file` as its last command by exec: close(1),
		// dup2(3, 1), close(3) a few hundred microseconds after start.
		f := filepath.Join(t.TempDir(), "out")
		script := loop(`dash -c 'dash -c "echo 1; exit 0" > ` + f + `' 2>/dev/null; ` +
			`[ "$(cat ` + f + `)" = 1 ] || echo "run $i: lost stdout"`)
		sameInModes(t, 2*time.Minute, "", nil, "dash", "-c", script)
	})
	t.Run("python-sigwait-term", func(t *testing.T) {
		t.Parallel()
		py := testenv.RequireCommand(t, "python3")
		src := `import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
os.kill(os.getpid(), signal.SIGTERM)
print("got", signal.Signals(signal.sigwait({signal.SIGTERM})).name)
`
		p := filepath.Join(t.TempDir(), "sigwait.py")
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		n := 15
		script := fmt.Sprintf("i=0; while [ $i -lt %d ]; do %s %s; i=$((i+1)); done", n, py, p)
		sameInModes(t, 2*time.Minute, strings.Repeat("got SIGTERM\n", n), nil, "sh", "-c", script)
	})
	t.Run("low-fd-limit", func(t *testing.T) {
		t.Parallel()
		// A soft (and hard) RLIMIT_NOFILE below 256, then a shell's
		// `exec 3>file`: fd 3 must be the program's, whatever the limit.
		f := filepath.Join(t.TempDir(), "out")
		for _, limit := range []string{"-n 255", "-n 40", "-Sn 100"} {
			t.Run(strings.ReplaceAll(limit, " ", ""), func(t *testing.T) {
				script := fmt.Sprintf(`ulimit %s; exec bash -c 'exec 3>%s && echo hello >&3; exec 3>&-; echo rc=$?; cat %s; ulimit -Sn; ulimit -Hn'`,
					limit, f, f)
				sameInModes(t, time.Minute, "", nil, "bash", "-c", script)
			})
		}
	})
}
