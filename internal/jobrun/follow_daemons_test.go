package jobrun

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/launch"
)

// fakeDaemons are two nodes' radicds speaking just enough of the launch
// API for Run: node 1 is gone once its rank is created (before radic run
// opens its gate), and node 0 says that rank 1 was restarted on it at
// epoch 1 and has exited 0, as its protector would have done.
type fakeDaemons struct {
	srv    [2]*httptest.Server
	mu     sync.Mutex
	dead   bool      // node 1
	diedAt time.Time // node 1
}

func (f *fakeDaemons) handler(node int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p := strings.Split(strings.Trim(r.URL.Path, "/"), "/") // v1 jobs J ranks R [start|output]
		f.mu.Lock()
		dead := node == 1 && f.dead
		f.mu.Unlock()
		if dead { // no answer: the connection drops, as to a dead node
			if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
				c.Close()
			}
			return
		}
		switch {
		case r.Method == http.MethodPost && len(p) == 4 && p[3] == "ranks":
			var rec launch.Record
			_ = json.NewDecoder(r.Body).Decode(&rec)
			_ = json.NewEncoder(w).Encode(launch.Started{Pid: 100 + rec.Rank})
			if node == 1 {
				// The node dies once the answer is out.
				f.mu.Lock()
				f.dead, f.diedAt = true, time.Now()
				f.mu.Unlock()
			}
		case r.Method == http.MethodPost && len(p) == 6 && p[5] == "start":
			w.WriteHeader(http.StatusNoContent)
		case r.Method == http.MethodGet && len(p) == 5: // status
			rank, _ := strconv.Atoi(p[4])
			st := launch.RankStatus{Job: p[2], Rank: rank, State: launch.StateExited, Exit: &launch.Exit{}}
			if rank == 1 {
				st.Epoch = 1
			}
			_ = json.NewEncoder(w).Encode(st)
		case r.Method == http.MethodGet && len(p) == 6 && p[5] == "output":
			w.Header().Set(launch.HeaderOffset, r.URL.Query().Get("from"))
			w.Header().Set(launch.HeaderEOF, "1")
		case r.Method == http.MethodGet && len(p) == 4 && p[1] == "recovery":
			f.mu.Lock()
			ev := launch.RecoveryEvent{Group: 1, Cause: "node", From: 1, To: 0, Epoch: 1, Start: f.diedAt, Seconds: 0.5}
			f.mu.Unlock()
			_ = json.NewEncoder(w).Encode(launch.JobRecovery{Job: p[3], Ranks: []launch.RankLoc{
				{Job: p[3], Rank: 0, Group: 0, Node: 0}, {Job: p[3], Rank: 1, Group: 1, Node: 0, Epoch: 1}},
				Events: []launch.RecoveryEvent{ev}})
		case r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		default:
			_, _ = io.Copy(io.Discard, r.Body)
			http.Error(w, "not faked: "+r.Method+" "+r.URL.Path, http.StatusNotFound)
		}
	}
}

// TestRunStartOnANodeThatDied: under --recovery, a rank whose node dies
// between its launch (its record is with its protectors) and the opening
// of its gate is restarted by its protector; radic run must follow it
// there, not stop the job because the start did not get through. (Found
// by TestRecoveryCampaign: kill-node during start-up, status 1.)
func TestRunStartOnANodeThatDied(t *testing.T) {
	f := &fakeDaemons{}
	for n := range f.srv {
		f.srv[n] = httptest.NewServer(f.handler(n))
		defer f.srv[n].Close()
	}
	var ranks []launch.Record
	for r := range 2 {
		ranks = append(ranks, launch.Record{Job: "j-1", Rank: r, Size: 2, Node: r, Path: "/bin/true", Argv: []string{"true"},
			Env: []string{"RADIC_RECOVERY=1"}, Cwd: "/"})
	}
	var mu sync.Mutex
	var logs []string
	var out strings.Builder
	code, err := Run(Options{
		Ranks:   ranks,
		Daemons: func(n int) (string, error) { return f.srv[n].Listener.Addr().String(), nil },
		Stdout:  &out, Stderr: &out,
		Logf: func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			logs = append(logs, strings.TrimSpace(fmt.Sprintf(format, args...)))
		},
	})
	mu.Lock()
	defer mu.Unlock()
	if err != nil || code != 0 {
		t.Fatalf("Run = %d, %v; want 0 (rank 1 restarted on node 0 and exited 0); radic run said:\n%s", code, err, strings.Join(logs, "\n"))
	}
	// The node died before radic run began to follow the job: its
	// recovery is this job's all the same, and is printed.
	if !strings.Contains(strings.Join(logs, "\n"), "rank 1 restarted on node 0 in 0.50 s; live again") {
		t.Errorf("no recovery event printed; radic run said:\n%s", strings.Join(logs, "\n"))
	}
}

// TestFollowerAsksEveryDaemon: node 0 was cut off from the ring (fenced)
// but still answers radic run, with the placements it had then; node 1
// knows that rank 0 was restarted on node 2. The follower must learn the
// move, not keep what the first daemon to answer says. (Found by
// TestRecoveryCampaign/partition: "rank 0: not restarted within 30s"
// while it ran on the spare.)
func TestFollowerAsksEveryDaemon(t *testing.T) {
	answer := func(rank0 launch.RankLoc) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = json.NewEncoder(w).Encode(launch.JobRecovery{Job: "j-1", Ranks: []launch.RankLoc{rank0}})
		}))
	}
	srv := []*httptest.Server{
		answer(launch.RankLoc{Job: "j-1", Rank: 0, Group: 0, Node: 0}),
		answer(launch.RankLoc{Job: "j-1", Rank: 0, Group: 0, Node: 2, Epoch: 1}),
	}
	for _, s := range srv {
		defer s.Close()
	}
	at := func(n int) *Client {
		return &Client{Node: n, HTTP: NewHTTPClient(), Daemons: func(n int) (string, error) {
			if n >= len(srv) {
				return "", fmt.Errorf("node %d: no daemon", n)
			}
			return srv[n].Listener.Addr().String(), nil
		}}
	}
	f := &follower{job: "j-1", nodes: []int{0, 1}, at: at, wh: []*where{newWhere(0)}, logf: func(string, ...any) {},
		failed: make(chan error, 1), since: time.Now()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.run(ctx)
	deadline := time.Now().Add(3 * time.Second)
	for {
		if n, e, _ := f.wh[0].get(); n == 2 && e == 1 {
			return
		}
		if time.Now().After(deadline) {
			n, e, _ := f.wh[0].get()
			t.Fatalf("rank 0 is followed on node %d at epoch %d after 3 s; want node 2, epoch 1 (node 1's answer)", n, e)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOutputOfAnInstanceThatExitedFirst: rank 0 was restarted in place
// and its new instance exited before its recovery event reached radic run
// (node 0's recovery table still says epoch 0). The exit's status says
// epoch 1: the forwarder must read that instance's output before it takes
// the rank for exited. (CI: the campaign's kill-rank of Jacobi's rank 0,
// whose restarted instance lived 170 ms: status 0, its digest line never
// printed.)
func TestOutputOfAnInstanceThatExitedFirst(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := strings.Split(strings.Trim(r.URL.Path, "/"), "/") // v1 jobs J ranks R [output]
		switch {
		case len(p) == 5: // status: the restarted instance has exited
			_ = json.NewEncoder(w).Encode(launch.RankStatus{Job: p[2], Rank: 0, State: launch.StateExited, Exit: &launch.Exit{}, Epoch: 1})
		case len(p) == 6 && p[5] == "output":
			q := r.URL.Query()
			w.Header().Set(launch.HeaderOffset, q.Get("from"))
			w.Header().Set(launch.HeaderEOF, "1")
			if q.Get("epoch") == "1" && q.Get("stream") == launch.Stdout && q.Get("from") == "0" {
				_, _ = io.WriteString(w, "digest=1\n")
			}
		default: // the recovery table: not moved yet
			_ = json.NewEncoder(w).Encode(launch.JobRecovery{Job: "j-1", Ranks: []launch.RankLoc{{Job: "j-1", Rank: 0}}})
		}
	}))
	defer srv.Close()
	cl := func(int) *Client {
		return &Client{Node: 0, HTTP: NewHTTPClient(), Daemons: func(int) (string, error) { return srv.Listener.Addr().String(), nil }}
	}
	f := &follower{job: "j-1", nodes: []int{0}, at: func(n int) *Client { return cl(n) }, wh: []*where{newWhere(0)},
		logf: func(string, ...any) {}, failed: make(chan error, 1), since: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	exits := make(chan exitMsg, 1)
	exited := make(chan struct{})
	var contact atomic.Int64
	go func() {
		f.watchExit(ctx, cl, 0, exits, &contact)
		<-exits
		close(exited)
	}()
	var out strings.Builder
	if err := f.forward(ctx, cl, 0, launch.Stdout, &out, exited, make(chan struct{})); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "digest=1\n" {
		t.Errorf("forwarded %q, want the restarted instance's %q", got, "digest=1\n")
	}
}
