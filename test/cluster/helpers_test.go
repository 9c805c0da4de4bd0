// Package cluster_test holds the system tests of the virtual cluster
// (`radic cluster|run|fault`) and of the test applications. Tests that need
// netns mode skip when not root; loopback-mode tests run as any user.
//
// Every test gets its own state directory, cluster name and subnet, so that
// it never touches a user's cluster or another test's, and removes its
// cluster in t.Cleanup even when it fails.
//
// The test binary doubles as the small programs the tests run inside the
// nodes (see helperMain): a TCP server that tells each client the address
// it sees, a one-shot dialer, a ticker, and a fake radicd.
package cluster_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
	case "serve":
		// Listen on our RADIC_PEERS entry; tell each client the address
		// we see it from.
		rank, _ := strconv.Atoi(os.Getenv("RADIC_RANK"))
		addr := strings.Split(os.Getenv("RADIC_PEERS"), ",")[rank]
		l, err := net.Listen("tcp4", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "serve:", err)
			return 1
		}
		fmt.Println("listening", addr)
		for {
			c, err := l.Accept()
			if err != nil {
				return 1
			}
			fmt.Fprintf(c, "peer=%s\n", c.RemoteAddr().(*net.TCPAddr).IP)
			c.Close()
		}
	case "dial":
		to, _ := time.ParseDuration(os.Getenv("RADIC_TEST_TIMEOUT"))
		c, err := net.DialTimeout("tcp4", os.Getenv("RADIC_TEST_ADDR"), to)
		if err != nil {
			fmt.Println("fail:", err)
			return 1
		}
		c.SetDeadline(time.Now().Add(to))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			fmt.Println("fail: read:", err)
			return 1
		}
		fmt.Print("ok ", line)
		return 0
	case "tick":
		// Write an increasing counter to a file, 100 times a second.
		f := os.Getenv("RADIC_TEST_FILE")
		for i := 0; ; i++ {
			os.WriteFile(f+".tmp", []byte(strconv.Itoa(i)), 0o644)
			os.Rename(f+".tmp", f)
			time.Sleep(10 * time.Millisecond)
		}
	case "radicd":
		// A stand-in radicd: record the command line, then behave as
		// RADIC_TEST_RADICD says.
		out := os.Getenv("RADIC_TEST_OUT")
		node := ""
		for i, a := range os.Args {
			if a == "--node" && i+1 < len(os.Args) {
				node = os.Args[i+1]
			}
		}
		b, _ := json.Marshal(os.Args[1:])
		os.WriteFile(filepath.Join(out, "args."+node), b, 0o644)
		switch os.Getenv("RADIC_TEST_RADICD") {
		case "fail":
			if node == "1" {
				fmt.Fprintln(os.Stderr, "radicd: cannot bind: simulated failure")
				return 3
			}
		case "notimpl":
			fmt.Fprintln(os.Stderr, "radicd: not implemented yet")
			return 1
		case "silent":
			time.Sleep(time.Hour)
		}
		c, err := net.Dial("unixgram", os.Getenv("NOTIFY_SOCKET"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "notify:", err)
			return 1
		}
		c.Write([]byte("STATUS=starting\nREADY=1\n"))
		c.Close()
		time.Sleep(time.Hour)
	}
	fmt.Fprintln(os.Stderr, "unknown RADIC_TEST_HELPER", mode)
	return 2
}

// tc is one test's cluster.
type tc struct {
	t     testing.TB
	dir   string // RADIC_STATE_DIR
	name  string
	radic string // bin/radic
	env   []string
	upOut string // what `cluster up` printed
}

// newCluster brings up a cluster of its own for t and removes it when t
// ends. extra are more `cluster up` flags.
func newCluster(t testing.TB, mode string, nodes, spares int, extra ...string) *tc {
	t.Helper()
	if mode == cluster.ModeNetns {
		testenv.RequireRoot(t)
	}
	c := &tc{t: t, radic: testenv.Artifact(t, "bin/radic")}
	// A short directory: radicd's notify socket path must fit in 107 bytes.
	dir, err := os.MkdirTemp("", "rc")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	c.name = fmt.Sprintf("t%05x", rand.IntN(1<<20))
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
	args := []string{"cluster", "up", "--mode", mode, "--name", c.name,
		"--nodes", strconv.Itoa(nodes), "--spares", strconv.Itoa(spares)}
	args = append(args, extra...)
	for try := 0; ; try++ {
		var sub string
		if mode == cluster.ModeNetns {
			sub = fmt.Sprintf("10.%d.0.0/16", 100+rand.IntN(150))
		} else {
			sub = fmt.Sprintf("127.%d.0.0/16", 100+rand.IntN(150))
		}
		out, err := c.radicErr(append(args, "--subnet", sub)...)
		if err == nil {
			c.upOut = out
			t.Logf("cluster up: %s", lastLine(out))
			break
		}
		if try < 5 && strings.Contains(out, "overlaps a route") {
			continue
		}
		t.Fatalf("radic cluster up: %v\n%s", err, out)
	}
	return c
}

func lastLine(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[len(l)-1]
}

func (c *tc) dumpLogs() {
	s, err := cluster.Load(c.dir)
	if err != nil {
		return
	}
	b, _ := json.MarshalIndent(s, "", "  ")
	c.t.Logf("state at failure:\n%s", b)
	for _, n := range s.Nodes {
		if b, err := os.ReadFile(filepath.Join(n.StateDir, "radicd.log")); err == nil && len(b) > 0 {
			c.t.Logf("radicd.log of node %d:\n%s", n.ID, b)
		}
	}
	if b, err := os.ReadFile(filepath.Join(c.dir, "faults.log")); err == nil {
		c.t.Logf("faults.log:\n%s", b)
	}
}

// cmd returns a `radic ARGS...` command for this cluster.
func (c *tc) cmd(args ...string) *exec.Cmd {
	cmd := exec.Command(c.radic, args...)
	cmd.Env = c.env
	cmd.WaitDelay = 5 * time.Second
	return cmd
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

func (c *tc) state() *cluster.State {
	c.t.Helper()
	s, err := cluster.Load(c.dir)
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}

// self is the test binary, which runs the in-node helpers.
func self(t testing.TB) string {
	p, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// job is a `radic run` in the background.
type job struct {
	cmd    *exec.Cmd
	out    *testenv.Buffer
	done   chan struct{}
	err    error
	launch time.Time
}

// start launches `radic run ARGS...` with extra environment.
func (c *tc) start(env []string, args ...string) *job {
	c.t.Helper()
	j := &job{cmd: c.cmd(append([]string{"run"}, args...)...), out: new(testenv.Buffer), done: make(chan struct{})}
	j.cmd.Env = append(j.cmd.Env, env...)
	j.cmd.WaitDelay = time.Second // ranks orphaned by a killed radic keep its output pipe
	j.cmd.Stdout, j.cmd.Stderr = j.out, j.out
	j.launch = time.Now()
	if err := j.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	go func() { j.err = j.cmd.Wait(); close(j.done) }()
	c.t.Cleanup(func() {
		select {
		case <-j.done:
		default:
			j.cmd.Process.Signal(syscall.SIGTERM)
			<-j.done
		}
	})
	return j
}

// wait waits for the job's end and returns its exit code.
func (j *job) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-j.done:
	case <-time.After(timeout):
		t.Fatalf("job did not end within %v; output so far:\n%s", timeout, j.out)
	}
	var ee *exec.ExitError
	if errors.As(j.err, &ee) {
		return ee.ExitCode()
	}
	if j.err != nil {
		t.Fatalf("job: %v", j.err)
	}
	return 0
}

// waitRanks waits until the newest job has n running ranks in the state.
func (c *tc) waitRanks(n int) cluster.Job {
	c.t.Helper()
	return clustertest.WaitRanks(c.t, c.dir, n)
}

// dial connects from node `from` to addr, inside the cluster, and returns
// the server's answer ("ok peer=IP") or the failure.
func (c *tc) dial(from int, addr string, timeout time.Duration) (string, bool) {
	c.t.Helper()
	cmd := c.cmd("run", "--np", "1", "--nodes", strconv.Itoa(from), "--", self(c.t))
	cmd.Env = append(cmd.Env, "RADIC_TEST_HELPER=dial", "RADIC_TEST_ADDR="+addr, "RADIC_TEST_TIMEOUT="+timeout.String())
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err == nil
}

// serve starts the address-reporting server as a one-rank job on node.
func (c *tc) serve(node, port int) (*job, string) {
	c.t.Helper()
	j := c.start([]string{"RADIC_TEST_HELPER=serve"}, "--np", "1", "--nodes", strconv.Itoa(node),
		"--port-base", strconv.Itoa(port), "--", self(c.t))
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(j.out.String(), "listening") {
		if time.Now().After(deadline) {
			c.t.Fatalf("server on node %d did not start:\n%s", node, j.out)
		}
		time.Sleep(10 * time.Millisecond)
	}
	n, _ := c.state().Node(node)
	return j, net.JoinHostPort(n.Addr, strconv.Itoa(port))
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
