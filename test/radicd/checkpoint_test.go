package radicd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/radic-project/radic/checkpoint/criu"
	"github.com/radic-project/radic/checkpoint/image"
	"github.com/radic-project/radic/internal/launch"
	"github.com/radic-project/radic/internal/radicd"
)

// TestCheckpointEndpoint: POST /v1/jobs/J/checkpoint on a node's radicd
// takes a criu image of the job's ranks there, leaves them running, and a
// second one is incremental against the first; a job the node does not
// run is a 404.
func TestCheckpointEndpoint(t *testing.T) {
	if err := criu.New(criu.Config{}).Usable(); err != nil {
		t.Skipf("criu not usable here: %v", err)
	}
	c := newNetnsCluster(t, 2)
	ctx := context.Background()
	cl := c.client(0)
	wd, _ := os.Getwd()
	// A shell counting on stdout: a tree of two (sh and its sleep).
	rec := launch.Record{Version: launch.Version, Job: "ck-1", Rank: 0, Size: 1, Node: 0, Path: "/bin/sh",
		Argv: []string{"/bin/sh", "-c", `i=0; while [ $i -lt 100000 ]; do i=$((i+1)); echo $i; sleep 0.02; done`},
		Env:  []string{"PATH=/usr/bin:/bin"}, Cwd: wd}
	st, err := cl.Launch(ctx, &rec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Signal(context.Background(), "ck-1", 0, syscall.SIGKILL) })
	if err := cl.Start(ctx, "ck-1", 0); err != nil {
		t.Fatal(err)
	}
	addr, metrics := c.daemon(0)
	post := func(job string) (radicd.CheckpointReply, int, string) {
		t.Helper()
		resp, err := http.Post("http://"+addr+"/v1/jobs/"+job+"/checkpoint", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var r radicd.CheckpointReply
		if resp.StatusCode == http.StatusOK {
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatalf("reply %q: %v", b, err)
			}
		}
		return r, resp.StatusCode, string(b)
	}
	time.Sleep(300 * time.Millisecond)
	r1, code, body := post("ck-1")
	if code != http.StatusOK {
		t.Fatalf("checkpoint: %d %s", code, body)
	}
	t.Logf("first: %+v", r1)
	if r1.Backend != criu.Name || len(r1.Pids) != 1 || r1.Pids[0] != st.Pid || r1.Bytes == 0 || r1.Dir == "" {
		t.Fatalf("first checkpoint = %+v; want a criu image of pid %d", r1, st.Pid)
	}
	m, err := image.Open(r1.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := image.Verify(r1.Dir, m); err != nil {
		t.Fatalf("the image radicd wrote does not verify: %v", err)
	}
	if len(m.Procs) < 1 || m.Procs[0].Pid != st.Pid {
		t.Errorf("image processes %+v; want rank 0's pid %d first", m.Procs, st.Pid)
	}
	time.Sleep(200 * time.Millisecond)
	r2, code, body := post("ck-1")
	if code != http.StatusOK {
		t.Fatalf("second checkpoint: %d %s", code, body)
	}
	t.Logf("second: %+v", r2)
	if r2.Parent != filepath.Base(r1.Dir) || r2.NewChunks >= r2.Chunks || r2.PackBytes >= r1.PackBytes {
		t.Errorf("second checkpoint = %+v; want it incremental against %s", r2, r1.Dir)
	}
	// The rank still runs and counts on.
	n1 := lastCount(t, cl, 0)
	time.Sleep(300 * time.Millisecond)
	if n2 := lastCount(t, cl, 0); n2 <= n1 {
		t.Errorf("the rank stopped counting after its checkpoints (%d, then %d)", n1, n2)
	}
	if _, code, body := post("nojob"); code != http.StatusNotFound {
		t.Errorf("checkpoint of a job the node does not run: %d %s; want 404", code, body)
	}
	// The same through `radic checkpoint JOB`: a third image, on node 0.
	out, err := c.radic("checkpoint", "ck-1")
	t.Logf("radic checkpoint ck-1:\n%s", out)
	if err != nil || !strings.Contains(out, "criu") || !strings.Contains(out, "00000003") {
		t.Errorf("radic checkpoint ck-1: %v; want node 0's third criu image", err)
	}
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"radic_checkpoints_total 3", "radic_checkpoint_failures_total 0", "radic_checkpoint_seconds_count 3"} {
		if !strings.Contains(string(mb), want+"\n") {
			t.Errorf("node 0's metrics lack %q", want)
		}
	}
	if out, err := c.radic("checkpoint", "nojob"); err == nil || !strings.Contains(out, "no node runs a rank") {
		t.Errorf("radic checkpoint nojob: %v\n%s; want an error saying no node runs it", err, out)
	}
}

// lastCount is the last number rank 0 of ck-1 printed so far.
func lastCount(t *testing.T, cl interface {
	Output(context.Context, string, int, string, uint64, time.Duration) (io.ReadCloser, bool, error)
}, from uint64) int {
	t.Helper()
	b, _, err := cl.Output(context.Background(), "ck-1", 0, launch.Stdout, from, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	out, _ := io.ReadAll(b)
	lines := strings.Fields(string(bytes.TrimSpace(out)))
	if len(lines) == 0 {
		t.Fatal("the rank printed nothing")
	}
	n, _ := strconv.Atoi(lines[len(lines)-1])
	return n
}
