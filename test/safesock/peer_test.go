package safesock_test

import (
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

// A program without radic talking to one with it: the connection is plain
// TCP, and data arrives intact both ways. The plain side is the Go stream
// peer (streamproto_test.go), which no LD_PRELOAD reaches; the radic side is
// stream. Cases:
//
//   - outside-job: the radic stream is a one-rank job on node 1; the plain
//     peer runs on node 0, outside that job, and either connects to the
//     radic stream (--listen) or accepts its connections (--connect).
//   - job-node: one two-rank job; rank 0 is the radic stream and rank 1,
//     on node 0, is the plain peer (LD_PRELOAD removed): the plain program
//     runs on a node of the job, so its address alone does not tell the
//     radic side that it is plain.
//
// Each case runs client-first (the connecting side's hello opens the
// connection) and server-first (the accepting side writes a greeting before
// it reads anything, and the connecting side writes nothing until it has
// it): an acceptor that waited for a radic hello would hang there.
func TestPlainPeer(t *testing.T) {
	s := streamSpec{conns: 2, bytes: 16 << 20, seed: 9}
	ref := reference(t, s)
	c := newCluster(t, 2)
	prog := testenv.Artifact(t, "build/apps/stream")
	port := 26000
	for _, sf := range []bool{false, true} {
		order := "client-first"
		if sf {
			order = "server-first"
		}
		p := peerConfig{conns: s.conns, bytes: uint64(s.bytes), seed: s.seed, serverFirst: sf}
		sargs := append(s.refArgs(), "--progress", "0")
		if sf {
			sargs = append(sargs, "--server-first")
		}

		t.Run("outside-job/plain-connects/"+order, func(t *testing.T) {
			c := c.with(t)
			port++
			addr := net.JoinHostPort(c.addr(1), strconv.Itoa(port))
			rj := c.start(runOpts{np: 1, nodes: "1", what: "radic stream --listen"},
				append([]string{prog, "--listen", addr}, sargs...)...)
			p := p
			p.role, p.addr = "connect", addr
			pj := c.start(runOpts{np: 1, nodes: "0", bare: true, env: p.environ(), what: "plain peer (connects)"}, self(t))
			checkPair(t, rj, pj, ref[0], ref[1])
		})

		t.Run("outside-job/plain-listens/"+order, func(t *testing.T) {
			c := c.with(t)
			port++
			addr := net.JoinHostPort(c.addr(1), strconv.Itoa(port))
			p := p
			p.role, p.addr = "listen", addr
			pj := c.start(runOpts{np: 1, nodes: "1", bare: true, env: p.environ(), what: "plain peer (listens)"}, self(t))
			rj := c.start(runOpts{np: 1, nodes: "0", what: "radic stream --connect"},
				append([]string{prog, "--connect", addr}, sargs...)...)
			checkPair(t, rj, pj, ref[1], ref[0])
		})

		t.Run("job-node/"+order, func(t *testing.T) {
			c := c.with(t)
			p := p
			p.role = "rank"
			script := `if [ "$RADIC_RANK" = 0 ]; then exec "$@"; fi; exec env -u LD_PRELOAD "$RADIC_TEST_SELF"`
			j := c.start(runOpts{np: 2, nodes: "1,0", what: "radic stream + plain rank 1",
				env: append(p.environ(), "RADIC_TEST_SELF="+self(t))},
				append([]string{"/bin/sh", "-c", script, "sh", prog}, sargs...)...)
			code := j.wait(2 * time.Minute)
			out := j.out.String()
			if code != 0 {
				t.Errorf("job exit status %d, want 0", code)
			}
			// The plain peer prints its line untagged by stream's
			// rules but tagged by radic run all the same.
			got := okLines(out)
			for r := range 2 {
				if got[r] != ref[r] {
					t.Errorf("rank %d: %q, want %q", r, got[r], ref[r])
				}
			}
		})
	}
}

// checkPair waits for a radic-side and a plain-side one-rank job and checks
// their "stream ok" lines.
func checkPair(t *testing.T, radicSide, plainSide *job, wantRadic, wantPlain string) {
	t.Helper()
	for _, x := range []struct {
		j    *job
		want string
	}{{radicSide, wantRadic}, {plainSide, wantPlain}} {
		code := x.j.wait(2 * time.Minute)
		got := okLines(x.j.out.String())[0]
		if code != 0 || got != x.want {
			t.Errorf("%s: exit status %d, %q; want 0 and %q", x.j.what, code, got, x.want)
		}
	}
}

var (
	// stream's own error line for a failed connection (exit 4).
	connErrRE = regexp.MustCompile(`(?m)^\[rank 0\] (stream: conn \d+: .* after \d+ bytes.*)$`)
	// The shim's log lines.
	radicLogRE = regexp.MustCompile(`(?m)^\[rank 0\] (radic\[.*)$`)
	// What the shim's line must contain. Loose on purpose, until the
	// shim's log format is fixed: a duration, a reason.
	durationRE = regexp.MustCompile(`\b\d+(\.\d+)?(ns|µs|us|ms|s|m)\b`)
	reasonRE   = regexp.MustCompile(`(?i)deadline|timeout|timed out|not resumed|silent|broken|unreachable|reset|refused|dead|gone|lost|gave up|give up`)
)

// With RADIC_DEADLINE=2s, a peer that is gone for good (killed, or its link
// cut with no end) turns into an error for the application: stream's rank
// 0 exits 4 with its connection error, no sooner than 2 s and well within
// 20 s after the fault, and
// the shim's log line on its stderr (prefix "radic[") names the connection
// (the peer's address or "conn"), the reason and the duration.
//
// The ranks ignore SIGTERM (and radic run gets --grace 15s), so that radic
// run, which stops a job when its first rank fails, does not end rank 0
// before its deadline does.
func TestDeadline(t *testing.T) {
	s := streamSpec{conns: 1, bytes: 1 << 30, mode: "poll", seed: 2, secs: 60}
	c := newCluster(t, 2)
	script := `trap '' TERM; exec "$@"`
	for _, f := range []struct {
		name  string
		fault []string
	}{
		{"kill-rank", []string{"kill-rank", "1"}},
		{"cut-link", []string{"cut-link", "1"}},
	} {
		t.Run(f.name, func(t *testing.T) {
			c := c.with(t)
			defer func() {
				if out, err := c.radicErr("fault", "heal"); err != nil {
					t.Errorf("fault heal: %v\n%s", err, out)
				}
			}()
			j := c.start(runOpts{np: 2, nodes: "0,1", grace: "15s", env: []string{"RADIC_DEADLINE=2s"}, what: "stream"},
				append([]string{"/bin/sh", "-c", script, "sh", testenv.Artifact(t, "build/apps/stream")}, s.args()...)...)
			j.waitReceived(0, 16, time.Minute)
			t0 := time.Now()
			c.fault(j, f.fault...)
			deadline := t0.Add(20 * time.Second)
			var m []string
			for m == nil && time.Now().Before(deadline) {
				m = connErrRE.FindStringSubmatch(j.out.String())
				time.Sleep(20 * time.Millisecond)
			}
			if m == nil {
				t.Fatalf("rank 0 reported no connection error within 20 s of the fault")
			}
			took := time.Since(t0)
			t.Logf("rank 0 after %v: %s", took.Round(time.Millisecond), m[1])
			j.wait(30 * time.Second)
			logs := radicLogRE.FindAllStringSubmatch(j.out.String(), -1)
			peer := c.addr(1)
			found := false
			for _, l := range logs {
				t.Logf("shim log: %s", l[1])
				if (strings.Contains(l[1], peer) || strings.Contains(strings.ToLower(l[1]), "conn")) &&
					durationRE.MatchString(l[1]) && reasonRE.MatchString(l[1]) {
					found = true
				}
			}
			if !found {
				t.Errorf("no radic[...] line on rank 0's stderr names the connection (%s or \"conn\"), a reason and a duration; %d radic lines", peer, len(logs))
			}
			// Before the deadline the peer might still come back (a
			// restart, a healed link): the application must not see
			// the error earlier.
			if took < 2*time.Second && !bare() {
				t.Errorf("the error came %v after the fault, before the 2 s deadline ran out", took.Round(time.Millisecond))
			}
		})
	}
}
