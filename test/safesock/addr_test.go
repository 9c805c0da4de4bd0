package safesock_test

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
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
	logical := c.logicalAddrs()
	c.fault(j, "readdress", "0")
	c.fault(j, "readdress", "1")
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := j.wait(time.Minute); code != 0 {
		t.Fatalf("addrs exited with status %d", code)
	}
	checkLogical(t, j.out.String(), 2, logical)
	t.Logf("after readdressing both nodes (now %s and %s), the ranks still see %s and %s",
		c.addr(0), c.addr(1), logical[0], logical[1])
}

// TestLogicalAddressesReaddressStorm makes the race of a move and a new
// connection likely on purpose: rank 1 opens connection after connection
// to rank 0 while both nodes are readdressed again and again, so that
// connections are accepted and connected just before, during and just
// after each move, on both sides. Every one of them must see only logical
// addresses.
func TestLogicalAddressesReaddressStorm(t *testing.T) {
	if bare() {
		t.Skip("bare mode: without radic a readdressed node is unreachable at its first address")
	}
	const conns, moves = 300, 12
	c := newCluster(t, 2)
	bin := testenv.Artifact(t, "build/apps/addrs")
	j := c.start(runOpts{np: 2, nodes: "0,1", what: "addrs"}, bin, strconv.Itoa(conns), "5000")
	j.waitFor(regexp.MustCompile(`addrs rank 1 conn 0 `), time.Minute)
	logical := c.logicalAddrs()
	for i := 0; i < moves && !j.ended(); i++ {
		c.fault(j, "readdress", strconv.Itoa(i%2))
		time.Sleep(time.Duration(20+rand.IntN(100)) * time.Millisecond)
	}
	if code := j.wait(2 * time.Minute); code != 0 {
		t.Fatalf("addrs exited with status %d", code)
	}
	checkLogical(t, j.out.String(), conns, logical)
	moved := regexp.MustCompile(`addrs rank 1 conn (\d+) accept`).FindAllStringSubmatch(j.out.String(), -1)
	standIns := strings.Count(j.out.String(), "stand-in")
	t.Logf("%d connections, %d moves of the nodes (now %s and %s), %d stand-ins: all saw %s and %s",
		len(moved), moves, c.addr(0), c.addr(1), standIns, logical[0], logical[1])
}

// logicalAddrs maps each node's id to its logical address.
func (c *tc) logicalAddrs() map[int]string {
	logical := map[int]string{}
	for _, n := range c.state().Nodes {
		logical[n.ID] = n.LogicalAddr
	}
	return logical
}

// checkLogical checks the address lines of build/apps/addrs (rank 0 on
// node 0, rank 1 on node 1): conns per rank, each showing the rank itself
// and its peer at their nodes' logical addresses.
func checkLogical(t *testing.T, out string, conns int, logical map[int]string) {
	t.Helper()
	re := regexp.MustCompile(`addrs rank (\d) conn (\d+) accept=(\S+) peer=(\S+) self=(\S+)`)
	lines := re.FindAllStringSubmatch(out, -1)
	if len(lines) != 2*conns {
		t.Fatalf("want %d address lines (2 ranks x %d connections), got %d:\n%s", 2*conns, conns, len(lines), out)
	}
	ip := func(ap string) string { h, _, _ := strings.Cut(ap, ":"); return h }
	bad := 0
	for _, l := range lines {
		rank, _ := strconv.Atoi(l[1])
		me, other := logical[rank], logical[1-rank]
		if ip(l[5]) != me || ip(l[4]) != other || (rank == 0 && ip(l[3]) != other) {
			if bad++; bad <= 10 {
				t.Errorf("rank %d conn %s saw accept=%s peer=%s self=%s; want itself at %s and its peer at %s (the logical addresses)",
					rank, l[2], l[3], l[4], l[5], me, other)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d connection ends saw a physical address", bad, len(lines))
	}
	// recvmsg and recvfrom name no sender on a stream, as on bare TCP.
	names := regexp.MustCompile(`addrs rank (\d) conn (\d+) namelen=(\d+)`).FindAllStringSubmatch(out, -1)
	if len(names) != 2*conns {
		t.Fatalf("want %d namelen lines, got %d", 2*conns, len(names))
	}
	for _, l := range names {
		if l[3] != "0" {
			t.Errorf("rank %s conn %s: recvmsg/recvfrom reported a %s-byte sender address on a TCP stream, want 0", l[1], l[2], l[3])
		}
	}
}

// TestLogicalAddressesPlainPeer: a connection from a peer that is not
// under radic is plain, but the rank that accepted it on a listener bound
// to its logical address still sees itself there, after a readdress, as
// it would bare (the kernel would say the node's new address: the
// listener is really on the wildcard). The plain peer, which reached the
// node at its current address, sees that address, as bare.
func TestLogicalAddressesPlainPeer(t *testing.T) {
	if bare() {
		t.Skip("bare mode: the test is of radic's address translation")
	}
	c := newCluster(t, 2)
	bin := testenv.Artifact(t, "build/apps/addrs")
	logical := c.logicalAddrs()
	c.fault(nil, "readdress", "0")
	moved := c.addr(0)
	// Rank 1 runs bare and connects to where node 0 is now.
	script := `if [ "$RADIC_RANK" = 1 ]; then RADIC_PEERS=$(echo "$RADIC_PEERS" | sed "s/^$LOGICAL0:/$MOVED0:/"); export RADIC_PEERS; exec env -u LD_PRELOAD "$@"; fi; exec "$@"`
	j := c.start(runOpts{np: 2, nodes: "0,1", what: "addrs, rank 1 bare", env: []string{"LOGICAL0=" + logical[0], "MOVED0=" + moved}},
		"/bin/sh", "-c", script, "sh", bin, "3")
	if code := j.wait(time.Minute); code != 0 {
		t.Fatalf("addrs exited with status %d", code)
	}
	re := regexp.MustCompile(`addrs rank (\d) conn (\d+) accept=(\S+) peer=(\S+) self=(\S+)`)
	lines := re.FindAllStringSubmatch(j.out.String(), -1)
	if len(lines) != 6 {
		t.Fatalf("want 6 address lines (2 ranks x 3 connections), got %d:\n%s", len(lines), j.out.String())
	}
	ip := func(ap string) string { h, _, _ := strings.Cut(ap, ":"); return h }
	for _, l := range lines {
		var wantSelf, wantPeer string
		if l[1] == "0" {
			wantSelf, wantPeer = logical[0], c.addr(1) // rank 1's node never moved
		} else {
			wantSelf, wantPeer = c.addr(1), moved
		}
		if ip(l[5]) != wantSelf || ip(l[4]) != wantPeer || (l[1] == "0" && ip(l[3]) != wantPeer) {
			t.Errorf("rank %s conn %s saw accept=%s peer=%s self=%s; want itself at %s and its peer at %s",
				l[1], l[2], l[3], l[4], l[5], wantSelf, wantPeer)
		}
	}
	if t.Failed() {
		return
	}
	t.Logf("node 0 moved from %s to %s; rank 0 accepted plain connections from %s and saw itself at %s", logical[0], moved, c.addr(1), logical[0])
}
