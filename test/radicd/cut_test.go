package radicd_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

// firewall drops the ring's UDP datagrams with an nftables table of its
// own, deleted in cleanup. Only heartbeat traffic (UDP port 7470) is cut, so
// the test can still read /status over TCP.
type firewall struct {
	t     *testing.T
	table string
}

func newFirewall(t *testing.T) *firewall {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "nft")
	f := &firewall{t: t, table: fmt.Sprintf("radicd_test_%d", os.Getpid())}
	f.nft("add table inet " + f.table)
	t.Cleanup(func() { f.nft("delete table inet " + f.table) })
	f.nft("add chain inet " + f.table + " out { type filter hook output priority 0 ; policy accept ; }")
	return f
}

func (f *firewall) nft(cmd string) {
	f.t.Helper()
	out, err := exec.Command("nft", strings.Fields(cmd)...).CombinedOutput()
	if err != nil {
		f.t.Fatalf("nft %s: %v\n%s", cmd, err, out)
	}
}

// isolate drops every heartbeat datagram to or from addr.
func (f *firewall) isolate(addr string) {
	f.nft(fmt.Sprintf("add rule inet %s out ip saddr %s udp sport 7470 drop", f.table, addr))
	f.nft(fmt.Sprintf("add rule inet %s out ip daddr %s udp dport 7470 drop", f.table, addr))
}

// cut drops heartbeat datagrams between a and b, both ways.
func (f *firewall) cut(a, b string) {
	f.nft(fmt.Sprintf("add rule inet %s out ip saddr %s ip daddr %s udp dport 7470 drop", f.table, a, b))
	f.nft(fmt.Sprintf("add rule inet %s out ip saddr %s ip daddr %s udp dport 7470 drop", f.table, b, a))
}

func (f *firewall) heal() { f.nft("flush chain inet " + f.table + " out") }

// TestShortCutNoFalsePositive isolates a node 20 times for 250 ms (below
// the fence timeout, 450 ms): no declaration, no fence.
func TestShortCutNoFalsePositive(t *testing.T) {
	fw := newFirewall(t)
	const n = 4
	r := startRing(t, 31, n, nil)
	rng := testenv.Rand(t)
	before, _ := r.status(2)
	for trial := range trials {
		time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
		fw.isolate(r.addr(2))
		time.Sleep(250 * time.Millisecond)
		fw.heal()
		time.Sleep(700 * time.Millisecond)
		for i := range n {
			if f := r.failures(i); f != 0 {
				t.Fatalf("trial %d: node %d counted %v failures after a 250ms cut", trial, i, f)
			}
		}
	}
	after, _ := r.status(2)
	if after.Ring.Inc != before.Ring.Inc || after.Ring.Fenced || r.metric(2, "radic_fences_total", "") != 0 {
		t.Errorf("node 2 fenced or changed incarnation on short cuts")
	}
	t.Logf("%d cuts of 250ms: no false positive (watchdog fired %v times on node 3)", trials, r.metric(3, "radic_heartbeats_missed_total", ""))
}

// TestCutLinkSavedByIndirectProbes cuts the link between node 2 and its
// monitor 3 for 3 s: the probes through 0 and 1 keep 2 alive (over IP
// the indirect ones; on the torus the direct probe's copy that goes the
// other way round).
func TestCutLinkSavedByIndirectProbes(t *testing.T) {
	fw := newFirewall(t)
	const n = 4
	r := startRing(t, 36, n, nil)
	fw.cut(r.addr(2), r.addr(3))
	time.Sleep(3 * time.Second)
	fw.heal()
	time.Sleep(300 * time.Millisecond)
	for i := range n {
		if f := r.failures(i); f != 0 {
			t.Errorf("node %d declared %v failures over a cut link", i, f)
		}
		if st, _ := r.status(i); st == nil || st.Ring.Fenced {
			t.Errorf("node %d fenced", i)
		}
	}
	saves := r.metric(3, "radic_indirect_saves_total", "")
	missed := r.metric(3, "radic_heartbeats_missed_total", "")
	refuted := r.metric(3, "radic_suspicions_refuted_total", "")
	if missed == 0 || refuted == 0 {
		t.Errorf("node 3 missed %v heartbeat deadlines and refuted %v suspicions: is the cut real?", missed, refuted)
	}
	// Over IP the direct probe has only the cut path, so the probes
	// through 0 and 1 must answer; on the torus the direct probe also
	// goes the other way round (through 0 and 1) and answers itself.
	if testFabric != "bg" && saves == 0 {
		t.Errorf("node 3 never needed the indirect probes: is the cut real?")
	}
	t.Logf("3s cut between 2 and its monitor 3: %v missed deadlines, %v suspicions refuted, %v of them by indirect probes, no failure",
		missed, refuted, saves)
}

// TestIsolatedNodeFencesItsJob puts a process in node 2's job cgroup, cuts
// node 2 off, and checks that node 2 kills the cgroup before its monitor
// declares it dead; after the cut heals it rejoins as a new incarnation.
func TestIsolatedNodeFencesItsJob(t *testing.T) {
	fw := newFirewall(t)
	cg := jobCgroup(t)
	const n = 4
	r := startRing(t, 41, n, func(i int) []string {
		if i == 2 {
			return []string{"--job-cgroup", cg}
		}
		return nil
	})
	job := startInCgroup(t, cg, "sleep", "600")
	jobDone := make(chan error, 1)
	go func() { jobDone <- job.Wait() }()
	before, _ := r.status(2)

	t0 := time.Now()
	fw.isolate(r.addr(2))
	select {
	case err := <-jobDone:
		t.Logf("job process stopped %v after the cut (%v)", time.Since(t0).Round(time.Millisecond), err)
	case <-time.After(3 * time.Second):
		t.Fatal("the isolated node did not stop its job within 3s")
	}
	m, ok := r.waitDeclared(3, 2, 3*time.Second)
	if !ok {
		t.Fatal("the isolated node was not declared dead")
	}
	st, err := r.status(2)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Ring.Fenced || st.LastFence == nil || st.LastFence.Killed != 1 || st.LastFence.Error != "" {
		t.Fatalf("node 2 status: fenced %v, last fence %+v; want fenced, 1 process killed", st.Ring.Fenced, st.LastFence)
	}
	if !st.LastFence.At.Before(m.DeclaredAt) {
		t.Errorf("fenced at %v, declared at %v: the job could run twice", st.LastFence.At, m.DeclaredAt)
	}
	t.Logf("fence at +%v (kill took %.1fms), declaration at +%v: margin %v",
		st.LastFence.At.Sub(t0).Round(time.Millisecond), st.LastFence.Elapsed,
		m.DeclaredAt.Sub(t0).Round(time.Millisecond), m.DeclaredAt.Sub(st.LastFence.At).Round(time.Millisecond))

	fw.heal()
	r.waitRing(n, 5*time.Second)
	after, _ := r.status(2)
	if after.Ring.Inc <= before.Ring.Inc {
		t.Errorf("node 2 rejoined with incarnation %d, want > %d", after.Ring.Inc, before.Ring.Inc)
	}
}

// jobCgroup makes a cgroup v2 directory for a job, removed in cleanup.
func jobCgroup(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t)
	root := ""
	for _, c := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(c, "cgroup.subtree_control")); err == nil {
			root = c
			break
		}
	}
	if root == "" {
		t.Skip("no cgroup v2 hierarchy mounted")
	}
	dir := filepath.Join(root, fmt.Sprintf("radicd-test-%d", os.Getpid()), "job")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Skipf("cannot create a cgroup: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		t.Skipf("cgroup.kill not available: %v", err)
	}
	t.Cleanup(func() {
		_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
		for range 100 {
			if err := os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		_ = os.Remove(filepath.Dir(dir))
	})
	return dir
}

// startInCgroup starts a process directly inside cgroup dir (clone3 with
// CLONE_INTO_CGROUP); cleanup kills it by pid.
func startInCgroup(t *testing.T, dir string, argv ...string) *exec.Cmd {
	t.Helper()
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v in cgroup %s: %v", argv, dir, err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return cmd
}
