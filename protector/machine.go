package protector

import (
	"fmt"
	"slices"
	"time"
)

type node struct {
	id     NodeID
	spare  bool // configured spare: active only once it hosts a group
	dead   bool // confirmed dead here
	seen   bool // in the last View
	lostAt time.Time
	// Heartbeat verdicts.
	suspectAt  time.Time
	declared   bool
	declaredAt time.Time
	fenced     bool // it announced that it fenced itself
}

type group struct {
	Placement
	rec    *recovery  // this machine drives its recovery
	rep    *reprotect // this machine (the steward) is re-protecting it
	failed bool       // a fatal ActFailed was emitted: no more attempts
	noProt bool       // ErrNoProtector reported for the current host
}

type reprotect struct {
	to       []NodeID
	host     NodeID
	sentAt   time.Time
	attempts int
	failed   bool
}

// Recovery milestones, the boundaries of the phases.
const (
	mDetect = iota
	mDeclared
	mConfirmed
	mStarted
	mReconnected
	mLive
	mProtected
	numMarks
)

type recovery struct {
	cause    string
	oldHost  NodeID
	base     uint64 // epoch before the recovery
	epoch    uint64 // of the current attempt
	target   NodeID // of the current attempt; None between attempts
	sentAt   time.Time
	tried    []NodeID
	aborting bool
	stopping bool // kill-rank: waiting for Stopped
	lastErr  error
	at       [numMarks]time.Time
}

// Machine is the pure recovery core of one node's protector. It is not
// safe for concurrent use; one goroutine of the edge owns it. Every input
// takes the current time; outputs are drained with Ready.
type Machine struct {
	cfg       Config
	self      NodeID
	nodes     map[NodeID]*node
	ids       []NodeID // every node, sorted
	groups    map[GroupID]*group
	gids      []GroupID // sorted
	fenced    bool
	fencedAt  time.Time
	noMajAt   time.Time // zero while the View holds a majority
	majAt     time.Time // when the View last gained a majority
	lastTick  time.Time
	lastRing  []NodeID
	out       []Action
	records   []Record
	stats     *Stats
	tickEvery time.Duration
	// reannounce: a node came back into reach; repeat our placements.
	reannounce   bool
	lastAnnounce time.Time // of every placement written here (AnnounceEvery)
}

// New makes the machine of cfg.Self; cfg is defaulted and validated.
// Every group starts live on its launch node, its data on that node's k
// protectors (launch records are stored there before a rank starts).
func New(cfg Config, stats *Stats, now time.Time) (*Machine, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if stats == nil {
		stats = new(Stats)
	}
	m := &Machine{
		cfg: cfg, self: cfg.Self, stats: stats, lastTick: now, lastAnnounce: now, majAt: now,
		nodes: map[NodeID]*node{}, groups: map[GroupID]*group{},
		// Ticks come at least this often, so that a longer gap is a
		// stall of this node (frozen), not a quiet period.
		tickEvery: cfg.FenceTimeout / 4,
	}
	for _, id := range cfg.Nodes {
		m.nodes[id] = &node{id: id, seen: true}
	}
	for _, id := range cfg.Spares {
		m.nodes[id] = &node{id: id, spare: true, seen: true}
	}
	m.ids = slices.Sorted(func(yield func(NodeID) bool) {
		for id := range m.nodes {
			if !yield(id) {
				return
			}
		}
	})
	for _, gs := range cfg.Groups {
		g := &group{Placement: Placement{Group: gs.ID, Procs: slices.Clone(gs.Procs),
			Host: gs.Node, Stage: StageLive}}
		m.groups[gs.ID] = g
		m.gids = append(m.gids, gs.ID)
	}
	slices.Sort(m.gids)
	for _, id := range m.gids {
		g := m.groups[id]
		g.Holders = m.protectorsOf(g.Host)
	}
	m.lastRing = m.ring()
	return m, nil
}

// Config returns the defaulted configuration.
func (m *Machine) Config() Config { return m.cfg }

// Fenced reports whether this node has fenced itself.
func (m *Machine) Fenced() bool { return m.fenced }

// Ready is what the machine wants done, the recoveries it finished, and
// when to call Tick next.
type Ready struct {
	Actions  []Action
	Records  []Record
	NextTick time.Time
}

// Ready drains the pending output.
func (m *Machine) Ready() Ready {
	r := Ready{Actions: m.out, Records: m.records, NextTick: m.nextTick()}
	m.out, m.records = nil, nil
	return r
}

func (m *Machine) emit(a Action) { m.out = append(m.out, a) }

func (m *Machine) fail(g *group, ph Phase, host NodeID, err error, fatal bool) {
	m.stats.Failures.Add(1)
	e := &RecoveryError{Group: g.Group, Phase: ph, Node: host, Err: err}
	m.emit(Action{Kind: ActFailed, Group: g.Group, Phase: ph, Err: e})
	if fatal {
		g.failed = true
	}
	if r := g.rec; r != nil {
		m.finish(g, time.Time{}, e)
	}
}

// --- Views of the cluster ------------------------------------------------

func (m *Machine) alive(id NodeID) bool {
	if id == m.self {
		return !m.fenced
	}
	n := m.nodes[id]
	return n != nil && !n.dead
}

// ring is every node not confirmed dead, spares included, in id order.
func (m *Machine) ring() []NodeID {
	var r []NodeID
	for _, id := range m.ids {
		if m.alive(id) {
			r = append(r, id)
		}
	}
	return r
}

func (m *Machine) hosts(id NodeID) bool {
	for _, g := range m.groups {
		if g.Host == id {
			return true
		}
	}
	return false
}

// active nodes protect others: configured actives, and spares once they
// host a group (a promoted spare joins the protection ring, as in
// heartbeat's Protectors).
func (m *Machine) active(id NodeID) bool { return !m.nodes[id].spare || m.hosts(id) }

// protectorsOf is where the data of a group hosted on host belongs: the
// next k alive active nodes after host, in id order, wrapping.
func (m *Machine) protectorsOf(host NodeID) []NodeID {
	var act []NodeID
	for _, id := range m.ids {
		if id != host && m.alive(id) && m.active(id) {
			act = append(act, id)
		}
	}
	if len(act) == 0 {
		return nil
	}
	i, _ := slices.BinarySearch(act, host)
	var out []NodeID
	for j := 0; j < len(act) && len(out) < m.cfg.Protectors; j++ {
		out = append(out, act[(i+j)%len(act)])
	}
	return out
}

// steward returns who acts for a group: its first alive holder other than
// its host (the recoverer when the host is dead, the re-protector when a
// holder died); else its host, which still has the data when it is a
// holder itself and must take a checkpoint when it is not.
func (m *Machine) steward(g *group) (who NodeID, checkpoint bool) {
	for _, h := range g.Holders {
		if h != g.Host && m.alive(h) {
			return h, false
		}
	}
	if !m.alive(g.Host) {
		return None, false
	}
	return g.Host, !slices.Contains(g.Holders, g.Host)
}

// majority reports whether this node's View holds a strict majority of
// the ring (itself included).
func (m *Machine) majority() bool {
	ring := m.ring()
	if m.fenced {
		return false
	}
	n := 0
	for _, id := range ring {
		if id == m.self || m.nodes[id].seen {
			n++
		}
	}
	return 2*n > len(ring)
}

// --- Inputs ----------------------------------------------------------------

// advance notices a stall: a gap between inputs longer than FenceTimeout
// means this node was not running (frozen, descheduled) and may have been
// declared meanwhile, so it fences before it does anything else.
func (m *Machine) advance(now time.Time) {
	if !m.fenced && now.Sub(m.lastTick) > m.cfg.FenceTimeout {
		m.fence(now, fmt.Errorf("%w: not scheduled for %v (frozen?)", ErrFenced, now.Sub(m.lastTick)))
	}
	if now.After(m.lastTick) {
		m.lastTick = now
	}
}

// Tick advances the timers to now: fencing, confirmation, phase timeouts.
func (m *Machine) Tick(now time.Time) {
	m.advance(now)
	m.step(now)
}

// View tells the machine which nodes this node can reach now (from the
// heartbeat: heard from within its timeout). Nodes not listed are out of
// reach; the list need not include Self.
func (m *Machine) View(now time.Time, reachable []NodeID) {
	m.advance(now)
	for _, id := range m.ids {
		if id == m.self {
			continue
		}
		n := m.nodes[id]
		in := slices.Contains(reachable, id)
		if n.seen && !in {
			n.lostAt = now
		}
		if !n.seen && in && !n.dead {
			// Announcements made while it was out of reach were lost
			// to it: repeat ours (anti-entropy).
			m.reannounce = true
		}
		n.seen = in
	}
	m.step(now)
}

// Suspect records a suspicion of id: the heartbeat watchdog fired, or an
// observer escalated a safe socket's error naming id. It only starts the
// detect phase's clock; the heartbeat decides.
func (m *Machine) Suspect(now time.Time, id NodeID) {
	m.advance(now)
	if n := m.nodes[id]; n != nil && id != m.self && n.suspectAt.IsZero() && !n.dead {
		n.suspectAt = now
	}
	m.step(now)
}

// Refuted: a suspicion of id was cleared (it answered). A later failure's
// detect phase starts at its own suspicion, not this one.
func (m *Machine) Refuted(now time.Time, id NodeID) {
	m.advance(now)
	if n := m.nodes[id]; n != nil && !n.declared && !n.dead {
		n.suspectAt = time.Time{}
	}
	m.step(now)
}

// Declared is the heartbeat's verdict that id is dead. fenced says id
// announced that it fenced itself (heartbeat's CauseFenced, or
// CauseRestarted when a restarted radicd kills its job cgroup before it
// heartbeats): then its processes are known to be gone and the declare
// timeout is not waited for. Declared about Self fences at once.
func (m *Machine) Declared(now time.Time, id NodeID, fenced bool) {
	m.advance(now)
	if id == m.self {
		if !m.fenced {
			m.fence(now, fmt.Errorf("%w: the ring declared this node dead", ErrFenced))
		}
		return
	}
	if n := m.nodes[id]; n != nil && !n.dead {
		if !n.declared {
			n.declared, n.declaredAt = true, now
		}
		n.fenced = n.fenced || fenced
	}
	m.step(now)
}

// Rejoined: id, which the ring had declared dead, came back as a new
// incarnation. A radicd only does that after it fenced itself (its job
// killed) or restarted (its job cgroup killed before it heartbeats), so
// the old incarnation's processes are known to be gone: its death is
// confirmed now. Without this a node cut off for longer than its fence
// timeout but back before DeclareTimeout was seen again, never confirmed,
// and the groups its fence had killed were restarted nowhere. (A first
// join, never declared, changes nothing.)
func (m *Machine) Rejoined(now time.Time, id NodeID) {
	m.advance(now)
	if n := m.nodes[id]; n != nil && id != m.self && n.declared && !n.dead {
		n.fenced = true
	}
	m.step(now)
}

// Learn merges a placement announced by another node's machine.
func (m *Machine) Learn(now time.Time, p Placement) {
	m.advance(now)
	g := m.groups[p.Group]
	if g == nil {
		return
	}
	if p.Epoch > g.Epoch || (p.Epoch == g.Epoch && p.Stage > g.Stage) {
		g.Host, g.Epoch, g.Stage = p.Host, p.Epoch, p.Stage
		g.noProt = false
	}
	if p.HoldersVer > g.HoldersVer || (p.HoldersVer == g.HoldersVer && p.HoldersBy > g.HoldersBy && p.HoldersBy != None) {
		g.Holders, g.HoldersVer, g.HoldersBy = slices.Clone(p.Holders), p.HoldersVer, p.HoldersBy
	}
	m.step(now)
}

// Started: the edge started group at epoch on this node, as a Restart
// asked. The machine announces the new host.
func (m *Machine) Started(now time.Time, id GroupID, epoch uint64) error {
	return m.hostStage(now, id, epoch, StageStarted)
}

// Reconnected: the peers' safe sockets have resumed with the group.
func (m *Machine) Reconnected(now time.Time, id GroupID, epoch uint64) error {
	return m.hostStage(now, id, epoch, StageReconnected)
}

// Live: the group's replay is exhausted; it runs live.
func (m *Machine) Live(now time.Time, id GroupID, epoch uint64) error {
	return m.hostStage(now, id, epoch, StageLive)
}

func (m *Machine) hostStage(now time.Time, id GroupID, epoch uint64, st Stage) error {
	m.advance(now)
	defer m.step(now)
	g := m.groups[id]
	switch {
	case m.fenced:
		return fmt.Errorf("group %d: %w", id, ErrFenced)
	case g == nil:
		return fmt.Errorf("%w: unknown group %d", ErrStale, id)
	case st == StageStarted && epoch <= g.Epoch:
		return fmt.Errorf("%w: group %d started at epoch %d, already at %d", ErrStale, id, epoch, g.Epoch)
	case st != StageStarted && (g.Host != m.self || g.Epoch != epoch || st <= g.Stage):
		return fmt.Errorf("%w: group %d %v at epoch %d, here %v at %d on %d", ErrStale, id, st, epoch, g.Stage, g.Epoch, g.Host)
	}
	g.Host, g.Epoch, g.Stage = m.self, epoch, st
	g.noProt = false
	m.announce(g)
	return nil
}

// Fence: the node's heartbeat ring fenced it (it found itself out of
// contact, or stalled, for its fence timeout): the ring's peers may
// declare it dead now, so this machine must not restart what it hosts,
// least of all the processes the fence is about to kill (they would run
// here and on the node that takes their group over). It stays inert until
// radicd restarts.
func (m *Machine) Fence(now time.Time, why string) {
	m.advance(now)
	defer m.step(now)
	if !m.fenced {
		m.fence(now, fmt.Errorf("%w: %s", ErrFenced, why))
	}
}

// Exited: a process of group, hosted here, exited (kill-rank). The group
// restarts as a whole, in place: Stop, then Restart on this node.
func (m *Machine) Exited(now time.Time, id GroupID, proc ProcID) error {
	m.advance(now)
	defer m.step(now)
	g := m.groups[id]
	switch {
	case m.fenced:
		return fmt.Errorf("group %d: %w", id, ErrFenced)
	case g == nil || g.Host != m.self:
		return fmt.Errorf("%w: group %d is not hosted here", ErrStale, id)
	case g.rec != nil || g.failed:
		return nil // already being restarted (its other processes exit too)
	}
	m.stats.KillRank.Add(1)
	r := &recovery{cause: CauseProcess, oldHost: m.self, base: g.Epoch, target: None, stopping: true, sentAt: now}
	r.at[mDetect], r.at[mDeclared] = now, now
	g.rec = r
	m.emit(Action{Kind: ActStop, Group: id, Epoch: g.Epoch, Procs: slices.Clone(g.Procs)})
	return nil
}

// Stopped: after ActStop, no process of the group runs here any more.
func (m *Machine) Stopped(now time.Time, id GroupID, epoch uint64) error {
	m.advance(now)
	defer m.step(now)
	g := m.groups[id]
	if g == nil || g.rec == nil || !g.rec.stopping || g.rec.base != epoch {
		return fmt.Errorf("%w: group %d stopped at epoch %d", ErrStale, id, epoch)
	}
	g.rec.stopping = false
	g.rec.at[mConfirmed] = now
	return nil
}

// RestartFailed: the target of the Restart at epoch could not start the
// group (and will not). The next target is tried.
func (m *Machine) RestartFailed(now time.Time, id GroupID, epoch uint64, err error) error {
	m.advance(now)
	defer m.step(now)
	g := m.groups[id]
	if g == nil || g.rec == nil || g.rec.epoch != epoch || g.rec.target == None || g.Epoch >= epoch {
		return fmt.Errorf("%w: restart of group %d at epoch %d failed", ErrStale, id, epoch)
	}
	m.stats.RestartsAborted.Add(1)
	g.rec.lastErr = err
	g.rec.target, g.rec.aborting = None, false
	return nil
}

// Aborted: the target of an aborted Restart confirms it does not run it.
func (m *Machine) Aborted(now time.Time, id GroupID, epoch uint64) error {
	m.advance(now)
	defer m.step(now)
	g := m.groups[id]
	if g == nil || g.rec == nil || g.rec.epoch != epoch || !g.rec.aborting {
		return fmt.Errorf("%w: abort of group %d at epoch %d", ErrStale, id, epoch)
	}
	g.rec.target, g.rec.aborting = None, false
	return nil
}

// Reprotected: the nodes to now hold the group's critical data.
func (m *Machine) Reprotected(now time.Time, id GroupID, to []NodeID) error {
	m.advance(now)
	defer m.step(now)
	g := m.groups[id]
	if g == nil || g.rep == nil {
		return fmt.Errorf("%w: reprotection of group %d", ErrStale, id)
	}
	want := m.protectorsOf(g.Host)
	var holders []NodeID
	for _, p := range want {
		if slices.Contains(to, p) || slices.Contains(g.Holders, p) {
			holders = append(holders, p)
		}
	}
	// Keep the holders that still have data when some wanted node did
	// not get it, so the group never ends with fewer copies.
	for _, h := range g.Holders {
		if len(holders) < len(want) && m.alive(h) && !slices.Contains(holders, h) {
			holders = append(holders, h)
		}
	}
	g.rep = nil
	m.setHolders(g, holders)
	return nil
}

// ReprotectFailed: sending the group's data failed (a refused transfer,
// or a checkpoint the backend cannot take); it is retried up to
// ReprotectAttempts, then reported.
func (m *Machine) ReprotectFailed(now time.Time, id GroupID, err error) error {
	m.advance(now)
	defer m.step(now)
	g := m.groups[id]
	if g == nil || g.rep == nil {
		return fmt.Errorf("%w: reprotection of group %d", ErrStale, id)
	}
	m.repFailed(g, now, err)
	return nil
}

func (m *Machine) repFailed(g *group, now time.Time, err error) {
	if g.rep.attempts >= m.cfg.ReprotectAttempts {
		g.rep.failed = true
		m.fail(g, PhaseReprotect, g.Host, fmt.Errorf("%w after %d attempts: %w", ErrUnprotected, g.rep.attempts, err), false)
		return
	}
	m.sendReprotect(g, now, g.rep.to, g.rep.attempts)
}

// --- The core --------------------------------------------------------------

func (m *Machine) step(now time.Time) {
	if m.fenced {
		return
	}
	maj := m.majority()
	m.checkFence(now, maj)
	if m.fenced {
		return
	}
	m.confirm(now, maj)
	m.reconcile(now, maj)
	if m.reannounce || now.Sub(m.lastAnnounce) >= m.cfg.AnnounceEvery {
		m.reannounce, m.lastAnnounce = false, now
		for _, id := range m.gids {
			g := m.groups[id]
			if st, _ := m.steward(g); g.Host == m.self || st == m.self {
				m.announce(g)
			}
		}
	}
}

// checkFence: a node whose View has lacked a strict majority of the ring
// for FenceTimeout fences itself. The majority confirms it dead only
// DeclareTimeout >= FenceTimeout + FenceMargin after losing it, so by then
// its processes are gone.
func (m *Machine) checkFence(now time.Time, maj bool) {
	if maj {
		if !m.noMajAt.IsZero() {
			m.noMajAt, m.majAt = time.Time{}, now
		}
		return
	}
	if m.noMajAt.IsZero() {
		m.noMajAt = now
	}
	if now.Sub(m.noMajAt) >= m.cfg.FenceTimeout {
		m.fence(now, fmt.Errorf("%w: no majority of the ring reachable for %v", ErrFenced, now.Sub(m.noMajAt)))
	}
}

func (m *Machine) fence(now time.Time, why error) {
	m.fenced, m.fencedAt = true, now
	m.stats.Fences.Add(1)
	var hosted []GroupID
	for _, id := range m.gids {
		if m.groups[id].Host == m.self {
			hosted = append(hosted, id)
		}
	}
	m.emit(Action{Kind: ActFence, Node: m.self, Groups: hosted, Err: why})
	for _, id := range m.gids {
		if g := m.groups[id]; g.rec != nil {
			m.finish(g, now, &RecoveryError{Group: id, Phase: m.phaseOf(g.rec), Node: g.rec.oldHost, Err: why})
		}
		m.groups[id].rep = nil
	}
}

// confirm turns a heartbeat declaration into a death this machine acts
// on: only with a majority, and only once the node's processes are known
// to be gone: it announced its fence, or it has been out of reach here
// for DeclareTimeout, longer than it may run without a majority.
func (m *Machine) confirm(now time.Time, maj bool) {
	if !maj {
		return
	}
	changed := false
	for _, id := range m.ids {
		n := m.nodes[id]
		if id == m.self || n.dead || !n.declared {
			continue
		}
		if n.fenced || (!n.seen && now.Sub(m.absentSince(n)) >= m.cfg.DeclareTimeout) {
			n.dead = true
			changed = true
			m.stats.Confirmed.Add(1)
		}
	}
	if !changed {
		return
	}
	ring := m.ring()
	if !slices.Equal(ring, m.lastRing) {
		m.lastRing = ring
		pred, succ := neighbours(ring, m.self)
		m.emit(Action{Kind: ActRepairRing, Ring: slices.Clone(ring), Pred: pred, Succ: succ})
	}
}

// absentSince is when n's absence from this node's View started to mean
// something: its absence counts only while this View holds a majority.
// A node that was itself cut off for less than FenceTimeout (so it did not
// fence) missed its peers for reasons on its own side; n kept its majority
// meanwhile and has had no cause to fence.
func (m *Machine) absentSince(n *node) time.Time {
	if n.lostAt.Before(m.majAt) {
		return m.majAt
	}
	return n.lostAt
}

func neighbours(ring []NodeID, self NodeID) (pred, succ NodeID) {
	i := slices.Index(ring, self)
	if i < 0 || len(ring) < 2 {
		return None, None
	}
	return ring[(i-1+len(ring))%len(ring)], ring[(i+1)%len(ring)]
}

// detectStart is when this node first saw signs of n's death: its
// suspicion (unless refuted), its current absence from the View (not an
// earlier one that healed), or the declaration.
func (m *Machine) detectStart(n *node) time.Time {
	t := n.declaredAt
	lost := n.lostAt
	if n.seen {
		lost = time.Time{}
	}
	for _, c := range []time.Time{n.suspectAt, lost} {
		if !c.IsZero() && c.Before(t) {
			t = c
		}
	}
	return t
}

// reconcile compares every group with what it should be and acts where
// this machine is the one to act: it restarts groups whose host died when
// it is their recoverer, and re-protects groups it is the steward of.
func (m *Machine) reconcile(now time.Time, maj bool) {
	for _, id := range m.gids {
		g := m.groups[id]
		if g.failed {
			continue
		}
		if g.rec != nil {
			m.drive(g, now, maj)
			if g.failed {
				continue
			}
		}
		st, _ := m.steward(g)
		if !m.alive(g.Host) {
			if g.rec != nil {
				continue
			}
			switch {
			case st == None && maj:
				m.fail(g, PhaseConfirm, g.Host, ErrDataLost, true)
			case st == m.self && maj:
				m.startRecovery(g, now)
				m.drive(g, now, maj)
			}
			continue
		}
		if st == m.self && maj && (g.rec == nil || g.rec.at[mStarted] != (time.Time{})) {
			m.reprotectCheck(g, now)
		}
	}
}

func (m *Machine) startRecovery(g *group, now time.Time) {
	dead := m.nodes[g.Host]
	r := &recovery{cause: CauseNode, oldHost: g.Host, base: g.Epoch, target: None}
	r.at[mDetect] = m.detectStart(dead)
	r.at[mDeclared] = dead.declaredAt
	r.at[mConfirmed] = now
	g.rec = r
	g.rep = nil
}

// candidates lists the restart targets in order of preference. For a
// dead node: the free spares, then this (the protector's) node. A free
// spare is the lowest alive spare in reach that hosts nothing and is
// not the target of another restart driven here; lowest first, as the
// heartbeat promotes spares, so that a holder taking over a recovery from
// a dead recoverer picks the same spare (whose edge refuses a second copy).
// For kill-rank: this node first (it is healthy), then the free spares.
func (m *Machine) candidates(g *group) []NodeID {
	var out []NodeID
	if g.rec.cause == CauseProcess {
		out = append(out, m.self) // in place: the node is healthy
	}
	for _, id := range m.ids {
		n := m.nodes[id]
		if !n.spare || id == m.self || !m.alive(id) || !n.seen || m.hosts(id) {
			continue
		}
		busy := false
		for _, o := range m.groups {
			if o != g && o.rec != nil && o.rec.target == id {
				busy = true
			}
		}
		if !busy {
			out = append(out, id)
		}
	}
	if g.rec.cause == CauseNode {
		out = append(out, m.self) // no free spare: the protector's own node
	}
	return out
}

// drive advances a recovery this machine runs.
func (m *Machine) drive(g *group, now time.Time, maj bool) {
	r := g.rec
	switch {
	case r.stopping:
		if now.Sub(r.sentAt) >= m.cfg.RestartTimeout {
			m.fail(g, PhaseConfirm, m.self, fmt.Errorf("%w: the group's other processes did not stop", ErrTimeout), true)
		}
		return
	case r.at[mStarted].IsZero():
		// An attempt being aborted counts only once the target said it
		// does not run it (Aborted): until then its start is no start.
		if g.Epoch == r.epoch && r.target != None && g.Host == r.target && !r.aborting {
			r.at[mStarted] = now
			break
		}
		m.restartStep(g, now, maj)
		return
	}
	if g.Epoch > r.epoch {
		// The group crashed again on its new host and was restarted
		// there (kill-rank): follow the later epoch.
		r.epoch, r.target = g.Epoch, g.Host
	}
	if !m.alive(g.Host) {
		// The new host died too. Its recovery starts afresh (reconcile).
		m.finish(g, now, &RecoveryError{Group: g.Group, Phase: m.phaseOf(r), Node: g.Host, Err: ErrHostDied})
		return
	}
	if g.Stage >= StageReconnected && r.at[mReconnected].IsZero() {
		r.at[mReconnected] = now
	}
	if g.Stage >= StageLive && r.at[mLive].IsZero() {
		r.at[mLive] = now
	}
	switch {
	case r.at[mReconnected].IsZero() && now.Sub(r.at[mStarted]) >= m.cfg.ReconnectTimeout:
		m.fail(g, PhaseReconnect, g.Host, ErrTimeout, true)
		return
	case r.at[mLive].IsZero() && !r.at[mReconnected].IsZero() && now.Sub(r.at[mReconnected]) >= m.cfg.ReplayTimeout:
		m.fail(g, PhaseReplay, g.Host, ErrTimeout, true)
		return
	}
	if r.at[mProtected].IsZero() && (m.protected(g) || g.noProt) {
		r.at[mProtected] = now
	}
	if !r.at[mLive].IsZero() && !r.at[mProtected].IsZero() {
		var err error
		if g.noProt {
			err = &RecoveryError{Group: g.Group, Phase: PhaseReprotect, Node: g.Host, Err: ErrNoProtector}
		}
		m.finish(g, now, err)
	}
}

// restartStep handles the restart phase: wait for the current target,
// abort it on timeout, fall back to the next one.
func (m *Machine) restartStep(g *group, now time.Time, maj bool) {
	r := g.rec
	if r.target != None {
		tn := m.nodes[r.target]
		if r.target == m.self {
			tn = &node{seen: true}
		}
		switch {
		case r.target != m.self && tn.dead:
			// The target died: whatever it started died with it.
			m.stats.RestartsAborted.Add(1)
			r.target, r.aborting = None, false
		case r.aborting && tn.seen && now.Sub(r.sentAt) >= m.cfg.RestartTimeout:
			// In reach yet silent: we cannot know it does not run the
			// group. (Out of reach, it will be confirmed dead or answer.)
			m.fail(g, PhaseRestart, r.target, fmt.Errorf("%w: restart at epoch %d on node %d neither started nor aborted", ErrTimeout, r.epoch, r.target), true)
			return
		case !r.aborting && now.Sub(r.sentAt) >= m.cfg.RestartTimeout:
			// It may still start: it must not, and must say so before
			// another node may run the group.
			m.stats.RestartsAborted.Add(1)
			r.aborting, r.sentAt = true, now
			r.lastErr = fmt.Errorf("%w: node %d did not start it within %v", ErrTimeout, r.target, m.cfg.RestartTimeout)
			m.emit(Action{Kind: ActAbort, Group: g.Group, Epoch: r.epoch, Node: r.target})
			return
		default:
			return
		}
	}
	if !maj {
		return // restarts happen only in a majority; we shall fence or regain it
	}
	var next NodeID = None
	for _, c := range m.candidates(g) {
		if !slices.Contains(r.tried, c) {
			next = c
			break
		}
	}
	if next == None {
		err := ErrNoTarget
		if r.lastErr != nil {
			err = fmt.Errorf("%w (tried %v; last: %w)", ErrNoTarget, r.tried, r.lastErr)
		}
		m.fail(g, PhaseRestart, r.oldHost, err, true)
		return
	}
	from := m.self
	if r.cause == CauseProcess {
		from, _ = m.steward(g)
		if from == m.self && !slices.Contains(g.Holders, m.self) {
			m.fail(g, PhaseRestart, m.self, ErrDataLost, true)
			return
		}
	}
	r.tried = append(r.tried, next)
	// Each attempt has its own epoch, so that a late start of an
	// aborted attempt is recognised as stale everywhere.
	r.epoch = r.base + uint64(len(r.tried))
	r.target, r.sentAt = next, now
	m.stats.Restarts.Add(1)
	m.emit(Action{Kind: ActRestart, Group: g.Group, Epoch: r.epoch, Node: next, From: from, Procs: slices.Clone(g.Procs)})
}

// protected: the group's data is on all the protectors its host should
// have (none of them the host itself).
func (m *Machine) protected(g *group) bool {
	want := m.protectorsOf(g.Host)
	if len(want) == 0 {
		return false
	}
	for _, p := range want {
		if !slices.Contains(g.Holders, p) {
			return false
		}
	}
	return true
}

// reprotectCheck makes the steward send the group's data where it lacks.
func (m *Machine) reprotectCheck(g *group, now time.Time) {
	want := m.protectorsOf(g.Host)
	if len(want) == 0 {
		if !g.noProt {
			g.noProt = true
			m.fail(g, PhaseReprotect, g.Host, ErrNoProtector, false)
		}
		return
	}
	g.noProt = false
	var missing []NodeID
	for _, p := range want {
		if !slices.Contains(g.Holders, p) {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		g.rep = nil
		if !slices.Equal(g.Holders, want) {
			// Drop holders that are dead or no longer protectors.
			m.setHolders(g, want)
		}
		return
	}
	if rep := g.rep; rep != nil && slices.Equal(rep.to, missing) && rep.host == g.Host {
		if !rep.failed && now.Sub(rep.sentAt) >= m.cfg.ReprotectTimeout {
			m.repFailed(g, now, fmt.Errorf("%w: no answer within %v", ErrTimeout, m.cfg.ReprotectTimeout))
		}
		return
	}
	m.sendReprotect(g, now, missing, 0)
}

func (m *Machine) sendReprotect(g *group, now time.Time, to []NodeID, attempts int) {
	_, ckpt := m.steward(g)
	g.rep = &reprotect{to: slices.Clone(to), host: g.Host, sentAt: now, attempts: attempts + 1}
	m.stats.Reprotects.Add(1)
	m.emit(Action{Kind: ActReprotect, Group: g.Group, Epoch: g.Epoch, From: m.self, To: slices.Clone(to), Checkpoint: ckpt})
}

func (m *Machine) setHolders(g *group, holders []NodeID) {
	g.Holders = slices.Clone(holders)
	g.HoldersVer++
	g.HoldersBy = m.self
	m.announce(g)
}

func (m *Machine) announce(g *group) {
	m.emit(Action{Kind: ActAnnounce, Group: g.Group, Epoch: g.Epoch, Placement: g.Placement.clone()})
}

func (m *Machine) phaseOf(r *recovery) Phase {
	switch {
	case r.stopping || r.at[mConfirmed].IsZero():
		return PhaseConfirm
	case r.at[mStarted].IsZero():
		return PhaseRestart
	case r.at[mReconnected].IsZero():
		return PhaseReconnect
	case r.at[mLive].IsZero():
		return PhaseReplay
	}
	return PhaseReprotect
}

// finish closes the recovery of g with its record; end zero means now is
// the last input's time.
func (m *Machine) finish(g *group, end time.Time, err error) {
	r := g.rec
	g.rec = nil
	if end.IsZero() {
		end = m.lastTick
	}
	rec := Record{Group: g.Group, Cause: r.cause, From: r.oldHost, To: r.target, Epoch: r.epoch,
		Start: r.at[mDetect], End: end, Attempts: len(r.tried), Err: err}
	rec.Total = end.Sub(rec.Start)
	span := func(a, b int) time.Duration {
		if r.at[a].IsZero() || r.at[b].IsZero() {
			return 0
		}
		return r.at[b].Sub(r.at[a])
	}
	rec.Phases[PhaseDetect] = span(mDetect, mDeclared)
	rec.Phases[PhaseConfirm] = span(mDeclared, mConfirmed)
	rec.Phases[PhaseRestart] = span(mConfirmed, mStarted)
	rec.Phases[PhaseReconnect] = span(mStarted, mReconnected)
	rec.Phases[PhaseReplay] = span(mReconnected, mLive)
	rec.Phases[PhaseReprotect] = span(mStarted, mProtected)
	if err == nil {
		m.stats.Recoveries.Add(1)
	}
	m.records = append(m.records, rec)
}

func (m *Machine) nextTick() time.Time {
	next := m.lastTick.Add(m.tickEvery)
	at := func(t time.Time) {
		if !t.IsZero() && t.Before(next) {
			next = t
		}
	}
	if m.fenced {
		return m.lastTick.Add(time.Hour)
	}
	if !m.noMajAt.IsZero() {
		at(m.noMajAt.Add(m.cfg.FenceTimeout))
	}
	at(m.lastAnnounce.Add(m.cfg.AnnounceEvery))
	for _, n := range m.nodes {
		if n.declared && !n.dead && !n.seen {
			at(m.absentSince(n).Add(m.cfg.DeclareTimeout))
		}
	}
	for _, g := range m.groups {
		if r := g.rec; r != nil {
			switch {
			case r.stopping || (r.target != None && r.at[mStarted].IsZero()):
				at(r.sentAt.Add(m.cfg.RestartTimeout))
			case !r.at[mStarted].IsZero() && r.at[mReconnected].IsZero():
				at(r.at[mStarted].Add(m.cfg.ReconnectTimeout))
			case !r.at[mReconnected].IsZero() && r.at[mLive].IsZero():
				at(r.at[mReconnected].Add(m.cfg.ReplayTimeout))
			}
		}
		if p := g.rep; p != nil && !p.failed {
			at(p.sentAt.Add(m.cfg.ReprotectTimeout))
		}
	}
	if !next.After(m.lastTick) {
		next = m.lastTick.Add(time.Millisecond)
	}
	return next
}
