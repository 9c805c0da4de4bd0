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
	bare := []string(nil)
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
	fmt.Fprintf(&t, "\nstart and exit cost of processes that use no socket: medians of %d rounds, each running every variant of a row once, in rotating order (%s)\n", runs, lib)
	fmt.Fprintf(&t, "%-26s %9s %9s %9s %12s %12s %7s %9s %4s\n", "workload", "bare ms", "empty ms", "radic ms",
		"bare ms/proc", "radic ms/pr", "ratio", "goal", "met")
	var floor string
	for _, w := range works {
		d := make([][]float64, len(w.envs))
		for i := 0; i < runs; i++ {
			n, rot := len(w.envs), i/2
			for k := 0; k < n; k++ {
				v := (rot + k) % n // odd rounds: the even one's order, turned around
				if i%2 == 1 {
					v = (rot + n - 1 - k) % n
				}
				r := run(b, 5*time.Minute, w.envs[v], w.argv...)
				if !r.ok() {
					b.Fatalf("%s failed:\n%v", w.name, r)
				}
				d[v] = append(d[v], float64(r.dur.Microseconds())/1000)
			}
		}
		mb, mp := median(d[0]), median(d[len(d)-1])
		emptyCol := "-"
		ratio := mp / mb
		met := "-"
		if w.goal == "<= 1.10" {
			met = "no"
			if ratio <= 1.10 {
				met = "yes"
			}
		}
		if len(d) == 3 {
			me := median(d[1])
			emptyCol = fmt.Sprintf("%.1f", me)
			floor = fmt.Sprintf("%s, same rounds: empty library %.3fx bare, radic %.3fx the empty library (what radic adds to any LD_PRELOAD)\n",
				w.name, me/mb, mp/me)
			b.ReportMetric(me/mb, "empty-preload-ratio")
			b.ReportMetric(mp/me, "over-empty-preload-ratio")
		}
		fmt.Fprintf(&t, "%-26s %9.1f %9s %9.1f %12.3f %12.3f %7.3f %9s %4s\n", w.name, mb, emptyCol, mp,
			mb/float64(w.per), mp/float64(w.per), ratio, w.goal, met)
		b.ReportMetric(ratio, strings.NewReplacer(" ", "-", ":", "", ",", "").Replace(w.name)+"-ratio")
	}
	t.WriteString(floor)
	fmt.Print(t.String())
}
