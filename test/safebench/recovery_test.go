package safebench_test

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

// jacobiRE: rank 0's time in its iterations (jacobi --verbose, stderr).
var jacobiRE = regexp.MustCompile(`jacobi\[rank 0\]: block .* iterations in ([0-9.]+) s`)

// BenchmarkRecoveryOverhead measures pessimistic logging (`radic run
// --recovery`: every received byte stored on the rank's protector before
// anything that depends on it leaves) against safe sockets without it
// (`--no-recovery`) and bare TCP (`--no-radic`), between two netns nodes
// of a 3-node cluster (radicd as `radic cluster up` runs it: one
// protector, the store fsyncs every append): the 8 B round trip (netbench
// lat, median of the run) and the bandwidth of 1 MiB writes (netbench bw,
// one way). The three kinds run in turn, the order rotating; the table
// shows the medians over the runs and the ratios against the goals (round
// trip <= 3x bare, bandwidth >= 0.5x bare).
//
// RADIC_BENCH_RUNS sets the runs per kind (default 5); RADIC_BENCH_BW_MIB
// the bytes per bandwidth run (default 256 MiB: a run with recovery moves
// them at tens of MB/s).
//
// A third row is build/apps/jacobi, two ranks (node 0 and node 1), the
// workload of `make demo` (256x256, 1-D strips; RADIC_BENCH_JACOBI_ITERS
// iterations, default 12000): the time rank 0 spends in its iterations
// (--verbose), a halo exchange and so one log hold per rank and
// iteration; goal <= 1.10x bare.
func BenchmarkRecoveryOverhead(b *testing.B) {
	requireBench(b)
	runs := testenv.EnvCount(b, "RADIC_BENCH_RUNS", 5, 3)
	bwMiB := testenv.EnvCount(b, "RADIC_BENCH_BW_MIB", 256, 16)
	jIters := testenv.EnvCount(b, "RADIC_BENCH_JACOBI_ITERS", 12000, 100)
	c := newCluster(b)
	jacobi := testenv.Artifact(b, "build/apps/jacobi")
	load := loadAvg()
	const iters = 5000
	latArgs := []string{"lat", "--iters", strconv.Itoa(iters)}
	bwArgs := []string{"bw", "--bytes", strconv.Itoa(bwMiB << 20), "--chunk", strconv.Itoa(bwChunk)}
	jArgs := []string{"--nx", "256", "--ny", "256", "--decomp", "1d", "--iters", strconv.Itoa(jIters), "--verbose"}
	kinds := []string{"bare", "no-recovery", "recovery"}
	flags := [][]string{{"--no-radic"}, {"--no-recovery"}, {"--recovery"}}
	var rtt, bw, jac [3][]float64
	t0 := time.Now()
	for i := 0; i < 3*runs; i++ {
		k := (i + i/3) % 3 // rotate the order every round
		run := append(append([]string{"run", "--np", "2", "--nodes", "0,1", "--tag-output"}, flags[k]...), "--")
		args := append(append([]string(nil), run...), c.prog)
		out := c.runRaw(append(append([]string(nil), args...), latArgs...)...)
		rtt[k] = append(rtt[k], parseFloat(b, latRE, out)[0])
		out = c.runRaw(append(append([]string(nil), args...), bwArgs...)...)
		bw[k] = append(bw[k], parseFloat(b, bwRE, out)[0])
		out = c.runRaw(append(append(append([]string(nil), run...), jacobi), jArgs...)...)
		jac[k] = append(jac[k], parseFloat(b, jacobiRE, out)[0])
	}
	var det strings.Builder
	for k, name := range kinds {
		fmt.Fprintf(&det, "%-11s round trip, median of each run (us): %s\n", name, testenv.Fmts(rtt[k], 1))
		fmt.Fprintf(&det, "%-11s bandwidth of each run (MB/s):        %s\n", name, testenv.Fmts(bw[k], 0))
		fmt.Fprintf(&det, "%-11s Jacobi, rank 0's iterations (s):     %s\n", name, testenv.Fmts(jac[k], 2))
	}
	var t strings.Builder
	fmt.Fprintf(&t, "\n### Pessimistic logging (recovery) vs safe sockets vs bare TCP, node 0 <-> node 1 (netns)\n\n")
	fmt.Fprintf(&t, "Medians of %d runs of each kind, in rotating order; %v in all; load average %s before, %s after.\n\n",
		runs, time.Since(t0).Round(time.Second), load, loadAvg())
	fmt.Fprintf(&t, "| metric | bare TCP | --no-recovery | --recovery | recovery/bare | goal | met |\n|---|---:|---:|---:|---:|---|---|\n")
	lb, ln, lr := testenv.Median(rtt[0]), testenv.Median(rtt[1]), testenv.Median(rtt[2])
	bb, bn, br := testenv.Median(bw[0]), testenv.Median(bw[1]), testenv.Median(bw[2])
	fmt.Fprintf(&t, "| 8 B round trip (median of %d) | %.1f us | %.1f us | %.1f us | %.2f | <= 3 | %s |\n",
		iters, lb, ln, lr, lr/lb, testenv.YesNo(lr/lb <= 3))
	fmt.Fprintf(&t, "| bandwidth, 1 MiB writes, %d MiB one way | %.0f MB/s | %.0f MB/s | %.0f MB/s | %.2f | >= 0.5 | %s |\n",
		bwMiB, bb, bn, br, br/bb, testenv.YesNo(br/bb >= 0.5))
	jb, jn, jr := testenv.Median(jac[0]), testenv.Median(jac[1]), testenv.Median(jac[2])
	fmt.Fprintf(&t, "| Jacobi 256x256 1-D, %d iterations, 2 ranks (s) | %.2f s | %.2f s | %.2f s | %.2f | <= 1.10 | %s |\n",
		jIters, jb, jn, jr, jr/jb, testenv.YesNo(jr/jb <= 1.10))
	fmt.Fprintf(&t, "\nThe runs, in the order run:\n\n```\n%s```\n", det.String())
	fmt.Print(t.String())
	b.ReportMetric(lr/lb, "recovery-rtt-ratio")
	b.ReportMetric(br/bb, "recovery-bw-ratio")
	b.ReportMetric(jr/jb, "recovery-jacobi-ratio")
}
