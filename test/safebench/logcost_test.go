package safebench_test

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

// BenchmarkLogCost measures the logging designs issue 10 allows before
// the shim gets one (test/apps/logcost.c): a receiver that logs every
// receive synchronously through its node's daemon to a protector
// ("sync"); one that copies each receive into a ring shared with the
// daemon and holds only its next send until the log is stable ("ring");
// the same with the kernel duplicating the bytes (splice and tee, "tee");
// and the ring without a protector ("copy", what the copy and its
// wake-ups cost alone), each against the same program without logging
// ("bare"), alternating, medians. One host, loopback: the protector hop is a local TCP
// connection, and only one end of the ping-pong logs (under radic both
// do). The goals are the recovery issue's for radic as a whole: round trip
// <= 3x bare, bandwidth >= 0.5x bare.
func BenchmarkLogCost(b *testing.B) {
	if !testenv.Bench() {
		b.Skip("benchmarks run with `make bench` (RADIC_BENCH=1)")
	}
	prog := testenv.Artifact(b, "build/apps/logcost")
	runs := testenv.EnvCount(b, "RADIC_BENCH_RUNS", 9, 5)
	modes := []string{"bare", "sync", "ring", "tee", "copy"}
	whole := map[string]bool{"sync": true, "ring": true, "tee": true} // copy has no protector: a part
	tests := []struct {
		name, goal string
		args       []string
		re         *regexp.Regexp
		better     func(ratio float64) bool
	}{
		{"8 B round trip", "<= 3x", []string{"lat", "--iters", "20000"},
			regexp.MustCompile(`lat rtt_med_us=([0-9.]+)`), func(r float64) bool { return r <= 3 }},
		{"bandwidth, 1 MiB writes", ">= 0.5x", []string{"bw", "--bytes", "512M", "--chunk", "1M"},
			regexp.MustCompile(`bw MBps=([0-9.]+)`), func(r float64) bool { return r >= 0.5 }},
	}
	var t strings.Builder
	fmt.Fprintf(&t, "\nlogging cost at the receiver, by design (build/apps/logcost, loopback, one end logs): medians of %d runs each, modes alternating\n", runs)
	fmt.Fprintf(&t, "%-24s %-5s %10s %10s %7s %8s %4s\n", "test", "mode", "median", "unit", "ratio", "goal", "met")
	for _, tc := range tests {
		got := map[string][]float64{}
		for i := 0; i < runs; i++ {
			for k := range modes {
				mode := modes[(i+k)%len(modes)] // rotate who goes first
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				out, err := exec.CommandContext(ctx, prog, append([]string{mode}, tc.args...)...).CombinedOutput()
				cancel()
				m := tc.re.FindSubmatch(out)
				if err != nil || m == nil {
					b.Fatalf("logcost %s %v: %v\n%s", mode, tc.args, err, out)
				}
				v, _ := strconv.ParseFloat(string(m[1]), 64)
				got[mode] = append(got[mode], v)
			}
		}
		unit := "us"
		if tc.args[0] == "bw" {
			unit = "MB/s"
		}
		bare := testenv.Median(got["bare"])
		for _, mode := range modes {
			med := testenv.Median(got[mode])
			ratio, met, goal := med/bare, "-", "-"
			if whole[mode] {
				goal, met = tc.goal, testenv.YesNo(tc.better(ratio))
			}
			if mode != "bare" {
				b.ReportMetric(ratio, tc.args[0]+"-"+mode+"-ratio")
			}
			fmt.Fprintf(&t, "%-24s %-5s %10.2f %10s %7.2f %8s %4s\n", tc.name, mode, med, unit, ratio, goal, met)
		}
	}
	fmt.Print(t.String())
}
