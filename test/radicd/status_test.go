package radicd_test

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

type statusJSON struct {
	Ring  []int `json:"ring"`
	Nodes []struct {
		ID              int      `json:"id"`
		Health          string   `json:"health"`
		Role            string   `json:"role"`
		Why             string   `json:"why"`
		Protectors      []int    `json:"protectors"`
		Protects        []int    `json:"protects"`
		Monitor         *int     `json:"monitor"`
		LastHeartbeatMS *float64 `json:"last_heartbeat_ms"`
	} `json:"nodes"`
}

// TestRadicStatus runs `radic status` against 3 nodes and a spare, before
// and after a node is killed.
func TestRadicStatus(t *testing.T) {
	r := startRing(t, 71, 4, func(i int) []string {
		if i == 3 {
			return []string{"--spare"}
		}
		return nil
	})
	addrs := strings.Join([]string{r.metrics(0), r.metrics(1), r.metrics(2), r.metrics(3)}, ",")
	run := func(args ...string) (string, int) {
		cmd := exec.Command(radicBin, append([]string{"status", "--addr", addrs}, args...)...)
		out, err := cmd.Output()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	out, code := run("--json")
	var st statusJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 0 {
		t.Fatalf("radic status --json: exit %d, %v\n%s", code, err, out)
	}
	if !slices.Equal(st.Ring, []int{0, 1, 2, 3}) || len(st.Nodes) != 4 {
		t.Fatalf("ring %v, %d nodes", st.Ring, len(st.Nodes))
	}
	for _, n := range st.Nodes {
		if n.Health != "ok" || n.Monitor == nil || *n.Monitor != (n.ID+1)%4 || n.LastHeartbeatMS == nil || *n.LastHeartbeatMS > 1000 {
			t.Errorf("node %d: %+v", n.ID, n)
		}
	}
	if !slices.Equal(st.Nodes[0].Protectors, []int{1}) || !slices.Equal(st.Nodes[2].Protectors, []int{0}) ||
		st.Nodes[3].Role != "spare" || len(st.Nodes[3].Protectors) != 0 {
		t.Errorf("protection: %+v", st.Nodes)
	}
	table, code := run()
	if code != 0 || !strings.Contains(table, "ring: 0 -> 1 -> 2 -> 3 -> 0") || !strings.Contains(table, "PROTECTED BY") {
		t.Errorf("radic status: exit %d\n%s", code, table)
	}
	t.Logf("radic status:\n%s", table)

	r.kill(1)
	if _, ok := r.waitDeclared(2, 1, 3*time.Second); !ok {
		t.Fatal("node 1 not declared")
	}
	time.Sleep(200 * time.Millisecond)
	table, code = run()
	if code != 3 || !strings.Contains(table, "dead (declared unreachable by node 2)") || !strings.Contains(table, "ring: 0 -> 2 -> 3 -> 0") {
		t.Errorf("after killing node 1: exit %d (want 3)\n%s", code, table)
	}
	out, _ = run("--json")
	st = statusJSON{}
	json.Unmarshal([]byte(out), &st)
	if len(st.Nodes) == 4 && st.Nodes[3].Role != "active" {
		t.Errorf("the spare was not promoted when node 1 died: %+v", st.Nodes[3])
	}
	t.Logf("after kill -9 of node 1:\n%s", table)
}
