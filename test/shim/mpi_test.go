package shim_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
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
				env, argv := m.job(t, "", n, "mpicheck", mpiIters)
				bare := run(t, mpiTimeout, env, argv...)
				if !bare.ok() {
					t.Fatalf("bare job failed (MPI or the machine, not the shim):\n%v", bare)
				}
				env, argv = m.job(t, lib, n, "mpicheck", mpiIters)
				var total time.Duration
				for i := 0; i < mpiRuns; i++ {
					pre := run(t, mpiTimeout, env, argv...)
					total += pre.dur
					if !pre.ok() {
						t.Fatalf("preloaded run %d of %d failed:\n%v", i+1, mpiRuns, pre)
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
				pre := run(t, mpiTimeout, menv, argv...)
				if !pre.ok() || pre.stdout != bare.stdout {
					t.Fatalf("managed-mode run failed or differs:\n%v\n%s", pre, diffLines(bare.stdout, pre.stdout))
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
