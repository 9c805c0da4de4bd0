package shim_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

// mpiImpl is one MPI library: how to build a job command line for it.
type mpiImpl struct {
	name     string // ompi or mpich: build/mpi/NAME-prog
	launcher string
	env      []string
}

var (
	openMPI = mpiImpl{"ompi", "mpirun", []string{
		"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "HWLOC_COMPONENTS=-gl",
	}}
	mpich = mpiImpl{"mpich", "mpiexec.mpich", []string{"UCX_TLS=tcp,self"}}
)

// job returns the environment and argv of an n-rank job of program prog
// with args. With lib set, the launcher runs under the preload and passes
// it to every rank.
func (m mpiImpl) job(t testing.TB, lib string, n int, prog string, args ...string) (env, argv []string) {
	t.Helper()
	bin := testenv.Artifact(t, filepath.Join("build", "mpi", m.name+"-"+prog))
	env = append(env, m.env...)
	if lib != "" {
		env = append(env, preloadEnv(lib))
	}
	switch m.name {
	case "ompi":
		argv = []string{m.launcher, "--oversubscribe", "--mca", "btl", "tcp,self", "--mca", "pml", "ob1", "-np", strconv.Itoa(n)}
		if lib != "" {
			argv = append(argv, "-x", "LD_PRELOAD")
		}
	default:
		argv = []string{m.launcher, "-n", strconv.Itoa(n)}
		if lib != "" {
			argv = append(argv, "-genv", "LD_PRELOAD", lib)
		}
	}
	return env, append(append(argv, bin), args...)
}

// mpichFourRanksHangs: MPICH 4.0.2 over UCX 1.13.1 with UCX_TLS=tcp,self
// hangs in MPI_Finalize in about a third of 4-rank runs on this 2-core VM
// *without* the preload (rank 0 spins in ucp_worker_progress flushing an
// endpoint while the other ranks wait in the PMI barrier). A test that
// required 10 clean runs would fail for MPICH's sake, not radic's.
// RADIC_TEST_MPICH4=1 runs it anyway.
const mpichFourRanksHangs = "MPICH 4.0.2/UCX 1.13.1 tcp: 4-rank jobs hang in MPI_Finalize in ~1/3 of runs even without the preload (rank 0 spins in ucp_worker_progress, the others wait in the PMI barrier); set RADIC_TEST_MPICH4=1 to run it anyway"

// ucxFinalizeHangWhat: the same bug hangs 2-rank jobs too, rarely: 1 of 40
// bare runs on this VM (and 1 of 10 preloaded in a CI run).
const ucxFinalizeHangWhat = "MPICH/UCX hung in MPI_Finalize after a correct run (rank stacks: PMPI_Finalize, one in ucp_worker_progress), the UCX TCP teardown bug that hangs bare jobs too (openucx/ucx#8738)"

// maxUpstreamHangs bounds how many such hangs a test tolerates: at the
// bare rate (~2.5%) three or more in one test come about once in 500.
const maxUpstreamHangs = 2

// ucxFinalizeHang reports whether a hung MPICH job's stacks are those of
// the UCX teardown bug: every rank inside MPI_Finalize, one of them
// progressing a UCX worker. (The shim's pass-through wrappers are on such
// stacks too, read() among them: they do not tell.)
func ucxFinalizeHang(stacks map[string]string) bool {
	ranks, progressing := 0, false
	for name, bt := range stacks {
		if !strings.HasPrefix(name, "mpich-") {
			continue // the launcher and its proxies
		}
		ranks++
		if !strings.Contains(bt, "MPI_Finalize") { // PMPI_Finalize, or its MPI_ alias
			return false
		}
		progressing = progressing || strings.Contains(bt, "ucp_worker_progress")
	}
	return ranks > 0 && progressing
}

func formatStacks(stacks map[string]string) string {
	var b strings.Builder
	for name, bt := range stacks {
		fmt.Fprintf(&b, "--- %s\n%s\n", name, tail(bt, 4000))
	}
	return b.String()
}

// mpiRuns is how many preloaded runs each job gets; mpiTimeout bounds each.
const (
	mpiRuns    = 10
	mpiTimeout = 60 * time.Second
	mpiIters   = "10"
)

// TestMPI runs Open MPI (btl tcp, pml ob1) and MPICH (UCX tcp) jobs of 2 and
// 4 ranks, launcher and ranks preloaded: a checked ping-pong and a checked
// allreduce (test/mpi/mpicheck.c), 10 runs each, every run bounded by a
// timeout, every run's output the same as the bare run's.
func TestMPI(t *testing.T) {
	lib := shimLib(t)
	for _, m := range []mpiImpl{openMPI, mpich} {
		for _, n := range []int{2, 4} {
			t.Run(fmt.Sprintf("%s-%d", m.name, n), func(t *testing.T) {
				testenv.RequireCommand(t, m.launcher)
				if m.name == "mpich" && n == 4 && os.Getenv("RADIC_TEST_MPICH4") == "" {
					t.Skip(mpichFourRanksHangs)
				}
				// A run that hits MPICH's own hang in MPI_Finalize
				// is done again, but only a few times in all (a shim
				// that made that hang frequent still fails here).
				upstream := 0
				runMPI := func(what string, env, argv []string) result {
					for {
						r := run(t, mpiTimeout, env, argv...)
						if m.name != "mpich" || !r.timedOut || !strings.Contains(r.stdout, "mpicheck: all checks passed") || !ucxFinalizeHang(r.stacks) {
							return r
						}
						upstream++
						t.Logf("%s: %s (%d so far)", what, ucxFinalizeHangWhat, upstream)
						if upstream > maxUpstreamHangs {
							t.Fatalf("%d runs hung in MPI_Finalize, more than the %d that MPICH's own rate explains:\n%v", upstream, maxUpstreamHangs, r)
						}
					}
				}
				env, argv := m.job(t, "", n, "mpicheck", mpiIters)
				bare := runMPI("bare run", env, argv)
				if !bare.ok() {
					t.Fatalf("bare job failed (MPI or the machine, not the shim):\n%v\n%s", bare, formatStacks(bare.stacks))
				}
				env, argv = m.job(t, lib, n, "mpicheck", mpiIters)
				var total time.Duration
				for i := 0; i < mpiRuns; i++ {
					pre := runMPI(fmt.Sprintf("preloaded run %d", i+1), env, argv)
					total += pre.dur
					if !pre.ok() {
						t.Fatalf("preloaded run %d of %d failed:\n%v\n%s", i+1, mpiRuns, pre, formatStacks(pre.stacks))
					}
					if pre.stdout != bare.stdout {
						t.Fatalf("preloaded run %d of %d: output differs from the bare run:\n%s",
							i+1, mpiRuns, diffLines(bare.stdout, pre.stdout))
					}
				}
				t.Logf("%d preloaded runs passed; bare %v, preloaded mean %v", mpiRuns,
					bare.dur.Round(time.Millisecond), (total / mpiRuns).Round(time.Millisecond))

				// Once more in the shim's managed test mode: the output
				// must not change, and Go must have been handed the
				// ranks' TCP traffic (proof that the job really ran
				// over sockets through the trampolines).
				counts := filepath.Join(t.TempDir(), "counts")
				menv := append(env, "RADIC_TEST_MANAGE=1", "RADIC_TEST_COUNTS="+counts)
				if m.name == "ompi" {
					argv = append(argv[:1], append([]string{"-x", "RADIC_TEST_MANAGE", "-x", "RADIC_TEST_COUNTS"}, argv[1:]...)...)
				} else {
					argv = append(argv[:1], append([]string{"-genv", "RADIC_TEST_MANAGE", "1", "-genv", "RADIC_TEST_COUNTS", counts}, argv[1:]...)...)
				}
				pre := runMPI("managed-mode run", menv, argv)
				if !pre.ok() || pre.stdout != bare.stdout {
					t.Fatalf("managed-mode run failed or differs:\n%v\n%s\n%s", pre, diffLines(bare.stdout, pre.stdout), formatStacks(pre.stacks))
				}
				c := readCounts(t, counts)
				in, out := c["read"]+c["readv"]+c["recv"]+c["recvfrom"]+c["recvmsg"],
					c["write"]+c["writev"]+c["send"]+c["sendto"]+c["sendmsg"]
				t.Logf("managed mode: Go saw %d receive and %d send calls on TCP sockets (%v)", in, out, c)
				if in == 0 || out == 0 {
					t.Fatalf("managed mode: Go saw no TCP data calls (%v): the job did not run over the trampolines", c)
				}
			})
		}
	}
}
