package radicd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/radic-project/radic/heartbeat"
)

// launchGate says whether this node may take a rank's launch now, from
// its ring's view (st) at now. A launch stores the rank's record with the
// node's protectors, and those are the ring's next alive members as this
// node sees them: while the ring changes, the two sides of a partition
// name different protectors. A node cut off with a minority that stored a
// record on a protector in its own minority (its ring had declared the
// real one dead) acknowledged a rank nobody can restart: the majority
// looks for the record on the protector it names, which never had it,
// and the minority fences (CI, the campaign's partition at 21 ms: "rank 0:
// not restarted within 30s"). So a launch waits for a ring that has been
// quiet for settle (no member suspect, none declared dead more recently)
// and holds a majority; settle is the time a node that lost its majority
// takes to fence itself, after which it launches nothing.
//
// The answer is nil (launch), or an error with wait true (the ring is
// changing: ask again soon) or false (cut off or fenced: this node will
// not launch; the launcher should say so).
func launchGate(st heartbeat.Status, now time.Time, settle time.Duration) (wait bool, err error) {
	if st.Fenced {
		return false, fmt.Errorf("node %d is fenced (cut off from its ring): it launches nothing until its radicd restarts", st.Self)
	}
	var dead, suspect []string
	var last time.Time
	for _, m := range st.Members {
		switch m.State {
		case "dead":
			dead = append(dead, fmt.Sprint(m.ID))
			if m.DeclaredAt.After(last) {
				last = m.DeclaredAt
			}
		case "suspect":
			if m.ID != st.Self {
				suspect = append(suspect, fmt.Sprint(m.ID))
			}
		}
	}
	if n := len(st.Members); n > 0 && 2*(n-len(dead)) <= n {
		return false, fmt.Errorf("node %d reaches %d of the %d members of its ring (dead to it: %s), not a majority: it fences itself rather than launch",
			st.Self, n-len(dead), n, strings.Join(dead, ","))
	}
	if len(suspect) > 0 {
		return true, fmt.Errorf("node %d's ring is changing (not heard from: %s)", st.Self, strings.Join(suspect, ","))
	}
	if ago := now.Sub(last); !last.IsZero() && ago < settle {
		return true, fmt.Errorf("node %d's ring changed %v ago (declared dead: %s); a launch waits %v for it to settle", st.Self, ago.Round(time.Millisecond), strings.Join(dead, ","), settle)
	}
	return false, nil
}

// ringShape is what a launch must find unchanged from before its record
// was stored to after: each member's incarnation and state.
func ringShape(st heartbeat.Status) string {
	var b strings.Builder
	ms := slices.Clone(st.Members)
	slices.SortFunc(ms, func(a, b heartbeat.MemberStatus) int { return int(a.ID) - int(b.ID) })
	for _, m := range ms {
		fmt.Fprintf(&b, "%d/%d/%s ", m.ID, m.Inc, m.State)
	}
	return b.String()
}

// gate is launchGate on this node's ring now: its shape when the node
// may launch, else a 503 with the reason and whether to wait.
func (d *Daemon) gate(ctx context.Context) (shape string, wait bool, err error) {
	st, ok := d.runner.Status(ctx)
	if !ok {
		return "", false, errors.New("daemon stopping")
	}
	st.Fenced = st.Fenced || d.fenced.Load()
	if wait, err := launchGate(st, time.Now(), d.settle()); err != nil {
		return "", wait, &httpError{http.StatusServiceUnavailable, err.Error()}
	}
	return ringShape(st), false, nil
}

// settle is how long a launch waits after a change of the ring: the
// protector's fence timeout (recovery.go), within which a node that lost
// its majority fences itself.
func (d *Daemon) settle() time.Duration { return max(2*d.cfg.Fence, time.Second) }

// insteadOf says whether this node may launch a rank in place of node
// lost, which could not launch it (`radic run` got no answer from it, or
// a refusal: cut off, fenced), from its ring's view st; known is whether
// the rank is in this node's directory already (lost created it before it
// was lost, and its recovery restarts it). Only once the ring has
// declared lost dead: a node merely slow could still start the rank, and
// no rank may run twice. The launch's own gate then waits for the ring to
// settle, past the pushes lost made before it went.
//
// The answer is an HTTP status and why: 400 (no such node, or this one),
// 503 (not declared dead yet: ask again), 409 (known: follow its
// recovery), or 0 and nil.
func insteadOf(st heartbeat.Status, lost int, known bool) (int, error) {
	if lost == int(st.Self) {
		return http.StatusBadRequest, fmt.Errorf("node %d cannot launch a rank in place of itself", lost)
	}
	i := slices.IndexFunc(st.Members, func(m heartbeat.MemberStatus) bool { return int(m.ID) == lost })
	if i < 0 {
		return http.StatusBadRequest, fmt.Errorf("node %d is not a member of node %d's ring", lost, st.Self)
	}
	if state := st.Members[i].State; state != "dead" {
		return http.StatusServiceUnavailable, fmt.Errorf("node %d is %s to node %d, not dead: a rank is launched in its place only once the ring has declared it dead", lost, state, st.Self)
	}
	if known {
		return http.StatusConflict, fmt.Errorf("the rank is known already (node %d created it before it was lost): its recovery restarts it", lost)
	}
	return 0, nil
}
