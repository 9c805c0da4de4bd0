package radicd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/reconfigure"
)

// locNode is one daemon's location table served over HTTP on
// 127.79.B.(id+1).
type locNode struct {
	loc   *locator
	srv   *http.Server
	ln    net.Listener
	hits  atomic.Int64 // requests served
	peers sync.Map     // setPeer calls: id -> netip.AddrPort
	saved atomic.Value // last persisted addrState
}

type locCluster struct {
	t     *testing.T
	nodes []*locNode
}

// newLocCluster starts n locators on 127.79.base.(id+1), random ports.
func newLocCluster(t *testing.T, base, n int) *locCluster {
	t.Helper()
	c := &locCluster{t: t}
	peers := map[heartbeat.NodeID]netip.AddrPort{}
	for id := range n {
		ln, err := net.Listen("tcp4", fmt.Sprintf("127.79.%d.%d:0", base, id+1))
		if err != nil {
			t.Skipf("cannot bind a 127.79 address: %v", err)
		}
		c.nodes = append(c.nodes, &locNode{ln: ln})
		peers[heartbeat.NodeID(id)] = ln.Addr().(*net.TCPAddr).AddrPort()
	}
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	ctx, cancel := context.WithCancel(context.Background())
	for id, nd := range c.nodes {
		loc, err := newLocator(id, peers, client, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		loc.bgCtx = ctx
		loc.setPeer = func(p int, a netip.AddrPort) { nd.peers.Store(p, a) }
		loc.persist = func(st addrState) error { nd.saved.Store(st); return nil }
		nd.loc = loc
		mux := http.NewServeMux()
		loc.routes(mux)
		nd.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			nd.hits.Add(1)
			mux.ServeHTTP(w, r)
		})}
		go nd.srv.Serve(nd.ln)
	}
	t.Cleanup(func() {
		cancel()
		for _, nd := range c.nodes {
			nd.srv.Close()
			nd.loc.bg.Wait()
		}
	})
	return c
}

func (c *locCluster) addr(id int) string { return c.nodes[id].ln.Addr().String() }

// do makes a request to node id and returns the status and body.
func (c *locCluster) do(id int, method, path, body string) (int, string) {
	c.t.Helper()
	req, _ := http.NewRequest(method, "http://"+c.addr(id)+path, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s on node %d: %v", method, path, id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func (c *locCluster) locate(id int, job, addr string) (int, string) {
	return c.do(id, http.MethodGet, "/v1/locate?job="+job+"&addr="+addr, "")
}

func (c *locCluster) hits() []int64 {
	var h []int64
	for _, nd := range c.nodes {
		h = append(h, nd.hits.Load())
	}
	return h
}

func TestLocatorRegistrationPush(t *testing.T) {
	c := newLocCluster(t, 1, 3)
	code, body := c.do(0, http.MethodPost, "/v1/listeners", `{"job":"J","port":20003,"lpid":"3","ctl_port":41234}`)
	if code != http.StatusNoContent {
		t.Fatalf("register: %d %s", code, body)
	}
	ip0 := c.nodes[0].ln.Addr().(*net.TCPAddr).IP.String()
	want := fmt.Sprintf(`{"managed":true,"node":0,"lpid":"3","addr":"%s:20003","ctl":"%s:41234","gen":0}`, ip0, ip0)
	before := c.hits()
	for id := range 3 {
		code, body := c.locate(id, "J", ip0+":20003")
		if code != 200 || body != want {
			t.Errorf("locate on node %d: %d %s\nwant %s", id, code, body, want)
		}
	}
	if after := c.hits(); after[0]-before[0] != 1 || after[1]-before[1] != 1 || after[2]-before[2] != 1 {
		t.Errorf("pushed registrations needed more traffic: requests %v -> %v", before, after)
	}
	// A pushed registration is not pushed further.
	code, _ = c.do(1, http.MethodPost, "/v1/listeners?from=0", `{"job":"K","port":1,"lpid":"9","ctl_port":2}`)
	if code != http.StatusNoContent {
		t.Fatalf("push: %d", code)
	}
	if _, found := c.nodes[1].loc.table.Locate("K", netip.AddrPortFrom(netip.MustParseAddr(ip0), 1)); !found {
		t.Error("the push did not reach node 1's table")
	}
	for _, id := range []int{0, 2} {
		if l := c.nodes[id].loc.table.Listeners(); len(l) != 1 {
			t.Errorf("node %d got a pushed registration re-pushed: %+v", id, l)
		}
	}
	// Unregistration is pushed too.
	code, _ = c.do(0, http.MethodDelete, "/v1/listeners", `{"job":"J","port":20003,"lpid":"3","ctl_port":41234}`)
	if code != http.StatusNoContent {
		t.Fatalf("unregister: %d", code)
	}
	for id := range 3 {
		if code, body := c.locate(id, "J", ip0+":20003"); body != `{"managed":false}` {
			t.Errorf("after unregister, locate on node %d: %d %s", id, code, body)
		}
	}
	if v := counterValue(t, c.nodes[2].loc.lookups, lookupHit); v != 1 {
		t.Errorf("node 2 hits = %v, want 1", v)
	}
}

func TestLocatorBadRequests(t *testing.T) {
	c := newLocCluster(t, 2, 2)
	for _, tc := range []struct {
		method, path, body string
		code               int
		msg                string
	}{
		{"POST", "/v1/listeners", `{"job":`, 400, "bad JSON"},
		{"POST", "/v1/listeners", ``, 400, "bad JSON"},
		{"POST", "/v1/listeners", `{"port":1,"lpid":"1","ctl_port":2}`, 400, `"job"`},
		{"POST", "/v1/listeners", `{"job":"J","lpid":"1","ctl_port":2}`, 400, `"port"`},
		{"POST", "/v1/listeners", `{"job":"J","port":70000,"lpid":"1","ctl_port":2}`, 400, `port`},
		{"POST", "/v1/listeners", `{"job":"J","port":1,"ctl_port":2}`, 400, `"lpid"`},
		{"POST", "/v1/listeners", `{"job":"J","port":1,"lpid":"1"}`, 400, `"ctl_port"`},
		{"DELETE", "/v1/listeners", `{"port":1}`, 400, `"job"`},
		{"DELETE", "/v1/listeners", `{"job":"J","port":1}`, 204, ""},
		{"POST", "/v1/listeners?from=x", `{"job":"J","port":1,"lpid":"1","ctl_port":2}`, 400, `"from"`},
		{"POST", "/v1/listeners?from=0", `{"job":"J","port":1,"lpid":"1","ctl_port":2}`, 400, `"from"`}, // itself
		{"POST", "/v1/listeners?from=9", `{"job":"J","port":1,"lpid":"1","ctl_port":2}`, 400, `"from"`},
		{"GET", "/v1/locate?addr=1.2.3.4:5", "", 400, `"job"`},
		{"GET", "/v1/locate?job=J", "", 400, `"addr"`},
		{"GET", "/v1/locate?job=J&addr=1.2.3.4", "", 400, `"addr"`},
		{"GET", "/v1/locate?job=J&addr=nowhere:80", "", 400, `"addr"`},
		{"GET", "/v1/locate?job=J&addr=1.2.3.4:5&local=maybe", "", 400, `"local"`},
		{"POST", "/v1/nodes/moved", `{"id":1,"gen":1}`, 400, `"addr"`},
		{"POST", "/v1/nodes/moved", `{"id":1,"addr":"10.1.1.1"}`, 400, `"gen"`},
		{"POST", "/v1/nodes/moved", `{"id":7,"addr":"10.1.1.1","gen":1}`, 400, `"id"`},
		{"POST", "/v1/nodes/moved", `{"id":0,"addr":"10.1.1.1","gen":1}`, 409, `this node`},
		{"PUT", "/v1/listeners", `{}`, 405, ""},
	} {
		code, body := c.do(0, tc.method, tc.path, tc.body)
		if code != tc.code || !strings.Contains(body, tc.msg) {
			t.Errorf("%s %s %s: %d %q, want %d and a message containing %s", tc.method, tc.path, tc.body, code, body, tc.code, tc.msg)
		}
	}
}

// A lookup that misses asks the node's daemon (once: the hit is cached);
// an address outside the cluster, or of this node, is answered with no
// traffic at all; a daemon that cannot be asked gives 503.
func TestLocatorMissAsksOwner(t *testing.T) {
	c := newLocCluster(t, 3, 3)
	// Node 1 knows its listener, but the push to the others was lost.
	l := reconfigure.Listener{Job: "J", Node: 1, Port: 20001, LPID: "1", CtlPort: 41001}
	if _, err := c.nodes[1].loc.table.Register(l); err != nil {
		t.Fatal(err)
	}
	ip1 := c.nodes[1].ln.Addr().(*net.TCPAddr).IP.String()
	before := c.hits()
	code, body := c.locate(2, "J", ip1+":20001")
	want := fmt.Sprintf(`{"managed":true,"node":1,"lpid":"1","addr":"%s:20001","ctl":"%s:41001","gen":0}`, ip1, ip1)
	if code != 200 || body != want {
		t.Fatalf("locate on node 2: %d %s\nwant %s", code, body, want)
	}
	if h := c.hits(); h[1]-before[1] != 1 {
		t.Errorf("node 1 was asked %d times, want once", h[1]-before[1])
	}
	// Cached: node 2 answers alone now, even from its table only.
	before = c.hits()
	if code, body := c.do(2, "GET", "/v1/locate?local=1&job=J&addr="+ip1+":20001", ""); code != 200 || body != want {
		t.Errorf("cached lookup: %d %s", code, body)
	}
	if h := c.hits(); h[1] != before[1] {
		t.Errorf("a cached hit asked node 1 again")
	}
	// A miss on node 1 is asked of node 1 and stays a miss.
	if _, body := c.locate(2, "J", ip1+":20002"); body != `{"managed":false}` {
		t.Errorf("remote miss: %s", body)
	}
	if _, body := c.locate(2, "other-job", ip1+":20001"); body != `{"managed":false}` {
		t.Errorf("other job: %s", body)
	}
	// No traffic: outside the cluster, this node's own address, local=1.
	before = c.hits()
	ip2 := c.nodes[2].ln.Addr().(*net.TCPAddr).IP.String()
	for _, q := range []string{"job=J&addr=192.0.2.1:80", "job=J&addr=[2001:db8::1]:80", "job=J&addr=" + ip2 + ":20001",
		"job=J&addr=" + ip1 + ":20009&local=1"} {
		if code, body := c.do(2, "GET", "/v1/locate?"+q, ""); code != 200 || body != `{"managed":false}` {
			t.Errorf("locate %s: %d %s", q, code, body)
		}
	}
	if h := c.hits(); h[0] != before[0] || h[1] != before[1] {
		t.Errorf("answers that need no other daemon made traffic: %v -> %v", before, h)
	}
	// Node 0's daemon is gone: a miss on its address cannot be answered.
	c.nodes[0].srv.Close()
	ip0 := c.nodes[0].ln.Addr().(*net.TCPAddr).IP.String()
	start := time.Now()
	code, body = c.locate(2, "J", ip0+":20000")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "node 0") {
		t.Errorf("owner down: %d %s, want 503 naming node 0", code, body)
	}
	if el := time.Since(start); el > 2*locPeerTimeout {
		t.Errorf("owner down: answered after %v", el)
	}
	lk := c.nodes[2].loc.lookups
	for r, want := range map[string]float64{lookupRemoteHit: 1, lookupRemoteMiss: 2, lookupHit: 1, lookupOutside: 2, lookupMiss: 2, lookupError: 1} {
		if v := counterValue(t, lk, r); v != want {
			t.Errorf("lookups{result=%s} = %v, want %v", r, v, want)
		}
	}
}

// A node the ring has declared dead is neither pushed to nor asked: a
// registration and a lookup go on without waiting for its daemon (a
// restarted rank's listen() waited locPeerTimeout for the push to its
// dead node before its peers could find it).
func TestLocatorSkipsDeadNodes(t *testing.T) {
	c := newLocCluster(t, 1, 3)
	for _, nd := range c.nodes {
		nd.loc.dead = func(id int) bool { return id == 2 }
	}
	before := c.hits()
	if code, body := c.do(0, http.MethodPost, "/v1/listeners", `{"job":"J","port":20003,"lpid":"3","ctl_port":41234}`); code != http.StatusNoContent {
		t.Fatalf("register: %d %s", code, body)
	}
	ip2 := c.nodes[2].ln.Addr().(*net.TCPAddr).IP.String()
	if code, body := c.locate(0, "J", ip2+":20002"); code != http.StatusServiceUnavailable || !strings.Contains(body, "declared dead") {
		t.Errorf("a lookup of the dead node's listener: %d %s, want 503 naming it dead", code, body)
	}
	if h := c.hits(); h[2] != before[2] || h[1]-before[1] != 1 {
		t.Errorf("requests per node %v -> %v: want one push to node 1 and none to the dead node 2", before, h)
	}
}

func TestLocatorMoves(t *testing.T) {
	c := newLocCluster(t, 4, 3)
	ip := netip.MustParseAddr
	nodes := func(id int) map[int]reconfigure.NodeInfo {
		_, body := c.do(id, "GET", "/v1/nodes", "")
		var rep reconfigure.NodesReply
		if err := json.Unmarshal([]byte(body), &rep); err != nil {
			t.Fatalf("nodes: %v: %s", err, body)
		}
		m := map[int]reconfigure.NodeInfo{}
		for _, n := range rep.Nodes {
			m[n.ID] = n
		}
		return m
	}
	if n := nodes(2); len(n) != 3 || n[1].Logical != "127.79.4.2" || n[1].Addr != "127.79.4.2" || n[1].Gen != 0 {
		t.Fatalf("nodes before: %+v", n)
	}
	post := func(to int, m string) int {
		code, _ := c.do(to, "POST", "/v1/nodes/moved", m)
		return code
	}
	if code := post(2, `{"id":1,"addr":"127.79.14.2","gen":2}`); code != 204 {
		t.Fatalf("moved: %d", code)
	}
	if code := post(2, `{"id":1,"addr":"127.79.13.2","gen":1}`); code != 204 { // stale: ignored
		t.Fatalf("stale moved: %d", code)
	}
	if n := nodes(2)[1]; n.Addr != "127.79.14.2" || n.Gen != 2 || n.Logical != "127.79.4.2" {
		t.Errorf("node 1 after moves: %+v", n)
	}
	if a, _ := c.nodes[2].peers.Load(1); a != netip.MustParseAddrPort("127.79.14.2:"+fmt.Sprint(c.nodes[1].loc.ports[1])) {
		t.Errorf("heartbeats not redirected: setPeer(1) = %v", a)
	}
	// A listener of node 1 is found by its logical and current address,
	// and answered with the current one.
	c.nodes[2].loc.table.Register(reconfigure.Listener{Job: "J", Node: 1, Port: 7, LPID: "p", CtlPort: 8})
	for _, a := range []string{"127.79.4.2:7", "127.79.14.2:7"} {
		if _, body := c.locate(2, "J", a); body != `{"managed":true,"node":1,"lpid":"p","addr":"127.79.14.2:7","ctl":"127.79.14.2:8","gen":2}` {
			t.Errorf("locate %s after the move: %s", a, body)
		}
	}

	// Node 0 moves itself: it persists the generation and tells the others.
	gen := c.nodes[0].loc.moveSelf(ip("127.79.24.1"), 0, "test")
	if gen != 1 || c.nodes[0].saved.Load() != (addrState{Addr: "127.79.24.1", Gen: 1}) {
		t.Errorf("moveSelf: gen %d, persisted %+v", gen, c.nodes[0].saved.Load())
	}
	deadline := time.Now().Add(2 * time.Second)
	for nodes(1)[0].Addr != "127.79.24.1" || nodes(2)[0].Addr != "127.79.24.1" {
		if time.Now().After(deadline) {
			t.Fatalf("the move was not announced: node 1 sees %+v, node 2 %+v", nodes(1)[0], nodes(2)[0])
		}
		time.Sleep(10 * time.Millisecond)
	}
	if v := counterValue(t, c.nodes[1].loc.moves, viaAnnounce); v != 1 {
		t.Errorf("node 1 moves{via=announce} = %v", v)
	}

	// Heartbeats from a new address: node 2 asks node 1's daemon there.
	// Node 1 moved to 127.79.34.2 (its daemon answers there too), and
	// node 2 missed the announcement.
	c.nodes[1].loc.table.Move(1, ip("127.79.34.2"), 3)
	ln, err := net.Listen("tcp4", fmt.Sprintf("127.79.34.2:%d", c.nodes[1].loc.ports[1]))
	if err != nil {
		t.Skipf("cannot bind node 1's new address: %v", err)
	}
	go c.nodes[1].srv.Serve(ln)
	c.nodes[2].loc.noteSource(1, netip.MustParseAddrPort("127.79.34.2:7470"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.nodes[2].loc.routineSources(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline = time.Now().Add(2 * time.Second)
	for nodes(2)[1].Addr != "127.79.34.2" {
		if time.Now().After(deadline) {
			t.Fatalf("node 2 did not learn node 1's move from its heartbeats: %+v", nodes(2)[1])
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Sync: node 0 takes newer entries; an entry for itself newer than
	// its own makes it move again above it.
	c.nodes[0].loc.merge([]reconfigure.NodeInfo{
		{ID: 1, Addr: "127.79.34.2", Gen: 3}, {ID: 2, Addr: "127.79.4.3", Gen: 0}, {ID: 0, Addr: "127.79.99.1", Gen: 5}}, viaSync)
	if n, _ := c.nodes[0].loc.table.Node(1); n.Gen != 3 {
		t.Errorf("sync: node 1 at gen %d", n.Gen)
	}
	if n, _ := c.nodes[0].loc.table.Node(0); n.Gen != 6 || n.Addr != ip("127.79.24.1") {
		t.Errorf("sync: this node is %+v, want its own address at gen 6", n)
	}
}

// The API's bodies are exactly the documented ones.
func TestLocatorWireExamples(t *testing.T) {
	c := newLocCluster(t, 5, 2)
	_, body := c.do(1, "GET", "/v1/nodes", "")
	var buf bytes.Buffer
	json.Compact(&buf, []byte(body))
	if buf.String() != `{"nodes":[{"id":0,"logical":"127.79.5.1","addr":"127.79.5.1","gen":0},{"id":1,"logical":"127.79.5.2","addr":"127.79.5.2","gen":0}]}` {
		t.Errorf("GET /v1/nodes = %s", body)
	}
}

// counterValue reads one labelled value of a counter vector.
func counterValue(t *testing.T, cv *prometheus.CounterVec, value string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(cv)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// A restarted radicd keeps its address generation: the same address
// restores it, another one (the node moved while radicd was down) is a
// move with the next generation.
func TestInitAddressRestoresGeneration(t *testing.T) {
	for _, tc := range []struct {
		name     string
		recorded *addrState
		wantGen  uint64
	}{
		{"first start", nil, 0},
		{"same address", &addrState{Addr: "127.79.6.1", Gen: 2}, 2},
		{"moved while down", &addrState{Addr: "127.79.16.1", Gen: 2}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.recorded != nil {
				if err := saveAddrState(dir, *tc.recorded); err != nil {
					t.Fatal(err)
				}
			}
			peers := map[heartbeat.NodeID]netip.AddrPort{0: netip.MustParseAddrPort("127.79.6.1:7470")}
			loc, err := newLocator(0, peers, &http.Client{}, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			loc.persist = func(st addrState) error { return saveAddrState(dir, st) }
			d := &Daemon{cfg: Config{Listen: peers[0], StateDir: dir}, self: 0, log: slog.New(slog.DiscardHandler), loc: loc}
			if _, watch := d.initAddress(); watch {
				t.Error("a daemon bound to its --listen address follows the node's address")
			}
			loc.bg.Wait()
			n, _ := loc.table.Node(0)
			if n.Gen != tc.wantGen || n.Addr != netip.MustParseAddr("127.79.6.1") {
				t.Errorf("after start: %+v, want 127.79.6.1 at gen %d", n, tc.wantGen)
			}
			st, have, err := loadAddrState(dir)
			if tc.wantGen > 0 && (!have || err != nil || st.Gen != tc.wantGen || st.Addr != "127.79.6.1") {
				t.Errorf("recorded %+v %v %v, want gen %d", st, have, err, tc.wantGen)
			}
		})
	}
}
