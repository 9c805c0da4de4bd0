package radicd

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/radic-project/radic/internal/launch"
	"github.com/radic-project/radic/protector"
)

// Recovery progress, for `radic status` and `radic run`. Only the
// recoverer's machine knows a recovery's phases, and only the new host
// knows how far its replay has come; both push what they know to every
// daemon, so that any live radicd can show every recovery under way:
//
//	POST /v1/recovery/progress    progressReport: the recoverer's recoveries under way (replaces its previous report)
//	POST /v1/recovery/replay      replayReport: replay progress of a restarted group, from its new host
//	POST /v1/recovery/divergence  launch.Divergence: radic run saw a restarted rank's output differ
//
// A recoverer repeats its report every progressEvery while it drives a
// recovery, and once more when it drives none; a report not renewed
// within progressStale (its recoverer died or is cut off: another
// protector takes the group over) is no longer shown.

const (
	progressEvery = time.Second
	progressStale = 5 * time.Second
	replayEvery   = 500 * time.Millisecond // between replay reports of one group
	replayKeep    = 10 * time.Minute       // a replay report's life after its last update
	recentEvents  = 10                     // finished recoveries in a status
)

type progressReport struct {
	By int `json:"by"`
	// At orders one recoverer's reports (pushes may overtake each other).
	At   time.Time                 `json:"at"`
	List []launch.RecoveryProgress `json:"list"`
}

type replayReport struct {
	Group int    `json:"group"`
	Epoch uint64 `json:"epoch"`
	Node  int    `json:"node"`
	Bytes uint64 `json:"bytes"`
	Total uint64 `json:"total"` // 0: not known
	Done  bool   `json:"done"`
}

type groupEpoch struct {
	group int
	epoch uint64
}

// progressBook is every daemon's view of the recoveries under way.
type progressBook struct {
	mu sync.Mutex
	// +checklocks:mu
	reports map[int]progressReport // by recoverer
	// +checklocks:mu
	heard map[int]time.Time // when each recoverer's report arrived (local clock)
	// +checklocks:mu
	replay map[groupEpoch]replayReport
	// +checklocks:mu
	replayAt map[groupEpoch]time.Time // last update (local clock)
	// +checklocks:mu
	replayPushed map[groupEpoch]time.Time
	// The recoverer's side (this node's machine).
	// +checklocks:mu
	mine []launch.RecoveryProgress
	// +checklocks:mu
	minePushed time.Time
}

func newProgressBook() *progressBook {
	return &progressBook{reports: map[int]progressReport{}, heard: map[int]time.Time{},
		replay: map[groupEpoch]replayReport{}, replayAt: map[groupEpoch]time.Time{}, replayPushed: map[groupEpoch]time.Time{}}
}

// progressOf converts the machine's view for the wire.
func progressOf(by int, ps []protector.Progress, now time.Time) []launch.RecoveryProgress {
	out := make([]launch.RecoveryProgress, 0, len(ps))
	for _, p := range ps {
		to := int(p.To)
		if p.To == protector.None {
			to = -1
		}
		out = append(out, launch.RecoveryProgress{Group: int(p.Group), Cause: p.Cause, From: int(p.From), To: to,
			Epoch: p.Epoch, Phase: p.Phase.String(), Start: p.Start, Since: p.Since, Attempts: p.Attempts, By: by, Updated: now})
	}
	return out
}

// sameProgress compares two reports but for their Updated times.
func sameProgress(a, b []launch.RecoveryProgress) bool {
	return slices.EqualFunc(a, b, func(x, y launch.RecoveryProgress) bool {
		x.Updated, y.Updated = time.Time{}, time.Time{}
		x.Replayed, y.Replayed = nil, nil
		return x == y
	})
}

// publishProgress is called by the recovery goroutine after every step
// with the machine's recoveries: it keeps them and pushes them to every
// daemon when they changed, and every progressEvery while there are any.
func (d *Daemon) publishProgress(ps []protector.Progress, now time.Time) {
	b := d.prog
	list := progressOf(d.cfg.Node, ps, now)
	b.mu.Lock()
	changed := !sameProgress(list, b.mine)
	due := len(list) > 0 && now.Sub(b.minePushed) >= progressEvery
	if !changed && !due {
		b.mu.Unlock()
		return
	}
	b.mine, b.minePushed = list, now
	rep := progressReport{By: d.cfg.Node, At: now, List: list}
	b.reports[d.cfg.Node], b.heard[d.cfg.Node] = rep, now
	b.mu.Unlock()
	go d.pushAll("/v1/recovery/progress", rep)
}

// noteReplay is the replay step's progress hook, on the new host of a
// restarted group: n more bytes of the group's log were replayed at epoch
// (total: the log's size to replay, 0 when not known; done: the replay is
// over, the group runs live). It counts radic_replay_bytes_total and
// reports the progress to every daemon (at most every replayEvery, and at
// the end), where `radic status` shows it and the recovery's event in
// `radic run` says how much was replayed. Safe from any goroutine.
func (d *Daemon) noteReplay(group int, epoch uint64, n, total uint64, done bool) {
	d.recMetrics.replayBytes.Add(float64(n))
	b := d.prog
	k := groupEpoch{group, epoch}
	now := time.Now()
	b.mu.Lock()
	r := b.replay[k]
	r.Group, r.Epoch, r.Node = group, epoch, d.cfg.Node
	r.Bytes += n
	if total > 0 {
		r.Total = total
	}
	r.Done = r.Done || done
	b.replay[k], b.replayAt[k] = r, now
	push := done || now.Sub(b.replayPushed[k]) >= replayEvery
	if push {
		b.replayPushed[k] = now
	}
	b.gcLocked(now)
	b.mu.Unlock()
	if push {
		go d.pushAll("/v1/recovery/replay", r)
	}
}

// +checklocks:b.mu
func (b *progressBook) gcLocked(now time.Time) {
	for k, at := range b.replayAt {
		if now.Sub(at) > replayKeep {
			delete(b.replay, k)
			delete(b.replayAt, k)
			delete(b.replayPushed, k)
		}
	}
}

// learn keeps a recoverer's report unless a later one is there already
// (and not stale: a restarted radicd's clock may be behind).
func (b *progressBook) learn(rep progressReport, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.reports[rep.By]; ok && rep.At.Before(old.At) && now.Sub(b.heard[rep.By]) <= progressStale {
		return
	}
	b.reports[rep.By], b.heard[rep.By] = rep, now
}

// learnReplay keeps a new host's replay report (pushed, or with its
// machine's announcement of the stage) unless a fuller one is there.
func (b *progressBook) learnReplay(rep replayReport, now time.Time) {
	k := groupEpoch{rep.Group, rep.Epoch}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.replay[k]; !ok || rep.Bytes >= old.Bytes {
		b.replay[k], b.replayAt[k] = rep, now
	}
	b.gcLocked(now)
}

// replayReportOf is this daemon's replay report of group at epoch, if any.
func (b *progressBook) replayReportOf(group int, epoch uint64) *replayReport {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.replay[groupEpoch{group, epoch}]
	if !ok {
		return nil
	}
	return &r
}

// replayed is how many bytes group replayed at epoch, if it was reported.
func (b *progressBook) replayed(group int, epoch uint64) *uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.replay[groupEpoch{group, epoch}]
	if !ok {
		return nil
	}
	n := r.Bytes
	return &n
}

// status is the recoveries under way as this daemon knows them (the
// newest report of each group), with their replay progress.
func (b *progressBook) status(now time.Time) []launch.RecoveryProgress {
	b.mu.Lock()
	defer b.mu.Unlock()
	byGroup := map[int]launch.RecoveryProgress{}
	for by, rep := range b.reports {
		if now.Sub(b.heard[by]) > progressStale {
			continue
		}
		for _, p := range rep.List {
			if old, ok := byGroup[p.Group]; ok && !p.Updated.After(old.Updated) {
				continue
			}
			if r, ok := b.replay[groupEpoch{p.Group, p.Epoch}]; ok {
				n := r.Bytes
				p.Replayed, p.ReplayTotal = &n, r.Total
			}
			byGroup[p.Group] = p
		}
	}
	out := make([]launch.RecoveryProgress, 0, len(byGroup))
	for _, p := range byGroup {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b launch.RecoveryProgress) int { return a.Group - b.Group })
	return out
}

// recoveryStatus is this daemon's part of /status.
func (d *Daemon) recoveryStatus(now time.Time) *launch.RecoveryStatus {
	rs := &launch.RecoveryStatus{InProgress: d.prog.status(now)}
	d.dir.mu.Lock()
	evs := d.dir.events[max(len(d.dir.events)-recentEvents, 0):]
	rs.Recent = slices.Clone(evs)
	d.dir.mu.Unlock()
	if rs.Recent == nil {
		rs.Recent = []launch.RecoveryEvent{}
	}
	return rs
}

// eventOf is a finished recovery as radic run and radic status show it.
// fatal says whether the machine reported the failure with ActFailed (the
// job must stop); a failed Record without one (its new host died: the
// recovery starts afresh) and a group left unprotected are warnings.
func eventOf(r protector.Record, fatal bool, replayed *uint64) RecoveryEvent {
	ev := RecoveryEvent{Group: int(r.Group), Cause: r.Cause, From: int(r.From), To: int(r.To), Epoch: r.Epoch,
		Start: r.Start, Seconds: r.Total.Seconds(), Replayed: replayed}
	if r.To == protector.None {
		ev.To = -1
	}
	for ph, d := range r.Phases {
		if d > 0 {
			if ev.Phases == nil {
				ev.Phases = map[string]float64{}
			}
			ev.Phases[protector.Phase(ph).String()] = d.Seconds()
		}
	}
	if r.Err == nil {
		return ev
	}
	// The event names the group and phase; the text is the reason.
	why := r.Err.Error()
	var re *protector.RecoveryError
	if errors.As(r.Err, &re) {
		ev.Phase, why = re.Phase.String(), re.Err.Error()
	}
	switch {
	case errors.Is(r.Err, protector.ErrNoProtector) || errors.Is(r.Err, protector.ErrUnprotected):
		ev.Warning = why
	case fatal:
		ev.Error = why
	default:
		ev.Warning = why + "; the recovery starts again"
	}
	return ev
}

// noteReady looks at a Ready before its actions run: which groups failed
// (e.fatal, for record), and the events of failures that end no recovery
// driven here (they have no Record).
func (e *recoveryEdge) noteReady(rd protector.Ready, now time.Time) {
	e.fatal = map[protector.GroupID]bool{}
	for _, a := range rd.Actions {
		if a.Kind != protector.ActFailed {
			continue
		}
		e.fatal[a.Group] = true
		recorded := slices.ContainsFunc(rd.Records, func(r protector.Record) bool { return r.Group == a.Group })
		if !recorded && !errors.Is(a.Err, protector.ErrUnprotected) && !errors.Is(a.Err, protector.ErrNoProtector) {
			e.publishEvent(failedEvent(a, now))
		}
	}
}

// failedEvent is an ActFailed that ended no recovery this machine drove
// (no Record): the group's data was lost before its recovery began.
func failedEvent(a protector.Action, now time.Time) RecoveryEvent {
	ev := RecoveryEvent{Group: int(a.Group), Phase: a.Phase.String(), Error: a.Err.Error(), Start: now, From: -1, To: -1}
	var re *protector.RecoveryError
	if errors.As(a.Err, &re) {
		ev.Error = re.Err.Error()
		if re.Node != protector.None {
			ev.From = int(re.Node)
		}
	}
	return ev
}

func (d *Daemon) progressRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/recovery/progress", func(w http.ResponseWriter, r *http.Request) {
		var rep progressReport
		if !decodeJSON(w, r, &rep) {
			return
		}
		d.prog.learn(rep, time.Now())
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/recovery/replay", func(w http.ResponseWriter, r *http.Request) {
		var rep replayReport
		if !decodeJSON(w, r, &rep) {
			return
		}
		d.prog.learnReplay(rep, time.Now())
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/recovery/divergence", func(w http.ResponseWriter, r *http.Request) {
		var dv launch.Divergence
		if !decodeJSON(w, r, &dv) {
			return
		}
		where := DivergedOutput
		if dv.Where == DivergedConnection {
			where = DivergedConnection
		}
		d.noteDivergence(where, fmt.Errorf("job %s rank %d: %s", dv.Job, dv.Rank, dv.Error))
		w.WriteHeader(http.StatusNoContent)
	})
}
