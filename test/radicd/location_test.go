package radicd_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/cluster"
	"github.com/radic-project/radic/internal/radicd"
	"github.com/radic-project/radic/internal/testenv"
	"github.com/radic-project/radic/reconfigure"
)

// helperMain runs the programs the location tests start as ranks (the
// test binary doubles as them, under RADICD_TEST_HELPER):
//
//	listen  register a radic listener on RADICD_TEST_PORT with the node's
//	        daemon, found through RADIC_DAEMON as the shim finds it, print
//	        the answer, then wait to be killed
//	nodes   print the daemon's GET /v1/nodes
func helperMain(mode string) int {
	daemon := os.Getenv(reconfigure.EnvDaemon)
	if daemon == "" {
		fmt.Println("no " + reconfigure.EnvDaemon)
		return 1
	}
	base := "http://" + daemon
	switch mode {
	case "listen":
		port, _ := strconv.Atoi(os.Getenv("RADICD_TEST_PORT"))
		body, _ := json.Marshal(reconfigure.ListenerRequest{Job: os.Getenv("RADIC_JOB"), Port: uint16(port),
			LPID: "rank-" + os.Getenv("RADIC_RANK"), CtlPort: uint16(port + 1000)})
		resp, err := http.Post(base+reconfigure.PathListeners, "application/json", bytes.NewReader(body))
		if err != nil {
			fmt.Println("register:", err)
			return 1
		}
		resp.Body.Close()
		fmt.Println("registered", resp.StatusCode)
		for {
			time.Sleep(time.Hour)
		}
	case "nodes":
		resp, err := http.Get(base + reconfigure.PathNodes)
		if err != nil {
			fmt.Println("nodes:", err)
			return 1
		}
		defer resp.Body.Close()
		io.Copy(os.Stdout, resp.Body)
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown RADICD_TEST_HELPER", mode)
	return 2
}

// getJSON GETs url into v and returns the status code.
func getJSON(url string, v any) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK && v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			return resp.StatusCode, fmt.Errorf("%v: %s", err, b)
		}
	}
	return resp.StatusCode, nil
}

func sendJSON(t *testing.T, method, url string, v any) int {
	t.Helper()
	b, _ := json.Marshal(v)
	req, _ := http.NewRequest(method, url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// scrape sums one metric of the /metrics at addr over the label sets that
// contain labels.
func scrape(addr, name, labels string) (float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name) || (len(l) > len(name) && l[len(name)] != ' ' && l[len(name)] != '{') {
			continue
		}
		if labels != "" && !strings.Contains(l, labels) {
			continue
		}
		var v float64
		fmt.Sscanf(l[strings.LastIndexByte(l, ' ')+1:], "%g", &v)
		sum += v
	}
	return sum, sc.Err()
}

// TestLocationPushAndRemoteLookup: a registration made on one daemon is
// pushed to the others before the answer, so they answer lookups alone; a
// daemon that missed it (it was down) asks the listener's node once and
// caches the answer; an address outside the cluster is answered at once.
func TestLocationPushAndRemoteLookup(t *testing.T) {
	r := startRing(t, 91, 3, nil)
	url := func(i int, path string) string { return "http://" + r.listen(i) + path }
	locate := func(i int, job, addr string) (reconfigure.LocateReply, int) {
		t.Helper()
		var rep reconfigure.LocateReply
		code, err := getJSON(url(i, reconfigure.PathLocate+"?job="+job+"&addr="+addr), &rep)
		if err != nil {
			t.Fatalf("locate on node %d: %v", i, err)
		}
		return rep, code
	}
	job := "rt-1"
	if code := sendJSON(t, "POST", url(0, reconfigure.PathListeners), reconfigure.ListenerRequest{Job: job, Port: 20000, LPID: "0", CtlPort: 41000}); code != 204 {
		t.Fatalf("register on node 0: %d", code)
	}
	want := reconfigure.LocateReply{Managed: true, Node: 0, LPID: "0", Addr: r.addr(0) + ":20000", Ctl: r.addr(0) + ":41000"}
	for i := range 3 {
		if rep, code := locate(i, job, r.addr(0)+":20000"); code != 200 || rep != want {
			t.Errorf("locate on node %d: %d %+v, want %+v", i, code, rep, want)
		}
	}
	for i := 1; i < 3; i++ {
		if hits, _ := scrape(r.metrics(i), "radic_location_lookups_total", `result="hit"`); hits != 1 {
			t.Errorf("node %d: %v local hits, want 1 (the registration was pushed)", i, hits)
		}
		if remote, _ := scrape(r.metrics(i), "radic_location_lookups_total", `result="remote_`); remote != 0 {
			t.Errorf("node %d asked node 0 although the registration was pushed", i)
		}
	}

	// Node 2 is down while node 0 registers a second listener: the push
	// to it fails, the registration still succeeds at once.
	r.kill(2)
	start := time.Now()
	if code := sendJSON(t, "POST", url(0, reconfigure.PathListeners), reconfigure.ListenerRequest{Job: job, Port: 20001, LPID: "1", CtlPort: 41001}); code != 204 {
		t.Fatalf("register with node 2 down: %d", code)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("registering with a daemon down took %v", el)
	}
	if errs, _ := scrape(r.metrics(0), "radic_location_push_errors_total", ""); errs != 1 {
		t.Errorf("node 0 counted %v push errors, want 1", errs)
	}
	r.start(2)
	r.waitRing(3, 5*time.Second)
	// The restarted node 2 has neither registration: it asks node 0.
	want2 := reconfigure.LocateReply{Managed: true, Node: 0, LPID: "1", Addr: r.addr(0) + ":20001", Ctl: r.addr(0) + ":41001"}
	for try := range 2 {
		if rep, code := locate(2, job, r.addr(0)+":20001"); code != 200 || rep != want2 {
			t.Errorf("lookup %d on the restarted node: %d %+v, want %+v", try, code, rep, want2)
		}
	}
	for res, want := range map[string]float64{"remote_hit": 1, "hit": 1} {
		if v, _ := scrape(r.metrics(2), "radic_location_lookups_total", `result="`+res+`"`); v != want {
			t.Errorf("restarted node 2: lookups{result=%s} = %v, want %v (asked once, then cached)", res, v, want)
		}
	}
	if rep, _ := locate(2, job, r.addr(0)+":20009"); rep.Managed {
		t.Errorf("a port nobody registered is managed: %+v", rep)
	}
	// Outside the cluster: no traffic, no wait.
	start = time.Now()
	if rep, code := locate(1, job, "192.0.2.1:80"); code != 200 || rep.Managed {
		t.Errorf("outside address: %d %+v", code, rep)
	}
	if v, _ := scrape(r.metrics(1), "radic_location_lookups_total", `result="outside"`); v != 1 {
		t.Errorf("node 1: lookups{result=outside} = %v", v)
	}
	t.Logf("outside lookup answered in %v", time.Since(start).Round(time.Microsecond))
	// Unregistration is pushed.
	if code := sendJSON(t, "DELETE", url(0, reconfigure.PathListeners), reconfigure.ListenerRequest{Job: job, Port: 20000}); code != 204 {
		t.Fatalf("unregister: %d", code)
	}
	if rep, _ := locate(1, job, r.addr(0)+":20000"); rep.Managed {
		t.Errorf("node 1 still has the unregistered listener: %+v", rep)
	}
	// Every daemon lists every node.
	for i := range 3 {
		var nodes reconfigure.NodesReply
		if _, err := getJSON(url(i, reconfigure.PathNodes), &nodes); err != nil || len(nodes.Nodes) != 3 || nodes.Nodes[2].Logical != r.addr(2) {
			t.Errorf("nodes on %d: %+v %v", i, nodes, err)
		}
	}
}

// netnsCluster is a `radic cluster` in netns mode with real daemons, for
// one test, removed in cleanup.
type netnsCluster struct {
	t   *testing.T
	dir string
	env []string
}

// with is c seen from test t (a subtest): its failures end t, not c's.
func (c *netnsCluster) with(t *testing.T) *netnsCluster {
	cc := *c
	cc.t = t
	return &cc
}

func newNetnsCluster(t *testing.T, nodes int, upArgs ...string) *netnsCluster {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip")
	testenv.RequireCommand(t, "nft")
	dir, err := os.MkdirTemp("", "rd") // short: notify socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	c := &netnsCluster{t: t, dir: dir, env: append(os.Environ(), "RADIC_STATE_DIR="+dir, "RADIC_RADICD="+radicdBin)}
	name := fmt.Sprintf("td%05x", rand.IntN(1<<20))
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpLogs()
		}
		if out, err := c.radic("cluster", "down"); err != nil {
			t.Errorf("cleanup: radic cluster down: %v\n%s", err, out)
		}
		os.RemoveAll(dir)
	})
	for try := 0; ; try++ {
		sub := fmt.Sprintf("10.%d.0.0/16", 100+rand.IntN(150))
		out, err := c.radic(append([]string{"cluster", "up", "--mode", "netns", "--name", name, "--nodes", strconv.Itoa(nodes), "--subnet", sub}, append(fabricArgs(), upArgs...)...)...)
		if err == nil {
			break
		}
		if try < 5 && strings.Contains(out, "overlaps a route") {
			continue
		}
		t.Fatalf("radic cluster up: %v\n%s", err, out)
	}
	if !c.state().Daemons {
		t.Fatal("the cluster runs without daemons")
	}
	return c
}

func (c *netnsCluster) radic(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, radicBin, args...)
	cmd.Env = c.env
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (c *netnsCluster) state() *cluster.State {
	c.t.Helper()
	s, err := cluster.Load(c.dir)
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}

func (c *netnsCluster) dumpLogs() {
	s, err := cluster.Load(c.dir)
	if err != nil {
		return
	}
	for _, n := range s.Nodes {
		if b, err := os.ReadFile(filepath.Join(n.StateDir, "radicd.log")); err == nil {
			c.t.Logf("radicd.log of node %d:\n%s", n.ID, b)
		}
	}
}

// daemon is node id's radicd protocol address and metrics address, at
// the node's current address (reachable from the host over the bridge).
func (c *netnsCluster) daemon(id int) (string, string) {
	n, err := c.state().Node(id)
	if err != nil {
		c.t.Fatal(err)
	}
	return net.JoinHostPort(n.Addr, strconv.Itoa(cluster.RadicdPort)), net.JoinHostPort(n.Addr, strconv.Itoa(cluster.MetricsPort))
}

// lockedBuffer is a bytes.Buffer for a writer and readers at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestReaddressIsNotAFailure readdresses node 1 of a 3-node netns cluster
// while a rank of a job runs on it: the move is not a failure (nobody is
// declared dead, node 1 does not fence, its rank survives), every daemon
// learns node 1's new address at generation 1 within 2 s, a lookup of the
// rank's listener by its logical address answers the new one, and the rank
// still reaches its daemon through RADIC_DAEMON.
func TestReaddressIsNotAFailure(t *testing.T) {
	c := newNetnsCluster(t, 3)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const port = 20500
	run := exec.Command(radicBin, "run", "--no-radic", "--np", "1", "--nodes", "1", "--", self)
	run.Env = append(cloneEnv(c.env), "RADICD_TEST_HELPER=listen", "RADICD_TEST_PORT="+strconv.Itoa(port))
	out := new(lockedBuffer)
	run.Stdout, run.Stderr = out, out
	run.WaitDelay = time.Second
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- run.Wait() }()
	t.Cleanup(func() {
		select {
		case <-runDone:
		default:
			_ = run.Process.Signal(syscall.SIGTERM)
			<-runDone
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(out.String(), "registered") {
		select {
		case err := <-runDone:
			t.Fatalf("the rank ended before registering (%v):\n%s", err, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rank did not register within 15 s:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(out.String(), "registered 204") {
		t.Fatalf("registration through RADIC_DAEMON: %s", out)
	}
	s := c.state()
	if len(s.Jobs) != 1 || len(s.Jobs[0].Ranks) != 1 {
		t.Fatalf("jobs: %+v", s.Jobs)
	}
	job, rank := s.Jobs[0].ID, s.Jobs[0].Ranks[0].Proc
	before, _ := s.Node(1)
	logical := before.LogicalAddr

	t0 := time.Now()
	if msg, err := c.radic("fault", "readdress", "1"); err != nil {
		t.Fatalf("readdress: %v\n%s", err, msg)
	}
	after, _ := c.state().Node(1)
	if after.Addr == logical || after.Generation != 1 {
		t.Fatalf("state after readdress: %+v", after)
	}
	newAddr := after.Addr

	// Within 2 s every daemon knows node 1's new address at generation 1,
	// and a lookup of the rank's listener by its logical address answers
	// the new one.
	wantLoc := reconfigure.LocateReply{Managed: true, Node: 1, LPID: "rank-0",
		Addr: net.JoinHostPort(newAddr, strconv.Itoa(port)), Ctl: net.JoinHostPort(newAddr, strconv.Itoa(port+1000)), Gen: 1}
	pending := map[string]bool{}
	for id := range 3 {
		pending["nodes "+strconv.Itoa(id)] = true
		pending["locate "+strconv.Itoa(id)] = true
	}
	last := map[string]string{}
	for len(pending) > 0 {
		for id := range 3 {
			d, _ := c.daemon(id)
			k := "nodes " + strconv.Itoa(id)
			if pending[k] {
				var nodes reconfigure.NodesReply
				_, err := getJSON("http://"+d+reconfigure.PathNodes, &nodes)
				last[k] = fmt.Sprintf("%+v %v", nodes, err)
				if err == nil && len(nodes.Nodes) == 3 && reflect.DeepEqual(nodes.Nodes[1], reconfigure.NodeInfo{ID: 1, Logical: logical, Addr: newAddr, Gen: 1, Earlier: []string{logical}}) {
					delete(pending, k)
					t.Logf("node %d knows node 1's new address %v after the readdress", id, time.Since(t0).Round(time.Millisecond))
				}
			}
			k = "locate " + strconv.Itoa(id)
			if pending[k] {
				var rep reconfigure.LocateReply
				code, err := getJSON("http://"+d+reconfigure.PathLocate+"?job="+job+"&addr="+net.JoinHostPort(logical, strconv.Itoa(port)), &rep)
				last[k] = fmt.Sprintf("%d %+v %v", code, rep, err)
				if code == 200 && rep == wantLoc {
					delete(pending, k)
				}
			}
		}
		if time.Since(t0) > 2*time.Second {
			for k := range pending {
				t.Errorf("2 s after the readdress, %s: %s", k, last[k])
			}
			t.FailNow()
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Let the detectors run well past their deadlines (heartbeat timeout +
	// probe timeout = 0.6 s; fence timeout 0.4 s), then check.
	time.Sleep(time.Until(t0.Add(2500 * time.Millisecond)))
	for id := range 3 {
		_, m := c.daemon(id)
		var st radicd.NodeStatus
		if _, err := getJSON("http://"+m+"/status", &st); err != nil {
			t.Errorf("status of node %d: %v", id, err)
			continue
		}
		if st.Ring.Fenced || st.LastFence != nil || len(st.Ring.Ring) != 3 {
			t.Errorf("node %d after the readdress: fenced %v, last fence %+v, ring %v", id, st.Ring.Fenced, st.LastFence, st.Ring.Ring)
		}
		for _, mem := range st.Ring.Members {
			if mem.State != "alive" {
				t.Errorf("node %d sees node %d %s", id, mem.ID, mem.State)
			}
		}
		if f, err := scrape(m, "radic_failures_detected_total", ""); err != nil || f != 0 {
			t.Errorf("node %d declared %v failures (%v)", id, f, err)
		}
		if f, _ := scrape(m, "radic_fences_total", ""); f != 0 {
			t.Errorf("node %d fenced itself %v times", id, f)
		}
		if id == 1 && (st.Addr != net.JoinHostPort(newAddr, strconv.Itoa(cluster.RadicdPort)) || st.AddrGen != 1) {
			t.Errorf("node 1's status: addr %s gen %d", st.Addr, st.AddrGen)
		}
	}
	if !rank.Alive() {
		t.Errorf("the rank on node 1 (pid %d) did not survive the readdress:\n%s", rank.Pid, out)
	}
	select {
	case err := <-runDone:
		t.Errorf("the job ended (%v):\n%s", err, out)
	default:
	}
	// The rank's RADIC_DAEMON still reaches its daemon.
	probe := exec.Command(radicBin, "run", "--no-radic", "--np", "1", "--nodes", "1", "--", self)
	probe.Env = append(cloneEnv(c.env), "RADICD_TEST_HELPER=nodes")
	b, err := probe.CombinedOutput()
	var nodes reconfigure.NodesReply
	if err != nil || json.Unmarshal(b, &nodes) != nil || len(nodes.Nodes) != 3 || nodes.Nodes[1].Addr != newAddr {
		t.Errorf("GET /v1/nodes through RADIC_DAEMON after the readdress: %v\n%s", err, b)
	}
	// How each daemon learnt the move: the announcement and the heartbeats
	// from the new address race.
	for _, id := range []int{0, 2} {
		_, m := c.daemon(id)
		var via []string
		for _, v := range []string{"announce", "heartbeat", "sync", "locate"} {
			if n, _ := scrape(m, "radic_location_moves_total", `via="`+v+`"`); n > 0 {
				via = append(via, fmt.Sprintf("%s=%v", v, n))
			}
		}
		t.Logf("node %d learnt the move by %s", id, strings.Join(via, ", "))
	}
}

func cloneEnv(env []string) []string { return append([]string(nil), env...) }

// TestReaddressLearntFromHeartbeats: node 1's announcements of its move are
// dropped (its outgoing TCP to the daemons' port), so its peers must learn
// the move from its heartbeats, which now come from the new address, and
// by asking its daemon there. No failure, no fence either.
func TestReaddressLearntFromHeartbeats(t *testing.T) {
	if testFabric == "bg" {
		t.Skip("on the Blue Gene fabric a move's announcement is a request on a fabric stream, over UDP with the heartbeats: dropping the daemons' TCP cannot make a node miss it while its heartbeats get through")
	}
	c := newNetnsCluster(t, 3)
	n1, _ := c.state().Node(1)
	for _, cmd := range []string{
		"add table inet radtest",
		"add chain inet radtest out { type filter hook output priority 0 ; policy accept ; }",
		fmt.Sprintf("add rule inet radtest out tcp dport %d drop", cluster.RadicdPort),
	} {
		if b, err := exec.Command("ip", append([]string{"netns", "exec", n1.Netns, "nft"}, strings.Fields(cmd)...)...).CombinedOutput(); err != nil {
			t.Fatalf("nft %s in %s: %v\n%s", cmd, n1.Netns, err, b)
		}
	}
	t0 := time.Now()
	if msg, err := c.radic("fault", "readdress", "1"); err != nil {
		t.Fatalf("readdress: %v\n%s", err, msg)
	}
	n1, _ = c.state().Node(1)
	for _, id := range []int{0, 2} {
		d, m := c.daemon(id)
		for {
			var nodes reconfigure.NodesReply
			_, err := getJSON("http://"+d+reconfigure.PathNodes, &nodes)
			if err == nil && len(nodes.Nodes) == 3 && nodes.Nodes[1].Addr == n1.Addr && nodes.Nodes[1].Gen == 1 {
				break
			}
			if time.Since(t0) > 2*time.Second {
				t.Fatalf("node %d does not know node 1's new address 2 s after the readdress: %+v %v", id, nodes, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("node %d learnt node 1's new address %v after the readdress", id, time.Since(t0).Round(time.Millisecond))
		if v, _ := scrape(m, "radic_location_moves_total", `via="heartbeat"`); v != 1 {
			t.Errorf("node %d: moves{via=heartbeat} = %v, want 1", id, v)
		}
	}
	time.Sleep(time.Until(t0.Add(2 * time.Second)))
	for id := range 3 {
		_, m := c.daemon(id)
		if f, err := scrape(m, "radic_failures_detected_total", ""); err != nil || f != 0 {
			t.Errorf("node %d declared %v failures (%v)", id, f, err)
		}
		if f, _ := scrape(m, "radic_fences_total", ""); f != 0 {
			t.Errorf("node %d fenced itself %v times", id, f)
		}
	}
	_, m1 := c.daemon(1)
	if e, _ := scrape(m1, "radic_location_push_errors_total", ""); e < 2 {
		t.Errorf("node 1's announcements were not dropped (%v push errors): the test tests nothing", e)
	}
}

// TestSimultaneousReaddress: two nodes move while neither can tell the
// other (their outgoing TCP to the daemons' port is dropped, as when each
// move's announcement is still on its way when the other node moves), so
// each sends its heartbeats and announcements to the address the other
// had. Nothing addressed can reach the other side again; only the
// heartbeats a moved node broadcasts (hbudp's beacon) can. Once the drop
// rules go, both must learn where the other is now. (Before the beacon,
// the ranks of a readdress storm lost each other for good: 1 run in 50 of
// TestLogicalAddressesReaddressStorm under load.)
func TestSimultaneousReaddress(t *testing.T) {
	c := newNetnsCluster(t, 2)
	nft := func(netns string, cmd string) {
		t.Helper()
		if b, err := exec.Command("ip", append([]string{"netns", "exec", netns, "nft"}, strings.Fields(cmd)...)...).CombinedOutput(); err != nil {
			t.Fatalf("nft %s in %s: %v\n%s", cmd, netns, err, b)
		}
	}
	st := c.state()
	for _, n := range st.Nodes {
		nft(n.Netns, "add table inet radtest")
		nft(n.Netns, "add chain inet radtest out { type filter hook output priority 0 ; policy accept ; }")
		nft(n.Netns, fmt.Sprintf("add rule inet radtest out tcp dport %d drop", cluster.RadicdPort))
	}
	for _, id := range []string{"0", "1"} {
		if msg, err := c.radic("fault", "readdress", id); err != nil {
			t.Fatalf("readdress: %v\n%s", err, msg)
		}
	}
	st = c.state()
	knows := func(id, other int) bool {
		d, _ := c.daemon(id)
		var nodes reconfigure.NodesReply
		if _, err := getJSON("http://"+d+reconfigure.PathNodes, &nodes); err != nil || len(nodes.Nodes) != 2 {
			return false
		}
		o, _ := st.Node(other)
		return nodes.Nodes[other].Addr == o.Addr
	}
	// Long enough for every addressed path (announcements, heartbeats)
	// to have been tried and lost.
	time.Sleep(time.Second)
	// On the fabric the daemons' requests ride UDP with the heartbeats,
	// and a node may learn the other's address from its beacon while the
	// TCP rules stand: they stage the lost announcements over IP only.
	if testFabric != "bg" && (knows(0, 1) || knows(1, 0)) {
		t.Fatalf("a node learnt the other's new address while every TCP to the daemons was dropped: the test tests nothing")
	}
	for _, n := range st.Nodes {
		nft(n.Netns, "delete table inet radtest")
	}
	t0 := time.Now()
	for _, pair := range [][2]int{{0, 1}, {1, 0}} {
		for !knows(pair[0], pair[1]) {
			if time.Since(t0) > 5*time.Second {
				t.Fatalf("node %d does not know node %d's new address 5 s after the drop rules went", pair[0], pair[1])
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("node %d knows node %d's new address %v after the drop rules went", pair[0], pair[1], time.Since(t0).Round(time.Millisecond))
	}
}
