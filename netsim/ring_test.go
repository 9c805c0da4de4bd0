package netsim

import (
	"encoding/binary"
	"testing"
	"time"
)

// ring is a minimal heartbeat ring over the torus, one member per node in
// id order (so successors are mostly one torus hop away): every member
// heartbeats its successor each period and declares its predecessor dead
// after a timeout of silence. heartbeat.Node cannot be used at this size:
// it gossips the whole membership view in every datagram (at most 96
// members in 1400 bytes) and walks all members on every tick.
type ring struct {
	sim      *Sim
	n        int
	period   time.Duration
	timeout  time.Duration
	lastHB   []time.Time // from the predecessor
	declared []time.Time
	seq      []uint64
}

func newRing(t *testing.T, sh Shape, period, timeout time.Duration, f Faults, seed uint64) *ring {
	sim, err := NewSim(SimConfig{Shape: sh, Faults: f, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	n := sh.Nodes()
	r := &ring{sim: sim, n: n, period: period, timeout: timeout,
		lastHB: make([]time.Time, n), declared: make([]time.Time, n), seq: make([]uint64, n)}
	start := sim.Now()
	for i := range n {
		r.lastHB[i] = start
		sim.Handle(NodeID(i), func(now time.Time, pkt []byte) {
			if h, _, err := DecodeTorus(pkt); err == nil && h.Proto == ProtoHeartbeat {
				r.lastHB[i] = now
			}
		})
		// Spread the members' phases over the period, as independent
		// daemons would be.
		phase := time.Duration(i) * period / time.Duration(n)
		sim.At(start.Add(phase), func(now time.Time) { r.beat(i, now) })
		sim.At(start.Add(phase+timeout), func(now time.Time) { r.watch(i, now) })
	}
	return r
}

func (r *ring) beat(i int, now time.Time) {
	if r.sim.crashed[i] {
		return
	}
	r.seq[i]++
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], r.seq[i])
	r.sim.SendTorus(NodeID(i), NodeID((i+1)%r.n), ProtoHeartbeat, b[:])
	r.sim.After(r.period, func(now time.Time) { r.beat(i, now) })
}

// watch is member i's watchdog on its predecessor, checked every period.
func (r *ring) watch(i int, now time.Time) {
	if r.sim.crashed[i] {
		return
	}
	pred := (i - 1 + r.n) % r.n
	if r.declared[pred].IsZero() && now.Sub(r.lastHB[i]) >= r.timeout {
		r.declared[pred] = now
	}
	r.sim.After(r.period/4, func(now time.Time) { r.watch(i, now) })
}

// A 16x16x16 torus (4,096 nodes) runs the heartbeat ring in virtual time
// under 1% packet loss; a crashed node is declared by its successor, and
// by nobody else, within timeout + one period of the crash.
func TestRing4096DetectsFailure(t *testing.T) {
	sh := Shape{16, 16, 16}
	const period, timeout = 100 * time.Millisecond, 350 * time.Millisecond
	r := newRing(t, sh, period, timeout, Faults{Drop: 0.01}, 42)
	r.sim.RunFor(time.Second)
	const victim = 1234
	crashAt := r.sim.Now()
	r.sim.Crash(victim)
	r.sim.RunFor(time.Second)
	for i, d := range r.declared {
		if i != victim && !d.IsZero() {
			t.Errorf("node %d declared dead at %v though alive (false positive)", i, d.Sub(crashAt))
		}
	}
	d := r.declared[victim]
	if d.IsZero() {
		t.Fatalf("crash of node %d not detected", victim)
	}
	detection := d.Sub(crashAt)
	if detection > timeout+period {
		t.Errorf("detection took %v, want <= timeout+period = %v", detection, timeout+period)
	}
	t.Logf("4,096-node torus: node %d %v declared %v after its crash (period %v, timeout %v); %d torus packets, %d hops, %d lost",
		victim, sh.Coord(victim), detection, period, timeout, r.sim.Stats.Sent, r.sim.Stats.Hops, r.sim.Stats.Dropped+r.sim.Stats.CrashedDrops)
}
