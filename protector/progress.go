package protector

import "time"

// Progress is a recovery this machine drives, as it stands: for `radic
// status` and the edge's progress reports. It is a copy; the machine keeps
// no reference to it.
type Progress struct {
	Group    GroupID
	Cause    string // CauseNode, CauseProcess
	From     NodeID // the old host
	To       NodeID // the current restart target; None between attempts
	Epoch    uint64 // of the current attempt
	Phase    Phase  // the phase it is in now
	Start    time.Time
	Since    time.Time // when the current phase began
	Attempts int       // restart targets tried so far
}

// Recoveries lists the recoveries this machine drives, by group, and
// those it will drive once their host's death is confirmed (declared by
// the heartbeat, waiting for its fence: PhaseConfirm, To None). Only the
// recoverer knows a recovery's phases; other machines see its placement.
func (m *Machine) Recoveries() []Progress {
	var out []Progress
	for _, id := range m.gids {
		g := m.groups[id]
		r := g.rec
		if r == nil {
			n := m.nodes[g.Host]
			if g.failed || g.Host == m.self || n == nil || !n.declared || n.dead || m.fenced {
				continue
			}
			if who, _ := m.steward(g); who != m.self {
				continue
			}
			out = append(out, Progress{Group: id, Cause: CauseNode, From: g.Host, To: None, Epoch: g.Epoch,
				Phase: PhaseConfirm, Start: m.detectStart(n), Since: n.declaredAt})
			continue
		}
		p := Progress{Group: id, Cause: r.cause, From: r.oldHost, To: r.target, Epoch: r.epoch,
			Phase: m.phaseOf(r), Start: r.at[mDetect], Attempts: len(r.tried)}
		p.Since = r.at[phaseStartMark[p.Phase]]
		if p.Since.IsZero() {
			p.Since = p.Start
		}
		out = append(out, p)
	}
	return out
}

// phaseStartMark is the milestone each phase (as phaseOf reports it)
// starts at. Reprotect runs from Started; phaseOf reports it only once
// the group is live, so it is shown from then.
var phaseStartMark = [NumPhases]int{
	PhaseDetect:    mDetect,
	PhaseConfirm:   mDeclared,
	PhaseRestart:   mConfirmed,
	PhaseReconnect: mStarted,
	PhaseReplay:    mReconnected,
	PhaseReprotect: mLive,
}
