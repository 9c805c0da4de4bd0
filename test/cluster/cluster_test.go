package cluster_test

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/cluster"
	"github.com/radic-project/radic/internal/cluster/cgroup"
	"github.com/radic-project/radic/internal/cluster/netns"
	"github.com/radic-project/radic/internal/cluster/nft"
	"github.com/radic-project/radic/internal/cluster/proc"
	"github.com/radic-project/radic/internal/testenv"
)

// A second `up` refuses; `down` removes the cluster and is idempotent.
func TestUpRefusesAndDownIsIdempotent(t *testing.T) {
	c := newCluster(t, cluster.ModeLoopback, 2, 1, "--no-daemons")
	out, err := c.radicErr("cluster", "up", "--mode", "loopback", "--nodes", "2", "--no-daemons")
	if err == nil || !strings.Contains(out, "already recorded") || !strings.Contains(out, "cluster down") {
		t.Fatalf("second cluster up: err=%v, want a refusal naming `radic cluster down`; output:\n%s", err, out)
	}
	st := c.must("cluster", "status")
	if !strings.Contains(st, "spare") || !strings.Contains(st, c.name) {
		t.Errorf("cluster status does not show the cluster:\n%s", st)
	}
	if out := c.must("cluster", "down"); !strings.Contains(out, "down") {
		t.Errorf("cluster down said:\n%s", out)
	}
	if out := c.must("cluster", "down"); !strings.Contains(out, "nothing to do") {
		t.Errorf("second cluster down said:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(c.dir, cluster.StateFile)); !os.IsNotExist(err) {
		t.Errorf("state file still there after down: %v", err)
	}
}

// `radic run`: the environment of each rank, tagged output, and the exit
// status of the first failing rank.
func TestRunEnvironmentAndExitStatus(t *testing.T) {
	for _, mode := range []string{cluster.ModeLoopback, cluster.ModeNetns} {
		t.Run(mode, func(t *testing.T) {
			c := newCluster(t, mode, 3, 0, "--no-daemons")
			out := c.must("run", "--np", "4", "--tag-output", "--port-base", "23000", "--",
				"/bin/sh", "-c", `echo "r=$RADIC_RANK n=$RADIC_SIZE node=$RADIC_NODE job=$RADIC_JOB peers=$RADIC_PEERS"`)
			s := c.state()
			var peers []string
			for r := range 4 {
				n, _ := s.Node(r % 3)
				peers = append(peers, n.Addr+":"+strconv.Itoa(23000+r))
			}
			for r := range 4 {
				want := "[rank " + strconv.Itoa(r) + "] r=" + strconv.Itoa(r) + " n=4 node=" + strconv.Itoa(r%3) +
					" job=" + c.name + "-1 peers=" + strings.Join(peers, ",")
				if !strings.Contains(out, want+"\n") {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if mode == cluster.ModeNetns {
				out := c.must("run", "--np", "2", "--", "/bin/sh", "-c", "cat /proc/self/cgroup; ls /sys/class/net")
				if !strings.Contains(out, "/radic/"+c.name+"/n1/job") || !strings.Contains(out, "eth0\n") {
					t.Errorf("ranks are not in their node's job cgroup and netns:\n%s", out)
				}
			}
			// Exit status: the first failing rank's, with a line saying so.
			cmd := c.cmd("run", "--np", "3", "--", "/bin/sh", "-c", `[ $RADIC_RANK = 1 ] && exit 7; sleep 30`)
			b, err := cmd.CombinedOutput()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 7 || !strings.Contains(string(b), "rank 1 (node 1") {
				t.Errorf("run with a failing rank: err=%v, want exit status 7 and a line naming rank 1; output:\n%s", err, b)
			}
			if len(c.state().Jobs) != 0 {
				t.Errorf("finished jobs still recorded: %+v", c.state().Jobs)
			}
		})
	}
}

// Ctrl-C ends the job cleanly: every rank gone, status 130.
func TestRunInterrupt(t *testing.T) {
	c := newCluster(t, cluster.ModeLoopback, 2, 0, "--no-daemons")
	j := c.start(nil, "--np", "4", "--", "/bin/sh", "-c", "trap 'echo got TERM; exit 0' TERM; while :; do sleep 0.05; done")
	jb := c.waitRanks(4)
	j.cmd.Process.Signal(syscall.SIGINT)
	if code := j.wait(t, 10*time.Second); code != 130 {
		t.Errorf("exit status after SIGINT = %d, want 130; output:\n%s", code, j.out)
	}
	for _, r := range jb.Ranks {
		if r.Proc.Alive() {
			t.Errorf("rank %d (pid %d) still running after the interrupt", r.Rank, r.Proc.Pid)
		}
	}
	if !strings.Contains(j.out.String(), "stopping job") {
		t.Errorf("no message about stopping the job:\n%s", j.out)
	}
}

var digestRE = regexp.MustCompile(`(?m)^(jacobi|farm) .*digest=[0-9a-f]{16}$`)

// reference runs an app as one rank on the host, outside any cluster.
func reference(t *testing.T, app string, args ...string) string {
	t.Helper()
	cmd := exec.Command(testenv.Artifact(t, "build/apps/"+app), args...)
	cmd.Env = append(os.Environ(), "RADIC_SIZE=1", "RADIC_RANK=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v (single host): %v\n%s", app, args, err, out)
	}
	d := digestRE.FindString(string(out))
	if d == "" {
		t.Fatalf("%s printed no digest line:\n%s", app, out)
	}
	return d
}

// Both apps on 4 nodes print the same digest as a single-host run, in both
// modes, with several decompositions and rank counts.
func TestAppsDigest(t *testing.T) {
	jacobiArgs := []string{"--n", "400", "--iters", "150"}
	farmArgs := []string{"--tasks", "200", "--width", "400", "--maxiter", "1000"}
	refJ := reference(t, "jacobi", jacobiArgs...)
	refF := reference(t, "farm", farmArgs...)
	t.Logf("reference: %s | %s", refJ, refF)
	runs := []struct {
		app  string
		ref  string
		np   string
		args []string
	}{
		{"jacobi", refJ, "4", jacobiArgs},
		{"jacobi", refJ, "8", append([]string{"--decomp", "1d", "--poller", "epoll"}, jacobiArgs...)},
		{"jacobi", refJ, "6", append([]string{"--decomp", "2d", "--poller", "epoll"}, jacobiArgs...)},
		{"farm", refF, "4", farmArgs},
		{"farm", refF, "8", farmArgs},
	}
	for _, mode := range []string{cluster.ModeNetns, cluster.ModeLoopback} {
		t.Run(mode, func(t *testing.T) {
			c := newCluster(t, mode, 4, 0, "--no-daemons")
			for _, r := range runs {
				t0 := time.Now()
				out := c.must(append([]string{"run", "--np", r.np, "--", testenv.Artifact(t, "build/apps/"+r.app)}, r.args...)...)
				got := digestRE.FindString(out)
				if got != r.ref {
					t.Errorf("%s --np %s %v on 4 %s nodes: got %q, want %q (single host); output:\n%s", r.app, r.np, r.args, mode, got, r.ref, out)
				} else {
					t.Logf("%s --np %s %v: same digest (%v)", r.app, r.np, r.args, time.Since(t0).Round(time.Millisecond))
				}
			}
		})
	}
}

// cut-link: a TCP connect across the cut fails; after the --for timer it
// works again.
func TestFaultCutLink(t *testing.T) {
	c := newCluster(t, cluster.ModeNetns, 2, 0, "--no-daemons")
	_, addr := c.serve(1, 24000)
	if out, ok := c.dial(0, addr, 2*time.Second); !ok {
		t.Fatalf("before the cut: %s", out)
	}
	// The host reaches node addresses too (metrics scrapes do).
	if conn, err := net.DialTimeout("tcp4", addr, 2*time.Second); err != nil {
		t.Errorf("from the host: %v", err)
	} else {
		conn.Close()
	}
	out := c.must("fault", "cut-link", "1", "--for", "2s")
	t.Logf("%s", strings.TrimSpace(out))
	if !strings.Contains(out, "cut-link 1") || !strings.Contains(out, "down") {
		t.Errorf("cut-link said %q", out)
	}
	if out, ok := c.dial(0, addr, 500*time.Millisecond); ok {
		t.Errorf("connect across a cut link succeeded: %s", out)
	} else {
		t.Logf("during the cut: %s", out)
	}
	c.waitHealed(10 * time.Second)
	if out, ok := c.dial(0, addr, 2*time.Second); !ok {
		t.Errorf("after the timer healed the link: %s", out)
	}
}

// partition: traffic between the two sides is dropped, inside one side it
// flows; heal removes the rules.
func TestFaultPartition(t *testing.T) {
	c := newCluster(t, cluster.ModeNetns, 3, 0, "--no-daemons")
	_, addr1 := c.serve(1, 24000)
	_, addr2 := c.serve(2, 24001)
	out := c.must("fault", "partition", "0,1")
	t.Logf("%s", strings.TrimSpace(out))
	if out, ok := c.dial(0, addr2, 500*time.Millisecond); ok {
		t.Errorf("connect across the partition (0 -> 2) succeeded: %s", out)
	}
	if out, ok := c.dial(2, addr1, 500*time.Millisecond); ok {
		t.Errorf("connect across the partition (2 -> 1) succeeded: %s", out)
	}
	if out, ok := c.dial(0, addr1, 2*time.Second); !ok {
		t.Errorf("connect inside one side (0 -> 1) failed: %s", out)
	}
	c.must("fault", "heal")
	if nft.TableExists(c.state().NftTable) && chainCount(t, c.state().NftTable) != 0 {
		t.Errorf("partition chains left after heal")
	}
	if out, ok := c.dial(0, addr2, 2*time.Second); !ok {
		t.Errorf("after heal (0 -> 2): %s", out)
	}
}

func chainCount(t *testing.T, table string) int {
	out, _ := exec.Command("nft", "list", "table", nft.Family, table).CombinedOutput()
	return strings.Count(string(out), "chain ")
}

// freeze: a frozen node's process makes no progress; after the timer it
// resumes. In loopback mode the same holds with SIGSTOP/SIGCONT.
func TestFaultFreeze(t *testing.T) {
	for _, mode := range []string{cluster.ModeNetns, cluster.ModeLoopback} {
		t.Run(mode, func(t *testing.T) {
			c := newCluster(t, mode, 2, 0, "--no-daemons")
			tick := filepath.Join(t.TempDir(), "tick")
			c.start([]string{"RADIC_TEST_HELPER=tick", "RADIC_TEST_FILE=" + tick}, "--np", "1", "--nodes", "1", "--", self(t))
			c.waitRanks(1)
			read := func() int {
				b, _ := os.ReadFile(tick)
				v, _ := strconv.Atoi(string(b))
				return v
			}
			for read() < 3 {
				time.Sleep(10 * time.Millisecond)
			}
			out := c.must("fault", "freeze", "1", "--for", "1500ms")
			t.Logf("%s", strings.TrimSpace(out))
			a := read()
			time.Sleep(600 * time.Millisecond)
			if b := read(); b != a {
				t.Errorf("the frozen process progressed: counter %d -> %d", a, b)
			}
			if mode == cluster.ModeNetns && !c.state().Nodes[1].Frozen {
				t.Errorf("node 1 not recorded as frozen")
			}
			c.waitHealed(10 * time.Second)
			time.Sleep(300 * time.Millisecond)
			if b := read(); b <= a {
				t.Errorf("no progress after the freeze ended: counter %d -> %d", a, b)
			}
		})
	}
}

// readdress: peers see the node's new address; the state keeps both.
func TestFaultReaddress(t *testing.T) {
	c := newCluster(t, cluster.ModeNetns, 2, 0, "--no-daemons")
	_, addr := c.serve(1, 24000)
	before := c.state().Nodes[0]
	out, ok := c.dial(0, addr, 2*time.Second)
	if !ok || !strings.Contains(out, "peer="+before.Addr) {
		t.Fatalf("before readdress: %q, want peer=%s", out, before.Addr)
	}
	msg := c.must("fault", "readdress", "0")
	t.Logf("%s", strings.TrimSpace(msg))
	after := c.state().Nodes[0]
	if after.Addr == before.Addr || after.LogicalAddr != before.Addr {
		t.Fatalf("state after readdress: addr %s logical %s; want a new addr and logical %s", after.Addr, after.LogicalAddr, before.Addr)
	}
	out, ok = c.dial(0, addr, 2*time.Second)
	if !ok || !strings.Contains(out, "peer="+after.Addr) {
		t.Errorf("after readdress: %q, want peer=%s", out, after.Addr)
	}
	// The old address is gone from the node.
	if b, _ := exec.Command("ip", "-n", before.Netns, "-4", "-o", "addr", "show", "eth0").CombinedOutput(); strings.Contains(string(b), before.Addr+"/") {
		t.Errorf("old address still on the node:\n%s", b)
	}
}

// kill-node: no process of the node is left, its address is gone, and
// the job reports which rank died and how.
func TestFaultKillNode(t *testing.T) {
	for _, mode := range []string{cluster.ModeNetns, cluster.ModeLoopback} {
		t.Run(mode, func(t *testing.T) {
			c := newCluster(t, mode, 3, 0, "--no-daemons")
			var addr string
			if mode == cluster.ModeNetns {
				_, addr = c.serve(2, 24000)
			}
			j := c.start(nil, "--np", "6", "--", "/bin/sh", "-c", "sleep 60 & sleep 60 & wait")
			jb := c.waitRanks(6)
			out := c.must("fault", "kill-node", "2")
			t.Logf("%s", strings.TrimSpace(out))
			for _, r := range jb.Ranks {
				if r.Node == 2 && r.Proc.Alive() {
					t.Errorf("rank %d of node 2 (pid %d) survived kill-node", r.Rank, r.Proc.Pid)
				}
			}
			s := c.state()
			n := s.Nodes[2]
			if !n.Dead {
				t.Errorf("node 2 not recorded dead")
			}
			if mode == cluster.ModeNetns {
				if pids, _ := cgroup.AllProcs(n.Cgroup); len(pids) != 0 {
					t.Errorf("processes left in node 2's cgroup: %v", pids)
				}
				if pids, _ := netns.Pids(n.Netns); len(pids) != 0 {
					t.Errorf("processes left in node 2's netns: %v", pids)
				}
				if out, ok := c.dial(0, addr, 500*time.Millisecond); ok {
					t.Errorf("node 2's address still answers: %s", out)
				}
			}
			code := j.wait(t, 15*time.Second)
			if code != 137 || !regexp.MustCompile(`rank [25] \(node 2, pid \d+\) was killed by signal 9`).MatchString(j.out.String()) {
				t.Errorf("job after kill-node: status %d (want 137), output:\n%s", code, j.out)
			}
			if out, err := c.radicErr("run", "--np", "1", "--nodes", "2", "--", "/bin/true"); err == nil {
				t.Errorf("run on a dead node succeeded: %s", out)
			}
		})
	}
}

// kill-rank: one process dies with SIGKILL; the job says which.
func TestFaultKillRank(t *testing.T) {
	c := newCluster(t, cluster.ModeLoopback, 2, 0, "--no-daemons")
	j := c.start(nil, "--np", "3", "--", "/bin/sleep", "60")
	c.waitRanks(3)
	out := c.must("fault", "kill-rank", "1")
	t.Logf("%s", strings.TrimSpace(out))
	if code := j.wait(t, 10*time.Second); code != 137 || !strings.Contains(j.out.String(), "rank 1 (node 1") {
		t.Errorf("job after kill-rank 1: status %d, output:\n%s", code, j.out)
	}
}

// The radicd contract: exact flags, inside the node, READY=1 awaited; an
// early exit fails `up` with the log's tail; "not implemented" falls back
// to no daemons with a warning.
func TestRadicdLaunch(t *testing.T) {
	out := t.TempDir()
	env := []string{"RADIC_RADICD=" + self(t), "RADIC_TEST_HELPER=radicd", "RADIC_TEST_OUT=" + out}
	for _, mode := range []string{cluster.ModeNetns, cluster.ModeLoopback} {
		t.Run("ready-"+mode, func(t *testing.T) {
			withEnv(t, append(env, "RADIC_TEST_RADICD=ok"))
			c := newCluster(t, mode, 2, 1)
			s := c.state()
			if !s.Daemons {
				t.Fatalf("state says no daemons")
			}
			for i := range s.Nodes {
				n := &s.Nodes[i]
				if n.Radicd == nil || !n.Radicd.Alive() {
					t.Fatalf("radicd of node %d not running", n.ID)
				}
				b, err := os.ReadFile(filepath.Join(out, "args."+strconv.Itoa(n.ID)))
				if err != nil {
					t.Fatal(err)
				}
				want := `["` + strings.Join(cluster.RadicdArgs(s, n), `","`) + `"]`
				if string(b) != want {
					t.Errorf("node %d radicd args:\n got %s\nwant %s", n.ID, b, want)
				}
				if mode == cluster.ModeNetns {
					cg, _ := os.ReadFile("/proc/" + strconv.Itoa(n.Radicd.Pid) + "/cgroup")
					if !strings.Contains(string(cg), "/radic/"+c.name+"/"+n.Name+"/daemon") {
						t.Errorf("radicd of node %d in cgroup %s", n.ID, cg)
					}
				}
			}
			t.Logf("radicd args of node 0: %s", strings.Join(cluster.RadicdArgs(s, &s.Nodes[0]), " "))
			if !strings.Contains(strings.Join(cluster.RadicdArgs(s, &s.Nodes[2]), " "), "--spare") {
				t.Errorf("the spare's radicd lacks --spare")
			}
			// kill-node takes the node's radicd too.
			c.must("fault", "kill-node", "1")
			if s.Nodes[1].Radicd.Alive() {
				t.Errorf("radicd of node 1 survived kill-node")
			}
		})
	}
	t.Run("early-exit", func(t *testing.T) {
		withEnv(t, append(env, "RADIC_TEST_RADICD=fail"))
		c := &tc{t: t, radic: testenv.Artifact(t, "bin/radic"), dir: t.TempDir()}
		c.env = append(os.Environ(), "RADIC_STATE_DIR="+c.dir)
		t.Cleanup(func() { c.radicErr("cluster", "down") })
		name := fmt.Sprintf("tf%05x", rand.IntN(1<<20))
		var out string
		var err error
		for try := 0; ; try++ {
			args := []string{"cluster", "up", "--nodes", "2", "--name", name}
			if os.Geteuid() == 0 {
				args = append(args, "--subnet", fmt.Sprintf("10.%d.0.0/16", 100+rand.IntN(150)))
			}
			// A subnet another cluster on this host holds is refused
			// before any radicd starts: pick another, as newCluster does.
			if out, err = c.radicErr(args...); try >= 5 || !strings.Contains(out, "overlaps a route") {
				break
			}
		}
		ee, _ := err.(*exec.ExitError)
		if ee == nil || ee.ExitCode() != 1 || !strings.Contains(out, "radicd on node 1 exited before it was ready") || !strings.Contains(out, "simulated failure") {
			t.Errorf("up with a failing radicd: err=%v (want exit status 1), output:\n%s", err, out)
		}
		if netns.Exists(name+"-n0") || netns.LinkExists(name+"-br") {
			t.Errorf("a failed up left its namespaces or links behind")
		}
		if _, err := os.Stat(filepath.Join(c.dir, cluster.StateFile)); !os.IsNotExist(err) {
			t.Errorf("a failed up left its state behind: %v", err)
		}
	})
	t.Run("not-implemented", func(t *testing.T) {
		withEnv(t, append(env, "RADIC_TEST_RADICD=notimpl"))
		c := newCluster(t, cluster.ModeLoopback, 2, 0)
		if c.state().Daemons {
			t.Errorf("state says daemons run, but radicd is not implemented")
		}
		if !strings.Contains(c.upOut, "not implemented") || !strings.Contains(c.upOut, "without daemons") {
			t.Errorf("no warning about the fallback:\n%s", c.upOut)
		}
	})
}

// withEnv sets environment variables for the rest of the test.
func withEnv(t *testing.T, env []string) {
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

// Killing `radic run` itself mid-run, with faults active, and then `cluster
// down` leaves no namespace, link, nft table, cgroup or process behind.
func TestCleanupAfterRadicKilled(t *testing.T) {
	c := newCluster(t, cluster.ModeNetns, 4, 1, "--no-daemons")
	j := c.start(nil, "--np", "4", "--", testenv.Artifact(t, "build/apps/jacobi"), "--n", "1000", "--iters", "1000000")
	jb := c.waitRanks(4)
	c.must("fault", "partition", "0,1", "--for", "60s")
	c.must("fault", "cut-link", "3")
	c.must("fault", "readdress", "4")
	c.must("fault", "freeze", "2", "--for", "60s")
	s := c.state()
	var timers []proc.ID
	for _, f := range s.Faults {
		if f.Timer != nil {
			timers = append(timers, *f.Timer)
		}
	}
	if len(timers) != 2 {
		t.Fatalf("want 2 fault timers recorded, have %+v", s.Faults)
	}
	j.cmd.Process.Kill() // SIGKILL radic itself
	<-j.done
	for _, r := range jb.Ranks {
		if !r.Proc.Alive() {
			t.Fatalf("rank %d died with radic; this test wants orphans to clean up", r.Rank)
		}
	}
	out := c.must("cluster", "down")
	t.Logf("%s", strings.TrimSpace(out))

	for _, r := range jb.Ranks {
		if r.Proc.Alive() {
			t.Errorf("rank %d (pid %d) survived cluster down", r.Rank, r.Proc.Pid)
		}
	}
	for _, tm := range timers {
		if tm.Alive() {
			t.Errorf("fault timer pid %d survived cluster down", tm.Pid)
		}
	}
	for _, n := range s.Nodes {
		if netns.Exists(n.Netns) {
			t.Errorf("namespace %s left", n.Netns)
		}
		if netns.LinkExists(n.Veth) {
			t.Errorf("link %s left", n.Veth)
		}
	}
	if netns.LinkExists(s.Bridge) {
		t.Errorf("bridge %s left", s.Bridge)
	}
	if nft.TableExists(s.NftTable) {
		t.Errorf("nft table %s left", s.NftTable)
	}
	if cgroup.Exists(s.Cgroup) {
		t.Errorf("cgroup %s left", s.Cgroup)
	}
	// No process anywhere still mentions this cluster's state directory
	// (fault timers) or runs from inside it.
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if strings.Contains(proc.Cmdline(pid), c.dir) {
			t.Errorf("process %d left: %s", pid, proc.Cmdline(pid))
		}
	}
	if out, _ := exec.Command("ip", "-4", "route").CombinedOutput(); strings.Contains(string(out), s.Bridge) {
		t.Errorf("route via %s left:\n%s", s.Bridge, out)
	}
}

// `cluster up` of 8 nodes + 2 spares (no daemons) takes well under a few
// seconds; the figure is logged.
func TestUpTime8Plus2(t *testing.T) {
	testenv.RequireRoot(t)
	t0 := time.Now()
	c := newCluster(t, cluster.ModeNetns, 8, 2, "--no-daemons")
	up := time.Since(t0)
	if n := len(c.state().Nodes); n != 10 {
		t.Fatalf("%d nodes, want 10", n)
	}
	cmd := c.cmd("run", "--np", "10", "--nodes", "0-9", "--", "/bin/sh", "-c", "exit 0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("run on all 10 nodes: %v\n%s", err, b)
	}
	t1 := time.Now()
	c.must("cluster", "down")
	down := time.Since(t1)
	t.Logf("cluster up 8 nodes + 2 spares (netns, --no-daemons): %v; cluster down: %v", up.Round(time.Millisecond), down.Round(time.Millisecond))
	if up > 5*time.Second {
		t.Errorf("cluster up took %v, want under a few seconds", up)
	}
}

// A `cluster up` killed half-way leaves a state that `up` refuses to start
// over and that `down` removes completely.
func TestDownAfterUpKilled(t *testing.T) {
	testenv.RequireRoot(t)
	for _, delay := range []time.Duration{0, 20 * time.Millisecond, 100 * time.Millisecond} {
		c := &tc{t: t, radic: testenv.Artifact(t, "bin/radic"), dir: t.TempDir()}
		c.env = append(os.Environ(), "RADIC_STATE_DIR="+c.dir)
		name := fmt.Sprintf("tk%05x", rand.IntN(1<<20))
		subnet := fmt.Sprintf("10.%d.0.0/16", 100+rand.IntN(150))
		t.Cleanup(func() { c.radicErr("cluster", "down") })
		up := c.cmd("cluster", "up", "--nodes", "8", "--spares", "2", "--name", name, "--subnet", subnet, "--no-daemons")
		if err := up.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill it `delay` after it first wrote its state.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if _, err := os.Stat(filepath.Join(c.dir, cluster.StateFile)); err == nil {
				break
			}
		}
		time.Sleep(delay)
		up.Process.Kill()
		up.Wait()
		s, err := cluster.Load(c.dir)
		if err != nil {
			t.Logf("killed %v after its first state write: no state (%v)", delay, err)
		} else {
			t.Logf("killed %v after its first state write: phase %s, %d resources recorded", delay, s.Phase, len(s.Resources))
			if out, err := c.radicErr("cluster", "up", "--nodes", "1", "--name", name, "--subnet", subnet); err == nil {
				t.Fatalf("up over a half-made cluster succeeded:\n%s", out)
			}
		}
		c.must("cluster", "down")
		for i := range 10 {
			if ns := name + "-n" + strconv.Itoa(i); netns.Exists(ns) {
				t.Errorf("namespace %s left", ns)
			}
			if l := name + "-v" + strconv.Itoa(i); netns.LinkExists(l) {
				t.Errorf("link %s left", l)
			}
		}
		if netns.LinkExists(name+"-br") || nft.TableExists("radic_"+name) {
			t.Errorf("bridge or nft table of %s left", name)
		}
		if mnt, err := cgroup.Mount(); err == nil && cgroup.Exists(filepath.Join(mnt, "radic", name)) {
			t.Errorf("cgroup of %s left", name)
		}
	}
}

// Loopback mode has no cgroup: `down` finds a killed job's processes by
// their recorded process groups, including children that outlived their
// rank.
func TestCleanupLoopback(t *testing.T) {
	c := newCluster(t, cluster.ModeLoopback, 2, 0, "--no-daemons")
	marker := fmt.Sprintf("300.%06d", rand.IntN(1000000))
	j := c.start(nil, "--np", "2", "--", "/bin/sh", "-c", "sleep "+marker+" & sleep "+marker+" & exec sleep 0.3")
	find := func() []int {
		var pids []int
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			if pid, err := strconv.Atoi(e.Name()); err == nil && proc.Cmdline(pid) == "sleep "+marker {
				pids = append(pids, pid)
			}
		}
		return pids
	}
	c.waitRanks(2)
	// The ranks are recorded before their programs start: kill the
	// launcher only once every rank's shell has forked its sleeps.
	for deadline := time.Now().Add(10 * time.Second); len(find()) < 4 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	j.cmd.Process.Kill()
	<-j.done
	time.Sleep(500 * time.Millisecond) // the ranks' leaders exit; their children stay
	if n := len(find()); n != 4 {
		t.Fatalf("%d orphaned sleeps before down, want 4", n)
	}
	c.must("cluster", "down")
	time.Sleep(100 * time.Millisecond)
	if left := find(); len(left) > 0 {
		t.Errorf("processes left after cluster down: %v", left)
	}
}
