package safesock_test

import (
	"context"
	"fmt"
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

var appDigestRE = regexp.MustCompile(`(jacobi|farm) .*digest=[0-9a-f]{16}`)

// appReference runs an app as one rank on the host, bare and outside any
// cluster, and returns its digest line.
func appReference(t *testing.T, app string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, testenv.Artifact(t, "build/apps/"+app), args...)
	cmd.Env = append(cleanEnv(), "RADIC_SIZE=1", "RADIC_RANK=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v (single host): %v\n%s", app, args, err, out)
	}
	d := appDigestRE.FindString(string(out))
	if d == "" {
		t.Fatalf("%s printed no digest line:\n%s", app, out)
	}
	t.Logf("reference (single host, bare, %v): %s", time.Since(t0).Round(time.Millisecond), d)
	return d
}

// appFaults runs app as four ranks on four nodes and, during the run, cuts
// node 1's link for 1 s, then node 3's, then gives node 0 (rank 0: the
// reduction root of jacobi, the master of farm) a new address. The job
// must end with exit 0 and the single-host digest. The apps' sizes make
// them last 5-9 s on 2 cores, so that every fault lands mid-run
// (the test fails, saying so, when the run ended too early).
func appFaults(t *testing.T, app string, args ...string) {
	ref := appReference(t, app, args...)
	c := newCluster(t, 4)
	j := c.start(runOpts{np: 4, what: app}, append([]string{testenv.Artifact(t, "build/apps/"+app)}, args...)...)
	jb := c.waitRanks(4)
	j.stalled = func() { c.dumpStall(jb) }
	time.Sleep(time.Second)
	for _, n := range []string{"1", "3"} {
		j.mustRun("cut-link " + n)
		c.fault(j, "cut-link", n, "--for", "1s")
		c.waitHealed(10 * time.Second)
		time.Sleep(200 * time.Millisecond)
	}
	j.mustRun("readdress 0")
	c.fault(j, "readdress", "0")
	code := j.wait(3 * time.Minute)
	got := appDigestRE.FindString(j.out.String())
	if code != 0 || got != ref {
		t.Errorf("%s on 4 nodes with two cuts and a readdress: exit status %d, %q; want 0 and %q (single host)", app, code, got, ref)
	} else {
		t.Logf("same digest as the single-host run (%v)", time.Since(j.launch).Round(time.Millisecond))
	}
}

// Jacobi (halo exchange over non-blocking sockets and poll, a
// max-allreduce through rank 0) across two cuts and a readdress.
func TestJacobiFaults(t *testing.T) {
	appFaults(t, "jacobi", "--n", "400", "--iters", "12000")
}

// The task farm (blocking sockets and select) across two cuts and a
// readdress of the master's node.
func TestFarmFaults(t *testing.T) {
	appFaults(t, "farm", "--tasks", "1000", "--width", "1000", "--maxiter", "20000")
}

// listening reports whether process pid's network namespace has a TCP
// socket listening on port (read from /proc, so that the check does not
// open a connection: iperf3 -1 would take it for its one client).
func listening(pid, port int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		fs := strings.Fields(line)
		if len(fs) > 3 && fs[3] == "0A" && strings.HasSuffix(fs[1], fmt.Sprintf(":%04X", port)) {
			return true
		}
	}
	return false
}

// Unmodified iperf3, server (rank 0, node 0) and client (rank 1, node 1) in
// one job under radic, `-t 8`, with a 3 s cut of the server's link in the
// middle: iperf3 completes and both exit 0.
func TestIperf3Cut(t *testing.T) {
	testenv.RequireCommand(t, "iperf3")
	c := newCluster(t, 2)
	gate := filepath.Join(t.TempDir(), "go")
	script := `p=${RADIC_PEERS%%,*}; ip=${p%:*}; port=${p##*:}
if [ "$RADIC_RANK" = 0 ]; then exec iperf3 -s -1 -B "$ip" -p "$port" --forceflush; fi
while [ ! -e "$RADIC_TEST_GATE" ]; do sleep 0.05; done
exec iperf3 -c "$ip" -p "$port" -t 8 --forceflush`
	j := c.start(runOpts{np: 2, nodes: "0,1", env: []string{"RADIC_TEST_GATE=" + gate}, what: "iperf3"}, "/bin/sh", "-c", script)
	jb := c.waitRanks(2)
	_, ps, _ := strings.Cut(jb.Ranks[0].Addr, ":")
	port, _ := strconv.Atoi(ps)
	for deadline := time.Now().Add(20 * time.Second); !listening(jb.Ranks[0].Proc.Pid, port); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) || j.ended() {
			t.Fatalf("the iperf3 server (rank 0, pid %d) did not listen on port %d within 20 s", jb.Ranks[0].Proc.Pid, port)
		}
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// The cut comes once the client has reported its third second. Its
	// intervals drift under load ("1.00-2.01", "2.01-3.00"), and one
	// that a stall stretched can jump past it ("2.00-4.87"), so an
	// interval ending at 3 s or later is matched.
	j.waitFor(regexp.MustCompile(`\[rank 1\] \[\s*\d+\]\s+\d+\.\d+-([3-9]|\d\d+)\.\d+\s+sec`), time.Minute)
	j.mustRun("the cut")
	c.fault(j, "cut-link", "0", "--for", "3s")
	j.stalled = func() { c.dumpStall(jb) }
	code := j.wait(time.Minute) // 8 s of traffic and a 3 s cut
	out := j.out.String()
	if code != 0 || !strings.Contains(out, "[rank 1] iperf Done.") {
		t.Errorf("iperf3 across a 3 s cut: exit status %d (want 0), client done: %v", code, strings.Contains(out, "[rank 1] iperf Done."))
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "[rank 1]") && (strings.Contains(l, "sender") || strings.Contains(l, "receiver")) {
			t.Logf("%s", l)
		}
	}
}

// Jacobi while the nodes are readdressed one after another, 200-500 ms
// apart: every readdress breaks all of a node's connections at once and
// its peers resume them within milliseconds, while the ranks poll.
func TestJacobiReaddressStorm(t *testing.T) {
	ref := appReference(t, "jacobi", "--n", "400", "--iters", "30000")
	c := newCluster(t, 4)
	j := c.start(runOpts{np: 4, what: "jacobi"}, testenv.Artifact(t, "build/apps/jacobi"), "--n", "400", "--iters", "30000")
	jb := c.waitRanks(4)
	j.stalled = func() { c.dumpStall(jb) }
	time.Sleep(500 * time.Millisecond)
	for i := 0; i < 16 && !j.ended(); i++ {
		c.fault(j, "readdress", strconv.Itoa(i%4))
		time.Sleep(time.Duration(200+37*(i%9)) * time.Millisecond)
	}
	code := j.wait(2 * time.Minute)
	got := appDigestRE.FindString(j.out.String())
	if code != 0 || got != ref {
		t.Errorf("jacobi on 4 nodes across 16 readdresses: exit status %d, %q; want 0 and %q (single host)", code, got, ref)
	}
}

// A ping-pong whose waiting thread is starved of CPU (build/apps/starve:
// SCHED_IDLE beside a spinning thread, all on one CPU) while the nodes are
// readdressed in turn. The wait that a break wakes looks at its fds again
// only long after the shim has reconnected: it must then be on the new
// socket, and wake for its data.
func TestWaitAcrossSwapStarved(t *testing.T) {
	if bare() {
		t.Skip("bare mode: without radic a readdressed node is unreachable at its first address")
	}
	for _, poller := range []string{"poll", "select"} {
		t.Run(poller, func(t *testing.T) {
			c := newCluster(t, 2)
			j := c.start(runOpts{np: 2, nodes: "0,1", what: "starve"}, testenv.Artifact(t, "build/apps/starve"), "--seconds", "8", "--poller", poller)
			jb := c.waitRanks(2)
			j.stalled = func() { c.dumpStall(jb) }
			time.Sleep(time.Second)
			for i := 0; i < 6 && !j.ended(); i++ {
				c.fault(j, "readdress", strconv.Itoa(i%2))
				time.Sleep(time.Second)
			}
			code := j.wait(time.Minute)
			trips := regexp.MustCompile(`starve rank 1 trips \d+`).FindString(j.out.String())
			if code != 0 || trips == "" {
				t.Fatalf("starve (%s) across 6 readdresses: exit status %d, %q; want 0 and its count of round trips", poller, code, trips)
			}
			t.Logf("%s: %s", poller, trips)
		})
	}
}

// iperf3's wait (apps/ctlwait): one thread selects (or polls) on 16 idle
// control connections and a data connection, and reads a control
// connection said to be readable with a blocking read. Three 1 s cuts
// break the 17 connections one after another (each has its own control
// channel), so most breaks land in a wait that an earlier break already
// sent round again: a socket shut down by a break must not be reported
// readable (TestIperf3Cut hung so, in a read of its control connection).
func TestWaitAcrossBreaks(t *testing.T) {
	for _, poller := range []string{"select", "poll"} {
		t.Run(poller, func(t *testing.T) {
			c := newCluster(t, 2)
			j := c.start(runOpts{np: 2, nodes: "0,1", what: "ctlwait"}, testenv.Artifact(t, "build/apps/ctlwait"),
				"--seconds", "9", "--conns", "16", "--poller", poller)
			jb := c.waitRanks(2)
			j.stalled = func() { c.dumpStall(jb) }
			time.Sleep(time.Second)
			for i := range 3 {
				j.mustRun(fmt.Sprintf("cut %d of 3", i+1))
				c.fault(j, "cut-link", strconv.Itoa(i%2), "--for", "1s")
				c.waitHealed(10 * time.Second)
				time.Sleep(500 * time.Millisecond)
			}
			code := j.wait(time.Minute)
			out := j.out.String()
			for _, r := range []string{"0", "1"} {
				if !regexp.MustCompile(`ctlwait rank ` + r + ` bytes [1-9]\d* waits`).MatchString(out) {
					t.Errorf("rank %s printed no result line", r)
				}
			}
			if code != 0 {
				t.Fatalf("ctlwait (%s) across 3 cuts: exit status %d, want 0", poller, code)
			}
		})
	}
}
