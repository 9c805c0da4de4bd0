package safesock_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

// TestLogicalAddresses: the application sees only logical addresses, in
// accept, getpeername and getsockname, on a connection made before and one
// made after both nodes were readdressed (the second connect goes to the
// logical address, which no longer exists on the wire).
func TestLogicalAddresses(t *testing.T) {
	if bare() {
		t.Skip("bare mode: without radic a readdressed node is unreachable at its first address")
	}
	c := newCluster(t, 2)
	bin := testenv.Artifact(t, "build/apps/addrs")
	gate := filepath.Join(t.TempDir(), "go")
	j := c.start(runOpts{np: 2, nodes: "0,1", env: []string{"RADIC_TEST_GATE=" + gate}, what: "addrs"}, bin, "2")
	j.waitFor(regexp.MustCompile(`addrs rank 1 conn 0 `), time.Minute)
	st := c.state()
	logical := map[int]string{}
	for _, n := range st.Nodes {
		logical[n.ID] = n.LogicalAddr
	}
	c.fault(j, "readdress", "0")
	c.fault(j, "readdress", "1")
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := j.wait(time.Minute); code != 0 {
		t.Fatalf("addrs exited with status %d", code)
	}
	re := regexp.MustCompile(`addrs rank (\d) conn (\d) accept=(\S+) peer=(\S+) self=(\S+)`)
	lines := re.FindAllStringSubmatch(j.out.String(), -1)
	if len(lines) != 4 {
		t.Fatalf("want 4 address lines (2 ranks x 2 connections), got %d:\n%s", len(lines), j.out.String())
	}
	ip := func(ap string) string { h, _, _ := strings.Cut(ap, ":"); return h }
	for _, l := range lines {
		rank, peerNode := l[1], "1"
		if rank == "1" {
			peerNode = "0"
		}
		me, other := logical[map[string]int{"0": 0, "1": 1}[rank]], logical[map[string]int{"0": 0, "1": 1}[peerNode]]
		if ip(l[5]) != me || ip(l[4]) != other || (rank == "0" && ip(l[3]) != other) {
			t.Errorf("rank %s conn %s saw accept=%s peer=%s self=%s; want itself at %s and its peer at %s (the logical addresses)",
				rank, l[2], l[3], l[4], l[5], me, other)
		}
	}
	t.Logf("after readdressing both nodes (now %s and %s), the ranks still see %s and %s",
		c.state().Nodes[0].Addr, c.state().Nodes[1].Addr, logical[0], logical[1])
}
