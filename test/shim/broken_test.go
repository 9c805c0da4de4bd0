package shim_test

import (
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

// TestBrokenShimIsCaught runs the data-transfer programs, and one MPI job,
// under lib/libradic-broken.so, whose read/recv trampolines drop a byte of
// TCP data now and then (every 97th read, see shim/core.c). Each must fail
// — a wrong byte, a short message, a timeout — which shows that the checks
// the other tests rely on see lost data.
func TestBrokenShimIsCaught(t *testing.T) {
	broken := testenv.Artifact(t, "lib/libradic-broken.so")
	env := []string{preloadEnv(broken)}
	for _, p := range []struct {
		name string
		args []string
	}{
		{"sockio", nil}, {"fortify", nil}, {"waiting", nil}, {"closeall", nil},
		{"stress", nil}, {"forksig", nil}, {"procs", nil}, {"pingpong", []string{"2000", "50"}},
	} {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			argv := append([]string{prog(t, p.name)}, p.args...)
			bare := run(t, time.Minute, nil, argv...)
			if !bare.ok() {
				t.Fatalf("bare run failed:\n%v", bare)
			}
			r := run(t, 30*time.Second, env, argv...)
			switch {
			case r.timedOut:
				t.Logf("caught: hung until killed (%v)", r.dur.Round(time.Millisecond))
			case r.code != 0:
				t.Logf("caught: exit %d: %s", r.code, tail(r.stderr, 300))
			case p.name != "pingpong" && r.stdout != bare.stdout:
				t.Logf("caught: output differs:\n%s", diffLines(bare.stdout, r.stdout))
			default:
				t.Fatalf("%s passed under the broken shim: its checks do not see dropped bytes\n%v", p.name, r)
			}
		})
	}
	t.Run("mpi", func(t *testing.T) {
		t.Parallel()
		testenv.RequireCommand(t, openMPI.launcher)
		e, argv := openMPI.job(t, "", 2, "mpicheck", mpiIters)
		bare := run(t, mpiTimeout, e, argv...)
		if !bare.ok() {
			t.Fatalf("bare job failed:\n%v", bare)
		}
		e, argv = openMPI.job(t, broken, 2, "mpicheck", mpiIters)
		r := run(t, 20*time.Second, e, argv...)
		switch {
		case r.timedOut:
			t.Logf("caught: the job hung until killed (bare took %v)", bare.dur.Round(time.Millisecond))
		case r.code != 0:
			t.Logf("caught: exit %d: %s", r.code, tail(r.stderr, 300))
		case r.stdout != bare.stdout:
			t.Logf("caught: output differs:\n%s", diffLines(bare.stdout, r.stdout))
		default:
			t.Fatalf("the MPI job passed under the broken shim\n%v", r)
		}
	})
}
