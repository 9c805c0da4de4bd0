// Package jobrun runs a job whose ranks the nodes' radicds launch: the
// launcher's side of radicd's launch API (package internal/launch), used
// by `radic run` on a cluster with daemons. It knows nothing of where the
// ranks were placed or how a node's daemon is found: the caller gives one
// launch record per rank and a [Daemons] func.
//
// A job runs in three steps, as the direct launcher did: every rank is
// created, held at its gate (radicd stores its launch record with its
// protectors first); the caller records the pids (Options.Created); then
// every gate opens. Each rank then has three long polls on its daemon:
// its exit status, and its stdout and stderr by byte offset. A poll that
// fails (the daemon moved, its link was cut) is asked again from the last
// offset written out, so nothing is lost or printed twice; radicd keeps a
// rank's unfetched output (4 MiB a stream, the rank waits beyond). The
// exit status and the messages are those of the direct launcher: the
// first failing rank's status (128+signal), SIGTERM to every rank and
// SIGKILL after the grace period on a failure or a signal.
//
// A rank whose daemon has not answered for 3 s once SIGKILL was sent (the
// job is being stopped; Grace has passed) is given up on: radic run ends,
// saying so, rather than wait for a link that may never heal. radicd
// still holds the rank, and kills it when radic run's goodbye (DELETE)
// reaches it; `radic cluster down` kills it in any case.
package jobrun

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/radic-project/radic/internal/launch"
)

// Timing of the polls.
const (
	pollWait     = 2 * time.Second        // radicd holds an output poll this long
	statusWait   = time.Second            // and a status poll this long
	pollSlack    = time.Second            // more for the answer: a connection to an address gone is dropped then
	retryEvery   = 200 * time.Millisecond // after a failed poll
	abandonAfter = 3 * time.Second        // of silence from a daemon, once SIGKILL was sent
	drainTimeout = 2 * time.Second        // of a stream held open by a rank's orphan, after its exit
	lostTimeout  = 10 * time.Second       // of a daemon unreachable after its rank's exit
	// unreachableFor is how long a launch or a start is retried while the
	// daemon cannot be reached (a readdressed node is found again within
	// refreshEvery; a dead one is then reported).
	unreachableFor = 5 * time.Second
)

// Options are a job's settings.
type Options struct {
	Ranks   []launch.Record // rank r is Ranks[r]
	Daemons Daemons
	HTTP    *http.Client // nil: NewHTTPClient()

	TagOutput      bool // prefix every output line with "[rank R] "
	Stdout, Stderr io.Writer
	Stdin          io.Reader // fed to the ranks whose record asks for stdin
	Grace          time.Duration
	Signals        <-chan os.Signal // stop the job (SIGTERM, SIGKILL after Grace)
	Logf           func(format string, args ...any)

	// Created, if set, is called once every rank exists and before any
	// runs, with their processes (rank r is started[r]; a zero one for a
	// rank its lost node had created, which its recovery restarts).
	Created func(started []launch.Started) error

	// Alternates are the nodes that may take a rank whose own node is
	// lost while the job launches (no answer, or a refusal: cut off,
	// fenced), in order of preference (spares first). With recovery on,
	// such a rank is launched on the first that will, once the ring has
	// declared its node dead (launchElsewhere); without, or with none, the
	// job does not start.
	Alternates []int
}

type exitMsg struct {
	rank int
	exit launch.Exit
}

// Run runs the job and returns its status: 0 when every rank exited 0,
// else the first failing rank's (128+signal), or 128+signal of a signal
// that stopped it. An error means the job could not start.
func Run(o Options) (int, error) {
	np := len(o.Ranks)
	if np == 0 {
		return 0, errors.New("jobrun: no rank")
	}
	if o.HTTP == nil {
		o.HTTP = NewHTTPClient()
	}
	if o.Grace == 0 {
		o.Grace = 3 * time.Second
	}
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	job := o.Ranks[0].Job
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	daemons := newBook(o.Daemons)
	var nodes []int
	clients := make([]*Client, np)
	wh := make([]*where, np)
	recovery := slices.Contains(o.Ranks[0].Env, "RADIC_RECOVERY=1")
	for r := range o.Ranks {
		clients[r] = &Client{Node: o.Ranks[r].Node, Daemons: daemons.daemon, Moved: daemons.movedFrom, HTTP: o.HTTP}
		wh[r] = newWhere(o.Ranks[r].Node)
		if !slices.Contains(nodes, o.Ranks[r].Node) {
			nodes = append(nodes, o.Ranks[r].Node)
		}
	}
	go daemons.run(ctx, nodes)
	// at is a client for node's daemon.
	at := func(node int) *Client {
		return &Client{Node: node, Daemons: daemons.daemon, Moved: daemons.movedFrom, HTTP: o.HTTP}
	}
	// cl is a client for where rank r runs now.
	cl := func(r int) *Client {
		n, _, _ := wh[r].get()
		if n == clients[r].Node {
			return clients[r]
		}
		return at(n)
	}
	// forget tells every daemon of the job that radic run is done with
	// it (ranks still there, such as held ones, are ended).
	forget := func() {
		seen := map[int]bool{}
		var wg sync.WaitGroup
		var all []*Client
		for r, c := range clients {
			all = append(all, c, cl(r))
		}
		for _, c := range all {
			if seen[c.Node] {
				continue
			}
			seen[c.Node] = true
			wg.Go(func() {
				fctx, fcancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer fcancel()
				_ = c.Forget(fctx, job)
			})
		}
		wg.Wait()
	}

	// Recoveries from here on are this job's (a node may die while its
	// ranks are created or started: see step 3).
	begun := time.Now()
	// Step 1: create every rank, held at its gate.
	started := make([]launch.Started, np)
	errs := make([]error, np)
	followed := make([]bool, np) // created by a node lost since: its recovery restarts it
	parallel(np, func(r int) {
		lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
		defer lcancel()
		started[r], errs[r] = launchRank(lctx, clients[r], &o.Ranks[r])
		if errs[r] != nil && recovery && len(o.Alternates) > 0 && lostAtLaunch(errs[r]) {
			lost := o.Ranks[r].Node
			ectx, ecancel := context.WithTimeout(ctx, elsewhereFor)
			defer ecancel()
			st, alt, follow, err := launchElsewhere(ectx, at, daemons.daemon, o.Ranks[r], o.Alternates)
			switch {
			case err != nil:
				errs[r] = fmt.Errorf("%w; and no other node took it: %w", errs[r], err)
			case follow:
				logf("radic run: rank %d: node %d was lost during the launch (%v) after it had created the rank; following its recovery", r, lost, errs[r])
				started[r], errs[r], followed[r] = launch.Started{}, nil, true
			default:
				logf("radic run: rank %d: node %d was lost during the launch (%v); launched on node %d in its place", r, lost, errs[r], alt.Node)
				started[r], errs[r], o.Ranks[r] = st, nil, alt
				clients[r], wh[r] = at(alt.Node), newWhere(alt.Node)
			}
		}
		if errs[r] != nil {
			errs[r] = fmt.Errorf("rank %d on node %d: %w", r, o.Ranks[r].Node, errs[r])
		}
	})
	for r := range o.Ranks {
		if !slices.Contains(nodes, o.Ranks[r].Node) {
			nodes = append(nodes, o.Ranks[r].Node)
		}
	}
	startErr := errors.Join(errs...)
	// Step 2: the caller records the pids.
	if startErr == nil && o.Created != nil {
		startErr = o.Created(started)
	}
	if startErr != nil {
		forget()
		return 0, startErr
	}

	// Step 3: open the gates.
	running := make([]bool, np)
	parallel(np, func(r int) {
		if followed[r] {
			running[r] = true // restarted without a gate
			return
		}
		sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
		defer scancel()
		if err := startRank(sctx, clients[r], job, r); err != nil {
			if recovery && Unreachable(err) {
				// Its node may have died since the rank was created:
				// its launch record is with its protectors, which
				// restart it; the follower finds it there (or gives
				// it up after followLost, as any rank out of reach).
				logf("radic run: rank %d on node %d: %v; following it (restarted elsewhere if its node died)", r, o.Ranks[r].Node, err)
				running[r] = true
				return
			}
			errs[r] = fmt.Errorf("rank %d on node %d: %w", r, o.Ranks[r].Node, err)
			return
		}
		running[r] = true
	})
	startErr = errors.Join(errs...)

	out := newOutput(o.TagOutput, o.Stdout, o.Stderr)
	exits := make(chan exitMsg, np)
	var outWG sync.WaitGroup
	nrun := 0
	// exited[r] is closed when rank r's exit is known (or it was given
	// up on): its output is then drained, not waited for for ever.
	// abandoned[r] is closed when rank r is given up on: its output is
	// not waited for at all.
	exited := make([]chan struct{}, np)
	abandoned := make([]chan struct{}, np)
	for r := range exited {
		exited[r] = make(chan struct{})
		abandoned[r] = make(chan struct{})
	}
	contact := make([]atomic.Int64, np) // unix nanoseconds of the last answer from the rank's daemon
	for r := range contact {
		contact[r].Store(time.Now().UnixNano())
	}
	diverged := make(chan error, 2*np)
	var fol *follower
	if recovery {
		fol = &follower{job: job, nodes: nodes, at: at, wh: wh, logf: logf, failed: make(chan error, 1), since: begun}
		go fol.run(ctx)
	}
	for r, ok := range running {
		if !ok {
			continue
		}
		nrun++
		if recovery {
			go fol.watchExit(ctx, cl, r, exits, &contact[r])
		} else {
			go watchExit(ctx, clients[r], job, r, exits, &contact[r])
		}
		streams := []string{launch.Stdout, launch.Stderr}
		if recovery {
			streams = append(streams, launch.Radic) // the shim's lines, kept out of stderr
		}
		for _, s := range streams {
			w := out.sink(r, s)
			outWG.Go(func() {
				defer w.Close()
				if recovery {
					if err := fol.forward(ctx, cl, r, s, w, exited[r], abandoned[r]); err != nil {
						diverged <- err
					}
					return
				}
				forward(ctx, clients[r], job, r, s, w, exited[r], abandoned[r], logf)
			})
		}
		if o.Ranks[r].Stdin && o.Stdin != nil {
			go func() {
				if err := clients[r].Stdin(ctx, job, r, o.Stdin); err != nil && ctx.Err() == nil {
					logf("radic run: stdin of rank %d: %v", r, err)
				}
			}()
		}
	}
	if startErr != nil && nrun == 0 {
		forget()
		return 0, startErr
	}

	// signal sends sig to every rank still running, each through its
	// daemon, without waiting for the answers.
	signal := func(sig syscall.Signal) {
		for r := range running {
			if !running[r] {
				continue
			}
			go func() {
				sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
				defer scancel()
				_ = cl(r).Signal(sctx, job, r, sig)
			}()
		}
	}
	code := 0
	failed, interrupted := false, false
	var stopTimer, abandonTimer <-chan time.Time
	stopping := func(sig syscall.Signal) {
		signal(sig)
		if stopTimer == nil {
			stopTimer = time.After(o.Grace)
		}
	}
	if startErr != nil {
		logf("radic run: %v; stopping the job", startErr)
		failed, code = true, 1
		stopping(syscall.SIGTERM)
	}
	for left := nrun; left > 0; {
		select {
		case e := <-exits:
			if !running[e.rank] {
				continue // given up on already
			}
			left--
			running[e.rank] = false
			close(exited[e.rank])
			c := e.exit.Status()
			if c != 0 && !failed && !interrupted {
				failed, code = true, c
				how := e.exit.String()
				if c == launch.ExitDiverged {
					how += " (the divergence exit: restarted, it regenerated other bytes than its peers had received; its DIVERGENCE line names the connection and the offset)"
				}
				logf("radic run: rank %d (node %d, pid %d) %s; stopping the job", e.rank, o.Ranks[e.rank].Node, started[e.rank].Pid, how)
				stopping(syscall.SIGTERM)
			}
		case err := <-diverged:
			if !failed {
				failed, code = true, 1
				logf("radic run: %v; stopping the job", err)
				stopping(syscall.SIGTERM)
			}
		case err := <-fol.failedCh():
			if !failed {
				failed, code = true, 1
				logf("radic run: %v; stopping the job", err)
				stopping(syscall.SIGTERM)
			}
		case sig := <-o.Signals:
			if interrupted {
				logf("radic run: %v again: killing the job", sig)
				signal(syscall.SIGKILL)
				continue
			}
			interrupted = true
			if !failed {
				code = 128 + int(sig.(syscall.Signal))
			}
			logf("radic run: %v: stopping job %s (SIGTERM, SIGKILL after %v)", sig, job, o.Grace)
			stopping(syscall.SIGTERM)
		case <-stopTimer:
			signal(syscall.SIGKILL)
			abandonTimer = time.After(abandonAfter)
		case <-abandonTimer:
			// Stop waiting for ranks on nodes whose daemons do not
			// answer (cut off, frozen or dead); the others die of the
			// SIGKILL and say so.
			abandonTimer = time.After(abandonAfter / 3)
			for r := range running {
				silent := time.Since(time.Unix(0, contact[r].Load()))
				if running[r] && silent >= abandonAfter {
					logf("radic run: rank %d (node %d, pid %d): its radicd has not answered for %v after SIGKILL; giving up on it",
						r, o.Ranks[r].Node, started[r].Pid, silent.Round(100*time.Millisecond))
					running[r] = false
					close(exited[r])
					close(abandoned[r])
					left--
				}
			}
		}
	}
	// Every stream is forwarded to its end; forward bounds the wait for
	// an orphan's pipe and for a daemon out of reach.
	outWG.Wait()
	cancel()
	forget()
	return code, nil
}

// launchRank launches rec's rank, asking again for a while if the daemon
// could not be reached (its node may be moving); a retry that finds the
// rank launched (409) takes its pid from the daemon: the first request got
// through.
func launchRank(ctx context.Context, c *Client, rec *launch.Record) (launch.Started, error) {
	var st launch.Started
	err := retryUnreachable(ctx, func(retry bool) error {
		var err error
		st, err = c.Launch(ctx, rec)
		if retry && httpStatus(err) == http.StatusConflict {
			rs, serr := c.Status(ctx, rec.Job, rec.Rank, 0)
			if serr != nil {
				return serr
			}
			st = launch.Started{Pid: rs.Pid, Start: rs.Start}
			return nil
		}
		return err
	})
	return st, err
}

// elsewhereFor bounds launchElsewhere: the ring declares a lost node dead
// within seconds, and a launch then waits for it to settle.
const elsewhereFor = 30 * time.Second

// lostAtLaunch reports whether a launch failed because its node is lost:
// out of reach, or refusing (cut off from its ring's majority, fenced).
func lostAtLaunch(err error) bool {
	return Unreachable(err) || httpStatus(err) == http.StatusServiceUnavailable
}

// launchElsewhere creates rec's rank, whose node was lost during the
// launch, on the first of alternates that takes it (LaunchInsteadOf:
// once its ring has declared the lost node dead). The rank keeps its
// logical node (RADIC_NODE: the address its peers know it by, as a rank
// restarted elsewhere does); its group is its new host. follow: the lost
// node had created the rank before it went, so its recovery restarts it
// (or has: the alternate runs it) and radic run follows it there.
func launchElsewhere(ctx context.Context, at func(int) *Client, daemons Daemons, rec launch.Record, alternates []int) (st launch.Started, alt launch.Record, follow bool, err error) {
	lost := rec.Node
	for _, m := range alternates {
		if m == lost {
			continue
		}
		addr, derr := daemons(m)
		if derr != nil {
			err = derr
			continue
		}
		alt = rec
		alt.Node, alt.Env = m, launch.HostedEnv(rec.Env, addr)
		c := at(m)
		for {
			st, err = c.LaunchInsteadOf(ctx, &alt, lost)
			switch code := httpStatus(err); {
			case err == nil:
				return st, alt, false, nil
			case code == http.StatusConflict:
				// Known already: here, held (our earlier attempt got
				// through), or restarted by the recovery of lost.
				rs, serr := c.Status(ctx, rec.Job, rec.Rank, 0)
				if serr == nil && rs.State == launch.StateHeld {
					return launch.Started{Pid: rs.Pid, Start: rs.Start}, alt, false, nil
				}
				return launch.Started{}, rec, true, nil
			case code == http.StatusServiceUnavailable && ctx.Err() == nil:
				sleep(ctx, retryEvery) // not declared dead yet, or its ring settling
				continue
			}
			break // out of reach, or refused for good: the next
		}
		if ctx.Err() != nil {
			break
		}
	}
	if err == nil {
		err = fmt.Errorf("no node to launch it in place of node %d", lost)
	}
	return launch.Started{}, rec, false, err
}

// startRank opens the rank's gate, likewise: a retry told "started
// already" (409) means the first request got through.
func startRank(ctx context.Context, c *Client, job string, rank int) error {
	return retryUnreachable(ctx, func(retry bool) error {
		err := c.Start(ctx, job, rank)
		if retry && httpStatus(err) == http.StatusConflict {
			return nil
		}
		return err
	})
}

// retryUnreachable calls fn until it succeeds, fails otherwise than by
// an unreachable daemon, or has failed so for unreachableFor.
func retryUnreachable(ctx context.Context, fn func(retry bool) error) error {
	deadline := time.Now().Add(unreachableFor)
	for retry := false; ; retry = true {
		err := fn(retry)
		if err == nil || !Unreachable(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		sleep(ctx, retryEvery)
	}
}

func httpStatus(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// watchExit polls the rank's status until it has exited, through any
// number of failed polls.
func watchExit(ctx context.Context, c *Client, job string, rank int, exits chan<- exitMsg, contact *atomic.Int64) {
	for ctx.Err() == nil {
		// Short polls: each answer is news that the daemon is there.
		pctx, pcancel := context.WithTimeout(ctx, statusWait+pollSlack)
		st, err := c.Status(pctx, job, rank, statusWait)
		pcancel()
		if err == nil || !Unreachable(err) {
			contact.Store(time.Now().UnixNano())
		}
		switch {
		case err == nil && st.Exit != nil:
			exits <- exitMsg{rank, *st.Exit}
			return
		case err == nil:
		case isNotFound(err):
			// radicd forgot the rank: restarted, or its node lost its
			// state. Its end is unknown: count it as killed.
			exits <- exitMsg{rank, launch.Exit{Signal: int(syscall.SIGKILL)}}
			return
		default:
			sleep(ctx, retryEvery)
		}
	}
}

func isNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

// forward copies one output stream of a rank to w, by offset, until its
// end: a failed poll is asked again from the last byte written out. Once
// the rank has exited (exited is closed), a stream that stays open without
// a byte for drainTimeout (a child of the rank holds it) is left, as the
// direct launcher leaves it; a daemon unreachable for lostTimeout then is
// given up on, saying what was not forwarded. A rank given up on
// (abandoned closed) is not waited for at all.
func forward(ctx context.Context, c *Client, job string, rank int, stream string, w io.Writer, exited, abandoned <-chan struct{}, logf func(string, ...any)) {
	var off uint64
	buf := make([]byte, 64<<10)
	var idleSince, failSince time.Time // after the exit: nothing new, no answer
	for ctx.Err() == nil {
		wait := pollWait
		done := false
		select {
		case <-abandoned:
			return
		default:
		}
		select {
		case <-exited:
			done = true
			wait = drainTimeout / 4
		default:
		}
		pctx, pcancel := context.WithTimeout(ctx, wait+pollSlack)
		if !done {
			// The exit ends a poll in flight: it may hang on an address
			// the node no longer has (readdressed), while the rest of
			// the output waits at the new one.
			go func() {
				select {
				case <-exited:
					pcancel()
				case <-pctx.Done():
				}
			}()
		}
		body, eof, err := c.Output(pctx, job, rank, stream, off, wait)
		if err != nil {
			pcancel()
			if isNotFound(err) {
				return
			}
			if done {
				if failSince.IsZero() {
					failSince = time.Now()
				} else if time.Since(failSince) > lostTimeout {
					logf("radic run: %s of rank %d after byte %d not forwarded: %v", stream, rank, off, err)
					return
				}
			}
			sleep(ctx, retryEvery)
			continue
		}
		failSince = time.Time{}
		complete := false
		n0 := off
		for {
			n, rerr := body.Read(buf)
			if n > 0 {
				_, _ = w.Write(buf[:n])
				off += uint64(n)
			}
			if rerr != nil {
				complete = errors.Is(rerr, io.EOF)
				break
			}
		}
		body.Close()
		pcancel()
		if eof && complete {
			return
		}
		switch {
		case !done || off > n0:
			idleSince = time.Time{}
		case idleSince.IsZero():
			idleSince = time.Now()
		case time.Since(idleSince) > drainTimeout:
			return
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// output is where the ranks' streams go: the launcher's stdout and
// stderr, each write whole under one lock, or line by line with a "[rank
// R] " prefix.
type output struct {
	tag    bool
	stdout io.Writer
	stderr io.Writer
	mu     sync.Mutex
}

func newOutput(tag bool, stdout, stderr io.Writer) *output {
	return &output{tag: tag, stdout: stdout, stderr: stderr}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (lockedWriter) Close() error { return nil }

// sink is the writer for rank's stream; the caller closes it at the
// stream's end (a partial last line is then tagged and ended).
func (o *output) sink(rank int, stream string) io.WriteCloser {
	w := o.stdout
	if stream == launch.Stderr || stream == launch.Radic {
		w = o.stderr
	}
	if !o.tag {
		return lockedWriter{&o.mu, w}
	}
	pr, pw := io.Pipe()
	t := &tagSink{pw: pw, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		Tag(rank, pr, w, &o.mu)
		pr.Close()
	}()
	return t
}

// tagSink feeds Tag; Close returns once Tag has written the last line.
type tagSink struct {
	pw   *io.PipeWriter
	done chan struct{}
}

func (t *tagSink) Write(p []byte) (int, error) { return t.pw.Write(p) }

func (t *tagSink) Close() error {
	t.pw.Close()
	<-t.done
	return nil
}

// Tag copies rd to w line by line, each prefixed "[rank R] " and written
// whole under mu; a last line without a newline gets one. It is the one
// definition of --tag-output, shared by both launchers.
func Tag(rank int, rd io.Reader, w io.Writer, mu *sync.Mutex) {
	br := bufio.NewReader(rd)
	prefix := fmt.Sprintf("[rank %d] ", rank)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			if !strings.HasSuffix(line, "\n") {
				line += "\n"
			}
			mu.Lock()
			_, _ = io.WriteString(w, prefix+line)
			mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// parallel runs fn(0..n-1) on a few goroutines at a time.
func parallel(n int, fn func(i int)) {
	const width = 8
	var wg sync.WaitGroup
	sem := make(chan struct{}, width)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fn(i)
		}()
	}
	wg.Wait()
}
