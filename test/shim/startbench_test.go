package shim_test

import (
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

// BenchmarkStartCost measures what the preload costs a process that never
// uses a socket (issue 9): its start and exit. A shell running /bin/true
// 1000 times and `make -j4` with 400 trivial recipes, bare and preloaded
// (plain LD_PRELOAD: Go is never loaded), against the goal <= 1.10x. An
// empty library preloaded in front of the same loop shows what any
// LD_PRELOAD costs here (the floor); it runs in the same rounds as bare and
// radic, so that the three medians see the same load on the machine. Each
// round runs every variant of a row once, in an order that rotates and
// turns around from round to round. The start of a test-mode process
// (RADIC_TEST_MANAGE=1: the Go control plane is loaded) is shown too,
// without a goal. Timing is reported, never failed on.
func BenchmarkStartCost(b *testing.B) {
	if !testenv.Bench() {
		b.Skip("benchmarks run with `make bench` (RADIC_BENCH=1)")
	}
	lib := shimLib(b)
	runs := benchRuns(b)
	dir := b.TempDir()
	var mk strings.Builder
	mk.WriteString("all:")
	for i := 0; i < 400; i++ {
		fmt.Fprintf(&mk, " t%d", i)
	}
	mk.WriteString("\nt%:\n\t@/bin/true $@\n.PHONY: all\n")
	makefile := filepath.Join(dir, "Makefile")
	if err := os.WriteFile(makefile, []byte(mk.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	// The floor: what any LD_PRELOAD costs, an empty library.
	empty := filepath.Join(dir, "empty.so")
	src := filepath.Join(dir, "empty.c")
	if err := os.WriteFile(src, []byte("int radic_bench_empty;\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	if r := run(b, time.Minute, nil, "cc", "-shared", "-fPIC", "-o", empty, src); !r.ok() {
		b.Fatalf("building an empty preload library:\n%v", r)
	}
	trueLoop := func(n int) []string {
		return []string{"sh", "-c", fmt.Sprintf("i=0; while [ $i -lt %d ]; do /bin/true; i=$((i+1)); done", n)}
	}
	// A row's variants: bare (no environment added) first, radic's last.
	var bare []string
	type work struct {
		name, goal string
		per        int // processes per run, for the per-process figure
		argv       []string
		envs       [][]string // the variants' environments
	}
	works := []work{
		{"sh: /bin/true x1000", "<= 1.10", 1001, trueLoop(1000),
			[][]string{bare, {preloadEnv(empty)}, {preloadEnv(lib)}}},
		{"make -j4, 400 recipes", "<= 1.10", 401, []string{"make", "-s", "-j4", "-f", makefile},
			[][]string{bare, {preloadEnv(lib)}}},
		{"test mode: /bin/true x200", "(report)", 201, trueLoop(200),
			[][]string{bare, {preloadEnv(lib), "RADIC_TEST_MANAGE=1"}}},
	}
	var t strings.Builder
	fmt.Fprintf(&t, "\nstart and exit cost of processes that use no socket: %d rounds, each running every variant of a row once, in rotating order (%s)\n", runs, lib)
	fmt.Fprintf(&t, "medians of the runs' wall time; ratio: the median of the rounds' radic/bare wall-time ratios (goal), cpu: the same for user+sys time\n")
	fmt.Fprintf(&t, "%-26s %9s %9s %9s %12s %12s %7s %7s %9s %4s\n", "workload", "bare ms", "empty ms", "radic ms",
		"bare ms/proc", "radic ms/pr", "ratio", "cpu", "goal", "met")
	var floor string
	for _, w := range works {
		n := len(w.envs)
		wall, cpu := make([][]float64, n), make([][]float64, n)
		for i := 0; i < runs; i++ {
			rot := i / 2
			for k := 0; k < n; k++ {
				v := (rot + k) % n // odd rounds: the even one's order, turned around
				if i%2 == 1 {
					v = (rot + n - 1 - k) % n
				}
				dw, dc, err := timeRun(w.envs[v], w.argv)
				if err != nil {
					b.Fatalf("%s: %v", w.name, err)
				}
				wall[v] = append(wall[v], dw)
				cpu[v] = append(cpu[v], dc)
			}
		}
		last := n - 1
		mb, mp := testenv.Median(wall[0]), testenv.Median(wall[last])
		ratio, cratio := pairedRatio(wall[last], wall[0]), pairedRatio(cpu[last], cpu[0])
		emptyCol := "-"
		met := "-"
		if w.goal == "<= 1.10" {
			met = "no"
			if ratio <= 1.10 {
				met = "yes"
			}
		}
		if n == 3 {
			emptyCol = fmt.Sprintf("%.1f", testenv.Median(wall[1]))
			eb, re := pairedRatio(wall[1], wall[0]), pairedRatio(wall[last], wall[1])
			floor = fmt.Sprintf("%s, per round: the empty library %.3fx bare (cpu %.3fx), radic %.3fx the empty library (cpu %.3fx): what radic adds to any LD_PRELOAD\n",
				w.name, eb, pairedRatio(cpu[1], cpu[0]), re, pairedRatio(cpu[last], cpu[1]))
			b.ReportMetric(eb, "empty-preload-ratio")
			b.ReportMetric(re, "over-empty-preload-ratio")
		}
		fmt.Fprintf(&t, "%-26s %9.1f %9s %9.1f %12.3f %12.3f %7.3f %7.3f %9s %4s\n", w.name, mb, emptyCol, mp,
			mb/float64(w.per), mp/float64(w.per), ratio, cratio, w.goal, met)
		b.ReportMetric(ratio, strings.NewReplacer(" ", "-", ":", "", ",", "").Replace(w.name)+"-ratio")
	}
	t.WriteString(floor)
	fmt.Print(t.String())
}

// timeRun runs argv with the base environment plus env and returns its wall
// time and the user+sys time of the whole process tree (every descendant is
// waited for), in ms. On a machine shared with other work the CPU time moves
// less than the wall time.
func timeRun(env, argv []string) (wall, cpu float64, err error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(baseEnv(), env...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	wall = float64(time.Since(start).Microseconds()) / 1000
	if err != nil {
		return 0, 0, fmt.Errorf("%v: %v\n%s", argv, err, out)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	cpu = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e6
	return wall, cpu, nil
}

// pairedRatio is the median of the rounds' a[i]/b[i]: each round's two runs
// ran next to each other, under the same load.
func pairedRatio(a, b []float64) float64 {
	r := make([]float64, len(a))
	for i := range a {
		r[i] = a[i] / b[i]
	}
	return testenv.Median(r)
}
