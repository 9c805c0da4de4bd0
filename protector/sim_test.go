package protector

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// world drives one Machine per node on an in-memory ring with a manual
// clock, in 1 ms steps, and plays every node's radicd edge: it executes
// the actions (starting and killing "processes", moving critical data),
// answers them after latencies, and feeds each machine its View and the
// heartbeat's verdicts as a heartbeat ring would. It keeps the ground
// truth (which copies of a group run where, which nodes hold its data)
// and checks the invariants after every step.
type world struct {
	t   testing.TB
	now time.Time
	cfg Config
	ids []NodeID
	rng *rand.Rand

	ms   map[NodeID]*Machine
	next map[NodeID]time.Time

	crashed, frozen, fenced map[NodeID]bool
	side                    map[NodeID]int // nodes reach each other iff on the same side

	view     map[[2]NodeID]bool      // what a's View says of b
	pending  map[[2]NodeID]time.Time // since when the truth differs from the View
	lostView map[[2]NodeID]time.Time
	told     map[[2]NodeID]bool // heartbeat verdict given
	toldF    map[[2]NodeID]bool // ... that the node fenced itself

	running map[GroupID][]instance
	data    map[GroupID]map[NodeID]bool
	aborted map[abortKey]bool
	noMaj   map[NodeID]time.Time // since when a node really lacks a majority
	queue   []event

	records  []Record
	failed   []emitted
	restarts []emitted
	rings    []emitted
	fences   []emitted

	// Knobs.
	lat, viewLag, declareLag                                       time.Duration
	startDelay, reconnectDelay, replayDelay, transferDelay, jitter time.Duration
	refuse, silent                                                 map[NodeID]bool
	noCheckpoint                                                   bool
}

type instance struct {
	node  NodeID
	epoch uint64
}

type abortKey struct {
	g     GroupID
	epoch uint64
	node  NodeID
}

type event struct {
	at time.Time
	to NodeID // None: the world itself
	fn func()
}

type emitted struct {
	at time.Time
	on NodeID
	Action
}

// newWorld makes n active nodes 0..n-1 (group i on node i, processes
// 10i, 10i+1) and the given spares.
func newWorld(t testing.TB, n int, spares []NodeID, mod func(*Config)) *world {
	t.Helper()
	w := &world{
		t: t, now: time.Unix(1_000_000, 0), rng: rand.New(rand.NewPCG(1, 2)),
		ms: map[NodeID]*Machine{}, next: map[NodeID]time.Time{},
		crashed: map[NodeID]bool{}, frozen: map[NodeID]bool{}, fenced: map[NodeID]bool{}, side: map[NodeID]int{},
		view: map[[2]NodeID]bool{}, pending: map[[2]NodeID]time.Time{}, lostView: map[[2]NodeID]time.Time{}, told: map[[2]NodeID]bool{}, toldF: map[[2]NodeID]bool{},
		running: map[GroupID][]instance{}, data: map[GroupID]map[NodeID]bool{}, aborted: map[abortKey]bool{}, noMaj: map[NodeID]time.Time{},
		lat: time.Millisecond, viewLag: 100 * time.Millisecond, declareLag: 300 * time.Millisecond,
		startDelay: 50 * time.Millisecond, reconnectDelay: 30 * time.Millisecond,
		replayDelay: 100 * time.Millisecond, transferDelay: 40 * time.Millisecond,
		refuse: map[NodeID]bool{}, silent: map[NodeID]bool{},
	}
	for i := range n {
		id := NodeID(i)
		w.cfg.Nodes = append(w.cfg.Nodes, id)
		w.cfg.Groups = append(w.cfg.Groups, GroupSpec{ID: GroupID(i), Node: id, Procs: []ProcID{ProcID(10 * i), ProcID(10*i + 1)}})
	}
	w.cfg.Spares = spares
	if mod != nil {
		mod(&w.cfg)
	}
	w.ids = slices.Sorted(slices.Values(append(slices.Clone(w.cfg.Nodes), spares...)))
	for _, id := range w.ids {
		cfg := w.cfg
		cfg.Self = id
		m, err := New(cfg, nil, w.now)
		if err != nil {
			t.Fatal(err)
		}
		w.ms[id], w.next[id] = m, w.now
		for _, o := range w.ids {
			w.view[[2]NodeID{id, o}] = true
		}
	}
	for _, gid := range w.ms[w.ids[0]].gids {
		g := w.ms[w.ids[0]].groups[gid]
		w.running[gid] = []instance{{g.Host, 0}}
		w.data[gid] = map[NodeID]bool{}
		for _, h := range g.Holders {
			w.data[gid][h] = true
		}
	}
	return w
}

func (w *world) logf(format string, args ...any) {
	w.t.Helper()
	if testing.Verbose() {
		w.t.Logf("%s "+format, append([]any{w.now.Format("05.000")}, args...)...)
	}
}

// up: the node's radicd runs (not crashed, not frozen).
func (w *world) up(id NodeID) bool { return !w.crashed[id] && !w.frozen[id] }

func (w *world) reach(a, b NodeID) bool { return w.up(b) && w.side[a] == w.side[b] }

// after queues fn for node to (None: the world) at now+d; it is dropped
// when to has crashed and held while to is frozen.
func (w *world) after(d time.Duration, to NodeID, fn func()) {
	if w.jitter > 0 {
		d += time.Duration(w.rng.Int64N(int64(w.jitter)))
	}
	w.queue = append(w.queue, event{at: w.now.Add(d), to: to, fn: fn})
}

// send is after for a message from a to b: lost if they cannot reach
// each other when it is sent.
func (w *world) send(a, b NodeID, d time.Duration, fn func()) {
	if a != b && !w.reach(a, b) {
		return
	}
	w.after(d, b, fn)
}

// --- Faults --------------------------------------------------------------

func (w *world) crash(id NodeID) {
	w.logf("crash %d", id)
	w.crashed[id] = true
	delete(w.ms, id)
	w.killOn(id)
	for _, d := range w.data {
		delete(d, id)
	}
}

func (w *world) killOn(id NodeID) {
	for g, is := range w.running {
		w.running[g] = slices.DeleteFunc(is, func(i instance) bool { return i.node == id })
	}
}

func (w *world) freeze(id NodeID) { w.logf("freeze %d", id); w.frozen[id] = true }
func (w *world) thaw(id NodeID)   { w.logf("thaw %d", id); delete(w.frozen, id) }

// partition puts the listed nodes on side 1, the rest on side 0.
func (w *world) partition(ids ...NodeID) {
	w.logf("partition %v", ids)
	for _, id := range ids {
		w.side[id] = 1
	}
}

func (w *world) heal() { w.logf("heal"); w.side = map[NodeID]int{} }

// exitProc plays kill-rank: a process of group g dies on its host.
func (w *world) exitProc(g GroupID) {
	host := w.running[g][0].node
	w.logf("process of group %d exits on %d", g, host)
	if err := w.ms[host].Exited(w.now, g, ProcID(10*int(g))); err != nil {
		w.t.Fatalf("Exited(%d) = %v", g, err)
	}
}

// --- The loop --------------------------------------------------------------

func (w *world) run(d time.Duration) {
	w.t.Helper()
	end := w.now.Add(d)
	for w.now.Before(end) {
		w.now = w.now.Add(time.Millisecond)
		q := w.queue
		w.queue = nil
		for _, e := range q {
			switch {
			case e.at.After(w.now) || (e.to != None && w.frozen[e.to]):
				w.queue = append(w.queue, e)
			case e.to != None && w.crashed[e.to]:
			default:
				e.fn()
			}
		}
		for _, a := range w.ids {
			if w.up(a) {
				w.feedView(a)
			}
		}
		for _, id := range w.ids {
			if w.up(id) && !w.now.Before(w.next[id]) {
				w.ms[id].Tick(w.now)
			}
		}
		for _, id := range w.ids {
			if w.up(id) {
				w.drain(id)
			}
		}
		w.check()
	}
}

// feedView plays the heartbeat for a: its View follows the truth viewLag
// later, a lost node is suspected then and declared declareLag after, and
// a fenced node that a can reach is declared as fenced.
func (w *world) feedView(a NodeID) {
	m := w.ms[a]
	dirty := false
	for _, b := range w.ids {
		if b == a {
			continue
		}
		k := [2]NodeID{a, b}
		truth := w.reach(a, b)
		if truth == w.view[k] {
			delete(w.pending, k)
		} else if since, ok := w.pending[k]; !ok {
			w.pending[k] = w.now
		} else if w.now.Sub(since) >= w.viewLag {
			delete(w.pending, k)
			w.view[k], dirty = truth, true
			if !truth {
				w.lostView[k] = w.now
			}
		}
	}
	if dirty {
		var in []NodeID
		for _, b := range w.ids {
			if b != a && w.view[[2]NodeID{a, b}] {
				in = append(in, b)
			}
		}
		m.View(w.now, in)
		for _, b := range w.ids {
			if b != a && !w.view[[2]NodeID{a, b}] && w.lostView[[2]NodeID{a, b}] == w.now {
				m.Suspect(w.now, b)
			}
		}
	}
	for _, b := range w.ids {
		k := [2]NodeID{a, b}
		switch {
		case b == a:
		case !w.told[k] && !w.view[k] && w.now.Sub(w.lostView[k]) >= w.declareLag:
			w.told[k] = true
			m.Declared(w.now, b, false)
		case !w.toldF[k] && w.view[k] && w.fenced[b]:
			// Heard from, announcing its fence (heartbeat's
			// CauseFenced), whether or not it was declared before.
			w.told[k], w.toldF[k] = true, true
			m.Declared(w.now, b, true)
		}
	}
}

func (w *world) drain(id NodeID) {
	m := w.ms[id]
	rd := m.Ready()
	w.next[id] = rd.NextTick
	if !rd.NextTick.After(w.now) {
		w.t.Fatalf("node %d: NextTick %v not after now %v: the edge would spin", id, rd.NextTick, w.now)
	}
	w.records = append(w.records, rd.Records...)
	for _, r := range rd.Records {
		w.logf("node %d: record %+v", id, r)
	}
	for _, a := range rd.Actions {
		w.exec(id, a)
	}
}

// exec plays node e's radicd edge.
func (w *world) exec(e NodeID, a Action) {
	w.t.Helper()
	w.logf("node %d: %v group=%d epoch=%d node=%d from=%d to=%v ckpt=%v err=%v", e, a.Kind, a.Group, a.Epoch, a.Node, a.From, a.To, a.Checkpoint, a.Err)
	em := emitted{w.now, e, a}
	g := a.Group
	switch a.Kind {
	case ActFence:
		w.fences = append(w.fences, em)
		w.fenced[e] = true
		w.killOn(e)
	case ActStop:
		w.after(w.lat, e, func() {
			w.running[g] = slices.DeleteFunc(w.running[g], func(i instance) bool { return i.node == e })
			_ = w.ms[e].Stopped(w.now, g, a.Epoch)
		})
	case ActRestart:
		w.restarts = append(w.restarts, em)
		w.checkMajority(e)
		y := a.Node
		w.send(e, y, w.lat, func() {
			switch {
			case w.fenced[y]:
				return
			case w.refuse[y]:
				w.send(y, e, w.lat, func() { _ = w.ms[e].RestartFailed(w.now, g, a.Epoch, errors.New("refused")) })
				return
			case w.silent[y]:
				return
			}
			w.after(w.startDelay, y, func() { w.start(e, y, g, a.Epoch, a.From) })
		})
	case ActAbort:
		y := a.Node
		w.send(e, y, w.lat, func() {
			w.aborted[abortKey{g, a.Epoch, y}] = true
			w.running[g] = slices.DeleteFunc(w.running[g], func(i instance) bool { return i.node == y && i.epoch == a.Epoch })
			w.send(y, e, w.lat, func() { _ = w.ms[e].Aborted(w.now, g, a.Epoch) })
		})
	case ActAnnounce:
		for _, b := range w.ids {
			if b != e {
				p := a.Placement.clone()
				w.send(e, b, w.lat, func() { w.ms[b].Learn(w.now, p) })
			}
		}
	case ActReprotect:
		w.after(w.transferDelay, e, func() {
			src := w.data[g][e]
			if a.Checkpoint {
				src = !w.noCheckpoint && slices.ContainsFunc(w.running[g], func(i instance) bool { return i.node == e })
			}
			if !src {
				_ = w.ms[e].ReprotectFailed(w.now, g, errors.New("no data to send (the exec backend cannot checkpoint)"))
				return
			}
			var got []NodeID
			for _, q := range a.To {
				if w.reach(e, q) && !w.fenced[q] {
					w.data[g][q] = true
					got = append(got, q)
				}
			}
			_ = w.ms[e].Reprotected(w.now, g, got)
		})
	case ActRepairRing:
		w.rings = append(w.rings, em)
	case ActFailed:
		w.failed = append(w.failed, em)
	}
}

// start is the target's edge starting a group: fetch the data from
// the holder, start the processes, report the stages.
func (w *world) start(r, y NodeID, g GroupID, epoch uint64, from NodeID) {
	if w.aborted[abortKey{g, epoch, y}] || w.fenced[y] {
		return
	}
	if !w.data[g][from] || !w.reach(y, from) && y != from {
		w.send(y, r, w.lat, func() { _ = w.ms[r].RestartFailed(w.now, g, epoch, errors.New("data unavailable")) })
		return
	}
	if err := w.ms[y].Started(w.now, g, epoch); err != nil {
		w.logf("node %d: Started(%d, %d) = %v: not run", y, g, epoch, err)
		return
	}
	w.running[g] = append(w.running[g], instance{y, epoch})
	alive := func() bool {
		return slices.Contains(w.running[g], instance{y, epoch})
	}
	w.after(w.reconnectDelay, y, func() {
		if alive() {
			_ = w.ms[y].Reconnected(w.now, g, epoch)
			w.after(w.replayDelay, y, func() {
				if alive() {
					_ = w.ms[y].Live(w.now, g, epoch)
				}
			})
		}
	})
}

// --- Invariants ------------------------------------------------------------

// checkMajority: a restart is ordered only by a machine whose View holds
// a strict majority of its ring, and which really held one no longer ago
// than the View's lag (a View is never newer than that).
func (w *world) checkMajority(e NodeID) {
	w.t.Helper()
	if !w.ms[e].majority() {
		w.t.Fatalf("%v: node %d ordered a restart without a majority in its View", w.now, e)
	}
	if w.realMajority(e) {
		// It does now: the ring it counts against may have shrunk in
		// this very step (a confirmed death), after w.noMaj was taken.
		return
	}
	if since, ok := w.noMaj[e]; ok && w.now.Sub(since) > w.viewLag+w.jitter+time.Millisecond {
		w.t.Fatalf("%v: node %d ordered a restart, cut off from the majority of its ring %v since %v", w.now, e, w.ms[e].ring(), since)
	}
}

// realMajority: e reaches a strict majority of the ring it believes in.
func (w *world) realMajority(e NodeID) bool {
	ring := w.ms[e].ring()
	n := 0
	for _, id := range ring {
		if id == e || (w.reach(e, id) && !w.fenced[id]) {
			n++
		}
	}
	return 2*n > len(ring)
}

// check runs after every step.
func (w *world) check() {
	w.t.Helper()
	for _, id := range w.ids {
		switch _, ok := w.noMaj[id]; {
		case !w.up(id) || w.realMajority(id):
			delete(w.noMaj, id)
		case !ok:
			w.noMaj[id] = w.now
		}
	}
	// No group live in two places: frozen copies do not run.
	for g, is := range w.running {
		var live []instance
		for _, i := range is {
			if !w.frozen[i.node] {
				live = append(live, i)
			}
		}
		if len(live) > 1 {
			w.t.Fatalf("%v: group %d runs in two places: %v", w.now, g, live)
		}
	}
	// Fence before declare: a node that any working machine treats as
	// dead has crashed, is frozen, or has fenced itself.
	for _, id := range w.ids {
		m := w.ms[id]
		if !w.up(id) || m.Fenced() {
			continue
		}
		for _, x := range w.ids {
			if !m.alive(x) && !w.crashed[x] && !w.frozen[x] && !w.fenced[x] {
				w.t.Fatalf("%v: node %d confirmed node %d dead, but it runs unfenced", w.now, id, x)
			}
		}
	}
}

// fatal lists the fatal failures reported for g.
func (w *world) fatal(g GroupID) []emitted {
	var out []emitted
	for _, f := range w.failed {
		if f.Group == g && !errors.Is(f.Err, ErrNoProtector) && !errors.Is(f.Err, ErrUnprotected) {
			out = append(out, f)
		}
	}
	return out
}

// settled checks the end state once faults are over: every group that
// no machine reported lost runs exactly once, on a working node, live in
// the eyes of every working machine, with its data on a working node
// other than its host (unless that was reported impossible).
func (w *world) settled() {
	w.t.Helper()
	var working []NodeID
	for _, id := range w.ids {
		if w.up(id) && !w.fenced[id] {
			working = append(working, id)
		}
	}
	if len(working) == 0 {
		// No majority was left anywhere: every node fenced itself and
		// the job stopped (each Fence action says why). Nothing runs.
		for g, is := range w.running {
			if len(is) > 0 {
				w.t.Errorf("every node fenced, but group %d runs at %v", g, is)
			}
		}
		return
	}
	for _, g := range w.ms[working[0]].gids {
		if len(w.fatal(g)) > 0 {
			continue
		}
		is := w.running[g]
		if len(is) != 1 || !slices.Contains(working, is[0].node) {
			w.t.Errorf("group %d runs at %v, want once on one of %v", g, is, working)
			continue
		}
		for _, id := range working {
			p := w.ms[id].groups[g]
			if p.Host != is[0].node || p.Epoch != is[0].epoch || p.Stage != StageLive || p.rec != nil {
				w.t.Errorf("node %d sees group %d on %d epoch %d %v (recovering=%v), truth %v", id, g, p.Host, p.Epoch, p.Stage, p.rec != nil, is[0])
			}
		}
		noProt := slices.ContainsFunc(w.failed, func(f emitted) bool { return f.Group == g && errors.Is(f.Err, ErrNoProtector) })
		if noProt {
			continue
		}
		holders := w.ms[working[0]].groups[g].Holders
		if len(holders) == 0 {
			w.t.Errorf("group %d has no protector", g)
		}
		for _, h := range holders {
			if h == is[0].node || !slices.Contains(working, h) || !w.data[g][h] {
				w.t.Errorf("group %d: holder %d (host %d) is not a working node holding its data (data on %v)", g, h, is[0].node, w.data[g])
			}
		}
	}
}

func (w *world) recordsFor(g GroupID) []Record {
	var out []Record
	for _, r := range w.records {
		if r.Group == g {
			out = append(out, r)
		}
	}
	return out
}

func (w *world) hostOf(g GroupID) NodeID {
	if is := w.running[g]; len(is) == 1 {
		return is[0].node
	}
	return None
}

func (w *world) String() string {
	return fmt.Sprintf("running=%v data=%v fenced=%v", w.running, w.data, w.fenced)
}
