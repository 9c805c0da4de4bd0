package radicd_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/clustertest"
	"github.com/radic-project/radic/internal/testenv"
)

// The replay tests run the two-way stream checker (test/apps/stream, 2
// ranks: rank 1 connects to rank 0, both directions stream 16 MiB at 4
// MiB/s, every byte checked, a digest per rank that depends only on the
// bytes received) under `radic run --recovery`, and kill a rank (the
// process, or its node) once its node has logged 2 MiB. The restarted rank
// must replay its log, resume the connection rank 0 still holds, and the
// job must end with the fault-free output: the same "stream ok" lines
// (digests) and status 0. --progress 0: the progress lines depend on
// timing, and a restarted rank's stderr is compared with its first run's.

// waitJob waits for the job's status, 3 minutes at most (then the test
// fails and its cleanup kills `radic run` and takes the cluster down).
func waitJob(t *testing.T, wait func() int) int {
	t.Helper()
	ch := make(chan int, 1)
	go func() { ch <- wait() }()
	select {
	case code := <-ch:
		return code
	case <-time.After(3 * time.Minute):
		t.Fatal("the job did not end within 3 minutes")
		return -1
	}
}

// streamRun is `radic run` of the stream checker on c.
func streamRun(t *testing.T, mode string) []string {
	return []string{"--np", "2", "--tag-output", "--recovery", "--lib", testenv.Artifact(t, "lib/libradic.so"), "--",
		testenv.Artifact(t, "build/apps/stream"), "--mode", mode, "--bytes", "16M", "--rate", "4M", "--progress", "0"}
}

// okLines are the "stream ok" lines of out, sorted by rank.
func okLines(out string) string {
	var ls [2]string
	re := regexp.MustCompile(`^\[rank (\d)\] (stream ok .*)$`)
	for l := range strings.SplitSeq(out, "\n") {
		if m := re.FindStringSubmatch(l); m != nil {
			r := m[1][0] - '0'
			ls[r] += m[2] + "\n"
		}
	}
	return ls[0] + ls[1]
}

// logBytes reads radic_log_bytes from node's metrics.
func (c *netnsCluster) logBytes(node int) float64 {
	_, m := c.daemon(node)
	resp, err := http.Get("http://" + m + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "radic_log_bytes "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// waitLogged waits until node has logged n more bytes than base (its
// radic_log_bytes before the job): the kill comes in the middle of the
// stream, with a log to replay.
func (c *netnsCluster) waitLogged(node int, base, n float64) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for c.logBytes(node) < base+n {
		if time.Now().After(deadline) {
			c.t.Fatalf("node %d did not log %.0f bytes within 30 s", node, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// replayed returns the bytes the restarted rank said it replays, from its
// shim's log file in the state dir of node (radicd's RADIC_LOG_FILE).
func (c *netnsCluster) replayed(node int) (int, string) {
	c.t.Helper()
	n, err := c.state().Node(node)
	if err != nil {
		c.t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(n.StateDir, "replay-*.log"))
	var all string
	var newest time.Time
	for _, f := range files { // this job's: the newest
		if st, err := os.Stat(f); err == nil && st.ModTime().After(newest) {
			b, _ := os.ReadFile(f)
			all, newest = string(b), st.ModTime()
		}
	}
	m := regexp.MustCompile(`replaying \d+ connections, (\d+) bytes`).FindStringSubmatch(all)
	if m == nil {
		return 0, all
	}
	v, _ := strconv.Atoi(m[1])
	return v, all
}

// dumpReplayLogs: if the test fails, its cleanup logs the restarted
// ranks' shim logs (before the cluster's own cleanup removes them).
func (c *netnsCluster) dumpReplayLogs() {
	c.t.Cleanup(func() {
		if !c.t.Failed() {
			return
		}
		files, _ := filepath.Glob(filepath.Join(c.dir, "nodes", "*", "replay-*.log"))
		for _, f := range files {
			b, _ := os.ReadFile(f)
			c.t.Logf("%s:\n%s", f, b)
		}
	})
}

// TestReplayStream: a rank killed in the middle of a two-way stream (alone,
// or with its node) is restarted, replays its log and the job ends as a
// fault-free run does, in each of the stream's I/O modes (blocking
// threads, poll, epoll level-triggered, edge-triggered and one-shot: a
// replayed report disarms a one-shot registration as the first run's
// did), whether it made the connection or accepted it
// (kill-node of the accepting rank: its listener moves with it, and the
// peer's reconnect finds it on the spare).
func TestReplayStream(t *testing.T) {
	c := newNetnsCluster(t, 2, "--spares", "1", "--fence-kill")
	c.dumpReplayLogs()
	lostNode := false // a kill-node took a compute node and the spare
	code, out := c.runJob(streamRun(t, "blocking")...)
	want := okLines(out)
	if code != 0 || strings.Count(want, "stream ok") != 2 {
		t.Fatalf("fault-free run: status %d, output:\n%s", code, out)
	}
	if testFabric == "bg" {
		// The ranks' logs went to their protectors on fabric streams,
		// and the daemons' requests to each other (the launch records
		// stored with the protectors) too.
		for _, service := range []string{"replica", "http"} {
			in := c.metricSum("radic_fabric_stream_bytes_total", `dir="in",service="`+service+`"`)
			out := c.metricSum("radic_fabric_stream_bytes_total", `dir="out",service="`+service+`"`)
			if in == 0 || out == 0 {
				t.Errorf("%s streams on the fabric moved %v bytes in and %v out: that traffic did not travel on the fabric", service, in, out)
			}
			t.Logf("%s on the fabric: %.0f bytes written to streams, %.0f received", service, out, in)
		}
	}
	for _, tc := range []struct {
		name, mode, fault string
		rank              int // the rank killed (rank 1 connected, rank 0 accepted), on node rank
		on                int // the node it restarts on
	}{
		{"kill-rank-blocking", "blocking", "kill-rank", 1, 1},
		{"kill-rank-poll", "poll", "kill-rank", 1, 1},
		{"kill-rank-epoll", "epoll", "kill-rank", 1, 1},
		{"kill-rank-epoll-et", "epoll-et", "kill-rank", 1, 1},
		{"kill-rank-epoll-oneshot", "epoll-oneshot", "kill-rank", 1, 1},
		{"kill-rank-acceptor", "blocking", "kill-rank", 0, 0},
		{"kill-node-blocking", "blocking", "kill-node", 1, 2},
		{"kill-node-acceptor", "blocking", "kill-node", 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := c.with(t)
			if tc.fault == "kill-node" {
				// Rank r runs on node r and restarts on the spare only
				// on a cluster that has not lost a node yet.
				if lostNode {
					c = newNetnsCluster(t, 2, "--spares", "1", "--fence-kill")
					c.dumpReplayLogs()
				}
				lostNode = true
			}
			base := c.logBytes(tc.rank)
			out, wait := c.startJob(streamRun(t, tc.mode)...)
			clustertest.WaitRanks(t, c.dir, 2)
			c.waitLogged(tc.rank, base, 2<<20)
			if o, err := c.radic("fault", tc.fault, strconv.Itoa(tc.rank)); err != nil {
				t.Fatalf("%s %d: %v\n%s", tc.fault, tc.rank, err, o)
			}
			code := waitJob(t, wait)
			got := okLines(out.String())
			if code != 0 || got != want {
				t.Fatalf("status %d, stream ok lines:\n%s\nwant:\n%s\nwhole output:\n%s", code, got, want, out.String())
			}
			n, log := c.replayed(tc.on)
			if n <= 0 || n >= 16<<20 {
				t.Errorf("the restarted rank replayed %d bytes, want some of the 16 MiB; its shim's log:\n%s", n, log)
			}
			if !regexp.MustCompile(`rank ` + strconv.Itoa(tc.rank) + ` restarted on node ` + strconv.Itoa(tc.on)).MatchString(out.String()) {
				t.Errorf("no recovery event naming node %d:\n%s", tc.on, out.String())
			}
			t.Logf("replayed %d bytes", n)
		})
	}
}

// TestReplayIdentity: a restarted rank is given its first run's pid and
// host name (getpid, gethostname, uname; each node has its own), and its
// signals to that pid reach it. whoami prints both, seeds its bytes with them and signals
// itself every round: given its new pid, the restarted rank's output and
// bytes differed from its first run's and the job stopped on the
// divergence.
func TestReplayIdentity(t *testing.T) {
	line := regexp.MustCompile(`\[rank (\d)\] whoami: rank \d pid (\d+) host (\S+)`)
	done := regexp.MustCompile(`\[rank (\d)\] whoami ok rank \d pid (\d+) host (\S+) signals (\d+)`)
	for _, tc := range []struct {
		fault string
		rank  int
	}{{"kill-node", 1}, {"kill-rank", 0}} {
		t.Run(tc.fault, func(t *testing.T) {
			c := newNetnsCluster(t, 2, "--spares", "1", "--fence-kill")
			c.dumpReplayLogs()
			base := c.logBytes(tc.rank)
			out, wait := c.startJob("--np", "2", "--tag-output", "--recovery", "--lib", testenv.Artifact(t, "lib/libradic.so"), "--",
				testenv.Artifact(t, "build/apps/whoami"), "400", "5")
			clustertest.WaitRanks(t, c.dir, 2)
			c.waitLogged(tc.rank, base, 100*8) // a hundred rounds in
			if o, err := c.radic("fault", tc.fault, strconv.Itoa(tc.rank)); err != nil {
				t.Fatalf("%s %d: %v\n%s", tc.fault, tc.rank, err, o)
			}
			code := waitJob(t, wait)
			o := out.String()
			if code != 0 || !strings.Contains(o, "restarted on node") {
				t.Fatalf("status %d (want 0, after a recovery):\n%s", code, o)
			}
			first := map[string][]string{}
			for _, m := range line.FindAllStringSubmatch(o, -1) {
				first[m[1]] = m[2:]
			}
			ends := done.FindAllStringSubmatch(o, -1)
			if len(first) != 2 || len(ends) != 2 {
				t.Fatalf("want each rank's first and last lines once:\n%s", o)
			}
			for _, m := range ends {
				if f := first[m[1]]; f == nil || f[0] != m[2] || f[1] != m[3] || m[4] != "400" {
					t.Errorf("rank %s ended as pid %s host %s with %s signals; it began as %v and signalled itself 400 times", m[1], m[2], m[3], m[4], f)
				}
				// Rank r began on node r, whose host name is nr: the
				// one restarted on the spare (n2) keeps it.
				if m[3] != "n"+m[1] {
					t.Errorf("rank %s's host name is %s, want its first node's, n%s", m[1], m[3], m[1])
				}
			}
		})
	}
}

// TestReplayStream1GiB: the two-way 1 GiB stream, either end's
// node killed mid-stream, ends byte-identical (each rank's digest of what
// it received equals the fault-free run's). Hundreds of MB of log go
// through the restart: fetched from the protector into the replay file,
// adopted by the new node's protectors (pushed to them in one request, it
// was refused: "http: request body too large", and the job failed),
// mapped by the restarted rank and replayed.
func TestReplayStream1GiB(t *testing.T) {
	run := func(t *testing.T) []string {
		return []string{"--np", "2", "--tag-output", "--recovery", "--lib", testenv.Artifact(t, "lib/libradic.so"), "--",
			testenv.Artifact(t, "build/apps/stream"), "--mode", "blocking", "--bytes", "1G", "--progress", "0"}
	}
	var want string
	for _, rank := range []int{1, 0} { // the connecting end's node, then the accepting end's
		t.Run(fmt.Sprintf("kill-node-%d", rank), func(t *testing.T) {
			c := newNetnsCluster(t, 2, "--spares", "1", "--fence-kill")
			c.dumpReplayLogs()
			if want == "" {
				code, out := c.runJob(run(t)...)
				if want = okLines(out); code != 0 || strings.Count(want, "stream ok") != 2 {
					t.Fatalf("fault-free run: status %d, output:\n%s", code, out)
				}
			}
			base := c.logBytes(rank)
			out, wait := c.startJob(run(t)...)
			clustertest.WaitRanks(t, c.dir, 2)
			c.waitLogged(rank, base, 256<<20) // about a quarter of the way
			if o, err := c.radic("fault", "kill-node", strconv.Itoa(rank)); err != nil {
				t.Fatalf("kill-node %d: %v\n%s", rank, err, o)
			}
			code := waitJob(t, wait)
			if got := okLines(out.String()); code != 0 || got != want {
				t.Fatalf("status %d, stream ok lines:\n%s\nwant:\n%s\nwhole output:\n%s", code, got, want, out.String())
			}
			n, log := c.replayed(2)
			if n < 128<<20 {
				t.Errorf("the restarted rank replayed %d bytes, want hundreds of MB; its shim's log:\n%s", n, log)
			}
			ev := regexp.MustCompile(`rank ` + strconv.Itoa(rank) + ` restarted on node 2 in [0-9.]+ s; replayed [0-9.]+ [kMG]?B`).FindString(out.String())
			if ev == "" {
				t.Fatalf("no recovery event naming node 2:\n%s", out.String())
			}
			t.Logf("%s (%d bytes)", ev, n)
		})
	}
}

// stallLog drops node's TCP to node `to`'s radicd port (its log's
// replication stream to its protector), not its heartbeats (UDP) nor the
// ranks' connections: the log stops becoming stable.
func (c *netnsCluster) stallLog(node, to int) {
	c.t.Helper()
	s := c.state()
	n, m := s.Nodes[node], s.Nodes[to]
	for _, args := range [][]string{
		{"add", "table", "inet", "rtest"},
		{"add", "chain", "inet", "rtest", "out", "{ type filter hook output priority 0; }"},
		{"add", "rule", "inet", "rtest", "out", "ip", "daddr", m.Addr, "tcp", "dport", "7470", "drop"},
	} {
		if out, err := exec.Command("ip", append([]string{"netns", "exec", n.Netns, "nft"}, args...)...).CombinedOutput(); err != nil {
			c.t.Fatalf("nft %v in %s: %v\n%s", args, n.Netns, err, out)
		}
	}
}

// TestReplayPessimism: node 1's log stops reaching its protector (node 0)
// for a second, then node 1 dies. With pessimistic logging nothing rank 1
// received in that second was acknowledged to rank 0 (acknowledgements
// say what is logged), so rank 0 still has those bytes and resends them
// after the restart: the job ends as a fault-free run does. With
// RADIC_TEST_ACK_BEFORE_LOG=1 (received bytes acknowledged before they are
// logged: broken pessimism) rank 0 has freed bytes the restarted rank's
// log never got; it refuses to resume below what it was told was logged,
// and the job fails with that reason. The same run is both the check and
// its control.
func TestReplayPessimism(t *testing.T) {
	for _, broken := range []bool{false, true} {
		name := "pessimistic"
		if broken {
			name = "ack-before-log"
		}
		t.Run(name, func(t *testing.T) {
			c := newNetnsCluster(t, 2, "--spares", "1", "--fence-kill")
			c.dumpReplayLogs()
			want := ""
			if !broken {
				code, out := c.runJob(streamRun(t, "blocking")...)
				if want = okLines(out); code != 0 {
					t.Fatalf("fault-free run: status %d:\n%s", code, out)
				}
			} else {
				c.env = append(c.env, "RADIC_TEST_ACK_BEFORE_LOG=1")
			}
			base := c.logBytes(1)
			out, wait := c.startJob(streamRun(t, "blocking")...)
			clustertest.WaitRanks(t, c.dir, 2)
			c.waitLogged(1, base, 2<<20)
			c.stallLog(1, 0)
			time.Sleep(time.Second) // rank 1 receives on (broken) or waits for its log (pessimistic)
			if o, err := c.radic("fault", "kill-node", "1"); err != nil {
				t.Fatalf("kill-node 1: %v\n%s", err, o)
			}
			code := waitJob(t, wait)
			switch {
			case broken && (code == 0 || !strings.Contains(out.String(), "acknowledged as logged; they are no longer kept")):
				t.Fatalf("status %d; want a failure naming the bytes acknowledged but not logged:\n%s", code, out.String())
			case !broken && (code != 0 || okLines(out.String()) != want):
				t.Fatalf("status %d, stream ok lines:\n%s\nwant:\n%s\nwhole output:\n%s", code, okLines(out.String()), want, out.String())
			}
		})
	}
}

// TestReplayDivergence: a rank that sends what it reads from /dev/urandom
// (test/apps/urandom) is killed and restarted; its regenerated bytes are
// not what rank 0 received, and the job stops with the divergence error
// naming the process, the connection and the offset, instead of going on
// with another history.
func TestReplayDivergence(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		logged float64 // bytes of rank 0's log before the kill
	}{
		{"mid-stream", nil, 10 << 16}, // ten blocks: rank 1 has answers in its log
		// Rank 0 answers the first block only after 2 s: rank 1 dies
		// having received nothing, so its log holds only its connect.
		// The restarted rank must resume that connection, which rank 0
		// holds, not open a second one under the same id (it did, and
		// both ranks waited a minute for each other).
		{"before-first-receive", []string{"64", "2000"}, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newNetnsCluster(t, 2, "--spares", "1", "--fence-kill")
			c.dumpReplayLogs()
			base := c.logBytes(1)
			args := append([]string{"--np", "2", "--tag-output", "--recovery", "--lib", testenv.Artifact(t, "lib/libradic.so"), "--",
				testenv.Artifact(t, "build/apps/urandom")}, tc.args...)
			out, wait := c.startJob(args...)
			clustertest.WaitRanks(t, c.dir, 2)
			c.waitLogged(1, base, tc.logged)
			if o, err := c.radic("fault", "kill-rank", "1"); err != nil {
				t.Fatalf("kill-rank 1: %v\n%s", err, o)
			}
			code := waitJob(t, wait)
			// radic run names the divergence exit; the rank's line (on its
			// stderr, which radic run may stop forwarding first, and in its
			// shim's log file) names the connection and the offset.
			if code != 86 || !strings.Contains(out.String(), "rank 1 (node 1, pid ") || !strings.Contains(out.String(), "the divergence exit") {
				t.Fatalf("status %d; want 86 and the divergence exit named:\n%s", code, out.String())
			}
			re := regexp.MustCompile(`DIVERGENCE: process 1, connection 1:0: the regenerated stream differs at offset \d+`)
			if _, log := c.replayed(1); !re.MatchString(log) {
				t.Errorf("no DIVERGENCE line naming the connection and offset in the restarted rank's log:\n%s", log)
			}
		})
	}
}

// TestReplayBothNodesInTurn: the accepting rank's node dies; once its rank
// runs again on the spare (having replayed the close of its listener:
// the stream checker closes it once its peer is in, as Jacobi and the farm
// do), the connecting rank's node dies too. The restarted connecting rank
// must find its peer where it runs now, on the spare, although the
// listener it connected to is closed and the listener's own node is dead.
// (Found by TestRecoveryCampaign/two-failures: the shim looked for the
// peer's control port among open listeners only, fell back to the dead
// node's address, and the recovery timed out in its reconnect phase.)
func TestReplayBothNodesInTurn(t *testing.T) {
	c := newNetnsCluster(t, 3, "--spares", "1", "--fence-kill")
	c.dumpReplayLogs()
	// Rank 1's shim says that its connection broke and resumed when rank
	// 0 dies, on its own stream (launch.Radic), not in the stderr that
	// its restarted instance regenerates: with the lines in its stderr,
	// radic run took the restarted rank 1 for a divergent one ("its
	// stderr differs from what was already delivered").
	// 48 MiB at 4 MiB/s: both ranks still stream when the second node
	// dies (a rank that has printed its "done" line, which holds its run
	// time, would regenerate another one: a divergence).
	run := streamRun(t, "blocking")
	run[slices.Index(run, "16M")] = "48M"
	code, out := c.runJob(run...)
	want := okLines(out)
	if code != 0 || strings.Count(want, "stream ok") != 2 {
		t.Fatalf("fault-free run: status %d, output:\n%s", code, out)
	}
	base := c.logBytes(1) // rank 0's protector
	job, wait := c.startJob(run...)
	clustertest.WaitRanks(t, c.dir, 2)
	c.waitLogged(1, base, 2<<20)
	if o, err := c.radic("fault", "kill-node", "0"); err != nil {
		t.Fatalf("kill-node 0: %v\n%s", err, o)
	}
	first := regexp.MustCompile(`rank 0 restarted on node 3 in [0-9.]+ s.*; live again`)
	for deadline := time.Now().Add(30 * time.Second); !first.MatchString(job.String()); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no recovery of rank 0 on node 3 within 30 s:\n%s", job.String())
		}
	}
	if o, err := c.radic("fault", "kill-node", "1"); err != nil {
		t.Fatalf("kill-node 1: %v\n%s", err, o)
	}
	code = waitJob(t, wait)
	if got := okLines(job.String()); code != 0 || got != want {
		t.Fatalf("status %d, stream ok lines:\n%s\nwant:\n%s\nwhole output:\n%s", code, got, want, job.String())
	}
	if !regexp.MustCompile(`rank 1 restarted on node 2 in [0-9.]+ s.*; live again`).MatchString(job.String()) {
		t.Errorf("no recovery event of rank 1 on node 2:\n%s", job.String())
	}
}

// TestReplayDeterminants: the server of a job is killed in the middle of
// it, three times, each time in a new job; its restart must take the path
// of its first run, which depends on a determinant other than the bytes
// received, and the job must end as a fault-free run does:
//
//	accept-order  test/apps/ticket: the server numbers its 3 clients in
//	              the order it accepts them. The restarted server is
//	              resumed by the clients in whatever order their
//	              resumes arrive; its accepts must return them in the
//	              logged order (shim: replay.go, the stand-ins' turns).
//	polls         test/apps/farm: the master hands the next task to the
//	              worker whose answer select() reported. The restarted
//	              master's selects must report what the logged ones did
//	              (shim/c/conn.c: replay_poll), not every connection with
//	              log left.
//
// Without either, the restarted server regenerates other answers or other
// task assignments than its clients received: DIVERGENCE, exit 86.
func TestReplayDeterminants(t *testing.T) {
	c := newNetnsCluster(t, 4, "--spares", "1", "--fence-kill")
	c.dumpReplayLogs()
	// The ranks' lines, in rank order (they reach radic run in any).
	lines := func(out string) string {
		ls := strings.SplitAfter(appLines(out), "\n")
		slices.Sort(ls)
		return strings.Join(ls, "")
	}
	farm := func(args ...string) []string {
		return append([]string{testenv.Artifact(t, "build/apps/farm"), "--tasks", "256", "--width", "256", "--maxiter", "20000"}, args...)
	}
	tries := regexp.MustCompile(`(?m)^\[rank (\d)\] rank \d connected after (\d+) tries\n`)
	for _, tc := range []struct {
		name   string
		args   []string
		rank   int     // the rank killed
		logged float64 // bytes of its log (on node rank+1, its protector) before the kill
		polls  bool    // the restarted rank has polls to replay
	}{
		{"accept-order", []string{testenv.Artifact(t, "build/apps/ticket"), "--rounds", "3000", "--pause-us", "1000"}, 0, 8 << 10, false},
		{"polls", farm(), 0, 64 << 10, true},
		{"epoll", farm("--wait", "epoll"), 0, 64 << 10, true},
		// The workers' first connects are refused until the master
		// listens: the restarted worker must be refused as often, and
		// print the same count (radic run compares what it regenerates).
		{"connect-retries", farm("--listen-delay-ms", "1000"), 1, 32, false},
		// The same on non-blocking sockets, the strict POSIX way: any
		// errno but EINPROGRESS from connect is fatal, refusals come
		// through SO_ERROR (radic's dial, made blocking, had said
		// ECONNREFUSED at once and the worker died).
		{"connect-retries-nonblocking", farm("--listen-delay-ms", "1000", "--nonblocking-connect"), 1, 32, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := append([]string{"--np", "4", "--tag-output", "--recovery", "--lib", testenv.Artifact(t, "lib/libradic.so"), "--"}, tc.args...)
			code, out := c.runJob(run...)
			want := lines(out)
			if code != 0 || want == "" {
				t.Fatalf("fault-free run: status %d, output:\n%s", code, out)
			}
			// The count of tries differs from run to run: each job
			// is checked against itself (radic run stops the job if
			// the restarted rank prints another), and its digest
			// against the fault-free run's.
			want = tries.ReplaceAllString(want, "")
			for i := range 3 {
				c := c.with(t)
				base := c.logBytes(tc.rank + 1)
				out, wait := c.startJob(run...)
				clustertest.WaitRanks(t, c.dir, 4)
				c.waitLogged(tc.rank+1, base, tc.logged)
				if o, err := c.radic("fault", "kill-rank", strconv.Itoa(tc.rank)); err != nil {
					t.Fatalf("kill-rank %d: %v\n%s", tc.rank, err, o)
				}
				code := waitJob(t, wait)
				got := lines(out.String())
				if strings.HasPrefix(tc.name, "connect-retries") {
					n := ""
					for _, m := range tries.FindAllStringSubmatch(got, -1) {
						if m[1] == "1" {
							n = m[2]
						}
					}
					if n == "" || n == "1" {
						t.Fatalf("job %d: rank 1's first connect was not refused (want a retry to replay):\n%s", i, out.String())
					}
					got = tries.ReplaceAllString(got, "")
				}
				if code != 0 || got != want {
					t.Fatalf("job %d: status %d, output:\n%s\nwant:\n%s\nwhole output:\n%s", i, code, got, want, out.String())
				}
				if ev := fmt.Sprintf("rank %d restarted on node %d", tc.rank, tc.rank); !strings.Contains(out.String(), ev) {
					t.Fatalf("job %d: no recovery event for rank %d:\n%s", i, tc.rank, out.String())
				}
				if _, log := c.replayed(tc.rank); tc.polls && !regexp.MustCompile(`, [1-9]\d* polls`).MatchString(log) {
					t.Fatalf("job %d: the restarted rank replayed no polls; its shim's log:\n%s", i, log)
				}
			}
		})
	}
}

// TestReplayFinishedPeers: the farm's master pauses after its last result,
// while its workers exit. Their daemons record them as finished (exited 0,
// output delivered), and:
//
//   - kill-rank 0 in the pause: the restarted master accepts its workers'
//     connections again, though the workers will never resume them (a
//     stand-in brings each to its accept), replays the results from its
//     log, prints the fault-free digest, and its recovery completes (it
//     waited for its finished peers until the reconnect phase timed out).
//   - kill-node of a worker's node in the pause: nothing of the finished
//     worker is left to regenerate, so it is not restarted (it was
//     re-executed, could not reach the master's closed listener, and
//     failed the job).
func TestReplayFinishedPeers(t *testing.T) {
	c := newNetnsCluster(t, 4, "--spares", "1", "--fence-kill")
	c.dumpReplayLogs()
	farm := func(pause string) []string {
		return []string{"--np", "4", "--tag-output", "--recovery", "--lib", testenv.Artifact(t, "lib/libradic.so"), "--",
			testenv.Artifact(t, "build/apps/farm"), "--tasks", "64", "--width", "256", "--maxiter", "2000", "--pause-ms", pause}
	}
	code, out := c.runJob(farm("0")...)
	want := appLines(out)
	if code != 0 || !strings.Contains(want, "digest=") {
		t.Fatalf("fault-free run: status %d, output:\n%s", code, out)
	}
	// waitFinished waits until node 0's radicd says ranks 1-3 finished.
	waitFinished := func(c *netnsCluster, out *lockedBuffer) {
		t.Helper()
		job := clustertest.WaitRanks(t, c.dir, 4)
		for end := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("ranks 1-3 not finished after 30 s:\n%s", out.String())
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			jr, err := c.client(0).Recovery(ctx, job.ID)
			cancel()
			n := 0
			for _, l := range jr.Ranks {
				if l.Finished && l.Rank > 0 && l.Exit != nil && l.Exit.Code == 0 {
					n++
				}
			}
			if err == nil && n == 3 {
				return
			}
		}
	}
	for _, tc := range []struct{ name, fault, node, event string }{
		{"kill-rank", "kill-rank", "0", "rank 0 restarted on node 0"},
		{"kill-node", "kill-node", "2", "rank 2 had finished: nothing to restart"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := c.with(t)
			if tc.fault == "kill-node" {
				c = newNetnsCluster(t, 4, "--spares", "1", "--fence-kill")
				c.dumpReplayLogs()
			}
			out, wait := c.startJob(farm("4000")...)
			waitFinished(c, out)
			if o, err := c.radic("fault", tc.fault, tc.node); err != nil {
				t.Fatalf("%s %s: %v\n%s", tc.fault, tc.node, err, o)
			}
			code := waitJob(t, wait)
			if got := appLines(out.String()); code != 0 || got != want {
				t.Fatalf("status %d, output:\n%s\nwant:\n%s\nwhole output:\n%s", code, got, want, out.String())
			}
			if !strings.Contains(out.String(), tc.event) {
				t.Fatalf("no %q in the output:\n%s", tc.event, out.String())
			}
			if tc.fault == "kill-rank" {
				if _, log := c.replayed(0); !strings.Contains(log, "has finished: a stand-in brings it to the app") {
					t.Fatalf("the restarted master did not settle its finished peers' connections; its shim's log:\n%s", log)
				}
			}
		})
	}
}
