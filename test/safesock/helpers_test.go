// Package safesock_test holds the system tests of safe sockets (issue 4):
// two processes of one job, both under radic, keep their TCP connections
// across link cuts, partitions, a frozen peer and an address change of
// either side; the application sees a delay, never an error, a lost or a
// duplicated byte. Connections to programs without radic stay plain TCP.
//
// Each cluster test brings up a netns cluster of its own (its own state
// directory, name and subnet, removed in t.Cleanup even when the test
// fails), runs build/apps/stream (or jacobi, farm, iperf3) with `radic run`,
// injects faults mid-run with `radic fault`, and compares what the ranks
// print with a bare run without faults (stream's digest depends only on its
// arguments). A failing test logs the job's output, the cluster state, the
// radicd logs and the fault log.
//
// Unless said otherwise, rank 0 (the side that listens and accepts, "the
// receiver" in the test names) runs on node 0 and rank 1 (the side that
// connects, "the sender") on node 1; on every stream connection both
// directions carry data at once.
//
// Settings, from the environment:
//
//	RADIC_SAFESOCK_BARE=1     run every rank bare (`radic run --no-radic`):
//	                          shows what plain TCP survives by itself (short
//	                          cuts, freezes, partitions) and what it cannot
//	                          (an address change), which must then fail.
//	RADIC_SAFESOCK_DAEMONS=M  the radicd of the test clusters: "default"
//	                          runs radicd as `radic cluster up` does (its
//	                          own detection settings; a node cut off from
//	                          the ring is declared dead and fences itself,
//	                          but with --fence-kill off it keeps its ranks);
//	                          "tolerant" gives radicd a 30 s heartbeat
//	                          timeout, so that no node is ever declared dead;
//	                          "none" starts no radicd (then nothing is
//	                          managed: the shim needs its node's radicd).
//	RADIC_TEST_STREAM_BYTES=N bytes per connection and direction of the
//	                          one-connection streams (K/M/G suffixes). The
//	                          default is 256M so that the package runs in a
//	                          few minutes on 2 cores; 1G (the figure)
//	                          with RADIC_SOAK set (`make soak`).
//
// The test binary doubles as a bare stream peer, written in Go from stream's
// specification (see helperMain and peer_test.go).
package safesock_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/cluster"
	"github.com/radic-project/radic/internal/clustertest"
	"github.com/radic-project/radic/internal/testenv"
)

func TestMain(m *testing.M) {
	if h := os.Getenv("RADIC_TEST_HELPER"); h != "" {
		os.Exit(helperMain(h))
	}
	os.Exit(m.Run())
}

// helperMain runs one of the in-node programs.
func helperMain(mode string) int {
	switch mode {
	case "streampeer":
		return peerMain()
	}
	fmt.Fprintln(os.Stderr, "unknown RADIC_TEST_HELPER", mode)
	return 2
}

// bare reports whether the ranks run without libradic.so.
func bare() bool { return os.Getenv("RADIC_SAFESOCK_BARE") != "" }

// daemons is the radicd setting of the test clusters.
func daemons(t *testing.T) string {
	switch d := os.Getenv("RADIC_SAFESOCK_DAEMONS"); d {
	case "", "default":
		return "default"
	case "tolerant", "none":
		return d
	default:
		t.Fatalf("RADIC_SAFESOCK_DAEMONS=%q: want tolerant, default or none", d)
		return ""
	}
}

// parseSize parses 256M, 1G, 4096.
func parseSize(s string) (int64, error) {
	mul := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mul = 1 << 10
	case strings.HasSuffix(s, "M"):
		mul = 1 << 20
	case strings.HasSuffix(s, "G"):
		mul = 1 << 30
	}
	if mul > 1 {
		s = s[:len(s)-1]
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a size (e.g. 256M)", s)
	}
	return v * mul, nil
}

// streamBytes is the size of the one-connection streams.
func streamBytes(t *testing.T) int64 {
	t.Helper()
	if s := os.Getenv("RADIC_TEST_STREAM_BYTES"); s != "" {
		v, err := parseSize(s)
		if err != nil {
			t.Fatalf("RADIC_TEST_STREAM_BYTES: %v", err)
		}
		return v
	}
	if testenv.Long() {
		return 1 << 30
	}
	return 256 << 20
}

var (
	netnsOnce sync.Once
	netnsErr  error
)

// requireNetns skips the test, saying why, when netns clusters cannot be
// built here: not root, a tool missing, or no network namespaces.
func requireNetns(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip")
	testenv.RequireCommand(t, "nft")
	netnsOnce.Do(func() {
		name := fmt.Sprintf("rsafeprobe%d", os.Getpid())
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			netnsErr = fmt.Errorf("ip netns add: %v: %s", err, bytes.TrimSpace(out))
			return
		}
		exec.Command("ip", "netns", "del", name).Run()
	})
	if netnsErr != nil {
		t.Skipf("network namespaces are not available: %v", netnsErr)
	}
}

// tc is one test's cluster.
type tc struct {
	t     *testing.T
	dir   string // RADIC_STATE_DIR
	name  string
	radic string // bin/radic
	env   []string
}

// newCluster brings up a netns cluster of its own for t (radicd as
// RADIC_SAFESOCK_DAEMONS says) and removes it when t ends.
func newCluster(t *testing.T, nodes int) *tc {
	t.Helper()
	requireNetns(t)
	c := &tc{t: t, radic: testenv.Artifact(t, "bin/radic")}
	testenv.Artifact(t, "build/apps/stream")
	if !bare() {
		testenv.Lib(t)
	}
	// A short directory: radicd's notify socket path must fit in 107 bytes.
	dir, err := os.MkdirTemp("", "rs")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	c.name = fmt.Sprintf("s%05x", rand.IntN(1<<20))
	c.env = append(os.Environ(), "RADIC_STATE_DIR="+c.dir)
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpLogs()
		}
		out, err := c.radicErr("cluster", "down")
		if err != nil {
			t.Errorf("cleanup: radic cluster down: %v\n%s", err, out)
		}
		os.RemoveAll(dir)
	})
	args := []string{"cluster", "up", "--mode", cluster.ModeNetns, "--name", c.name, "--nodes", strconv.Itoa(nodes)}
	switch daemons(t) {
	case "none":
		args = append(args, "--no-daemons")
	case "tolerant":
		// No fault of these tests may get a node declared dead or
		// fenced: recovery is a later stage, and these tests are about
		// the connections. (Fence timeout: 30 s + 5 s - 2 periods.)
		w := filepath.Join(dir, "radicd-tolerant")
		script := fmt.Sprintf("#!/bin/sh\nexec %s --heartbeat-timeout 30s --probe-timeout 5s \"$@\"\n", testenv.Artifact(t, "bin/radicd"))
		if err := os.WriteFile(w, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--radicd", w)
	}
	for try := 0; ; try++ {
		sub := fmt.Sprintf("10.%d.0.0/16", 100+rand.IntN(150))
		out, err := c.radicErr(append(args, "--subnet", sub)...)
		if err == nil {
			t.Logf("cluster up (%s, daemons %s): %s", c.name, daemons(t), lastLine(out))
			break
		}
		if try < 5 && strings.Contains(out, "overlaps a route") {
			continue
		}
		t.Fatalf("radic cluster up: %v\n%s", err, out)
	}
	return c
}

// with returns c for a subtest: its jobs, faults and failures belong to t.
func (c *tc) with(t *testing.T) *tc {
	cc := *c
	cc.t = t
	return &cc
}

func lastLine(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[len(l)-1]
}

func (c *tc) dumpLogs() {
	s, err := cluster.Load(c.dir)
	if err != nil {
		c.t.Logf("no cluster state to dump: %v", err)
		return
	}
	b, _ := json.MarshalIndent(s, "", "  ")
	c.t.Logf("cluster state at failure:\n%s", b)
	for _, n := range s.Nodes {
		if b, err := os.ReadFile(filepath.Join(n.StateDir, "radicd.log")); err == nil && len(b) > 0 {
			c.t.Logf("radicd.log of node %d:\n%s", n.ID, tailBytes(b, 20000))
		}
	}
	if b, err := os.ReadFile(filepath.Join(c.dir, "faults.log")); err == nil {
		c.t.Logf("faults.log:\n%s", b)
	}
}

func tailBytes(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	return append([]byte("...\n"), b[len(b)-n:]...)
}

// radicErr runs radic and returns its combined output.
func (c *tc) radicErr(args ...string) (string, error) {
	return clustertest.Radic(c.radic, c.env, args...)
}

// must runs radic and fails the test if it fails.
func (c *tc) must(args ...string) string {
	c.t.Helper()
	return clustertest.Must(c.t, c.radic, c.env, args...)
}

// fault injects a fault (`radic fault ARGS`) and logs what radic did.
func (c *tc) fault(j *job, args ...string) {
	c.t.Helper()
	out := c.must(append([]string{"fault"}, args...)...)
	at := ""
	if j != nil {
		at = fmt.Sprintf(" at +%v", time.Since(j.launch).Round(time.Millisecond))
	}
	c.t.Logf("fault%s: %s", at, strings.TrimSpace(out))
}

func (c *tc) state() *cluster.State {
	c.t.Helper()
	s, err := cluster.Load(c.dir)
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}

// addr is node id's current address.
func (c *tc) addr(id int) string {
	c.t.Helper()
	n, err := c.state().Node(id)
	if err != nil {
		c.t.Fatal(err)
	}
	return n.Addr
}

// waitHealed waits until no fault is active.
func (c *tc) waitHealed(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for len(c.state().Faults) > 0 {
		if time.Now().After(deadline) {
			c.t.Fatalf("faults still active after %v: %+v", timeout, c.state().Faults)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitRanks waits until the newest job has n running ranks in the state.
func (c *tc) waitRanks(n int) cluster.Job {
	c.t.Helper()
	return clustertest.WaitRanks(c.t, c.dir, n)
}

// self is the test binary, which runs the in-node helpers.
func self(t *testing.T) string {
	p, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// runOpts are the `radic run` settings of a job.
type runOpts struct {
	np    int
	nodes string   // --nodes; "" for every node
	bare  bool     // --no-radic even when the package runs under radic
	grace string   // --grace
	env   []string // more environment for the ranks
	what  string   // a name for the logs
}

// job is a `radic run` in the background, its output tagged by rank.
type job struct {
	t      *testing.T
	what   string
	cmd    *exec.Cmd
	out    *testenv.Buffer
	done   chan struct{}
	err    error
	launch time.Time
	// stalled, if set, is called when the job has not ended in time,
	// before it is stopped: what it logs is what a hang looked like.
	stalled func()
}

// start launches `radic run ... --tag-output -- ARGV...`. The job is
// stopped, and on failure its output logged, when the test ends.
func (c *tc) start(o runOpts, argv ...string) *job {
	c.t.Helper()
	args := []string{"run", "--np", strconv.Itoa(o.np), "--tag-output"}
	if o.nodes != "" {
		args = append(args, "--nodes", o.nodes)
	}
	if o.bare || bare() {
		args = append(args, "--no-radic")
	}
	if o.grace != "" {
		args = append(args, "--grace", o.grace)
	}
	args = append(append(args, "--"), argv...)
	cmd := exec.Command(c.radic, args...)
	cmd.Env = append(append([]string(nil), c.env...), o.env...)
	cmd.WaitDelay = time.Second // ranks orphaned by a killed radic keep its output pipe
	j := &job{t: c.t, what: o.what, cmd: cmd, out: new(testenv.Buffer), done: make(chan struct{})}
	if j.what == "" {
		j.what = filepath.Base(argv[0])
	}
	cmd.Stdout, cmd.Stderr = j.out, j.out
	j.launch = time.Now()
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.t.Logf("started %s: radic %s", j.what, strings.Join(args, " "))
	go func() { j.err = cmd.Wait(); close(j.done) }()
	c.t.Cleanup(func() {
		if !j.ended() {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-j.done:
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				<-j.done
			}
		}
		if c.t.Failed() {
			c.t.Logf("output of %s (radic run, %v):\n%s", j.what, j.err, summarize(j.out.String()))
		}
	})
	return j
}

// summarize drops all but the last three progress lines of each rank from
// a job's output.
func summarize(out string) string {
	lines := strings.Split(out, "\n")
	left := map[string]int{}
	keep := make([]bool, len(lines))
	dropped := 0
	for i := len(lines) - 1; i >= 0; i-- {
		m := progressRE.FindStringSubmatch(lines[i])
		if m == nil || left[m[1]] < 3 {
			keep[i] = true
			if m != nil {
				left[m[1]]++
			}
		} else {
			dropped++
		}
	}
	var b strings.Builder
	if dropped > 0 {
		fmt.Fprintf(&b, "(%d earlier progress lines left out)\n", dropped)
	}
	for i, l := range lines {
		if keep[i] {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return strings.TrimRight(b.String(), "\n")
}

func (j *job) ended() bool {
	select {
	case <-j.done:
		return true
	default:
		return false
	}
}

// wait waits for the job's end and returns its exit status, or -1 when it
// did not end within timeout (it is then stopped). Bare, no job is given
// more than a minute: what bare TCP does not survive hangs.
func (j *job) wait(timeout time.Duration) int {
	if bare() && timeout > time.Minute {
		timeout = time.Minute
	}
	select {
	case <-j.done:
	case <-time.After(timeout):
		j.t.Errorf("%s did not end within %v (stopping it)", j.what, timeout)
		if j.stalled != nil {
			j.stalled()
		}
		j.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-j.done:
		case <-time.After(30 * time.Second):
			j.cmd.Process.Kill()
			<-j.done
		}
		return -1
	}
	var ee *exec.ExitError
	if errors.As(j.err, &ee) {
		return ee.ExitCode()
	}
	if j.err != nil {
		j.t.Errorf("%s: %v", j.what, j.err)
		return -1
	}
	return 0
}

// waitFor waits until the job's output matches re, and returns the match.
// It fails the test when the job ends first or after timeout.
func (j *job) waitFor(re *regexp.Regexp, timeout time.Duration) []string {
	j.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if m := re.FindStringSubmatch(j.out.String()); m != nil {
			return m
		}
		if j.ended() {
			j.t.Fatalf("%s ended (%v) before its output matched %q", j.what, j.err, re)
		}
		if time.Now().After(deadline) {
			j.t.Fatalf("%s: no output matching %q within %v", j.what, re, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var progressRE = regexp.MustCompile(`\[rank (\d+)\] stream: rank \d+: ([\d.]+)/([\d.]+) MiB received`)

// waitReceived waits until rank has received at least mib MiB, by its
// progress lines; it fails the test if the job ends first.
func (j *job) waitReceived(rank int, mib float64, timeout time.Duration) {
	j.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := -1.0
		for _, m := range progressRE.FindAllStringSubmatch(j.out.String(), -1) {
			if m[1] == strconv.Itoa(rank) {
				got, _ = strconv.ParseFloat(m[2], 64)
			}
		}
		if got >= mib {
			j.t.Logf("rank %d has received %.1f MiB at +%v", rank, got, time.Since(j.launch).Round(time.Millisecond))
			return
		}
		if j.ended() {
			j.t.Fatalf("%s ended (%v) before rank %d had received %.1f MiB: the fault would not land mid-stream (make the stream longer)",
				j.what, j.err, rank, mib)
		}
		if time.Now().After(deadline) {
			j.t.Fatalf("rank %d did not receive %.1f MiB within %v (last progress: %.1f MiB)", rank, mib, timeout, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mustRun fails the test when the job has ended already: the fault about to
// be injected would not land mid-run.
func (j *job) mustRun(what string) {
	j.t.Helper()
	if j.ended() {
		j.t.Fatalf("%s ended (%v) before %s: the run is too short for this test (make it longer)", j.what, j.err, what)
	}
}

// ---- stream ----

// streamSpec is one stream run's arguments.
type streamSpec struct {
	conns int
	bytes int64 // per connection and direction
	mode  string
	seed  uint64
	secs  float64 // nominal duration: sets --rate (0: no cap)
	extra []string
}

// refArgs are the arguments the digest depends on.
func (s streamSpec) refArgs() []string {
	return []string{"--conns", strconv.Itoa(s.conns), "--bytes", strconv.FormatInt(s.bytes, 10),
		"--seed", strconv.FormatUint(s.seed, 10)}
}

func (s streamSpec) args() []string {
	a := append(s.refArgs(), "--mode", s.mode, "--progress", "0.2")
	if s.secs > 0 {
		a = append(a, "--rate", strconv.FormatInt(int64(float64(s.bytes)*float64(s.conns)/s.secs), 10))
	}
	return append(a, s.extra...)
}

// totalMiB is what each rank receives, in MiB.
func (s streamSpec) totalMiB() float64 { return float64(s.bytes) * float64(s.conns) / (1 << 20) }

// timeout is how long the run may take: its nominal duration, the faults,
// and room for a slow shim (16 MiB/s) and slow resumption.
func (s streamSpec) timeout(faults time.Duration) time.Duration {
	return time.Duration(s.secs*float64(time.Second)) + faults + 90*time.Second +
		time.Duration(float64(s.bytes)*float64(s.conns)/(16<<20)*float64(time.Second))
}

var okRE = regexp.MustCompile(`(?m)^\[rank (\d+)\] (stream ok rank \d+ conns \d+ bytes \d+ digest [0-9a-f]{16})$`)

// okLines returns each rank's "stream ok" line.
func okLines(out string) map[int]string {
	got := map[int]string{}
	for _, m := range okRE.FindAllStringSubmatch(out, -1) {
		r, _ := strconv.Atoi(m[1])
		got[r] = m[2]
	}
	return got
}

var (
	refMu    sync.Mutex
	refCache = map[string]map[int]string{}
)

// reference runs the stream bare on loopback, without a cluster and
// without faults, two processes on 127.0.0.1, and returns each rank's
// "stream ok" line. Computed once per test binary and set of arguments.
func reference(t *testing.T, s streamSpec) map[int]string {
	t.Helper()
	key := strings.Join(s.refArgs(), " ")
	refMu.Lock()
	defer refMu.Unlock()
	if r, ok := refCache[key]; ok {
		return r
	}
	t0 := time.Now()
	r, err := loopbackStream(t, s.refArgs(), 2, nil)
	if err != nil {
		t.Fatalf("bare reference run of stream %s: %v", key, err)
	}
	t.Logf("reference (bare, loopback, %v): %v", time.Since(t0).Round(time.Millisecond), r)
	refCache[key] = r
	return r
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// loopbackStream runs an np-rank stream on 127.0.0.1, bare (env may add an
// LD_PRELOAD), and returns each rank's "stream ok" line; an error carries
// every rank's exit status and output.
func loopbackStream(t *testing.T, args []string, np int, env []string) (map[int]string, error) {
	t.Helper()
	prog := testenv.Artifact(t, "build/apps/stream")
	base := freePort(t)
	peers := make([]string, np)
	for i := range peers {
		peers[i] = "127.0.0.1:" + strconv.Itoa(base+i)
	}
	clean := cleanEnv()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	type res struct {
		out, errOut bytes.Buffer
		err         error
	}
	rs := make([]res, np)
	var wg sync.WaitGroup
	for r := range np {
		cmd := exec.CommandContext(ctx, prog, args...)
		cmd.Env = append(append(clean, "RADIC_RANK="+strconv.Itoa(r), "RADIC_SIZE="+strconv.Itoa(np),
			"RADIC_PEERS="+strings.Join(peers, ",")), env...)
		cmd.Stdout, cmd.Stderr = &rs[r].out, &rs[r].errOut
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		wg.Add(1)
		go func() { defer wg.Done(); rs[r].err = cmd.Wait() }()
	}
	wg.Wait()
	lines := map[int]string{}
	var fail []string
	for r := range rs {
		line := strings.TrimSpace(rs[r].out.String())
		if rs[r].err != nil || !strings.HasPrefix(line, "stream ok rank "+strconv.Itoa(r)+" ") {
			fail = append(fail, fmt.Sprintf("rank %d: %v\nstdout: %s\nstderr: %s", r, rs[r].err, line, tailBytes(rs[r].errOut.Bytes(), 2000)))
		}
		lines[r] = line
	}
	if fail != nil {
		return lines, errors.New(strings.Join(fail, "\n"))
	}
	return lines, nil
}

// startStream runs stream as a two-rank job on nodes 0 (rank 0) and 1.
func (c *tc) startStream(s streamSpec, env ...string) *job {
	c.t.Helper()
	return c.start(runOpts{np: 2, nodes: "0,1", env: env, what: "stream"},
		append([]string{testenv.Artifact(c.t, "build/apps/stream")}, s.args()...)...)
}

// checkStream asserts that the job exited 0 and that every rank printed
// the reference's "stream ok" line.
func checkStream(t *testing.T, j *job, code int, ref map[int]string) {
	t.Helper()
	if code != 0 {
		t.Errorf("stream job exit status %d, want 0", code)
	}
	got := okLines(j.out.String())
	for r := 0; r < len(ref); r++ {
		switch {
		case got[r] == "":
			t.Errorf("rank %d printed no \"stream ok\" line; want %q", r, ref[r])
		case got[r] != ref[r]:
			t.Errorf("rank %d: %q, want %q (bare run, no fault)", r, got[r], ref[r])
		}
	}
	// A resume must not wait on a poll of the old socket: the break's
	// shutdown ends every such poll at once. (A poll that reported the
	// break while it still held the old socket waited, with the hold, for
	// the lock the resume held while it waited for the hold to go: a
	// second each time, the peer gave the resume up, and after a restart
	// a second resume was refused. Every readdress of a poll-driven
	// stream did it.)
	if strings.Contains(j.out.String(), "a wait on its old socket did not end") {
		t.Errorf("a resume waited for a poll on the old socket:\n%s", j.out.String())
	}
	if !t.Failed() {
		t.Logf("both ranks: same digest as the bare run (%v)", time.Since(j.launch).Round(time.Millisecond))
	}
	if bare() && t.Failed() {
		t.Logf("(bare mode: the ranks ran without libradic.so)")
	}
}

// cleanEnv is this process's environment without LD_PRELOAD and radic's
// variables: a bare process outside any job.
func cleanEnv() []string {
	var clean []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LD_PRELOAD=") && !strings.HasPrefix(kv, "RADIC_") {
			clean = append(clean, kv)
		}
	}
	return clean
}

// execStream is a bare stream process on the host, stopped after two
// minutes.
func execStream(t *testing.T, prog string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Env = cleanEnv()
	cmd.WaitDelay = time.Second
	return cmd
}

// dumpStall logs, for a job that hangs, every node's TCP sockets with their
// queues and timers (`ss -tnie` in its namespace) and what each thread of
// the ranks is doing (state, kernel wait channel, system call): whether
// bytes sit at the receiver, at the sender, or nowhere.
func (c *tc) dumpStall(jb cluster.Job) {
	for _, n := range c.state().Nodes {
		out, err := exec.Command("ip", "netns", "exec", n.Netns, "ss", "-tnie").CombinedOutput()
		c.t.Logf("sockets of node %d (%v):\n%s", n.ID, err, out)
	}
	for _, r := range jb.Ranks {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", r.Proc.Pid))
		var b strings.Builder
		for _, task := range tasks {
			comm, _ := os.ReadFile(task + "/comm")
			wchan, _ := os.ReadFile(task + "/wchan")
			sc, _ := os.ReadFile(task + "/syscall")
			fmt.Fprintf(&b, "%s %s wchan=%s syscall=%s\n", filepath.Base(task), strings.TrimSpace(string(comm)), wchan, strings.TrimSpace(string(sc)))
			b.WriteString(pollSet(r.Proc.Pid, string(sc)))
		}
		fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", r.Proc.Pid))
		for _, fd := range fds {
			if l, err := os.Readlink(fd); err == nil {
				fmt.Fprintf(&b, "fd %s -> %s\n", filepath.Base(fd), l)
			}
		}
		c.t.Logf("rank %d (pid %d) threads and fds:\n%s", r.Rank, r.Proc.Pid, b.String())
		c.t.Logf("rank %d (pid %d) stacks:\n%s", r.Rank, r.Proc.Pid, stacks(r.Proc.Pid))
	}
}

// stacks is every thread's stack of process pid, from gdb when there is
// one: the system call a thread is in does not say who made it (a
// blocking read of the app's, a wait of the shim's, a Go runtime thread).
func stacks(pid int) string {
	gdb, err := exec.LookPath("gdb")
	if err != nil {
		return "(no gdb)"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, gdb, "-batch", "-nx", "-p", strconv.Itoa(pid),
		"-ex", "thread apply all bt 25").CombinedOutput()
	if err != nil {
		return fmt.Sprintf("gdb: %v\n%s", err, out)
	}
	return string(out)
}

// pollSet decodes the fd set of a thread blocked in poll or ppoll (x86-64
// numbers 7 and 271) from the process's memory: which files the wait
// really holds, since a safe socket's wait may hold its wake eventfd.
func pollSet(pid int, syscallLine string) string {
	f := strings.Fields(syscallLine)
	if len(f) < 3 || (f[0] != "7" && f[0] != "271") {
		return ""
	}
	addr, err1 := strconv.ParseUint(strings.TrimPrefix(f[1], "0x"), 16, 64)
	n, err2 := strconv.ParseUint(strings.TrimPrefix(f[2], "0x"), 16, 64)
	if err1 != nil || err2 != nil || n > 1024 {
		return ""
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return fmt.Sprintf("  poll set unreadable: %v\n", err)
	}
	defer mem.Close()
	buf := make([]byte, 8*n)
	if _, err := mem.ReadAt(buf, int64(addr)); err != nil {
		return fmt.Sprintf("  poll set unreadable: %v\n", err)
	}
	var b strings.Builder
	for i := uint64(0); i < n; i++ {
		e := buf[8*i:]
		fd := int32(binary.LittleEndian.Uint32(e))
		events, revents := binary.LittleEndian.Uint16(e[4:]), binary.LittleEndian.Uint16(e[6:])
		file, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd))
		fmt.Fprintf(&b, "  poll fd %d (%s) events=%#x revents=%#x\n", fd, file, events, revents)
	}
	return b.String()
}
