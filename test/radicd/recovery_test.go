package radicd_test

import (
	"encoding/json"
	"fmt"
	"net"
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
	"github.com/radic-project/radic/internal/radicd"
	"github.com/radic-project/radic/internal/testenv"
)

// counter is a deterministic rank that uses no sockets: 30 numbered
// lines, one every 50 ms.
const counter = `i=0; while [ $i -lt 30 ]; do echo "r$RADIC_RANK $i"; i=$((i+1)); sleep 0.05; done; echo "r$RADIC_RANK on $(ip -4 -o addr show eth0 | awk '{print $4}') done"`

func counterWant() string {
	var b strings.Builder
	for r := range 2 {
		for i := range 30 {
			b.WriteString("[rank " + itoa(r) + "] r" + itoa(r) + " " + itoa(i) + "\n")
		}
	}
	return b.String()
}

func itoa(i int) string { return strconv.Itoa(i) }

// counterLines keeps the numbered lines of the output, by rank: the
// ranks' lines interleave, each rank's in its order.
func counterLines(out string) (string, []string) {
	var b strings.Builder
	var other []string
	byRank := [2][]string{}
	re := regexp.MustCompile(`^\[rank (\d)\] r\d \d+$`)
	for l := range strings.SplitSeq(out, "\n") {
		if m := re.FindStringSubmatch(l); m != nil {
			byRank[m[1][0]-'0'] = append(byRank[m[1][0]-'0'], l)
		} else if l != "" {
			other = append(other, l)
		}
	}
	for _, ls := range byRank {
		for _, l := range ls {
			b.WriteString(l + "\n")
		}
	}
	return b.String(), other
}

// startJob starts `radic run ARGS...` and returns its output buffer and
// a func that waits for its status.
func (c *netnsCluster) startJob(args ...string) (*lockedBuffer, func() int) {
	j := exec.Command(radicBin, append([]string{"run"}, args...)...)
	j.Env = c.env
	out := &lockedBuffer{}
	j.Stdout, j.Stderr = out, out
	if err := j.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = j.Process.Kill() })
	return out, func() int {
		err := j.Wait()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		if err != nil {
			c.t.Fatal(err)
		}
		return 0
	}
}

// watchRecovery polls a radicd's /status until it has shown group's
// recovery under way and then not, or for at most d; it returns the
// phases it saw, in order ("confirm 1->?", "restart 1->2", ...).
func watchRecovery(addr string, group int, d time.Duration) []string {
	var seen []string
	cl := &http.Client{Timeout: time.Second}
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		resp, err := cl.Get("http://" + addr + "/status")
		if err != nil {
			continue
		}
		var st radicd.NodeStatus
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil || st.Recovery == nil {
			continue
		}
		now := false
		for _, p := range st.Recovery.InProgress {
			if p.Group != group {
				continue
			}
			now = true
			to := "?"
			if p.To >= 0 {
				to = strconv.Itoa(p.To)
			}
			ph := fmt.Sprintf("%s %d->%s", p.Phase, p.From, to)
			if len(seen) == 0 || seen[len(seen)-1] != ph {
				seen = append(seen, ph)
			}
		}
		if !now && len(seen) > 0 {
			break
		}
	}
	return seen
}

// metricSum sums a metric over the cluster's daemons that answer (a
// killed node's address takes no connection: skipped after 300 ms).
func (c *netnsCluster) metricSum(name, labels string) float64 {
	sum := 0.0
	for _, n := range c.state().Nodes {
		_, maddr := c.daemon(n.ID)
		conn, err := net.DialTimeout("tcp", maddr, 300*time.Millisecond)
		if err != nil {
			continue
		}
		conn.Close()
		if v, err := scrape(maddr, name, labels); err == nil {
			sum += v
		}
	}
	return sum
}

// waitMetric waits up to 5 s for a metric's sum over the cluster to be want.
func (c *netnsCluster) waitMetric(t *testing.T, name, labels string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := c.metricSum(name, labels)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s{%s} = %v over the cluster, want %v", name, labels, got, want)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func waitOutput(t *testing.T, out *lockedBuffer, s string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(out.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the output after 15 s:\n%s", s, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRestartLostRank: with --recovery on a cluster with --fence-kill, a
// rank whose node dies is restarted on the spare, and one killed alone is
// restarted in place; radic run follows it, its output is the fault-free
// run's (no line twice, none missing) and the job exits 0. No replay yet:
// the ranks use no sockets between them.
func TestRestartLostRank(t *testing.T) {
	c := newNetnsCluster(t, 2, "--spares", "1", "--fence-kill")
	run := []string{"--np", "2", "--tag-output", "--no-radic", "--recovery", "--", "/bin/sh", "-c", counter}
	want := counterWant()
	t.Run("fault-free", func(t *testing.T) {
		code, out := c.runJob(run...)
		got, _ := counterLines(out)
		if code != 0 || got != want {
			t.Fatalf("status %d, output:\n%s", code, out)
		}
	})
	t.Run("kill-rank", func(t *testing.T) {
		out, wait := c.startJob(run...)
		clustertest.WaitRanks(t, c.dir, 2)
		waitOutput(t, out, "r1 8\n")
		if o, err := c.radic("fault", "kill-rank", "1"); err != nil {
			t.Fatalf("kill-rank 1: %v\n%s", err, o)
		}
		code := wait()
		got, _ := counterLines(out.String())
		if code != 0 || got != want {
			t.Fatalf("status %d, numbered lines:\n%s\nwhole output:\n%s", code, got, out.String())
		}
		if a := c.state().Nodes[1].Addr; !strings.Contains(out.String(), "[rank 1] r1 on "+a+"/16 done") {
			t.Errorf("rank 1 did not end on its node (%s):\n%s", a, out.String())
		}
		if !regexp.MustCompile(`radic run: a rank of node 1 died at [0-9:.]+; rank 1 restarted on node 1 in [0-9.]+ s; live again\n`).MatchString(out.String()) {
			t.Errorf("no recovery event in the output:\n%s", out.String())
		}
		// The recovery's series, on the node that drove it (node 1 itself).
		c.waitMetric(t, "radic_recoveries_total", `cause="process",result="ok"`, 1)
		for _, m := range []struct{ name, labels string }{
			{"radic_recovery_seconds_count", ""},
			{"radic_recovery_phase_seconds_count", `phase="confirm"`},
			{"radic_recovery_phase_seconds_count", `phase="restart"`},
		} {
			if v := c.metricSum(m.name, m.labels); v < 1 {
				t.Errorf("%s{%s} = %v over the cluster, want >= 1", m.name, m.labels, v)
			}
		}
		if v := c.metricSum("radic_recoveries_total", `result="failed"`); v != 0 {
			t.Errorf("radic_recoveries_total{result=\"failed\"} = %v, want 0", v)
		}
		_, maddr := c.daemon(0)
		have := metricFamilies(t, maddr)
		for _, want := range []string{"radic_recovery_phase_seconds", "radic_replay_bytes_total", "radic_divergences_total", "radic_log_bytes", "radic_log_records"} {
			if !slices.Contains(have, want) {
				t.Errorf("node 0 does not export %s", want)
			}
		}
		// radic status (the cluster's daemons) shows it among the recent ones.
		st, err := c.radic("status")
		if err != nil || !regexp.MustCompile(`recent recoveries:\n(  .*\n)*  a rank of node 1 died at [0-9:.]+; the ranks of node 1 restarted on node 1 in [0-9.]+ s; live again\n`).MatchString(st) {
			t.Errorf("radic status: %v\n%s", err, st)
		}
	})
	t.Run("kill-rank-divergent", func(t *testing.T) {
		// Each instance prints the clock: the restarted one's output
		// differs from what was delivered, and the job stops.
		clock := `i=0; while [ $i -lt 30 ]; do echo "r$RADIC_RANK $i $(date +%s%N)"; i=$((i+1)); sleep 0.05; done`
		out, wait := c.startJob("--np", "2", "--tag-output", "--no-radic", "--recovery", "--", "/bin/sh", "-c", clock)
		clustertest.WaitRanks(t, c.dir, 2)
		waitOutput(t, out, "r1 8 ")
		before := c.metricSum("radic_divergences_total", `where="output"`)
		if o, err := c.radic("fault", "kill-rank", "1"); err != nil {
			t.Fatalf("kill-rank 1: %v\n%s", err, o)
		}
		if code := wait(); code == 0 || !strings.Contains(out.String(), "rank 1 diverged after its restart") {
			t.Fatalf("status %d, want the divergence; output:\n%s", code, out.String())
		}
		c.waitMetric(t, "radic_divergences_total", `where="output"`, before+1)
	})
	t.Run("kill-rank-without-recovery", func(t *testing.T) {
		out, wait := c.startJob("--np", "2", "--tag-output", "--no-radic", "--", "/bin/sh", "-c", counter)
		clustertest.WaitRanks(t, c.dir, 2)
		waitOutput(t, out, "r1 8\n")
		if o, err := c.radic("fault", "kill-rank", "1"); err != nil {
			t.Fatalf("kill-rank 1: %v\n%s", err, o)
		}
		if code := wait(); code != 137 || !strings.Contains(out.String(), "was killed by signal 9") {
			t.Fatalf("status %d, want 137 and the rank's death; output:\n%s", code, out.String())
		}
	})
	t.Run("kill-node", func(t *testing.T) {
		out, wait := c.startJob(run...)
		clustertest.WaitRanks(t, c.dir, 2)
		waitOutput(t, out, "r1 8\n")
		// The spare's radicd (neither the recoverer nor the dead node)
		// shows the recovery under way: its recoverer pushes it.
		_, spareMetrics := c.daemon(2)
		phases := make(chan []string, 1)
		go func() { phases <- watchRecovery(spareMetrics, 1, 10*time.Second) }()
		if o, err := c.radic("fault", "kill-node", "1"); err != nil {
			t.Fatalf("kill-node 1: %v\n%s", err, o)
		}
		code := wait()
		if seen := <-phases; len(seen) == 0 {
			t.Errorf("node 2's /status never showed the recovery of group 1 under way")
		} else {
			t.Logf("recovery of group 1 under way, as node 2 showed it: %v", seen)
		}
		got, other := counterLines(out.String())
		if code != 0 || got != want {
			t.Fatalf("status %d, numbered lines:\n%s\nwhole output:\n%s", code, got, out.String())
		}
		s := c.state()
		spare := s.Nodes[2].Addr
		if !strings.Contains(out.String(), "[rank 1] r1 on "+spare+"/16 done") {
			t.Errorf("rank 1 did not end on the spare %s:\n%s", spare, out.String())
		}
		if !regexp.MustCompile(`radic run: node 1 died at [0-9:.]+; rank 1 restarted on node 2 in [0-9.]+ s; live again\n`).MatchString(out.String()) {
			t.Errorf("no recovery event in the output:\n%s", out.String())
		}
		t.Logf("other lines: %q", other)
		c.waitMetric(t, "radic_recoveries_total", `cause="node",result="ok"`, 1)
		// (detect is 0, not observed, on a recoverer that was not the
		// dead node's watchdog: it learns the declaration.)
		if v := c.metricSum("radic_recovery_phase_seconds_count", `phase="restart"`); v < 1 {
			t.Errorf("radic_recovery_phase_seconds_count{phase=\"restart\"} = %v over the live nodes, want >= 1", v)
		}
		// One daemon's address is enough: no cluster state needed.
		_, maddr := c.daemon(2)
		cmd := exec.Command(radicBin, "status", "--addr", maddr)
		cmd.Env = append(os.Environ(), "RADIC_STATE_DIR="+filepath.Join(t.TempDir(), "none"))
		b, _ := cmd.CombinedOutput() // exit 3: node 1 is dead
		if !regexp.MustCompile(`  node 1 died at [0-9:.]+; the ranks of node 1 restarted on node 2 in [0-9.]+ s; live again\n`).Match(b) {
			t.Errorf("radic status --addr %s:\n%s", maddr, b)
		}
	})
}

// TestFenceIsNotACrash: node 1's link is down for 0.7 s: its heartbeat
// fences it after 0.4 s and kills its rank, before its protector's own
// fence timeout (1 s) and before the link returns. Those exits are not
// crashes to restart in place (kill-rank): the ring restarts the rank on
// the spare, and only there. (Found by TestRecoveryCampaign/freeze under
// load: node 1, fenced by its heartbeat, restarted its rank itself four
// times while the spare ran it too; radic run lost track of it.)
//
// Both halves of the fix are needed: the fenced node's protector machine
// is fenced by its heartbeat's fence before the kill (Machine.Fence), so
// that it never restarts in place; and its return as a new incarnation
// after a fence confirms its death to the ring (Machine.Rejoined), since a
// cut shorter than DeclareTimeout (1.5 s) but longer than the heartbeat's
// fence timeout (0.4 s) is otherwise never confirmed, and the rank is
// restarted nowhere ("rank 1: not restarted within 30s").
func TestFenceIsNotACrash(t *testing.T) {
	c := newNetnsCluster(t, 2, "--spares", "1", "--fence-kill")
	run := []string{"--np", "2", "--tag-output", "--no-radic", "--recovery", "--", "/bin/sh", "-c", counter}
	out, wait := c.startJob(run...)
	clustertest.WaitRanks(t, c.dir, 2)
	waitOutput(t, out, "r1 8\n")
	if o, err := c.radic("fault", "cut-link", "1", "--for", "700ms"); err != nil {
		t.Fatalf("cut-link 1: %v\n%s", err, o)
	}
	code := waitJob(t, wait)
	got, _ := counterLines(out.String())
	if code != 0 || got != counterWant() {
		t.Fatalf("status %d, numbered lines:\n%s\nwhole output:\n%s", code, got, out.String())
	}
	if strings.Contains(out.String(), "a rank of node 1 died") {
		t.Errorf("node 1 restarted its fenced rank itself:\n%s", out.String())
	}
	if !regexp.MustCompile(`radic run: node 1 died at [0-9:.]+; rank 1 restarted on node 2 in [0-9.]+ s; live again\n`).MatchString(out.String()) {
		t.Errorf("no recovery of rank 1 on the spare:\n%s", out.String())
	}
}

// TestLaunchInPlaceOfLostNode: a node lost before the job's launch reaches
// it (its link cut: no answer; or partitioned from the rest of its ring:
// it fences itself and refuses) does not stop a job under recovery: once
// the ring has declared the node dead, its rank is launched on the spare,
// under its own logical node (its peers reach it at the address they were
// given), and the job ends with the fault-free output. Without a spare it
// goes to node 0, where rank 0 listens: Jacobi's rank 3 connects to it
// from rank 0's own node, and that connection, a guest's, is managed
// (rank 0's shim reads its hello; taken for plain TCP, rank 0 read
// radic's bytes as the peer's rank: "unexpected connection from rank
// 1380009033", "RADI").
func TestLaunchInPlaceOfLostNode(t *testing.T) {
	run := []string{"--np", "4", "--tag-output", "--recovery", "--lib", testenv.Artifact(t, "lib/libradic.so"), "--",
		testenv.Artifact(t, "build/apps/jacobi"), "--n", "128", "--iters", "200"}
	var want string
	for _, tc := range []struct {
		name, fault string
		up          []string
		on          int
	}{
		{"cut-link", "cut-link", []string{"--spares", "1", "--fence-kill"}, 4},
		{"partition", "partition", []string{"--spares", "1", "--fence-kill"}, 4},
		{"no-spare", "cut-link", []string{"--fence-kill"}, 0},
	} {
		fault := tc.fault
		t.Run(tc.name, func(t *testing.T) {
			c := newNetnsCluster(t, 4, tc.up...)
			if want == "" {
				code, out := c.runJob(run...)
				if want = appLines(out); code != 0 || !strings.Contains(want, "digest=") {
					t.Fatalf("fault-free run: status %d, output:\n%s", code, out)
				}
			}
			if o, err := c.radic("fault", fault, "3"); err != nil {
				t.Fatalf("%s 3: %v\n%s", fault, err, o)
			}
			code, out := c.runJob(run...)
			if got := appLines(out); code != 0 || got != want {
				t.Fatalf("status %d, output:\n%s\nwant:\n%s\nwhole output:\n%s", code, got, want, out)
			}
			if !regexp.MustCompile(`radic run: rank 3: node 3 was lost during the launch \(.*\); launched on node ` + itoa(tc.on) + ` in its place`).MatchString(out) {
				t.Fatalf("rank 3 not launched on node %d in place of node 3:\n%s", tc.on, out)
			}
		})
	}
}
