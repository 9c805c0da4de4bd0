package radicd_test

import (
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/clustertest"
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
		if !regexp.MustCompile(`radic run: a rank of node 1 died at [0-9:.]+; rank 1 restarted on node 1 in [0-9.]+ s`).MatchString(out.String()) {
			t.Errorf("no recovery event in the output:\n%s", out.String())
		}
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
		if o, err := c.radic("fault", "kill-node", "1"); err != nil {
			t.Fatalf("kill-node 1: %v\n%s", err, o)
		}
		code := wait()
		got, other := counterLines(out.String())
		if code != 0 || got != want {
			t.Fatalf("status %d, numbered lines:\n%s\nwhole output:\n%s", code, got, out.String())
		}
		s := c.state()
		spare := s.Nodes[2].Addr
		if !strings.Contains(out.String(), "[rank 1] r1 on "+spare+"/16 done") {
			t.Errorf("rank 1 did not end on the spare %s:\n%s", spare, out.String())
		}
		if !regexp.MustCompile(`radic run: node 1 died at [0-9:.]+; rank 1 restarted on node 2 in [0-9.]+ s`).MatchString(out.String()) {
			t.Errorf("no recovery event in the output:\n%s", out.String())
		}
		t.Logf("other lines: %q", other)
	})
}
