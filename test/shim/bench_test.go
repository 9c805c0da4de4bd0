package shim_test

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

// benchRuns is how many bare and how many preloaded runs each row gets
// (alternating); RADIC_BENCH_RUNS overrides it (at least 5).
func benchRuns(b *testing.B) int {
	n := 15
	if s := os.Getenv("RADIC_BENCH_RUNS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 5 {
			b.Fatalf("RADIC_BENCH_RUNS=%q: want a number >= 5", s)
		}
		n = v
	}
	return n
}

var (
	latRe = regexp.MustCompile(`(?m)^lat_us=([0-9.]+)$`)
	bwRe  = regexp.MustCompile(`(?m)^bw_MBps=([0-9.]+)$`)
)

// parsePingPong reads the figures a ping-pong program prints.
func parsePingPong(out string) (lat, bw float64, err error) {
	l, b := latRe.FindStringSubmatch(out), bwRe.FindStringSubmatch(out)
	if l == nil || b == nil {
		return 0, 0, fmt.Errorf("no lat_us=/bw_MBps= lines in %q", tail(out, 300))
	}
	lat, _ = strconv.ParseFloat(l[1], 64)
	bw, _ = strconv.ParseFloat(b[1], 64)
	return lat, bw, nil
}

// benchSystem is one row pair of the table: a way to run a ping-pong
// bare (lib "") or preloaded.
type benchSystem struct {
	name string
	cmd  func(lib string) (env, argv []string)
	skip string
}

// BenchmarkPreloadOverhead measures what the preload costs on the paths it
// must not slow down: a C TCP ping-pong (test/progs/pingpong.c), and Open MPI
// (btl tcp) and MPICH (UCX tcp) ping-pongs (test/mpi/pingpong.c) of 2
// ranks. Bare and preloaded runs alternate; the table shows medians and
// the ratio, against the goals latency <= 1.03x and bandwidth >= 0.97x.
// Timing is reported, never failed on.
func BenchmarkPreloadOverhead(b *testing.B) {
	if !testenv.Bench() {
		b.Skip("benchmarks run with `make bench` (RADIC_BENCH=1)")
	}
	lib := shimLib(b)
	runs := benchRuns(b)
	cprog := prog(b, "pingpong")
	systems := []benchSystem{
		{name: "C TCP loopback", cmd: func(lib string) ([]string, []string) {
			var env []string
			if lib != "" {
				env = []string{preloadEnv(lib)}
			}
			return env, []string{cprog, "20000", "300"}
		}},
	}
	for _, m := range []mpiImpl{openMPI, mpich} {
		s := benchSystem{name: map[string]string{"ompi": "Open MPI btl tcp", "mpich": "MPICH UCX tcp"}[m.name]}
		s.cmd = func(lib string) ([]string, []string) { return m.job(b, lib, 2, "pingpong", "10000", "200") }
		if _, err := execLookPath(m.launcher); err != nil {
			s.skip = m.launcher + " is not installed"
		}
		systems = append(systems, s)
	}

	type row struct {
		system, metric, unit string
		bare, pre, ratio     float64
		goal                 string
		met                  bool
	}
	var rows []row
	for _, s := range systems {
		if s.skip != "" {
			fmt.Printf("skipping %s: %s\n", s.name, s.skip)
			continue
		}
		var lat, bw [2][]float64 // [0] bare, [1] preloaded
		for i := 0; i < 2*runs; i++ {
			which := i % 2
			if (i/2)%2 == 1 {
				which = 1 - which // alternate who goes first, too
			}
			l := ""
			if which == 1 {
				l = lib
			}
			env, argv := s.cmd(l)
			r := run(b, 3*time.Minute, env, argv...)
			if !r.ok() {
				b.Fatalf("%s run failed:\n%v", s.name, r)
			}
			la, bwv, err := parsePingPong(r.stdout)
			if err != nil {
				b.Fatalf("%s: %v", s.name, err)
			}
			lat[which] = append(lat[which], la)
			bw[which] = append(bw[which], bwv)
		}
		lb, lp := testenv.Median(lat[0]), testenv.Median(lat[1])
		bb, bp := testenv.Median(bw[0]), testenv.Median(bw[1])
		rows = append(rows,
			row{s.name, "8 B latency", "us", lb, lp, lp / lb, "<= 1.03", lp/lb <= 1.03},
			row{s.name, "1 MiB bandwidth", "MB/s", bb, bp, bp / bb, ">= 0.97", bp/bb >= 0.97})
		key := strings.NewReplacer(" ", "-").Replace(strings.ToLower(s.name))
		b.ReportMetric(lp/lb, key+"-lat-ratio")
		b.ReportMetric(bp/bb, key+"-bw-ratio")
	}

	var t strings.Builder
	fmt.Fprintf(&t, "\npreload overhead: medians of %d bare and %d preloaded runs, alternating (%s)\n", runs, runs, lib)
	fmt.Fprintf(&t, "%-18s %-16s %14s %14s %7s %8s %4s\n", "system", "metric", "bare", "preload", "ratio", "goal", "met")
	for _, r := range rows {
		met := "no"
		if r.met {
			met = "yes"
		}
		fmt.Fprintf(&t, "%-18s %-16s %9.2f %-4s %7.2f %-4s %7.3f %8s %4s\n", r.system, r.metric,
			r.bare, r.unit, r.pre, r.unit, r.ratio, r.goal, met)
	}
	fmt.Print(t.String())
}
