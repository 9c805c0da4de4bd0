package safebench_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

// The overhead runs: netbench lat and bw (test/apps/netbench.c).
const (
	latIters = 20000   // timed round trips per run (plus a tenth to warm up)
	bwBytes  = 1 << 30 // per run, one way; the last 7/8 are timed
	bwChunk  = 1 << 20 // bytes per write
)

var (
	latRE = regexp.MustCompile(`\[rank 1\] lat rtt_med_us=([0-9.]+) rtt_mean_us=([0-9.]+) rtt_p99_us=([0-9.]+)`)
	bwRE  = regexp.MustCompile(`\[rank 0\] bw MBps=([0-9.]+) `)
)

func parseFloat(b *testing.B, re *regexp.Regexp, out string) []float64 {
	b.Helper()
	m := re.FindStringSubmatch(out)
	if m == nil {
		b.Fatalf("no %q in the output:\n%s", re, tail(out, 3000))
	}
	v := make([]float64, len(m)-1)
	for i := range v {
		v[i], _ = strconv.ParseFloat(m[i+1], 64)
	}
	return v
}

// BenchmarkSafeSocketOverhead measures what managed connections cost
// without faults against bare TCP, between two netns nodes: the 8 B round
// trip (netbench lat: the median round trip of 20000, TCP_NODELAY) and the
// bandwidth of 1 MiB writes (netbench bw: 1 GiB one way, a bare
// sender and receiver, the data not touched). Bare (`radic run
// --no-radic`) and managed (`radic run`) runs alternate, who goes first
// alternating too; the table shows the medians over the runs and their
// ratio against the goals round trip <= 1.10x and bandwidth >= 0.95x.
func BenchmarkSafeSocketOverhead(b *testing.B) {
	requireBench(b)
	runs := testenv.EnvCount(b, "RADIC_BENCH_RUNS", 9, 5)
	c := newCluster(b)
	load := loadAvg()
	latArgs := []string{"lat", "--iters", strconv.Itoa(latIters)}
	bwArgs := []string{"bw", "--bytes", strconv.Itoa(bwBytes), "--chunk", strconv.Itoa(bwChunk)}

	var rtt, rttMean, rttP99, bw [2][]float64 // [0] bare, [1] managed
	reruns := 0
	// run runs netbench once; a managed run that came up unmanaged is run
	// again (twice at most) and counted.
	run := func(managed bool, args []string) string {
		for attempt := 0; ; attempt++ {
			out := c.run(managed, args...)
			err := checkManaged(out, managed)
			if err == nil {
				return out
			}
			if !managed || attempt == 2 {
				b.Fatalf("netbench %s: %v\n%s", args[0], err, tail(out, 3000))
			}
			reruns++
			b.Logf("netbench %s: %v; running it again\n%s", args[0], err, tail(out, 3000))
		}
	}
	t0 := time.Now()
	for i := 0; i < 2*runs; i++ {
		which := i % 2
		if (i/2)%2 == 1 {
			which = 1 - which // alternate who goes first, too
		}
		managed := which == 1
		l := parseFloat(b, latRE, run(managed, latArgs))
		rtt[which] = append(rtt[which], l[0])
		rttMean[which] = append(rttMean[which], l[1])
		rttP99[which] = append(rttP99[which], l[2])
		bw[which] = append(bw[which], parseFloat(b, bwRE, run(managed, bwArgs))[0])
	}
	var det strings.Builder
	for w, name := range []string{"bare", "managed"} {
		fmt.Fprintf(&det, "%-7s round trip, median of each run (us): %s\n", name, testenv.Fmts(rtt[w], 1))
		fmt.Fprintf(&det, "%-7s round trip, mean of each run (us):   %s\n", name, testenv.Fmts(rttMean[w], 1))
		fmt.Fprintf(&det, "%-7s round trip, p99 of each run (us):    %s\n", name, testenv.Fmts(rttP99[w], 1))
		fmt.Fprintf(&det, "%-7s bandwidth of each run (MB/s):        %s\n", name, testenv.Fmts(bw[w], 0))
	}

	lb, lm := testenv.Median(rtt[0]), testenv.Median(rtt[1])
	mb, mm := testenv.Median(rttMean[0]), testenv.Median(rttMean[1])
	bb, bm := testenv.Median(bw[0]), testenv.Median(bw[1])
	var t strings.Builder
	fmt.Fprintf(&t, "\n### Safe sockets without faults vs bare TCP, node 0 <-> node 1 (netns)\n\n")
	fmt.Fprintf(&t, "Medians of %d bare (`radic run --no-radic`) and %d managed (`radic run`, %s) runs, alternating; "+
		"%v in all; load average %s before, %s after.\n\n",
		runs, runs, c.lib, time.Since(t0).Round(time.Second), load, loadAvg())
	fmt.Fprintf(&t, "| metric | bare TCP | safe socket | ratio | goal | met |\n|---|---:|---:|---:|---|---|\n")
	fmt.Fprintf(&t, "| 8 B round trip (median of %d per run) | %.1f us | %.1f us | %.3f | <= 1.10 | %s |\n",
		latIters, lb, lm, lm/lb, testenv.YesNo(lm/lb <= 1.10))
	fmt.Fprintf(&t, "| 8 B round trip (mean of %d per run) | %.1f us | %.1f us | %.3f | (for information) | |\n",
		latIters, mb, mm, mm/mb)
	fmt.Fprintf(&t, "| bandwidth, 1 MiB writes, %d MiB one way | %.0f MB/s | %.0f MB/s | %.3f | >= 0.95 | %s |\n",
		bwBytes>>20, bb, bm, bm/bb, testenv.YesNo(bm/bb >= 0.95))
	fmt.Fprintf(&t, "\nRange over the runs: round trip bare %.1f-%.1f us, managed %.1f-%.1f us; bandwidth bare %.0f-%.0f MB/s, managed %.0f-%.0f MB/s.\n",
		testenv.MinOf(rtt[0]), testenv.MaxOf(rtt[0]), testenv.MinOf(rtt[1]), testenv.MaxOf(rtt[1]), testenv.MinOf(bw[0]), testenv.MaxOf(bw[0]), testenv.MinOf(bw[1]), testenv.MaxOf(bw[1]))
	if reruns > 0 {
		fmt.Fprintf(&t, "\nManaged runs whose connection came up unmanaged, and were run again: %d (see the log).\n", reruns)
	}
	fmt.Fprintf(&t, "\nThe runs, in the order run:\n\n```\n%s```\n", det.String())
	fmt.Print(t.String())
	b.ReportMetric(lm/lb, "rtt-ratio")
	b.ReportMetric(bm/bb, "bw-ratio")
	b.ReportMetric(lm, "managed-rtt-us")
	b.ReportMetric(bm, "managed-MB/s")
}

// The heal runs: netbench flow, a cut of node 1's link, the heal. Each
// cut lasts cutFor plus a random part of up to cutJitter: with cuts of one
// fixed length every heal would land at the same point of the shim's
// reconnection cycle (a new dial every 50 ms) and of
// the kernel's address resolution retries (one a second), and the trials
// would measure one point of each over and over.
const (
	cutFor    = 2 * time.Second
	cutJitter = time.Second
	settle    = 500 * time.Millisecond // flowing before each cut
)

// healGoal is the "100 ms plus the backoff step". The initiator
// starts a new reconnection dial every 50 ms (shim/safe.go's dialEvery),
// so a heal waits at most that long for the first dial that can reach the
// peer (the dials under way lost their SYNs to the cut).
const healGoal = 100*time.Millisecond + 50*time.Millisecond

var gapRE = regexp.MustCompile(`\[rank (\d)\] gap rank \d start=([0-9.]+) end=([0-9.]+) ms=`)

// gapAfter finds rank's first gap that began in [from, to]: the silence of
// a cut made at from and healed by to. It returns its end.
func gapAfter(out string, rank int, from, to float64) (float64, bool) {
	for _, m := range gapRE.FindAllStringSubmatch(out, -1) {
		if m[1] != strconv.Itoa(rank) {
			continue
		}
		start, _ := strconv.ParseFloat(m[2], 64)
		end, _ := strconv.ParseFloat(m[3], 64)
		if start >= from && start <= to {
			return end, true
		}
	}
	return 0, false
}

// healRow is one way of running the flow.
type healRow struct {
	conn, neigh string
	managed     bool
	static      bool // permanent neighbour entries on both nodes
	goal        bool // judged against healGoal

	toFlow  []float64 // per trial: ms from the heal to data in both directions
	perRank [2][]float64
	healCmd []float64 // ms `radic fault heal` took
	upInCmd []float64 // ms from its start to the link being up
	cuts    []float64 // ms from `radic fault cut-link` returning to the heal
	resumed [2]string // per rank, the shim's "resumed after" durations
	broken  [2]string // per rank, the shim's reasons for its breaks, counted
}

// watchLinkUp polls the operational state of a host link (the host end of
// a node's veth pair) until it is up, and sends the time it saw it up; the
// zero time when it was up already at the first look. It gives up after
// 5 s.
func watchLinkUp(link string) <-chan time.Time {
	ch := make(chan time.Time, 1)
	path := filepath.Join("/sys/class/net", link, "operstate")
	go func() {
		for start, first := time.Now(), true; time.Since(start) < 5*time.Second; first = false {
			if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == "up" {
				if first {
					ch <- time.Time{}
				} else {
					ch <- time.Now()
				}
				return
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	return ch
}

// healTrials runs the flow of row r and cuts node 1's link n times.
func (c *bc) healTrials(r *healRow, n int, rng *rand.Rand) {
	b := c.b
	b.Helper()
	stop := filepath.Join(c.dir, fmt.Sprintf("stop.%d", time.Now().UnixNano()))
	j := c.start(r.managed, "flow", "--rate", "1M", "--chunk", "1K", "--gap", "1", "--stop-file", stop)
	j.waitFor("data flowing both ways", 30*time.Second, func(out string) bool {
		return strings.Contains(out, "[rank 0] flow receiving rank 0") && strings.Contains(out, "[rank 1] flow receiving rank 1")
	})
	if err := checkManaged(j.out.String(), r.managed); err != nil {
		b.Fatalf("%s: %v", r.conn, err)
	}
	n1, err := c.state().Node(1)
	if err != nil {
		b.Fatal(err)
	}
	veth := n1.Veth
	for i := range n {
		time.Sleep(settle)
		if j.ended() {
			b.Fatalf("the flow ended (%v) before cut %d", j.err, i+1)
		}
		tCut := time.Now()
		c.must("fault", "cut-link", "1")
		cut := cutFor + time.Duration(rng.Int64N(int64(cutJitter)))
		r.cuts = append(r.cuts, float64(cut.Milliseconds()))
		time.Sleep(cut)
		up := watchLinkUp(veth)
		t0 := time.Now()
		c.must("fault", "heal")
		t1 := time.Now()
		var tUp time.Time
		select {
		case tUp = <-up:
		case <-time.After(2 * time.Second):
			b.Fatalf("cut %d: %s did not come up within 2 s of `radic fault heal`", i+1, veth)
		}
		if tUp.IsZero() {
			b.Fatalf("cut %d: %s was up before `radic fault heal`: the cut did not take", i+1, veth)
		}
		var ends [2]float64
		j.waitFor(fmt.Sprintf("data after cut %d (a gap line of both ranks)", i+1), 30*time.Second, func(out string) bool {
			ok := true
			for rank := range 2 {
				e, found := gapAfter(out, rank, unixSecs(tCut)-0.2, unixSecs(t1))
				ends[rank] = e
				ok = ok && found
			}
			return ok
		})
		h := unixSecs(tUp)
		d := [2]float64{(ends[0] - h) * 1e3, (ends[1] - h) * 1e3}
		r.perRank[0] = append(r.perRank[0], d[0])
		r.perRank[1] = append(r.perRank[1], d[1])
		r.toFlow = append(r.toFlow, max(d[0], d[1]))
		r.healCmd = append(r.healCmd, float64(t1.Sub(t0).Microseconds())/1e3)
		r.upInCmd = append(r.upInCmd, float64(tUp.Sub(t0).Microseconds())/1e3)
	}
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	j.wait(time.Minute)
	out := j.out.String()
	for rank := range 2 {
		m := regexp.MustCompile(fmt.Sprintf(`\[rank %d\] flow ok rank %d sent \d+ received \d+ gaps (\d+)`, rank, rank)).FindStringSubmatch(out)
		if m == nil {
			b.Fatalf("rank %d printed no \"flow ok\" line:\n%s", rank, tail(out, 5000))
		}
		if m[1] != strconv.Itoa(n) {
			b.Logf("%s: rank %d saw %s gaps of 1 s or more, for %d cuts", r.conn, rank, m[1], n)
		}
	}
	if r.managed {
		for rank := range 2 {
			var d []string
			for _, m := range resumedRE.FindAllStringSubmatch(out, -1) {
				if m[1] == strconv.Itoa(rank) {
					d = append(d, m[2])
				}
			}
			r.resumed[rank] = strings.Join(d, " ")
			why := map[string]int{}
			var order []string
			for _, m := range brokenRE.FindAllStringSubmatch(out, -1) {
				if m[1] == strconv.Itoa(rank) {
					if why[m[2]] == 0 {
						order = append(order, m[2])
					}
					why[m[2]]++
				}
			}
			var w []string
			for _, k := range order {
				w = append(w, fmt.Sprintf("%d× %q", why[k], k))
			}
			r.broken[rank] = strings.Join(w, ", ")
		}
	}
}

var brokenRE = regexp.MustCompile(`\[rank (\d)\] radic\[\d+\]: connection \S+ \(.*\) broken: ([^;]+);`)

var resumedRE = regexp.MustCompile(`\[rank (\d)\] radic\[\d+\]: connection \S+ \(.*\) resumed after (\S+):`)

// staticNeighbours gives nodes 0 and 1 permanent neighbour (ARP) entries
// for each other, so that a heal does not wait for address resolution.
func (c *bc) staticNeighbours() {
	b := c.b
	b.Helper()
	type nic struct{ ns, dev, addr, mac string }
	var nics [2]nic
	s := c.state()
	for id := range 2 {
		n, err := s.Node(id)
		if err != nil {
			b.Fatal(err)
		}
		out, err := exec.Command("ip", "-n", n.Netns, "-o", "-4", "addr", "show").CombinedOutput()
		if err != nil {
			b.Fatalf("ip -n %s addr show: %v\n%s", n.Netns, err, out)
		}
		dev := ""
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) >= 4 && strings.HasPrefix(f[3], n.Addr+"/") {
				dev = f[1]
			}
		}
		if dev == "" {
			b.Fatalf("node %d (netns %s): no device with address %s:\n%s", id, n.Netns, n.Addr, out)
		}
		out, err = exec.Command("ip", "-n", n.Netns, "-o", "link", "show", "dev", dev).CombinedOutput()
		m := regexp.MustCompile(`link/ether ([0-9a-f:]{17})`).FindSubmatch(out)
		if err != nil || m == nil {
			b.Fatalf("ip -n %s link show dev %s: %v\n%s", n.Netns, dev, err, out)
		}
		nics[id] = nic{n.Netns, dev, n.Addr, string(m[1])}
	}
	for id := range 2 {
		me, peer := nics[id], nics[1-id]
		args := []string{"-n", me.ns, "neigh", "replace", peer.addr, "lladdr", peer.mac, "dev", me.dev, "nud", "permanent"}
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			b.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		b.Logf("node %d: permanent neighbour %s at %s", id, peer.addr, peer.mac)
	}
}

// BenchmarkSafeSocketHeal measures how long data takes to flow again after
// a link heals. Both ranks of netbench flow send 1 MiB/s to each other in
// 1 KiB writes (rank 1, the connecting side, on node 1); node 1's link is
// cut (`radic fault cut-link 1`), healed after 2 to 3 s (`radic fault
// heal`), and the time from the moment the link is up again (the host end
// of node 1's veth pair, watched while the heal command runs) to the first
// byte each rank receives after the silence (netbench prints its
// wall-clock time) is taken; a trial's figure is the later of the two
// directions. The table
// shows median and max over the trials (RADIC_BENCH_HEAL_TRIALS, default
// 20) for safe sockets and, for reference, bare TCP, with the neighbour
// (ARP) entries as the cluster leaves them, and safe sockets again with
// permanent neighbour entries: the cut node's entry for its peer is
// INCOMPLETE when the link comes back, and the kernel re-probes it only
// once a second (retrans_time_ms), whatever the transport does.
func BenchmarkSafeSocketHeal(b *testing.B) {
	requireBench(b)
	trials := testenv.EnvCount(b, "RADIC_BENCH_HEAL_TRIALS", 20, 3)
	c := newCluster(b)
	rng := testenv.Rand(b)
	load := loadAvg()
	rows := []*healRow{
		{conn: "safe socket", neigh: "as the cluster leaves them (ARP)", managed: true, goal: true},
		{conn: "bare TCP (reference)", neigh: "as the cluster leaves them (ARP)"},
		{conn: "safe socket", neigh: "permanent (no ARP after the heal)", managed: true, static: true, goal: true},
	}
	t0 := time.Now()
	for _, r := range rows {
		if r.static {
			c.staticNeighbours()
		}
		c.healTrials(r, trials, rng)
	}
	var det strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&det, "%s, neighbour entries %s:\n", r.conn, r.neigh)
		fmt.Fprintf(&det, "  heal to flow, both ways (ms): %s\n", testenv.Fmts(r.toFlow, 1))
		fmt.Fprintf(&det, "  rank 1 -> rank 0 (ms):        %s\n", testenv.Fmts(r.perRank[0], 1))
		fmt.Fprintf(&det, "  rank 0 -> rank 1 (ms):        %s\n", testenv.Fmts(r.perRank[1], 1))
		fmt.Fprintf(&det, "  cut, until the heal (ms):     %s\n", testenv.Fmts(r.cuts, 0))
		fmt.Fprintf(&det, "  radic fault heal took (ms):   %s\n", testenv.Fmts(r.healCmd, 1))
		fmt.Fprintf(&det, "  link up after its start (ms): %s\n", testenv.Fmts(r.upInCmd, 1))
		if r.managed {
			fmt.Fprintf(&det, "  the shim of rank 1 (initiator), \"resumed after\": %s\n", r.resumed[1])
			fmt.Fprintf(&det, "  the shim of rank 0 (acceptor), \"resumed after\":  %s\n", r.resumed[0])
			fmt.Fprintf(&det, "  the shim of rank 1, \"broken\": %s\n", r.broken[1])
			fmt.Fprintf(&det, "  the shim of rank 0, \"broken\": %s\n", r.broken[0])
		}
	}

	var t strings.Builder
	fmt.Fprintf(&t, "\n### Safe sockets: link heal to data flowing again\n\n")
	fmt.Fprintf(&t, "Node 1's link cut for %v to %v (random) and healed (`radic fault cut-link 1`, `radic fault heal`), %d times per row; "+
		"time from the link being up again (`/sys/class/net/VETH/operstate`, polled) to the first byte received after the silence, "+
		"the later of the two directions (a steady 1 MiB/s each way in 1 KiB writes). Managed runs: %s. %v in all; load average %s before, %s after.\n\n",
		cutFor, cutFor+cutJitter, trials, c.lib, time.Since(t0).Round(time.Second), load, loadAvg())
	fmt.Fprintf(&t, "| connection | neighbour entries | trials | median | max | goal (max) | met |\n|---|---|---:|---:|---:|---|---|\n")
	for _, r := range rows {
		goal, met := "(reference)", ""
		if r.goal {
			goal = fmt.Sprintf("<= %d ms", healGoal.Milliseconds())
			met = testenv.YesNo(testenv.MaxOf(r.toFlow) <= float64(healGoal.Milliseconds()))
		}
		fmt.Fprintf(&t, "| %s | %s | %d | %.0f ms | %.0f ms | %s | %s |\n", r.conn, r.neigh, len(r.toFlow),
			testenv.Median(r.toFlow), testenv.MaxOf(r.toFlow), goal, met)
	}
	fmt.Fprintf(&t, "\nGoal: 100 ms plus the backoff step, the step being the 50 ms between reconnection dials "+
		"(a heal waits for the next one; those under way lost their SYNs to the cut).\n")
	fmt.Fprintf(&t, "\nThe trials, in the order run:\n\n```\n%s```\n", det.String())
	fmt.Print(t.String())
	b.ReportMetric(testenv.Median(rows[0].toFlow), "heal-median-ms")
	b.ReportMetric(testenv.MaxOf(rows[0].toFlow), "heal-max-ms")
	b.ReportMetric(testenv.Median(rows[2].toFlow), "heal-static-arp-median-ms")
	b.ReportMetric(testenv.MaxOf(rows[2].toFlow), "heal-static-arp-max-ms")
}
