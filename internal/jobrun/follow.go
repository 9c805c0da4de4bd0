package jobrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/radic-project/radic/internal/launch"
)

// Following a restarted rank (radic run --recovery): radicd restarts the
// ranks of a lost node elsewhere, or a crashed rank's group in place
// (internal/radicd/recovery.go), and every radicd can say where each rank
// of the job runs now and at which epoch (GET /v1/recovery/jobs/J). radic
// run asks while the job runs, moves a rank's polls to its new instance,
// prints the recoveries, and drops the output the new instance regenerates
// up to the offset already delivered, after comparing it: a mismatch is a
// divergence and stops the job.

// where is where one rank runs now.
type where struct {
	mu sync.Mutex
	// +checklocks:mu
	node int
	// +checklocks:mu
	epoch uint64
	// +checklocks:mu
	moved chan struct{} // closed at the next move
	// +checklocks:mu
	exit *launch.Exit // the instance at epoch finished (RankLoc.Finished)
}

func newWhere(node int) *where { return &where{node: node, moved: make(chan struct{})} }

// get is the rank's node and epoch, and a channel closed when it moves.
func (w *where) get() (node int, epoch uint64, moved <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.node, w.epoch, w.moved
}

// move records a newer instance; it reports whether it was one.
func (w *where) move(node int, epoch uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if epoch <= w.epoch {
		return false
	}
	w.node, w.epoch = node, epoch
	close(w.moved)
	w.moved = make(chan struct{})
	return true
}

// finish records that the instance at epoch finished with e: its daemons
// said so, and its node may be gone before its status was read.
func (w *where) finish(node int, epoch uint64, e launch.Exit) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if epoch < w.epoch || w.exit != nil {
		return
	}
	w.node, w.epoch, w.exit = node, epoch, &e
	close(w.moved)
	w.moved = make(chan struct{})
}

// finished is the exit of the rank's last instance, if it finished.
func (w *where) finished() (launch.Exit, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.exit == nil {
		return launch.Exit{}, false
	}
	return *w.exit, true
}

// keepDelivered bounds the delivered output kept per stream to compare a
// restarted instance's byte by byte; beyond it the prefix is compared by
// its hash at its end.
const keepDelivered = 64 << 20

// DivergenceError: a restarted rank regenerated output that differs
// from what was delivered.
type DivergenceError struct {
	Rank   int
	Stream string
	Offset uint64 // first differing byte (with a hash: the end of the compared prefix)
	Hashed bool
}

func (e *DivergenceError) Error() string {
	if e.Hashed {
		return fmt.Sprintf("rank %d diverged after its restart: its %s differs from what was already delivered within the first %d bytes", e.Rank, e.Stream, e.Offset)
	}
	return fmt.Sprintf("rank %d diverged after its restart: its %s differs from what was already delivered at byte %d", e.Rank, e.Stream, e.Offset)
}

// dedup is one output stream of a rank across its instances: what was
// delivered, and how far the current instance has regenerated it.
type dedup struct {
	rank      int
	stream    string
	delivered uint64
	kept      []byte // delivered[0:len(kept)]
	sum       uint64 // FNV-1a 64 of everything delivered
	// The current instance: bytes [0, regen) of it were compared.
	regen    uint64
	regenSum uint64
	// fresh: every instance's bytes are new, never compared
	// (launch.Radic: each instance's shim says what it saw itself).
	fresh bool
}

const fnvOffset = 14695981039346656037

func newDedup(rank int, stream string) *dedup {
	return &dedup{rank: rank, stream: stream, sum: fnvOffset, regenSum: fnvOffset, fresh: stream == launch.Radic}
}

func fnvAdd(h uint64, b []byte) uint64 {
	// FNV-1a 64, resumed from h.
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

// restart starts comparing a new instance from its offset 0.
func (d *dedup) restart() { d.regen, d.regenSum = 0, fnvOffset }

// feed takes bytes of the current instance at its offset off (== the
// bytes it had given so far) and returns what is new, to be written out.
func (d *dedup) feed(off uint64, b []byte) ([]byte, error) {
	if off != d.regen {
		return nil, fmt.Errorf("rank %d %s: bytes at offset %d, expected %d", d.rank, d.stream, off, d.regen)
	}
	if d.fresh {
		d.regen += uint64(len(b))
		return b, nil
	}
	if d.regen < d.delivered {
		n := min(uint64(len(b)), d.delivered-d.regen)
		old := d.regen
		if d.regen+n <= uint64(len(d.kept)) {
			if i := firstDiff(d.kept[d.regen:d.regen+n], b[:n]); i >= 0 {
				return nil, &DivergenceError{Rank: d.rank, Stream: d.stream, Offset: old + uint64(i)}
			}
		}
		d.regenSum = fnvAdd(d.regenSum, b[:n])
		d.regen += n
		b = b[n:]
		if d.regen == d.delivered && d.regenSum != d.sum {
			return nil, &DivergenceError{Rank: d.rank, Stream: d.stream, Offset: d.delivered, Hashed: true}
		}
	}
	if len(b) == 0 {
		return nil, nil
	}
	d.regen += uint64(len(b))
	d.regenSum = fnvAdd(d.regenSum, b)
	d.delivered += uint64(len(b))
	d.sum = fnvAdd(d.sum, b)
	if room := keepDelivered - len(d.kept); room > 0 {
		d.kept = append(d.kept, b[:min(room, len(b))]...)
	}
	return b, nil
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// DescribeRecovery is a recovery event as radic run and radic status
// print it, ranks being the group's ranks (in one job; none: unknown):
//
//	node 2 died at 12:01:03.120; ranks 2,6 restarted on node 4 in 0.84 s; replayed 38 MB; live again
//	recovery of ranks 2,6 (group 2, from node 2) failed in restart after 5.00 s: protector: no node to restart on
//
// "replayed" is there when the replay step reported its bytes.
func DescribeRecovery(ev launch.RecoveryEvent, ranks []int) string {
	rs := make([]string, len(ranks))
	for i, r := range ranks {
		rs[i] = strconv.Itoa(r)
	}
	which := "rank " + strings.Join(rs, ",")
	switch len(ranks) {
	case 0:
		which = fmt.Sprintf("the ranks of node %d", ev.Group)
	case 1:
	default:
		which = "ranks " + strings.Join(rs, ",")
	}
	if ev.Error != "" {
		from := ""
		if ev.From >= 0 && ev.Cause != "" {
			from = fmt.Sprintf(", from node %d", ev.From)
		}
		phase := ""
		if ev.Phase != "" {
			phase = " in " + ev.Phase
		}
		after := ""
		if ev.Seconds > 0 {
			after = fmt.Sprintf(" after %.2f s", ev.Seconds)
		}
		return fmt.Sprintf("recovery of %s (group %d%s) failed%s%s: %s", which, ev.Group, from, phase, after, ev.Error)
	}
	at := ev.Start.Local().Format("15:04:05.000")
	var b strings.Builder
	if ev.Cause == "process" {
		fmt.Fprintf(&b, "a rank of node %d died at %s; ", ev.From, at)
	} else {
		fmt.Fprintf(&b, "node %d died at %s; ", ev.From, at)
	}
	if ev.Warning != "" && ev.Phase != "reprotect" {
		// Interrupted (its new host died): another attempt follows.
		fmt.Fprintf(&b, "the restart of %s on node %d was interrupted in %s after %.2f s: %s", which, ev.To, ev.Phase, ev.Seconds, ev.Warning)
		return b.String()
	}
	fmt.Fprintf(&b, "%s restarted on node %d in %.2f s", which, ev.To, ev.Seconds)
	if ev.Replayed != nil {
		fmt.Fprintf(&b, "; replayed %s", SizeSI(*ev.Replayed))
	}
	b.WriteString("; live again")
	if ev.Warning != "" {
		fmt.Fprintf(&b, ", but unprotected (a further failure of node %d is fatal): %s", ev.To, ev.Warning)
	}
	return b.String()
}

// SizeSI is n bytes in decimal units: 512 B, 1.5 kB, 38 MB, 2.1 GB.
func SizeSI(n uint64) string {
	const units = "kMGTPE"
	if n < 1000 {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n)/1000, 0
	for f >= 1000 && i < len(units)-1 {
		f, i = f/1000, i+1
	}
	if f < 10 {
		return fmt.Sprintf("%.1f %cB", f, units[i])
	}
	return fmt.Sprintf("%.0f %cB", f, units[i])
}

// ranksOf lists the job's ranks of ev's group that ev restarted, and
// those it left alone because they had finished before (a group whose
// ranks have all finished is not restarted).
func ranksOf(jr launch.JobRecovery, ev launch.RecoveryEvent) (restarted, finished []int) {
	for _, l := range jr.Ranks {
		switch {
		case l.Group != ev.Group:
		case l.Finished && l.Epoch < ev.Epoch:
			finished = append(finished, l.Rank)
		default:
			restarted = append(restarted, l.Rank)
		}
	}
	slices.Sort(restarted)
	slices.Sort(finished)
	return restarted, finished
}

// describeFinished is a recovery event of a group whose ranks had all
// finished: nothing was restarted.
func describeFinished(ev launch.RecoveryEvent, ranks []int) string {
	rs := make([]string, len(ranks))
	for i, r := range ranks {
		rs[i] = strconv.Itoa(r)
	}
	which := "rank " + rs[0] + " had"
	if len(rs) > 1 {
		which = "ranks " + strings.Join(rs, ",") + " had all"
	}
	return fmt.Sprintf("node %d died at %s; %s finished: nothing to restart", ev.From, ev.Start.Local().Format("15:04:05.000"), which)
}

// follower follows the ranks of a job launched with recovery.
type follower struct {
	job    string
	nodes  []int // whose daemons to ask, in order (the launch nodes, then those learned)
	at     func(node int) *Client
	wh     []*where
	logf   func(string, ...any)
	failed chan error // a recovery failed: the job must stop
	events int        // looked at so far
	since  time.Time  // the job's start: older events are a previous job's
}

// failedCh is nil for a job without recovery (a nil channel never fires).
func (f *follower) failedCh() <-chan error {
	if f == nil {
		return nil
	}
	return f.failed
}

// followEvery is how often radic run asks where the ranks run.
const followEvery = 250 * time.Millisecond

func (f *follower) run(ctx context.Context) {
	t := time.NewTicker(followEvery)
	defer t.Stop()
	good := -1 // the node whose answer was learned last
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Every daemon is asked, and the most advanced answer wins: a
		// daemon that answers is not always one that knows (a node cut
		// off from the ring, fenced, still answers radic run, with the
		// placements it had when it was cut off: radic run, asking it
		// first, never learned that the ranks had moved).
		nodes := slices.Clone(f.nodes)
		answers := make([]*launch.JobRecovery, len(nodes))
		var wg sync.WaitGroup
		for i, n := range nodes {
			wg.Go(func() {
				qctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				if jr, err := f.at(n).Recovery(qctx, f.job); err == nil {
					answers[i] = &jr
				}
			})
		}
		wg.Wait()
		best := -1
		for i, jr := range answers {
			if jr == nil {
				continue
			}
			if best < 0 || newerRecovery(*jr, *answers[best]) || (!newerRecovery(*answers[best], *jr) && nodes[i] == good) {
				best = i
			}
		}
		if best < 0 {
			continue
		}
		good = nodes[best]
		f.learn(*answers[best])
	}
}

// newerRecovery reports whether a knows of later instances of the job's
// ranks than b (their epochs summed), or of as many and more recoveries.
func newerRecovery(a, b launch.JobRecovery) bool {
	sum := func(jr launch.JobRecovery) (s uint64) {
		for _, l := range jr.Ranks {
			s += l.Epoch
		}
		return s
	}
	if sa, sb := sum(a), sum(b); sa != sb {
		return sa > sb
	}
	return len(a.Events) > len(b.Events)
}

// learn applies what a daemon said.
func (f *follower) learn(jr launch.JobRecovery) {
	for _, l := range jr.Ranks {
		if l.Rank >= 0 && l.Rank < len(f.wh) {
			f.wh[l.Rank].move(l.Node, l.Epoch)
			if l.Finished && l.Exit != nil {
				f.wh[l.Rank].finish(l.Node, l.Epoch, *l.Exit)
			}
		}
		if !slices.Contains(f.nodes, l.Node) {
			f.nodes = append(f.nodes, l.Node)
		}
	}
	for ; f.events < len(jr.Events); f.events++ {
		ev := jr.Events[f.events]
		if ev.Start.Before(f.since) {
			continue
		}
		restarted, finished := ranksOf(jr, ev)
		line := DescribeRecovery(ev, restarted)
		if len(restarted) == 0 && len(finished) > 0 && ev.Error == "" && ev.Warning == "" {
			line = describeFinished(ev, finished)
		}
		if ev.Error != "" {
			// The job stops with this line (radic run prints it then).
			select {
			case f.failed <- errors.New(line):
			default:
				f.logf("radic run: %s", line)
			}
			continue
		}
		f.logf("radic run: %s", line)
	}
}

// reportDivergence tells the rank's radicd (radic_divergences_total,
// and its log) that the rank's regenerated output differs; best effort.
func (f *follower) reportDivergence(ctx context.Context, c *Client, rank int, err error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	dv := launch.Divergence{Job: f.job, Rank: rank, Where: "output", Error: err.Error()}
	if rerr := c.Divergence(rctx, dv); rerr != nil {
		f.logf("radic run: the divergence of rank %d was not reported to its radicd: %v", rank, rerr)
	}
}

// followLost is how long a rank may be out of reach, or unknown where it
// was, without being restarted elsewhere, before radic run counts it as
// killed.
const followLost = 30 * time.Second

// watchExit is watchExit for a rank that may be restarted: a status of
// "restarting", a daemon out of reach or a rank unknown there wait for
// the rank's next instance.
func (f *follower) watchExit(ctx context.Context, cl func(int) *Client, rank int, exits chan<- exitMsg, contact *atomic.Int64) {
	var lostSince time.Time
	for ctx.Err() == nil {
		c := cl(rank)
		_, epoch, moved := f.wh[rank].get()
		pctx, pcancel := context.WithTimeout(ctx, statusWait+pollSlack)
		st, err := c.Status(pctx, f.job, rank, statusWait)
		pcancel()
		if err == nil || !Unreachable(err) {
			contact.Store(time.Now().UnixNano())
		}
		switch {
		case err == nil && st.Exit != nil && st.Epoch >= epoch:
			// An instance newer than the one we knew (restarted in
			// place, and exited, before its recovery event reached
			// us) is recorded first: the output forwarders must read
			// it before they see the rank exited, or its output is
			// lost (CI, the campaign's kill-rank of Jacobi's rank 0: a
			// restarted instance that lived 170 ms, status 0, its
			// digest line never printed).
			if node, _, _ := f.wh[rank].get(); st.Epoch > epoch {
				f.wh[rank].move(node, st.Epoch)
			}
			exits <- exitMsg{rank, *st.Exit}
			return
		case err == nil && st.State != launch.StateRestarting && st.Epoch >= epoch:
			lostSince = time.Time{}
			continue
		}
		// Restarting, out of reach, unknown, or an older instance.
		if e, ok := f.wh[rank].finished(); ok {
			// It finished, and its node went before we read its
			// status: its daemons kept the exit.
			exits <- exitMsg{rank, e}
			return
		}
		if lostSince.IsZero() {
			lostSince = time.Now()
		} else if time.Since(lostSince) > followLost {
			f.logf("radic run: rank %d: not restarted within %v (%v)", rank, followLost, err)
			exits <- exitMsg{rank, launch.Exit{Signal: int(syscall.SIGKILL)}}
			return
		}
		select {
		case <-moved:
			lostSince = time.Time{}
		case <-time.After(retryEvery):
		case <-ctx.Done():
		}
	}
}

// forward is forward for a rank that may be restarted: it reads each
// instance from its offset 0 and writes out only what goes beyond what
// was delivered, after comparing the rest. It returns a
// *DivergenceError when they differ.
func (f *follower) forward(ctx context.Context, cl func(int) *Client, rank int, stream string, w io.Writer, exited, abandoned <-chan struct{}) error {
	dd := newDedup(rank, stream)
	var off, cur uint64 // offset in the instance at epoch cur
	buf := make([]byte, 64<<10)
	var idleSince, failSince time.Time
	for ctx.Err() == nil {
		select {
		case <-abandoned:
			return nil
		default:
		}
		c := cl(rank)
		_, epoch, moved := f.wh[rank].get()
		if epoch != cur {
			cur, off = epoch, 0
			dd.restart()
		}
		wait, done := pollWait, false
		select {
		case <-exited:
			done, wait = true, drainTimeout/4
		default:
		}
		pctx, pcancel := context.WithTimeout(ctx, wait+pollSlack)
		go func() {
			select {
			case <-exited:
			case <-moved:
			case <-pctx.Done():
				return
			}
			if !done {
				pcancel()
			}
		}()
		body, eof, err := c.OutputEpoch(pctx, f.job, rank, stream, off, wait, cur)
		if err != nil {
			pcancel()
			if done {
				if failSince.IsZero() {
					failSince = time.Now()
				} else if time.Since(failSince) > lostTimeout {
					f.logf("radic run: %s of rank %d after byte %d not forwarded: %v", stream, rank, dd.delivered, err)
					return nil
				}
			}
			select {
			case <-moved:
			case <-time.After(retryEvery):
			case <-ctx.Done():
			}
			continue
		}
		failSince = time.Time{}
		complete := false
		n0 := off
		for {
			n, rerr := body.Read(buf)
			if n > 0 {
				out, derr := dd.feed(off, buf[:n])
				if derr != nil {
					body.Close()
					pcancel()
					f.reportDivergence(ctx, c, rank, derr)
					return derr
				}
				if len(out) > 0 {
					_, _ = w.Write(out)
				}
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
			// The instance's stream ended: the rank's end, or its death
			// before a restart. A newer instance first: the rank's exit
			// may be its (watchExit records it before it reports it).
			select {
			case <-moved:
				continue
			default:
			}
			select {
			case <-exited:
				return nil
			case <-moved:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		switch {
		case !done || off > n0:
			idleSince = time.Time{}
		case idleSince.IsZero():
			idleSince = time.Now()
		case time.Since(idleSince) > drainTimeout:
			return nil
		}
	}
	return nil
}
