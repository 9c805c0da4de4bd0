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
// (plain LD_PRELOAD: Go is never loaded), alternating, medians of the
// runs, against the goal <= 1.10x. An empty library preloaded in front of
// the same loop shows what any LD_PRELOAD costs here. The start of a test-mode process
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
	type work struct {
		name, goal string
		per        int // processes per run, for the per-process figure
		argv       []string
		env        []string // the preloaded run's environment
	}
	works := []work{
		{"sh: /bin/true x1000", "<= 1.10", 1001, trueLoop(1000), []string{preloadEnv(lib)}},
		{"empty preload: x1000", "(floor)", 1001, trueLoop(1000), []string{preloadEnv(empty)}},
		{"make -j4, 400 recipes", "<= 1.10", 401, []string{"make", "-s", "-j4", "-f", makefile}, []string{preloadEnv(lib)}},
		{"test mode: /bin/true x200", "(report)", 201, trueLoop(200), []string{preloadEnv(lib), "RADIC_TEST_MANAGE=1"}},
	}
	preloaded := map[string]float64{} // median preloaded run, by workload
	var t strings.Builder
	fmt.Fprintf(&t, "\nstart and exit cost of processes that use no socket: medians of %d bare and %d preloaded runs, alternating (%s)\n", runs, runs, lib)
	fmt.Fprintf(&t, "%-26s %10s %10s %12s %12s %7s %9s %4s\n", "workload", "bare ms", "preload ms", "bare ms/proc", "pre ms/proc", "ratio", "goal", "met")
	for _, w := range works {
		var d [2][]float64
		for i := 0; i < 2*runs; i++ {
			which := i % 2
			if (i/2)%2 == 1 {
				which = 1 - which
			}
			var env []string
			if which == 1 {
				env = w.env
			}
			r := run(b, 5*time.Minute, env, w.argv...)
			if !r.ok() {
				b.Fatalf("%s failed:\n%v", w.name, r)
			}
			d[which] = append(d[which], float64(r.dur.Microseconds())/1000)
		}
		mb, mp := median(d[0]), median(d[1])
		preloaded[w.name] = mp
		ratio := mp / mb
		met := "-"
		if w.goal == "<= 1.10" {
			met = "no"
			if ratio <= 1.10 {
				met = "yes"
			}
		}
		fmt.Fprintf(&t, "%-26s %10.1f %10.1f %12.3f %12.3f %7.3f %9s %4s\n", w.name, mb, mp,
			mb/float64(w.per), mp/float64(w.per), ratio, w.goal, met)
		b.ReportMetric(ratio, strings.NewReplacer(" ", "-", ":", "", ",", "").Replace(w.name)+"-ratio")
	}
	// Any preload costs the floor's ratio here; what radic itself adds is
	// the preloaded loop against the same loop under the empty library.
	over := preloaded[works[0].name] / preloaded[works[1].name]
	fmt.Fprintf(&t, "%s against %s, both preloaded: %.3fx (what radic adds to any LD_PRELOAD)\n", works[0].name, works[1].name, over)
	b.ReportMetric(over, "over-empty-preload-ratio")
	fmt.Print(t.String())
}
