package cluster_test

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/cluster"
	"github.com/radic-project/radic/internal/testenv"
)

var (
	mpiLatRe = regexp.MustCompile(`(?m)^lat_us=([0-9.]+)$`)
	mpiBwRe  = regexp.MustCompile(`(?m)^bw_MBps=([0-9.]+)$`)
)

// BenchmarkMPIAcrossNodes measures what radic costs an MPI job across two
// nodes (no recovery): the Open MPI (btl tcp) and MPICH (UCX tcp)
// ping-pongs of test/mpi/pingpong.c, 8 B latency and 1 MiB bandwidth,
// ranks 0 and 1 on nodes 0 and 1 through `radic mpirun|mpiexec`, bare
// (--no-radic) and under radic alternating, medians of RADIC_BENCH_RUNS
// (default 9) each, against the goals latency <= 1.10x and bandwidth
// >= 0.95x. Timing is reported, never failed on.
func BenchmarkMPIAcrossNodes(b *testing.B) {
	if !testenv.Bench() {
		b.Skip("benchmarks run with `make bench` (RADIC_BENCH=1)")
	}
	testenv.RequireRoot(b)
	runs := 9
	if s := os.Getenv("RADIC_BENCH_RUNS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 3 {
			b.Fatalf("RADIC_BENCH_RUNS=%q: want a number >= 3", s)
		}
		runs = v
	}
	c := newCluster(b, cluster.ModeNetns, 2, 0)
	type row struct {
		system, metric, unit string
		bare, radic, ratio   float64
		goal                 string
		met                  bool
		all                  [2][]float64
	}
	var rows []row
	for _, k := range []mpiKind{ompiKind, mpichKind} {
		if _, err := exec.LookPath(k.launcher); err != nil {
			fmt.Printf("skipping %s: %s is not installed\n", k.name, k.launcher)
			continue
		}
		var lat, bw [2][]float64 // [0] bare, [1] radic
		for i := 0; i < 2*runs; i++ {
			which := i % 2
			if (i/2)%2 == 1 {
				which = 1 - which // alternate who goes first, too
			}
			r := c.runMPI(b, k, mpiOpts{bare: which == 0, nodes: "0,1", np: 2, prog: "pingpong",
				args: []string{"10000", "200"}, timeout: 3 * time.Minute, quiet: true, success: "bw_MBps="})
			if !r.ok() {
				b.Fatalf("%v", r)
			}
			l, w := mpiLatRe.FindStringSubmatch(r.out), mpiBwRe.FindStringSubmatch(r.out)
			if l == nil || w == nil {
				b.Fatalf("%s: no lat_us=/bw_MBps= lines:\n%v", k.name, r)
			}
			lv, _ := strconv.ParseFloat(l[1], 64)
			wv, _ := strconv.ParseFloat(w[1], 64)
			lat[which] = append(lat[which], lv)
			bw[which] = append(bw[which], wv)
		}
		name := map[string]string{"ompi": "Open MPI btl tcp", "mpich": "MPICH UCX tcp"}[k.name]
		lb, lr := testenv.Median(lat[0]), testenv.Median(lat[1])
		bb, br := testenv.Median(bw[0]), testenv.Median(bw[1])
		rows = append(rows,
			row{name, "8 B latency", "us", lb, lr, lr / lb, "<= 1.10", lr/lb <= 1.10, lat},
			row{name, "1 MiB bandwidth", "MB/s", bb, br, br / bb, ">= 0.95", br/bb >= 0.95, bw})
		b.ReportMetric(lr/lb, k.name+"-lat-ratio")
		b.ReportMetric(br/bb, k.name+"-bw-ratio")
	}
	var t strings.Builder
	fmt.Fprintf(&t, "\nMPI across two netns nodes, bare vs radic (no recovery): medians of %d runs each, alternating\n\n", runs)
	fmt.Fprintf(&t, "| MPI | metric | bare | radic | radic/bare | goal | met |\n|---|---|---:|---:|---:|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&t, "| %s | %s | %.1f %s | %.1f %s | %.2fx | %s | %v |\n", r.system, r.metric, r.bare, r.unit, r.radic, r.unit, r.ratio, r.goal, r.met)
	}
	fmt.Fprintf(&t, "\nevery run, in the order run (bare | radic):\n")
	for _, r := range rows {
		fmt.Fprintf(&t, "%s %s: %v | %v\n", r.system, r.metric, r.all[0], r.all[1])
	}
	fmt.Print(t.String())
}
