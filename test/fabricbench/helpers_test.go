// Package fabricbench_test holds the benchmarks of the Blue Gene
// transport against TCP (issue 12), run by `make bench` (RADIC_BENCH=1);
// without it, without root, or without network namespaces they skip and
// say why.
//
// The network benchmarks build two network namespaces joined by a veth
// pair (10.213.7.1/24 and 10.213.7.2/24, no default route, so traffic
// goes only between them), run the helper program fabricpeer in each
// (fabricpeer/main.go: a udplink.Node with a bulktransport.Endpoint, or a
// TCP client and server) and drive the peers over their standard input
// and output. Every benchmark runs both transports side by side in the
// same run, several runs alternating which goes first, and reports the
// medians over the runs. The namespaces, the link and the peers are
// removed in b.Cleanup, even when the benchmark fails.
//
//   - BenchmarkFirstMessage: a 64-byte message to a peer with no state:
//     a fresh Endpoint pair each time, from WriteMsg to the receiver's
//     ReadMsg, against TCP connect and send, from the start of the
//     connect to the server having the bytes. Goal: delta-t faster.
//   - BenchmarkBulkThroughput: 64 MiB in 64 KiB messages, Bulk protocol,
//     against TCP on the same link. Goal: >= 0.9x TCP.
//   - BenchmarkSmallMessageRate: 64-byte messages per second, Short
//     protocol, against TCP with TCP_NODELAY and one write per message.
//     Issue 12 sets no goal; the table shows the ratio.
//   - BenchmarkInstructionsPerMessage (instructions_test.go): callgrind
//     instruction counts per message and per layer of the protocol cores
//     run in memory, in the manner of the UCX study (seed 002). Needs
//     valgrind, which scripts/deps.sh does not install; skips without.
//
// Figures are reported, never failed on: a markdown table on standard
// output (the testing package cuts a benchmark's log to 10 lines), with
// every run in the order run, its first rows in the log, and the medians
// as b.ReportMetric. A run that breaks (a peer fails, a message is lost
// for good, the wrong bytes arrive) fails the benchmark.
//
// Settings, from the environment:
//
//	RADIC_BENCH=1                run at all (`make bench` sets it)
//	RADIC_BENCH_RUNS=N           runs of each transport, or of each callgrind workload (default 5)
//	RADIC_BENCH_PROFILE=DIR      write CPU profiles of the network peers into DIR
//	RADIC_BENCH_BULK_INFLIGHT=N  unacknowledged bulk writes (default 1)
package fabricbench_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

// The two nodes' addresses on the veth link, and the ports the peers use.
const (
	addr0   = "10.213.7.1"
	addr1   = "10.213.7.2"
	prefix  = "/24"
	udpPort = "7000"
	tcpPort = "7001"
)

// requireBench skips b unless benchmarks were asked for.
func requireBench(b *testing.B) {
	b.Helper()
	if !testenv.Bench() {
		b.Skip("benchmarks run with `make bench` (RADIC_BENCH=1)")
	}
}

// requireNetns skips b unless two-node network namespaces can be built.
func requireNetns(b *testing.B) {
	b.Helper()
	testenv.RequireRoot(b)
	testenv.RequireCommand(b, "ip")
	name := fmt.Sprintf("fbprobe%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		b.Skipf("network namespaces are not available: ip netns add: %v: %s", err, bytes.TrimSpace(out))
	}
	if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
		b.Fatalf("ip netns del %s: %v: %s", name, err, bytes.TrimSpace(out))
	}
}

// buildPeer builds fabricpeer into a temporary directory. Without cgo:
// valgrind's callgrind aborts on the cgo runtime's thread start
// (pthread_sigmask; "vgCallgrind_post_signal: Assertion failed"), and
// with -trimpath the layers' files are named by their import paths.
func buildPeer(b *testing.B) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "fabricpeer")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./test/fabricbench/fabricpeer")
	cmd.Dir = testenv.Root(b)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build fabricpeer: %v\n%s", err, out)
	}
	return bin
}

// ---- the two nodes ----

// pair is two network namespaces joined by a veth pair: node 0 and
// node 1. The link's ends are named like their namespaces.
type pair struct {
	b    *testing.B
	ns   [2]string
	prog string
	prof string // RADIC_BENCH_PROFILE
}

// newPair builds the two nodes; they are removed when b ends.
func newPair(b *testing.B) *pair {
	b.Helper()
	id := fmt.Sprintf("fb%d%03d", os.Getpid()%100000, rand.IntN(1000)) // + "a": at most 11 of IFNAMSIZ's 15
	p := &pair{b: b, ns: [2]string{id + "a", id + "b"}, prog: buildPeer(b), prof: os.Getenv("RADIC_BENCH_PROFILE")}
	b.Cleanup(p.remove)
	for _, ns := range p.ns {
		p.ip("netns", "add", ns)
	}
	p.ip("link", "add", p.ns[0], "netns", p.ns[0], "type", "veth", "peer", "name", p.ns[1], "netns", p.ns[1])
	for i, a := range []string{addr0, addr1} {
		ns := p.ns[i]
		p.ip("-n", ns, "addr", "add", a+prefix, "dev", ns)
		p.ip("-n", ns, "link", "set", "dev", ns, "up")
		p.ip("-n", ns, "link", "set", "dev", "lo", "up")
	}
	b.Logf("nodes: netns %s (%s) and %s (%s), veth, MTU 1500", p.ns[0], addr0, p.ns[1], addr1)
	return p
}

func (p *pair) ip(args ...string) {
	p.b.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		p.b.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
}

// remove deletes the link and the namespaces (the peers are gone by
// then: their cleanups were registered later, so they ran first).
func (p *pair) remove() {
	exec.Command("ip", "-n", p.ns[0], "link", "del", p.ns[0]).Run() // may never have been made
	for _, ns := range p.ns {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil &&
			!bytes.Contains(out, []byte("No such file")) {
			p.b.Errorf("cleanup: ip netns del %s: %v: %s", ns, err, bytes.TrimSpace(out))
		}
	}
}

// udpRcvbufErrors is node's count of UDP datagrams dropped for a full
// socket buffer (/proc/net/snmp, Udp RcvbufErrors).
func (p *pair) udpRcvbufErrors(node int) int64 {
	out, err := exec.Command("ip", "netns", "exec", p.ns[node], "cat", "/proc/net/snmp").Output()
	if err != nil {
		return -1
	}
	var names []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == "RcvbufErrors" && i < len(f) {
				v, _ := strconv.ParseInt(f[i], 10, 64)
				return v
			}
		}
	}
	return -1
}

// peer is a fabricpeer running in a node, driven line by line.
type peer struct {
	b      *testing.B
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *testenv.Buffer
}

// start runs fabricpeer ARGS in node; it is stopped when b ends.
func (p *pair) start(node int, name string, args ...string) *peer {
	b := p.b
	b.Helper()
	if p.prof != "" {
		args = append(args, "-cpuprofile", filepath.Join(p.prof, name+".prof"))
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", p.ns[node], p.prog}, args...)...)
	pr := &peer{b: b, name: name, cmd: cmd, lines: make(chan string, 64), stderr: new(testenv.Buffer)}
	var err error
	if pr.stdin, err = cmd.StdinPipe(); err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = pr.stderr
	if err := cmd.Start(); err != nil {
		b.Fatalf("start %s: %v", name, err)
	}
	var read sync.WaitGroup
	read.Add(1)
	go func() {
		defer read.Done()
		defer close(pr.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			pr.lines <- sc.Text()
		}
	}()
	b.Cleanup(func() {
		// ip netns exec execs the peer: cmd.Process is the peer itself.
		pr.stdin.Close() // EOF: the peer ends by itself
		exited := make(chan struct{})
		go func() {
			for range pr.lines { // unblock the reader
			}
			read.Wait()
			cmd.Wait()
			close(exited)
		}()
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if b.Failed() {
			if s := pr.stderr.String(); s != "" {
				b.Logf("%s stderr:\n%s", name, s)
			}
		}
	})
	return pr
}

// do sends one command line.
func (pr *peer) do(format string, args ...any) {
	pr.b.Helper()
	if _, err := fmt.Fprintf(pr.stdin, format+"\n", args...); err != nil {
		pr.b.Fatalf("%s: command %q: %v", pr.name, fmt.Sprintf(format, args...), err)
	}
}

// want waits for the next line whose first word is word and returns its
// other words as numbers. Lines of a send still finishing ("start",
// "done") are skipped; a failure or anything else fails the benchmark.
func (pr *peer) want(word string, timeout time.Duration) []int64 {
	pr.b.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-pr.lines:
			if !ok {
				pr.b.Fatalf("%s ended before %q: %s", pr.name, word, pr.stderr.String())
			}
			f := strings.Fields(l)
			if len(f) == 0 {
				continue
			}
			switch f[0] {
			case word:
				v := make([]int64, len(f)-1)
				for i, s := range f[1:] {
					if v[i], ok = parseInt(s); !ok {
						pr.b.Fatalf("%s: %q: not a number in %q", pr.name, s, l)
					}
				}
				return v
			case "start", "done":
				continue
			}
			pr.b.Fatalf("%s: %q while waiting for %q", pr.name, l, word)
		case <-deadline:
			pr.b.Fatalf("%s: no %q within %v", pr.name, word, timeout)
		}
	}
}

// wantLine is want for a line of text ("stats ...").
func (pr *peer) wantLine(word string, timeout time.Duration) string {
	pr.b.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-pr.lines:
			if !ok {
				pr.b.Fatalf("%s ended before %q: %s", pr.name, word, pr.stderr.String())
			}
			if strings.HasPrefix(l, word+" ") {
				return l
			}
			if strings.HasPrefix(l, "fail") {
				pr.b.Fatalf("%s: %s", pr.name, l)
			}
		case <-deadline:
			pr.b.Fatalf("%s: no %q within %v", pr.name, word, timeout)
		}
	}
}

func parseInt(s string) (int64, bool) {
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}

// ---- numbers ----

// loadAvg is the 1-minute load average (the machine may be busy with more
// than this benchmark), or "?".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// sideBySide runs measure for both transports runs times each,
// alternating which goes first: run i is delta-t then TCP for even i,
// TCP then delta-t for odd i. It returns the figures in the order run,
// [0] delta-t and [1] TCP.
func sideBySide(runs int, measure func(tcp bool) float64) (v [2][]float64) {
	for i := range runs {
		for k := range 2 {
			tcp := k == 1
			if i%2 == 1 {
				tcp = !tcp
			}
			x := measure(tcp)
			if tcp {
				v[1] = append(v[1], x)
			} else {
				v[0] = append(v[0], x)
			}
		}
	}
	return v
}

// row is one line of a comparison table.
type row struct {
	metric  string
	dt, tcp []float64 // per run
	unit    string
	prec    int
	ratioOf string // what the ratio is, e.g. "delta-t/TCP"
	goal    string
	met     func(ratio float64) bool // nil: no goal
}

// ratio is delta-t's median over TCP's.
func (r row) ratio() float64 { return testenv.Median(r.dt) / testenv.Median(r.tcp) }

// report prints a benchmark's table on standard output, as
// test/safebench does: the testing package cuts a benchmark's b.Log
// output to its first 10 lines (testing.B.trimOutput), which a table
// with its runs outgrows. The table's first rows are logged too, so that
// they stand beside the benchmark's result line.
func report(b *testing.B, text string) {
	b.Helper()
	fmt.Print(text)
	logged := 0
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| metric") && !strings.HasPrefix(l, "| layer") && logged < 6 {
			b.Logf("%s", l)
			logged++
		}
	}
}

// table formats rows as markdown, with the runs in the order run below.
func table(title string, runs int, t0 time.Time, load string, rows ...row) string {
	var t strings.Builder
	fmt.Fprintf(&t, "\n### %s\n\n", title)
	fmt.Fprintf(&t, "Medians of %d delta-t (bulktransport.Endpoint over udplink) and %d TCP runs, alternating which goes first; "+
		"%v in all; load average %s before, %s after.\n\n", runs, runs, time.Since(t0).Round(time.Second), load, loadAvg())
	fmt.Fprintf(&t, "| metric | delta-t | TCP | ratio | goal | met |\n|---|---:|---:|---:|---|---|\n")
	for _, r := range rows {
		met := "(no goal set)"
		if r.met != nil {
			met = testenv.YesNo(r.met(r.ratio()))
		}
		fmt.Fprintf(&t, "| %s | %.*f %s | %.*f %s | %.3f (%s) | %s | %s |\n", r.metric, r.prec, testenv.Median(r.dt), r.unit,
			r.prec, testenv.Median(r.tcp), r.unit, r.ratio(), r.ratioOf, r.goal, met)
	}
	fmt.Fprintf(&t, "\nThe runs, in the order run (range):\n\n```\n")
	for _, r := range rows {
		fmt.Fprintf(&t, "%s, delta-t (%s): %s  (%.*f-%.*f)\n", r.metric, r.unit, testenv.Fmts(r.dt, r.prec), r.prec, testenv.MinOf(r.dt), r.prec, testenv.MaxOf(r.dt))
		fmt.Fprintf(&t, "%s, TCP     (%s): %s  (%.*f-%.*f)\n", r.metric, r.unit, testenv.Fmts(r.tcp, r.prec), r.prec, testenv.MinOf(r.tcp), r.prec, testenv.MaxOf(r.tcp))
	}
	fmt.Fprintf(&t, "```\n")
	return t.String()
}
