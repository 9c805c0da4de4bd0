package radicd_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/cluster"
	"github.com/radic-project/radic/internal/cluster/proc"
	"github.com/radic-project/radic/internal/clustertest"
	"github.com/radic-project/radic/internal/jobrun"
	"github.com/radic-project/radic/internal/launch"
	"github.com/radic-project/radic/internal/testenv"
	"github.com/radic-project/radic/msglog/record"
)

// runJob runs `radic run ARGS...` on the cluster and returns its exit
// status and output (stdout and stderr as one).
func (c *netnsCluster) runJob(args ...string) (int, string) {
	c.t.Helper()
	out, err := c.radic(append([]string{"run"}, args...)...)
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), out
	case err != nil:
		c.t.Fatalf("radic run: %v\n%s", err, out)
	}
	return 0, out
}

// client is a launch API client for node's radicd, found in the state.
func (c *netnsCluster) client(node int) *jobrun.Client {
	return &jobrun.Client{Node: node, HTTP: jobrun.NewHTTPClient(), Daemons: func(id int) (string, error) {
		s, err := cluster.Load(c.dir)
		if err != nil {
			return "", err
		}
		n, err := s.Node(id)
		if err != nil {
			return "", err
		}
		return cluster.NodeDaemon(s, n), nil
	}}
}

// TestRunThroughDaemons: on a cluster with daemons, `radic run`'s ranks
// are launched by their nodes' radicds and are the processes the direct
// launcher made (the node's job cgroup and address, cwd, RADIC_DAEMON,
// the preload, pids in the state that kill-rank uses); the job's status
// is the first failing rank's (3; 137 for SIGKILL); their output survives
// their nodes' readdressing; Ctrl-C stops it (SIGTERM reaches every rank,
// status 130).
func TestRunThroughDaemons(t *testing.T) {
	c := newNetnsCluster(t, 2)
	s := c.state()
	lib := testenv.Artifact(t, "lib/libradic.so")
	t.Run("process", func(t *testing.T) {
		code, out := c.runJob("--np", "2", "--tag-output", "--lib", lib, "--",
			"/bin/sh", "-c", `echo "cg $(grep '^0::' /proc/self/cgroup)"; echo "addr $(ip -4 -o addr show eth0 | awk '{print $4}')"; echo "cwd $(pwd)"; echo "daemon $RADIC_DAEMON"; echo "preload $LD_PRELOAD"; echo "rank $RADIC_RANK of $RADIC_SIZE on $RADIC_NODE"`)
		if code != 0 {
			t.Fatalf("status %d, output:\n%s", code, out)
		}
		wd, _ := os.Getwd()
		for r := range 2 {
			n := s.Nodes[r]
			for _, want := range []string{
				fmt.Sprintf("[rank %d] cg 0::/radic/%s/%s/job", r, s.Name, n.Name),
				fmt.Sprintf("[rank %d] addr %s/16", r, n.Addr),
				fmt.Sprintf("[rank %d] cwd %s", r, wd),
				fmt.Sprintf("[rank %d] daemon 127.0.0.1:%d", r, cluster.RadicdPort),
				fmt.Sprintf("[rank %d] preload %s", r, lib),
				fmt.Sprintf("[rank %d] rank %d of 2 on %d", r, r, r),
			} {
				if !strings.Contains(out, want+"\n") {
					t.Errorf("no line %q in the output:\n%s", want, out)
				}
			}
		}
	})
	t.Run("status", func(t *testing.T) {
		for _, tc := range []struct {
			script string
			code   int
			says   string
		}{
			{`echo ok`, 0, ""},
			{`[ $RADIC_RANK = 1 ] && exit 3; sleep 0.2`, 3, `rank 1 \(node 1, pid \d+\) exited with status 3; stopping the job`},
			{`[ $RADIC_RANK = 1 ] && kill -9 $$; sleep 0.2`, 137, `rank 1 \(node 1, pid \d+\) was killed by signal 9 \(killed\); stopping the job`},
		} {
			code, out := c.runJob("--np", "2", "--no-radic", "--", "/bin/sh", "-c", tc.script)
			if code != tc.code || (tc.says != "" && !regexp.MustCompile(tc.says).MatchString(out)) {
				t.Errorf("radic run -- sh -c %q: status %d, output:\n%s\nwant status %d and %q", tc.script, code, out, tc.code, tc.says)
			}
		}
	})
	t.Run("kill-rank", func(t *testing.T) {
		j := exec.Command(radicBin, "run", "--np", "2", "--no-radic", "--", "/bin/sh", "-c", `echo "pid $$"; exec sleep 60`)
		j.Env = c.env
		var out lockedBuffer
		j.Stdout, j.Stderr = &out, &out
		if err := j.Start(); err != nil {
			t.Fatal(err)
		}
		defer j.Process.Kill()
		job := clustertest.WaitRanks(t, c.dir, 2)
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(out.String(), "pid ") < 2 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		// The pid in the state is the rank's own: the shell's $$, which
		// execs sleep.
		if !strings.Contains(out.String(), fmt.Sprintf("pid %d\n", job.Ranks[1].Proc.Pid)) {
			t.Errorf("rank 1's pid in the state is %d; the ranks said:\n%s", job.Ranks[1].Proc.Pid, out.String())
		}
		if o, err := c.radic("fault", "kill-rank", "1"); err != nil {
			t.Fatalf("kill-rank: %v\n%s", err, o)
		}
		err := j.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 137 || !strings.Contains(out.String(), "rank 1 (node 1, pid ") {
			t.Errorf("after kill-rank 1: %v, output:\n%s\nwant status 137 naming rank 1", err, out.String())
		}
		if job.Ranks[0].Proc.Alive() {
			t.Errorf("rank 0 (pid %d) outlived the job", job.Ranks[0].Proc.Pid)
		}
	})
	// Both nodes readdressed while their ranks print: every line
	// arrives, the connections to the old addresses notwithstanding
	// (radic run once lost what a rank printed after its node moved: the
	// exit came through the new address before the output did).
	t.Run("readdress", func(t *testing.T) {
		j := exec.Command(radicBin, "run", "--np", "2", "--no-radic", "--tag-output", "--",
			"/bin/sh", "-c", `i=0; while [ $i -lt 60 ]; do echo "line $i"; i=$((i+1)); sleep 0.02; done`)
		j.Env = c.env
		var out lockedBuffer
		j.Stdout, j.Stderr = &out, &out
		if err := j.Start(); err != nil {
			t.Fatal(err)
		}
		defer j.Process.Kill()
		clustertest.WaitRanks(t, c.dir, 2)
		for _, n := range []string{"0", "1"} {
			if o, err := c.radic("fault", "readdress", n); err != nil {
				t.Fatalf("readdress %s: %v\n%s", n, err, o)
			}
		}
		if err := j.Wait(); err != nil {
			t.Errorf("radic run across two readdresses: %v; output:\n%s", err, out.String())
		}
		for r := range 2 {
			for i := range 60 {
				if l := fmt.Sprintf("[rank %d] line %d\n", r, i); !strings.Contains(out.String(), l) {
					t.Fatalf("line %q missing after the readdresses; output:\n%s", l, out.String())
				}
			}
		}
	})
	// A node readdressed after its rank was created and before its gate
	// opened: the start finds the daemon at its new address (it once
	// failed the job when the start was in flight to the old one).
	t.Run("readdress-at-start", func(t *testing.T) {
		wd, _ := os.Getwd()
		var out lockedBuffer
		recs := []launch.Record{{Version: launch.Version, Job: "ras-1", Rank: 0, Size: 1, Node: 0,
			Path: "/bin/echo", Argv: []string{"echo", "started"}, Env: []string{"PATH=/usr/bin:/bin"}, Cwd: wd}}
		code, err := jobrun.Run(jobrun.Options{Ranks: recs, Daemons: c.client(0).Daemons, Stdout: &out, Stderr: &out,
			Logf: func(f string, a ...any) { fmt.Fprintf(&out, f+"\n", a...) },
			Created: func([]launch.Started) error {
				o, err := c.radic("fault", "readdress", "0")
				if err != nil {
					return fmt.Errorf("readdress: %v: %s", err, o)
				}
				return nil
			}})
		if err != nil || code != 0 || out.String() != "started\n" {
			t.Errorf("a job whose node moved before its start: status %d, %v, output %q; want 0 and \"started\\n\"", code, err, out.String())
		}
	})
	t.Run("interrupt", func(t *testing.T) {
		j := exec.Command(radicBin, "run", "--np", "2", "--no-radic", "--tag-output", "--",
			"/bin/sh", "-c", `trap 'echo term; exit 5' TERM; echo up; while :; do sleep 0.05; done`)
		j.Env = c.env
		var out lockedBuffer
		j.Stdout, j.Stderr = &out, &out
		if err := j.Start(); err != nil {
			t.Fatal(err)
		}
		defer j.Process.Kill()
		job := clustertest.WaitRanks(t, c.dir, 2)
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(out.String(), "up\n") < 2 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		t0 := time.Now()
		j.Process.Signal(syscall.SIGINT)
		err := j.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Errorf("after SIGINT: %v; want exit status 130; output:\n%s", err, out.String())
		}
		for r := range 2 {
			if !strings.Contains(out.String(), fmt.Sprintf("[rank %d] term\n", r)) {
				t.Errorf("rank %d did not get SIGTERM; output:\n%s", r, out.String())
			}
			if job.Ranks[r].Proc.Alive() {
				t.Errorf("rank %d (pid %d) outlived the job", r, job.Ranks[r].Proc.Pid)
			}
		}
		t.Logf("SIGINT to the end of radic run: %v", time.Since(t0).Round(time.Millisecond))
	})
}

// TestLaunchAPI drives radicd's launch API directly: a launch record is
// on the protector before the rank runs; output read in pieces, with a
// reader that drops its connection mid-body and asks again from the last
// byte it kept, is exactly what the rank wrote; offsets already released
// or beyond the end are refused; the exit status and signals; and the
// errors name what is wrong (unknown job or rank, bad program, a node
// whose daemon is down).
func TestLaunchAPI(t *testing.T) {
	c := newNetnsCluster(t, 3)
	ctx := context.Background()
	cl := c.client(0)
	wd, _ := os.Getwd()
	rec := func(job string, argv ...string) launch.Record {
		return launch.Record{Version: launch.Version, Job: job, Rank: 0, Size: 1, Node: 0,
			Path: argv[0], Argv: argv, Env: []string{"PATH=/usr/bin:/bin"}, Cwd: wd}
	}

	// 300000 bytes on stdout, "bye" on stderr, exit 3.
	const n = 300000
	r := rec("api-1", "/bin/sh", "-c", fmt.Sprintf(`head -c %d /dev/zero | tr '\0' x; echo bye >&2; exit 3`, n))
	st, err := cl.Launch(ctx, &r)
	if err != nil {
		t.Fatal(err)
	}
	if !(proc.ID{Pid: st.Pid, Start: st.Start}).Alive() {
		t.Errorf("the created rank (pid %d) is not alive, held at its gate", st.Pid)
	}
	// The launch record is on node 0's protector (node 1) already.
	prot, _ := c.daemon(1)
	url := fmt.Sprintf("http://%s/v1/replica/read?node=0&owner=%d&stream=%d&from=0", prot, launch.StoreOwner, launch.StreamOf("api-1", 0))
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	stored, _, err := record.Decode(body)
	if err != nil {
		t.Fatalf("read the launch record from protector 1: %v (%d bytes, status %s)", err, len(body), resp.Status)
	}
	got, err := launch.Decode(stored)
	if err != nil || got.Job != "api-1" || strings.Join(got.Argv, " ") != strings.Join(r.Argv, " ") {
		t.Errorf("protector 1 holds %+v, %v; want the record launched", got, err)
	}
	if len(st.Protectors) != 1 || st.Protectors[0] != 1 {
		t.Errorf("launch says the record is on protectors %v; want [1]", st.Protectors)
	}
	if err := cl.Start(ctx, "api-1", 0); err != nil {
		t.Fatal(err)
	}
	// Read 1000 bytes of a reply and hang up; then again from 1000.
	var have []byte
	b, _, err := cl.Output(ctx, "api-1", 0, launch.Stdout, 0, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	part := make([]byte, 1000)
	if _, err := io.ReadFull(b, part); err != nil {
		t.Fatal(err)
	}
	b.Close()
	have = append(have, part...)
	for {
		b, eof, err := cl.Output(ctx, "api-1", 0, launch.Stdout, uint64(len(have)), 5*time.Second)
		if err != nil {
			t.Fatalf("output from %d: %v", len(have), err)
		}
		more, err := io.ReadAll(b)
		b.Close()
		if err != nil {
			t.Fatal(err)
		}
		have = append(have, more...)
		if eof {
			break
		}
	}
	if len(have) != n || strings.Trim(string(have), "x") != "" {
		t.Errorf("stdout read in pieces across a dropped connection: %d bytes (want %d x's)", len(have), n)
	}
	// The reader's last ask (from=n) released everything before n.
	if _, _, err := cl.Output(ctx, "api-1", 0, launch.Stdout, 10, 0); !httpStatus(err, http.StatusRequestedRangeNotSatisfiable) {
		t.Errorf("output from a released offset: %v; want 416", err)
	}
	if _, _, err := cl.Output(ctx, "api-1", 0, launch.Stderr, 99, 0); !httpStatus(err, http.StatusRequestedRangeNotSatisfiable) {
		t.Errorf("output beyond the end: %v; want 416", err)
	}
	b, eof, err := cl.Output(ctx, "api-1", 0, launch.Stderr, 0, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	errOut, _ := io.ReadAll(b)
	b.Close()
	if !eof {
		b, eof, err = cl.Output(ctx, "api-1", 0, launch.Stderr, uint64(len(errOut)), 5*time.Second)
		if err != nil || !eof {
			t.Fatalf("stderr not at its end after the rank exited: eof %v, %v", eof, err)
		}
		b.Close()
	}
	if string(errOut) != "bye\n" {
		t.Errorf("stderr = %q; want \"bye\\n\"", errOut)
	}
	rs, err := cl.Status(ctx, "api-1", 0, 5*time.Second)
	if err != nil || rs.Exit == nil || rs.Exit.Status() != 3 || rs.Stdout != n {
		t.Errorf("status = %+v, %v; want exited with 3 after %d bytes of stdout", rs, err, n)
	}

	// A signal: SIGKILL to a sleeping rank is status 137.
	r = rec("api-2", "sleep", "60")
	if _, err := cl.Launch(ctx, &r); err != nil {
		t.Fatal(err)
	}
	if err := cl.Start(ctx, "api-2", 0); err != nil {
		t.Fatal(err)
	}
	if err := cl.Signal(ctx, "api-2", 0, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rs, err = cl.Status(ctx, "api-2", 0, 5*time.Second)
	if err != nil || rs.Exit == nil || rs.Exit.Status() != 137 {
		t.Errorf("status after SIGKILL = %+v, %v; want 137", rs, err)
	}

	// Errors name what is wrong.
	for _, tc := range []struct {
		what string
		err  func() error
		code int
		says string
	}{
		{"unknown job", func() error { _, err := cl.Status(ctx, "nosuch", 0, 0); return err }, 404, `node 0 runs no rank 0 of job "nosuch"`},
		{"unknown rank", func() error { return cl.Signal(ctx, "api-1", 7, syscall.SIGTERM) }, 404, `node 0 runs no rank 7 of job "api-1"`},
		{"bad program", func() error { r := rec("api-3", "/no/such/prog"); _, err := cl.Launch(ctx, &r); return err }, 422, "program /no/such/prog: stat /no/such/prog: no such file or directory"},
		{"not in PATH", func() error { r := rec("api-4", "no-such-prog"); _, err := cl.Launch(ctx, &r); return err }, 422, `program "no-such-prog" not found in the rank's PATH (/usr/bin:/bin)`},
		{"wrong node", func() error { r := rec("api-5", "/bin/true"); r.Node = 2; _, err := cl.Launch(ctx, &r); return err }, 400, "placed on node 2, but this is node 0"},
		{"twice", func() error { r := rec("api-1", "/bin/true"); _, err := cl.Launch(ctx, &r); return err }, 409, "rank 0 of job api-1 is already launched on node 0"},
	} {
		err := tc.err()
		if !httpStatus(err, tc.code) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v; want status %d saying %q", tc.what, err, tc.code, tc.says)
		}
	}
	if err := cl.Forget(ctx, "api-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Status(ctx, "api-1", 0, 0); !httpStatus(err, 404) {
		t.Errorf("status of a forgotten job: %v; want 404", err)
	}

	// A node whose daemon is down: radic run names it.
	if o, err := c.radic("fault", "kill-node", "2"); err != nil {
		t.Fatalf("kill-node: %v\n%s", err, o)
	}
	code, out := c.runJob("--np", "1", "--nodes", "1", "--no-radic", "--", "/bin/true")
	if code != 0 {
		t.Errorf("a job on a live node after kill-node 2: status %d\n%s", code, out)
	}
	cl2 := c.client(2)
	r = rec("api-6", "/bin/true")
	r.Node = 2
	_, err = cl2.Launch(ctx, &r)
	if !jobrun.Unreachable(err) || !strings.Contains(err.Error(), "node 2's radicd (") || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("launch on a dead node: %v; want node 2's radicd named unreachable", err)
	}
}

// httpStatus reports whether err is radicd's answer with that status.
func httpStatus(err error, code int) bool {
	var e *jobrun.Error
	return errors.As(err, &e) && e.Status == code
}
