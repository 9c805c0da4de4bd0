package reconfigure

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
)

var (
	ip  = netip.MustParseAddr
	ipp = netip.MustParseAddrPort
)

// cluster3 is a table of nodes 0-2 at 10.77.0.(id+1), node 1 registered
// as listening for job "j" on 20001 (lpid "1", control port 41001).
func cluster3(t *testing.T) *Table {
	t.Helper()
	tb := NewTable()
	for id := range 3 {
		if err := tb.AddNode(id, netip.AddrFrom4([4]byte{10, 77, 0, byte(id + 1)})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tb.Register(Listener{Job: "j", Node: 1, Port: 20001, LPID: "1", CtlPort: 41001}); err != nil {
		t.Fatal(err)
	}
	return tb
}

func TestMoveGenerations(t *testing.T) {
	type move struct {
		addr  string
		gen   uint64
		moved bool
	}
	for _, tc := range []struct {
		name     string
		moves    []move
		wantAddr string
		wantGen  uint64
	}{
		{"none", nil, "10.77.0.2", 0},
		{"one", []move{{"10.77.1.2", 1, true}}, "10.77.1.2", 1},
		{"generation 0 is stale", []move{{"10.77.1.2", 0, false}}, "10.77.0.2", 0},
		{"in order", []move{{"10.77.1.2", 1, true}, {"10.77.2.2", 2, true}}, "10.77.2.2", 2},
		{"stale after newer", []move{{"10.77.2.2", 2, true}, {"10.77.1.2", 1, false}}, "10.77.2.2", 2},
		{"same generation twice", []move{{"10.77.1.2", 1, true}, {"10.77.9.2", 1, false}}, "10.77.1.2", 1},
		{"skipped generation", []move{{"10.77.5.2", 5, true}}, "10.77.5.2", 5},
		{"back to the logical address", []move{{"10.77.1.2", 1, true}, {"10.77.0.2", 2, true}}, "10.77.0.2", 2},
		{"mapped IPv4", []move{{"::ffff:10.77.1.2", 1, true}}, "10.77.1.2", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := cluster3(t)
			for _, m := range tc.moves {
				moved, err := tb.Move(1, ip(m.addr), m.gen)
				if err != nil || moved != m.moved {
					t.Errorf("Move(1, %s, %d) = %v, %v; want %v", m.addr, m.gen, moved, err, m.moved)
				}
			}
			n, ok := tb.Node(1)
			if !ok || n.Addr != ip(tc.wantAddr) || n.Gen != tc.wantGen || n.Logical != ip("10.77.0.2") {
				t.Errorf("node 1 = %+v, want addr %s gen %d logical 10.77.0.2", n, tc.wantAddr, tc.wantGen)
			}
		})
	}
}

func TestTableErrors(t *testing.T) {
	tb := cluster3(t)
	if _, err := tb.Move(7, ip("10.77.1.8"), 1); err == nil {
		t.Error("Move of an unknown node succeeded")
	}
	if _, err := tb.Move(1, netip.Addr{}, 1); err == nil {
		t.Error("Move to no address succeeded")
	}
	if _, err := tb.Move(1, ip("0.0.0.0"), 1); err == nil {
		t.Error("Move to 0.0.0.0 succeeded")
	}
	if err := tb.AddNode(1, ip("10.77.0.2")); err != nil {
		t.Errorf("AddNode again, same address: %v", err)
	}
	if err := tb.AddNode(1, ip("10.77.0.9")); err == nil {
		t.Error("AddNode again with another logical address succeeded")
	}
	for _, l := range []Listener{
		{Node: 1, Port: 1, LPID: "1", CtlPort: 1},
		{Job: "j", Node: 1, LPID: "1", CtlPort: 1},
		{Job: "j", Node: 1, Port: 1, CtlPort: 1},
		{Job: "j", Node: 1, Port: 1, LPID: "1"},
		{Job: "j", Node: 9, Port: 1, LPID: "1", CtlPort: 1},
	} {
		if _, err := tb.Register(l); err == nil {
			t.Errorf("Register(%+v) succeeded", l)
		}
	}
	var zero Table
	if _, ok := zero.Locate("j", ipp("10.77.0.1:1")); ok {
		t.Error("the zero Table found a node")
	}
	if err := zero.AddNode(0, ip("10.0.0.1")); err != nil {
		t.Errorf("the zero Table is not ready: %v", err)
	}
}

func TestLocate(t *testing.T) {
	tb := cluster3(t)
	if _, err := tb.Move(1, ip("10.77.1.2"), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Move(1, ip("10.77.2.2"), 2); err != nil {
		t.Fatal(err)
	}
	managed := Location{Managed: true, Node: 1, LPID: "1", Addr: ipp("10.77.2.2:20001"), Ctl: ipp("10.77.2.2:41001"), Gen: 2}
	for _, tc := range []struct {
		name, job, addr string
		found           bool
		want            Location
	}{
		{"logical", "j", "10.77.0.2:20001", true, managed},
		{"current", "j", "10.77.2.2:20001", true, managed},
		{"earlier", "j", "10.77.1.2:20001", true, managed},
		{"mapped", "j", "[::ffff:10.77.0.2]:20001", true, managed},
		{"unknown job", "k", "10.77.0.2:20001", true, Location{Node: 1, Addr: ipp("10.77.2.2:20001"), Gen: 2}},
		{"unknown port", "j", "10.77.0.2:20002", true, Location{Node: 1, Addr: ipp("10.77.2.2:20002"), Gen: 2}},
		{"other node, same port", "j", "10.77.0.1:20001", true, Location{Node: 0, Addr: ipp("10.77.0.1:20001")}},
		{"outside the cluster", "j", "192.0.2.1:20001", false, Location{}},
		{"IPv6", "j", "[2001:db8::1]:20001", false, Location{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, found := tb.Locate(tc.job, ipp(tc.addr))
			if found != tc.found || got != tc.want {
				t.Errorf("Locate(%s, %s) = %+v, %v; want %+v, %v", tc.job, tc.addr, got, found, tc.want, tc.found)
			}
		})
	}
}

// An address held now by one node and logically by another: applications
// name the logical owner, the wire shows the current one.
func TestAddressPrecedence(t *testing.T) {
	tb := cluster3(t)
	// Node 0 moves onto node 2's logical address (node 2 moved away).
	tb.Move(2, ip("10.77.1.3"), 1)
	tb.Move(0, ip("10.77.0.3"), 1)
	if n, _ := tb.NodeByAddr(ip("10.77.0.3")); n.ID != 0 {
		t.Errorf("NodeByAddr(10.77.0.3) = node %d, want 0 (current address wins on the wire)", n.ID)
	}
	if l, _ := tb.Locate("j", ipp("10.77.0.3:1")); l.Node != 2 {
		t.Errorf("Locate(10.77.0.3) = node %d, want 2 (logical address wins for applications)", l.Node)
	}
	// An earlier address taken by another node belongs to that node.
	tb.Move(1, ip("10.77.5.2"), 1)
	tb.Move(1, ip("10.77.6.2"), 2)
	tb.Move(0, ip("10.77.5.2"), 2)
	for _, f := range []func(netip.Addr) int{
		func(a netip.Addr) int { n, _ := tb.NodeByAddr(a); return n.ID },
		func(a netip.Addr) int { l, _ := tb.Locate("j", netip.AddrPortFrom(a, 1)); return l.Node },
	} {
		if id := f(ip("10.77.5.2")); id != 0 {
			t.Errorf("10.77.5.2 (node 1's earlier, node 0's current) -> node %d, want 0", id)
		}
	}
	if n, ok := tb.NodeByAddr(ip("10.77.0.2")); !ok || n.ID != 1 || n.Addr != ip("10.77.6.2") {
		t.Errorf("NodeByAddr(logical of 1) = %+v, %v", n, ok)
	}
	if _, ok := tb.NodeByAddr(ip("10.77.9.9")); ok {
		t.Errorf("NodeByAddr of an unknown address found a node")
	}
}

func TestRegisterUnregister(t *testing.T) {
	tb := cluster3(t)
	l := Listener{Job: "j", Node: 1, Port: 20001, LPID: "1", CtlPort: 41001}
	if changed, _ := tb.Register(l); changed {
		t.Error("registering the same listener again changed the table")
	}
	l2 := l
	l2.LPID, l2.CtlPort = "7", 41007 // a restarted process
	if changed, _ := tb.Register(l2); !changed {
		t.Error("a new owner of the port did not change the table")
	}
	if loc, _ := tb.Locate("j", ipp("10.77.0.2:20001")); loc.LPID != "7" || loc.Ctl != ipp("10.77.0.2:41007") {
		t.Errorf("after re-registration: %+v", loc)
	}
	for _, tc := range []struct {
		name    string
		job     string
		node    int
		port    uint16
		lpid    string
		removed bool
	}{
		{"other job", "k", 1, 20001, "", false},
		{"other node", "j", 0, 20001, "", false},
		{"other port", "j", 1, 20002, "", false},
		{"earlier owner", "j", 1, 20001, "1", false},
		{"owner", "j", 1, 20001, "7", true},
		{"again", "j", 1, 20001, "", false},
	} {
		if got := tb.Unregister(tc.job, tc.node, tc.port, tc.lpid); got != tc.removed {
			t.Errorf("%s: Unregister = %v, want %v", tc.name, got, tc.removed)
		}
	}
	if loc, found := tb.Locate("j", ipp("10.77.0.2:20001")); loc.Managed || !found {
		t.Errorf("after Unregister: %+v, %v; want found, not managed", loc, found)
	}
	tb.Register(l)
	if !tb.Unregister("j", 1, 20001, "") {
		t.Error("Unregister without lpid did not remove")
	}
}

func TestListenersAndNodesOrdered(t *testing.T) {
	tb := cluster3(t)
	tb.Register(Listener{Job: "a", Node: 2, Port: 5, LPID: "x", CtlPort: 6})
	tb.Register(Listener{Job: "j", Node: 0, Port: 9, LPID: "x", CtlPort: 6})
	tb.Register(Listener{Job: "j", Node: 0, Port: 3, LPID: "x", CtlPort: 6})
	var got []string
	for _, l := range tb.Listeners() {
		got = append(got, l.Job+"/"+string(rune('0'+l.Node))+"/"+string(rune('0'+l.Port%10)))
	}
	if strings.Join(got, " ") != "a/2/5 j/0/3 j/0/9 j/1/1" {
		t.Errorf("Listeners order: %v", got)
	}
	ns := tb.Nodes()
	if len(ns) != 3 || ns[0].ID != 0 || ns[2].ID != 2 {
		t.Errorf("Nodes: %+v", ns)
	}
}

func TestConcurrentUse(t *testing.T) {
	tb := cluster3(t)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				switch g {
				case 0:
					tb.Move(1, netip.AddrFrom4([4]byte{10, 77, byte(i % 250), 2}), uint64(i+1))
				case 1:
					tb.Register(Listener{Job: "j", Node: 2, Port: uint16(i + 1), LPID: "p", CtlPort: 1})
				case 2:
					tb.Unregister("j", 2, uint16(i), "")
				default:
					tb.Locate("j", ipp("10.77.0.2:20001"))
					tb.NodeByAddr(ip("10.77.3.2"))
					tb.Nodes()
				}
			}
		})
	}
	wg.Wait()
	if n, _ := tb.Node(1); n.Gen != 500 {
		t.Errorf("after 500 moves, gen %d", n.Gen)
	}
}

func TestWire(t *testing.T) {
	b, _ := json.Marshal(LocateReply{})
	if string(b) != `{"managed":false}` {
		t.Errorf("unmanaged reply = %s", b)
	}
	loc := Location{Managed: true, Node: 2, LPID: "3", Addr: ipp("10.77.1.3:20003"), Ctl: ipp("10.77.1.3:41234"), Gen: 1}
	b, _ = json.Marshal(loc.Reply())
	want := `{"managed":true,"node":2,"lpid":"3","addr":"10.77.1.3:20003","ctl":"10.77.1.3:41234","gen":1}`
	if string(b) != want {
		t.Errorf("managed reply = %s\nwant %s", b, want)
	}
	var back LocateReply
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if got, err := back.Location(); err != nil || got != loc {
		t.Errorf("round trip: %+v, %v", got, err)
	}
	if (Location{Node: 1}).Reply() != (LocateReply{}) {
		t.Error("an unmanaged Location has a non-zero reply")
	}
	b, _ = json.Marshal(NodesReply{Nodes: []NodeInfo{{ID: 0, Logical: "10.77.0.1", Addr: "10.77.0.1"}}})
	if string(b) != `{"nodes":[{"id":0,"logical":"10.77.0.1","addr":"10.77.0.1","gen":0}]}` {
		t.Errorf("nodes reply = %s", b)
	}

	for _, tc := range []struct {
		req        ListenerRequest
		unregister bool
		err        string
	}{
		{ListenerRequest{Job: "J", Port: 1, LPID: "3", CtlPort: 2}, false, ""},
		{ListenerRequest{Port: 1, LPID: "3", CtlPort: 2}, false, `"job"`},
		{ListenerRequest{Job: "J", LPID: "3", CtlPort: 2}, false, `"port"`},
		{ListenerRequest{Job: "J", Port: 1, CtlPort: 2}, false, `"lpid"`},
		{ListenerRequest{Job: "J", Port: 1, LPID: "3"}, false, `"ctl_port"`},
		{ListenerRequest{Job: "J", Port: 1}, true, ""},
		{ListenerRequest{Port: 1}, true, `"job"`},
	} {
		err := tc.req.Check(tc.unregister)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("Check(%+v, %v) = %v, want %q", tc.req, tc.unregister, err, tc.err)
		}
	}
	for _, tc := range []struct {
		m   MoveRequest
		err string
	}{
		{MoveRequest{ID: 1, Addr: "10.77.1.2", Gen: 1}, ""},
		{MoveRequest{ID: 1, Gen: 1}, `"addr"`},
		{MoveRequest{ID: 1, Addr: "nowhere", Gen: 1}, `"addr"`},
		{MoveRequest{ID: 1, Addr: "10.77.1.2"}, `"gen"`},
		{MoveRequest{ID: -1, Addr: "10.77.1.2", Gen: 1}, `"id"`},
	} {
		_, err := tc.m.Parse()
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("Parse(%+v) = %v, want %q", tc.m, err, tc.err)
		}
	}
	if _, err := (LocateReply{Managed: true, Addr: "x"}).Location(); err == nil {
		t.Error("a bad reply parsed")
	}
}

// TestEarlier: the addresses a node had before, oldest first, without the
// current one, bounded; what GET /v1/nodes serves so that a connection made
// just before a move is still known to come from the node.
func TestEarlier(t *testing.T) {
	tb := cluster3(t)
	if got := tb.Earlier(1); len(got) != 0 {
		t.Fatalf("a node that never moved has earlier addresses %v", got)
	}
	for g := uint64(1); g <= maxHistory+2; g++ {
		if _, err := tb.Move(1, ip(fmt.Sprintf("10.77.%d.2", g)), g); err != nil {
			t.Fatal(err)
		}
	}
	got := tb.Earlier(1)
	if len(got) != maxHistory || got[0] != ip("10.77.2.2") || got[maxHistory-1] != ip(fmt.Sprintf("10.77.%d.2", maxHistory+1)) {
		t.Fatalf("earlier addresses after %d moves: %v; want the last %d before the current one, oldest first", maxHistory+2, got, maxHistory)
	}
	if tb.Earlier(99) != nil {
		t.Fatal("an unknown node has earlier addresses")
	}
}

// TestLocateClosed: an unregistered listener keeps naming its last
// process (Closed, LPID, Ctl), for a restarted process that replays its
// connect to it; a new registration makes it a listener again.
func TestLocateClosed(t *testing.T) {
	tb := cluster3(t)
	l := Listener{Job: "j", Node: 1, Port: 5000, LPID: "1", CtlPort: 41001}
	if _, err := tb.Register(l); err != nil {
		t.Fatal(err)
	}
	if !tb.Unregister("j", 1, 5000, "1") {
		t.Fatal("Unregister found nothing")
	}
	loc, found := tb.Locate("j", netip.MustParseAddrPort("10.77.0.2:5000"))
	if !found || loc.Managed || !loc.Closed || loc.LPID != "1" || loc.Ctl != netip.MustParseAddrPort("10.77.0.2:41001") {
		t.Fatalf("Locate after Unregister = %+v, %v; want Closed with LPID 1 and Ctl 10.77.0.2:41001", loc, found)
	}
	if r := loc.Reply(); !r.Closed || r.Managed || r.Ctl != "10.77.0.2:41001" {
		t.Errorf("Reply() = %+v", r)
	}
	if b, _ := loc.Reply().MarshalJSON(); !strings.Contains(string(b), `"closed":true`) {
		t.Errorf("closed reply encodes as %s", b)
	}
	if b, _ := (Location{}).Reply().MarshalJSON(); string(b) != `{"managed":false}` {
		t.Errorf("unmanaged reply encodes as %s", b)
	}
	l.CtlPort = 41007 // a restarted process
	if _, err := tb.Register(l); err != nil {
		t.Fatal(err)
	}
	if loc, _ := tb.Locate("j", netip.MustParseAddrPort("10.77.0.2:5000")); !loc.Managed || loc.Closed || loc.Ctl.Port() != 41007 {
		t.Errorf("Locate after a new Register = %+v", loc)
	}
}

// A rank restarted on another node keeps its logical address: its
// listener is registered by the new node's daemon under the rank's own
// node, and the location leads to the new node (the old one is dead),
// before and after the listener is closed; a move of the dead node's
// address changes nothing about it.
func TestLocateMovedListener(t *testing.T) {
	tb := cluster3(t)
	n := 0
	req := ListenerRequest{Job: "j", Port: 20000, LPID: "0", CtlPort: 42000, Node: &n}
	if l := req.Listener(2); !l.Moved || l.Node != 0 || l.Host != 2 {
		t.Fatalf("Listener(2) of a request for node 0 = %+v; want node 0 moved to host 2", l)
	}
	if l := req.Listener(0); l.Moved || l.Node != 0 {
		t.Fatalf("Listener(0) of a request for node 0 = %+v; want node 0, not moved", l)
	}
	if _, err := tb.Register(req.Listener(2)); err != nil {
		t.Fatal(err)
	}
	want := Location{Managed: true, Node: 0, LPID: "0", Addr: ipp("10.77.0.3:20000"), Ctl: ipp("10.77.0.3:42000"), Moved: true, Host: 2}
	if got, _ := tb.Locate("j", ipp("10.77.0.1:20000")); got != want {
		t.Errorf("Locate of the moved listener = %+v\nwant %+v", got, want)
	}
	rep := want.Reply()
	if back, err := rep.Location(); err != nil || back != want {
		t.Errorf("its reply %+v parses back to %+v, %v", rep, back, err)
	}
	if !tb.Unregister("j", req.LogicalNode(2), 20000, "0") {
		t.Fatal("Unregister of the moved listener changed nothing")
	}
	got, _ := tb.Locate("j", ipp("10.77.0.1:20000"))
	if !got.Closed || got.Ctl != ipp("10.77.0.3:42000") || !got.Moved {
		t.Errorf("Locate of the closed moved listener = %+v; want it closed, its control port on host 2", got)
	}
	if _, err := tb.Register(Listener{Job: "j", Node: 0, Port: 1, LPID: "0", CtlPort: 1, Moved: true, Host: 9}); err == nil {
		t.Error("a listener moved to an unknown host was registered")
	}
}
