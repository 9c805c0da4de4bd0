package heartbeat

import (
	"slices"
	"time"
)

// MemberStatus is one member as this node sees it.
type MemberStatus struct {
	ID    NodeID `json:"id"`
	Inc   uint64 `json:"incarnation"`
	State string `json:"state"` // unknown, alive, suspect, dead
	Role  string `json:"role"`
	// LastHeard is the age of the last datagram (or indirect proof of
	// life) from the member; negative when never heard.
	LastHeard   time.Duration `json:"-"`
	LastHeardMS float64       `json:"last_heard_ms"`
	Indirect    bool          `json:"indirect,omitempty"` // last proof of life came through a prober
	Cause       string        `json:"cause,omitempty"`    // why it was declared dead
	DeclaredAt  time.Time     `json:"declared_at,omitzero"`
	// Protectors hold the member's critical data (its next k alive active
	// members); Protects is the reverse.
	Protectors []NodeID `json:"protectors"`
	Protects   []NodeID `json:"protects"`
	Monitor    NodeID   `json:"monitor"` // who runs the watchdog on it (None if alone)
}

// Status is a snapshot of one member's view of the ring.
type Status struct {
	Self      NodeID    `json:"self"`
	Inc       uint64    `json:"incarnation"`
	Role      string    `json:"role"`
	Fenced    bool      `json:"fenced"`
	FencedAt  time.Time `json:"fenced_at,omitzero"`
	Ring      []NodeID  `json:"ring"`      // alive members in ring order
	Monitored NodeID    `json:"monitored"` // whose watchdog runs here
	// Neighbours are the ring predecessor and successor, which this node
	// heartbeats and hears from.
	Neighbours []NodeID       `json:"neighbours"`
	Members    []MemberStatus `json:"members"`
	PeriodMS   float64        `json:"period_ms"`
	TimeoutMS  float64        `json:"timeout_ms"`
	ProbeMS    float64        `json:"probe_timeout_ms"`
	FenceMS    float64        `json:"fence_timeout_ms"`
}

// Protectors returns the next k alive active members after id, in ring
// order: where id's critical data lives.
func (n *Node) Protectors(id NodeID) []NodeID {
	var actives []NodeID
	for _, x := range n.ids {
		if m := n.members[x]; m.State == Alive && m.Role == RoleActive && x != id {
			actives = append(actives, x)
		}
	}
	if len(actives) == 0 {
		return nil
	}
	i := 0
	for i < len(actives) && actives[i] < id {
		i++
	}
	var out []NodeID
	for j := 0; j < len(actives) && len(out) < n.cfg.Protectors; j++ {
		out = append(out, actives[(i+j)%len(actives)])
	}
	return out
}

// Status returns a snapshot; now gives the ages.
func (n *Node) Status(now time.Time) Status {
	ring := n.ring()
	st := Status{
		Self: n.self.ID, Inc: n.self.Inc, Role: n.self.Role.String(),
		Fenced: n.fenced, Ring: ring, Monitored: n.monitored,
		PeriodMS:  ms(n.cfg.Period),
		TimeoutMS: ms(n.cfg.Timeout),
		ProbeMS:   ms(n.cfg.ProbeTimeout),
		FenceMS:   ms(n.cfg.FenceTimeout),
	}
	if n.fenced {
		st.FencedAt = n.fencedAt
	}
	pred, succ := neighbours(ring, n.self.ID)
	for _, x := range []NodeID{pred, succ} {
		if x != None && !slices.Contains(st.Neighbours, x) {
			st.Neighbours = append(st.Neighbours, x)
		}
	}
	protects := map[NodeID][]NodeID{}
	prot := map[NodeID][]NodeID{}
	for _, id := range n.ids {
		m := n.members[id]
		if m.State == Alive && m.Role == RoleActive {
			prot[id] = n.Protectors(id)
			for _, p := range prot[id] {
				protects[p] = append(protects[p], id)
			}
		}
	}
	for _, id := range n.ids {
		m := n.members[id]
		ms := MemberStatus{ID: id, Inc: m.Inc, State: m.State.String(), Role: m.Role.String(),
			Protectors: prot[id], Protects: protects[id], Monitor: None, Indirect: m.indirectAck}
		if m.suspect {
			ms.State = "suspect"
		}
		if m.heard {
			ms.LastHeard = now.Sub(m.lastHeard)
			if m == n.self {
				ms.LastHeard = 0
			}
		} else {
			ms.LastHeard = -1
		}
		ms.LastHeardMS = float64(ms.LastHeard) / 1e6
		if m.State == Dead {
			ms.Cause = m.cause
			ms.DeclaredAt = m.declaredAt
		}
		if m.State == Alive {
			_, succ := neighbours(ring, id)
			ms.Monitor = succ
		}
		st.Members = append(st.Members, ms)
	}
	return st
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }
