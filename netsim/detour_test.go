package netsim

import (
	"math/rand/v2"
	"testing"
)

// With nothing down, Detour routes exactly as dimension order does.
func TestDetourIsDimensionOrderWhenAllUp(t *testing.T) {
	sh := Shape{4, 3, 2}
	r := NewDetour(sh)
	r.SetDown(5, true)
	r.SetDown(5, false) // back up: the tables are dropped
	for a := range NodeID(sh.Nodes()) {
		for b := range NodeID(sh.Nodes()) {
			d1, ok1 := r.NextHop(sh.Coord(a), sh.Coord(b))
			d2, ok2 := sh.NextHop(sh.Coord(a), sh.Coord(b))
			if d1 != d2 || ok1 != ok2 {
				t.Fatalf("%d -> %d: Detour %v %v, dimension order %v %v", a, b, d1, ok1, d2, ok2)
			}
		}
	}
}

// walk follows r from a to b and returns the nodes visited after a.
func walk(t *testing.T, sh Shape, r *Detour, a, b NodeID) []NodeID {
	t.Helper()
	var path []NodeID
	at := sh.Coord(a)
	for range 4 * sh.Nodes() {
		d, ok := r.NextHop(at, sh.Coord(b))
		if !ok {
			return path
		}
		at = sh.Neighbour(at, d)
		path = append(path, sh.ID(at))
	}
	t.Fatalf("%d -> %d: no arrival after %d hops: %v", a, b, len(path), path)
	return nil
}

// A dead node on a ring is gone round the other way: 0 -> 2 on a ring of
// six with node 1 down is 0, 5, 4, 3, 2, and the nodes on the way agree
// (5 -> 2 would be a tie won by plus, back through 0 and into 1, without
// the shared distances).
func TestDetourGoesRoundADeadNode(t *testing.T) {
	sh := Shape{6, 1, 1}
	r := NewDetour(sh)
	r.SetDown(1, true)
	got := walk(t, sh, r, 0, 2)
	want := []NodeID{5, 4, 3, 2}
	if len(got) != len(want) {
		t.Fatalf("0 -> 2 with 1 down: %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("0 -> 2 with 1 down: %v, want %v", got, want)
		}
	}
}

// Random dead sets on a 4x4x2 torus: every route between two live nodes
// that are still connected arrives, never enters a dead node and is a
// shortest path over the live ones; the route to a dead node is the
// dimension-order one.
func TestDetourRandomDeadSets(t *testing.T) {
	sh := Shape{4, 4, 2}
	rng := rand.New(rand.NewPCG(12, 1))
	for trial := range 50 {
		r := NewDetour(sh)
		for range 1 + rng.IntN(6) {
			r.SetDown(NodeID(rng.IntN(sh.Nodes())), true)
		}
		for a := range NodeID(sh.Nodes()) {
			for b := range NodeID(sh.Nodes()) {
				if r.Down(a) || a == b {
					continue
				}
				if r.Down(b) {
					d1, _ := r.NextHop(sh.Coord(a), sh.Coord(b))
					d2, _ := sh.NextHop(sh.Coord(a), sh.Coord(b))
					if d1 != d2 {
						t.Fatalf("trial %d: %d -> dead %d took %v, want dimension order %v", trial, a, b, d1, d2)
					}
					continue
				}
				shortest := r.distances(sh.Coord(b))[a]
				if shortest < 0 {
					continue // cut off: lost as without Detour
				}
				path := walk(t, sh, r, a, b)
				for _, n := range path {
					if r.Down(n) {
						t.Fatalf("trial %d: %d -> %d went through dead node %d: %v", trial, a, b, n, path)
					}
				}
				if len(path) != int(shortest) {
					t.Fatalf("trial %d: %d -> %d in %d hops, shortest over live nodes %d", trial, a, b, len(path), shortest)
				}
			}
		}
	}
}

// The alternate route arrives, goes Z, Y, X, and crosses no link the
// dimension-order route crosses when every dimension is a ring (a 1-D
// torus always; ties included).
func TestAltRouteIsDisjoint(t *testing.T) {
	links := func(sh Shape, a, b Coord, rt Route) map[[2]NodeID]bool {
		got := map[[2]NodeID]bool{}
		at := a
		for range 4 * sh.Nodes() {
			d, ok := sh.NextHopRoute(at, b, rt)
			if !ok {
				return got
			}
			next := sh.Neighbour(at, d)
			x, y := sh.ID(at), sh.ID(next)
			got[[2]NodeID{min(x, y), max(x, y)}] = true
			at = next
		}
		t.Fatalf("%v -> %v on route %x: no arrival", a, b, rt)
		return nil
	}
	for _, sh := range []Shape{{6, 1, 1}, {5, 1, 1}, {4, 1, 1}, {3, 1, 1}} {
		for a := range NodeID(sh.Nodes()) {
			for b := range NodeID(sh.Nodes()) {
				ca, cb := sh.Coord(a), sh.Coord(b)
				prim := links(sh, ca, cb, 0)
				alt := links(sh, ca, cb, sh.AltRoute(ca, cb))
				for l := range alt {
					if prim[l] {
						t.Fatalf("%v: %d -> %d: both routes cross link %v", sh, a, b, l)
					}
				}
			}
		}
	}
	// On a 3-D torus the alternate route arrives from everywhere to
	// everywhere, with the header's route surviving a round trip.
	sh := Shape{4, 3, 2}
	for a := range NodeID(sh.Nodes()) {
		for b := range NodeID(sh.Nodes()) {
			rt := sh.AltRoute(sh.Coord(a), sh.Coord(b))
			h, _, err := DecodeTorus(AppendTorus(nil, TorusHeader{Proto: ProtoHeartbeat, Route: rt, Src: sh.Coord(a), Dst: sh.Coord(b)}, nil))
			if err != nil || h.Route != rt || h.Proto != ProtoHeartbeat {
				t.Fatalf("header round trip: %+v %v, want route %x", h, err, rt)
			}
			links(sh, sh.Coord(a), sh.Coord(b), rt)
		}
	}
}
