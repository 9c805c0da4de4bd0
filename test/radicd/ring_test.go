package radicd_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/internal/radicd"
)

// ring is a set of real radicd processes on 127.78.0.(base+i).
type ring struct {
	t     *testing.T
	base  int
	n     int
	dir   string
	extra [][]string // per-node extra flags
	procs []*exec.Cmd
	waits []chan error
}

func (r *ring) addr(i int) string   { return fmt.Sprintf("127.78.0.%d", r.base+i) }
func (r *ring) listen(i int) string { return r.addr(i) + ":7470" }
func (r *ring) metrics(i int) string {
	return r.addr(i) + ":9470"
}

func (r *ring) peers() string {
	var p []string
	for i := range r.n {
		p = append(p, fmt.Sprintf("%d=%s", i, r.listen(i)))
	}
	return strings.Join(p, ",")
}

// startRing starts n daemons and waits for READY=1 from each.
func startRing(t *testing.T, base, n int, extra func(i int) []string) *ring {
	t.Helper()
	r := &ring{t: t, base: base, n: n, dir: t.TempDir(), procs: make([]*exec.Cmd, n), waits: make([]chan error, n)}
	for i := range n {
		if extra != nil {
			r.extra = append(r.extra, extra(i))
		} else {
			r.extra = append(r.extra, nil)
		}
	}
	t.Cleanup(r.killAll)
	for i := range n {
		r.start(i)
	}
	r.waitRing(n, 5*time.Second)
	return r
}

// start launches node i and waits for its READY=1 on a NOTIFY_SOCKET.
func (r *ring) start(i int) {
	t := r.t
	t.Helper()
	sock := filepath.Join(r.dir, fmt.Sprintf("notify-%d-%d.sock", i, time.Now().UnixNano()%1e6))
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	args := []string{"--node", fmt.Sprint(i), "--listen", r.listen(i), "--peers", r.peers(),
		"--state-dir", filepath.Join(r.dir, fmt.Sprintf("n%d", i)), "--metrics-addr", r.metrics(i)}
	if testFabric != "" {
		args = append(args, "--fabric", testFabric)
	}
	args = append(args, r.extra[i]...)
	cmd := exec.Command(radicdBin, args...)
	logf, err := os.OpenFile(filepath.Join(r.dir, fmt.Sprintf("n%d.log", i)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.procs[i] = cmd
	w := make(chan error, 1)
	r.waits[i] = w
	go func() { w <- cmd.Wait() }()
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ln.Read(buf)
			if err != nil {
				return
			}
			if strings.Contains(string(buf[:n]), "READY=1") {
				got <- string(buf[:n])
				return
			}
		}
	}()
	select {
	case <-got:
	case err := <-w:
		w <- err
		t.Fatalf("radicd %d exited before READY=1 (%v); log:\n%s", i, err, r.log(i))
	case <-time.After(10 * time.Second):
		t.Fatalf("radicd %d sent no READY=1 in 10s; log:\n%s", i, r.log(i))
	}
}

func (r *ring) log(i int) string {
	b, _ := os.ReadFile(filepath.Join(r.dir, fmt.Sprintf("n%d.log", i)))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func (r *ring) pid(i int) int { return r.procs[i].Process.Pid }

// kill SIGKILLs node i and reaps it.
func (r *ring) kill(i int) {
	if r.procs[i] == nil {
		return
	}
	_ = syscall.Kill(r.pid(i), syscall.SIGCONT)
	_ = r.procs[i].Process.Kill()
	select {
	case <-r.waits[i]:
	case <-time.After(5 * time.Second):
		r.t.Errorf("radicd %d (pid %d) did not die", i, r.pid(i))
	}
	r.procs[i] = nil
}

func (r *ring) killAll() {
	for i := range r.procs {
		r.kill(i)
	}
	if r.t.Failed() {
		for i := range r.n {
			r.t.Logf("log of node %d:\n%s", i, r.log(i))
		}
	}
}

func (r *ring) status(i int) (*radicd.NodeStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.metrics(i)+"/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var st radicd.NodeStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, err
	}
	return &st, nil
}

func member(st *radicd.NodeStatus, id int) heartbeat.MemberStatus {
	for _, m := range st.Ring.Members {
		if int(m.ID) == id {
			return m
		}
	}
	return heartbeat.MemberStatus{}
}

// waitRing waits until every running node sees `size` alive members.
func (r *ring) waitRing(size int, timeout time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok := true
		for i := range r.n {
			if r.procs[i] == nil {
				continue
			}
			st, err := r.status(i)
			if err != nil || len(st.Ring.Ring) != size || st.Ring.Fenced {
				ok = false
				break
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			for i := range r.n {
				if st, err := r.status(i); err == nil {
					r.t.Logf("node %d: ring %v fenced %v", i, st.Ring.Ring, st.Ring.Fenced)
				}
			}
			r.t.Fatalf("ring did not reach %d alive members in %v", size, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitDeclared polls node `by` until it sees `id` dead and returns the
// member entry.
func (r *ring) waitDeclared(by, id int, timeout time.Duration) (heartbeat.MemberStatus, bool) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if st, err := r.status(by); err == nil {
			if m := member(st, id); m.State == "dead" {
				return m, true
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return heartbeat.MemberStatus{}, false
}

// metric reads one sample of node i's /metrics (sum over label sets that
// match the given label substring).
func (r *ring) metric(i int, name, labels string) float64 {
	resp, err := http.Get("http://" + r.metrics(i) + "/metrics")
	if err != nil {
		r.t.Fatalf("metrics of node %d: %v", i, err)
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
	return sum
}

func (r *ring) failures(i int) float64 { return r.metric(i, "radic_failures_detected_total", "") }

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	k := int(p*float64(len(sorted)-1) + 0.5)
	return sorted[k]
}
