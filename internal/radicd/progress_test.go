package radicd

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/internal/launch"
	"github.com/radic-project/radic/msglog"
	"github.com/radic-project/radic/protector"
)

var t0 = time.Date(2026, 12, 4, 12, 1, 3, 120e6, time.UTC)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// TestRecoveryMetricsObserve: every Record counts once by cause and
// result; only successful ones feed radic_recovery_seconds; every phase
// a recovery completed feeds its histogram.
func TestRecoveryMetricsObserve(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newRecoveryMetrics(reg)
	ok := protector.Record{Group: 2, Cause: protector.CauseNode, From: 2, To: 4, Total: ms(840)}
	ok.Phases[protector.PhaseDetect] = ms(400)
	ok.Phases[protector.PhaseRestart] = ms(200)
	ok.Phases[protector.PhaseReplay] = ms(100)
	failed := protector.Record{Group: 1, Cause: protector.CauseProcess, From: 1, To: 1, Total: ms(5000),
		Err: &protector.RecoveryError{Group: 1, Phase: protector.PhaseRestart, Node: 1, Err: protector.ErrTimeout}}
	failed.Phases[protector.PhaseConfirm] = ms(30)
	m.observe(ok)
	m.observe(ok)
	m.observe(failed)
	for _, c := range []struct {
		cause, result string
		want          float64
	}{
		{"node", "ok", 2}, {"node", "failed", 0}, {"process", "ok", 0}, {"process", "failed", 1},
	} {
		if got := value(t, m.total.WithLabelValues(c.cause, c.result)); got != c.want {
			t.Errorf("radic_recoveries_total{cause=%q,result=%q} = %v, want %v", c.cause, c.result, got, c.want)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range mfs {
		for _, mm := range mf.GetMetric() {
			if h := mm.GetHistogram(); h != nil {
				key := mf.GetName()
				for _, l := range mm.GetLabel() {
					key += "/" + l.GetValue()
				}
				counts[key] = h.GetSampleCount()
			}
		}
	}
	want := map[string]uint64{
		"radic_recovery_seconds":                 2,
		"radic_recovery_phase_seconds/detect":    2,
		"radic_recovery_phase_seconds/confirm":   1,
		"radic_recovery_phase_seconds/restart":   2,
		"radic_recovery_phase_seconds/reconnect": 0,
		"radic_recovery_phase_seconds/replay":    2,
		"radic_recovery_phase_seconds/reprotect": 0,
	}
	if d := cmp.Diff(want, counts); d != "" {
		t.Errorf("histogram sample counts (-want +got):\n%s", d)
	}
	// The series exist before the first recovery (for rates and alerts).
	if n := len(collect(t, newRecoveryMetrics(prometheus.NewRegistry()).divergences)); n != 2 {
		t.Errorf("radic_divergences_total has %d series before any divergence, want 2", n)
	}
}

func TestEventOf(t *testing.T) {
	n := uint64(38 << 20)
	base := protector.Record{Group: 2, Cause: protector.CauseNode, From: 2, To: 4, Epoch: 1, Start: t0, Total: ms(840)}
	phased := base
	phased.Phases[protector.PhaseDetect], phased.Phases[protector.PhaseReplay] = ms(300), ms(40)
	withErr := func(ph protector.Phase, err error) protector.Record {
		r := base
		r.Err = &protector.RecoveryError{Group: 2, Phase: ph, Node: 4, Err: err}
		return r
	}
	cases := []struct {
		name     string
		r        protector.Record
		fatal    bool
		replayed *uint64
		want     launch.RecoveryEvent
	}{
		{"ok", base, false, &n, launch.RecoveryEvent{Group: 2, Cause: "node", From: 2, To: 4, Epoch: 1, Start: t0, Seconds: 0.84, Replayed: &n}},
		{"phases", phased, false, nil, launch.RecoveryEvent{Group: 2, Cause: "node", From: 2, To: 4, Epoch: 1, Start: t0, Seconds: 0.84,
			Phases: map[string]float64{"detect": 0.3, "replay": 0.04}}},
		{"failed", withErr(protector.PhaseRestart, protector.ErrNoTarget), true, nil, launch.RecoveryEvent{Group: 2, Cause: "node", From: 2, To: 4, Epoch: 1, Start: t0, Seconds: 0.84,
			Phase: "restart", Error: "protector: no node to restart on"}},
		{"unprotected", withErr(protector.PhaseReprotect, protector.ErrNoProtector), true, nil, launch.RecoveryEvent{Group: 2, Cause: "node", From: 2, To: 4, Epoch: 1, Start: t0, Seconds: 0.84,
			Phase: "reprotect", Warning: "protector: no other active node left to protect the group"}},
		{"new host died", withErr(protector.PhaseReplay, protector.ErrHostDied), false, nil, launch.RecoveryEvent{Group: 2, Cause: "node", From: 2, To: 4, Epoch: 1, Start: t0, Seconds: 0.84,
			Phase: "replay", Warning: "protector: the new host died during recovery; the recovery starts again"}},
	}
	for _, c := range cases {
		if d := cmp.Diff(c.want, eventOf(c.r, c.fatal, c.replayed)); d != "" {
			t.Errorf("%s: eventOf (-want +got):\n%s", c.name, d)
		}
	}
	a := protector.Action{Kind: protector.ActFailed, Group: 3, Phase: protector.PhaseConfirm,
		Err: &protector.RecoveryError{Group: 3, Phase: protector.PhaseConfirm, Node: 3, Err: protector.ErrDataLost}}
	if ev := failedEvent(a, t0); ev.From != 3 || ev.To != -1 || ev.Phase != "confirm" || ev.Error != protector.ErrDataLost.Error() {
		t.Errorf("failedEvent = %+v", ev)
	}
}

// TestProgressBook: a recoverer's report replaces its previous one,
// the newest report of a group wins, a report not renewed within
// progressStale is dropped, and replay progress joins its group and epoch.
func TestProgressBook(t *testing.T) {
	reg := prometheus.NewRegistry()
	d := &Daemon{cfg: Config{Node: 3}, log: slog.New(slog.DiscardHandler), prog: newProgressBook(), dir: newDirectory(),
		recMetrics: newRecoveryMetrics(reg)}
	ps := []protector.Progress{{Group: 2, Cause: protector.CauseNode, From: 2, To: 4, Epoch: 1, Phase: protector.PhaseReplay,
		Start: t0, Since: t0.Add(ms(700)), Attempts: 1}}
	now := time.Now()
	d.publishProgress(ps, now)
	d.noteReplay(2, 1, 10<<20, 38<<20, false)
	d.noteReplay(2, 1, 28<<20, 0, true)
	d.noteReplay(2, 0, 5, 0, true) // another epoch
	if got := value(t, d.recMetrics.replayBytes); got != 38<<20+5 {
		t.Errorf("radic_replay_bytes_total = %v, want %v", got, 38<<20+5)
	}
	got := d.prog.status(now)
	replayed := uint64(38 << 20)
	want := []launch.RecoveryProgress{{Group: 2, Cause: "node", From: 2, To: 4, Epoch: 1, Phase: "replay", Start: t0,
		Since: t0.Add(ms(700)), Attempts: 1, By: 3, Replayed: &replayed, ReplayTotal: 38 << 20, Updated: now}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("status (-want +got):\n%s", diff)
	}
	if r := d.prog.replayed(2, 1); r == nil || *r != replayed {
		t.Errorf("replayed(2, 1) = %v, want %d", r, replayed)
	}
	if r := d.prog.replayed(2, 7); r != nil {
		t.Errorf("replayed(2, 7) = %d, want unknown", *r)
	}
	// An older report of the same group by another recoverer loses.
	d.prog.mu.Lock()
	old := want[0]
	old.By, old.Phase, old.Updated = 1, "restart", now.Add(-time.Second)
	d.prog.reports[1] = progressReport{By: 1, List: []launch.RecoveryProgress{old}}
	d.prog.heard[1] = now
	d.prog.mu.Unlock()
	if got := d.prog.status(now); len(got) != 1 || got[0].By != 3 {
		t.Errorf("status with an older report of group 2 = %+v, want node 3's", got)
	}
	// A report overtaken by a later one is ignored.
	d.prog.learn(progressReport{By: 3, At: now.Add(-time.Millisecond)}, now)
	if got := d.prog.status(now); len(got) != 1 || got[0].By != 3 {
		t.Errorf("status after an overtaken report = %+v, want node 3's", got)
	}
	// The recovery ended: the next step's empty list replaces the report.
	d.publishProgress(nil, now.Add(ms(50)))
	if got := d.prog.status(now); len(got) != 1 || got[0].By != 1 {
		t.Errorf("status after node 3's recovery ended = %+v, want node 1's (not stale yet)", got)
	}
	if got := d.prog.status(now.Add(progressStale + time.Second)); len(got) != 0 {
		t.Errorf("status once node 1's report is stale = %+v, want none", got)
	}
}

// TestAnnouncementCarriesReplay: the new host's announcement of a stage
// carries its replay report, so that the recoverer, which records the
// recovery's event as it learns the stage Live, knows how much was
// replayed even when the report's own push has not come (the event said
// only "live again").
func TestAnnouncementCarriesReplay(t *testing.T) {
	reg := prometheus.NewRegistry()
	host := &Daemon{cfg: Config{Node: 4}, log: slog.New(slog.DiscardHandler), prog: newProgressBook(), dir: newDirectory(),
		recMetrics: newRecoveryMetrics(reg)}
	host.noteReplay(2, 1, 38<<20, 0, true)
	body, err := json.Marshal(host.announcementOf(protector.Placement{Group: 2, Host: 4, Epoch: 1, Stage: protector.StageLive}))
	if err != nil {
		t.Fatal(err)
	}
	recoverer := &Daemon{cfg: Config{Node: 3}, log: slog.New(slog.DiscardHandler), prog: newProgressBook(), dir: newDirectory()}
	mux := http.NewServeMux()
	recoverer.recoveryRoutes(mux)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/recovery/learn", bytes.NewReader(body)))
	if rec.Code != http.StatusNoContent {
		t.Fatalf("learn: %d %s", rec.Code, rec.Body)
	}
	if r := recoverer.prog.replayed(2, 1); r == nil || *r != 38<<20 {
		t.Errorf("the recoverer's replayed(2, 1) = %v after the announcement, want %d", r, 38<<20)
	}
	// An announcement without a report (an older daemon's, or a stage
	// before any replay) is still a Placement.
	body, _ = json.Marshal(protector.Placement{Group: 5, Host: 4, Epoch: 1})
	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/recovery/learn", bytes.NewReader(body)))
	if rec.Code != http.StatusNoContent || recoverer.prog.replayed(5, 1) != nil {
		t.Errorf("a bare Placement: %d %s, replayed(5, 1) = %v", rec.Code, rec.Body, recoverer.prog.replayed(5, 1))
	}
}

func TestSameProgressIgnoresTimes(t *testing.T) {
	a := progressOf(1, []protector.Progress{{Group: 2, To: protector.None, Phase: protector.PhaseRestart, Start: t0}}, t0)
	b := progressOf(1, []protector.Progress{{Group: 2, To: protector.None, Phase: protector.PhaseRestart, Start: t0}}, t0.Add(time.Second))
	if a[0].To != -1 {
		t.Errorf("To of no target = %d, want -1", a[0].To)
	}
	if !sameProgress(a, b) {
		t.Error("sameProgress differs on Updated alone")
	}
	b[0].Phase = "reconnect"
	if sameProgress(a, b) {
		t.Error("sameProgress misses a phase change")
	}
}

// collect gathers c's metrics.
func collect(t *testing.T, c prometheus.Collector) []*dto.Metric {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	c.Collect(ch)
	close(ch)
	var out []*dto.Metric
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		out = append(out, &pb)
	}
	return out
}

// value is a counter's or gauge's value.
func value(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	ms := collect(t, c)
	if len(ms) != 1 {
		t.Fatalf("%d metrics, want 1", len(ms))
	}
	if ms[0].GetCounter() != nil {
		return ms[0].GetCounter().GetValue()
	}
	return ms[0].GetGauge().GetValue()
}

// TestLogTotals: radic_log_bytes and radic_log_records count what the
// stores hold of the protected processes' logs, launch records excluded,
// over every protected node.
func TestLogTotals(t *testing.T) {
	ss, err := openStores(t.TempDir(), msglog.Options{Sync: msglog.SyncNever}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	rec := &launch.Record{Version: 1, Job: "j", Rank: 0, Node: 1, Path: "/bin/true"}
	lr, err := launch.Encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	for node, recs := range map[int][]msglog.Record{
		1: {lr, {Kind: msglog.KindData, Owner: 5, Stream: 1, Offset: 0, Payload: make([]byte, 1000)},
			{Kind: msglog.KindData, Owner: 5, Stream: 1, Offset: 1000, Payload: make([]byte, 500)},
			{Kind: msglog.KindDeterminant, Owner: 5, Stream: 2, Offset: 0, Payload: make([]byte, 40)}},
		2: {{Kind: msglog.KindData, Owner: 9, Stream: 1, Offset: 0, Payload: make([]byte, 60)}},
	} {
		st, err := ss.get(heartbeat.NodeID(node))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.AppendBatch(recs); err != nil {
			t.Fatal(err)
		}
	}
	b, r := ss.logTotals()
	if b != 1000+500+40+60 || r != 4 {
		t.Errorf("logTotals() = %d bytes, %d records; want 1600, 4", b, r)
	}
}
