package netsim

// Detour routes around nodes known to be down. Dimension-order routing
// gives every pair one path, so one dead node cuts every route through it;
// on the emulated machine the daemons learn which nodes are dead (their
// heartbeat ring declares them) and tell the router, which then takes the
// shortest path over the nodes still up. Every node that knows the same
// dead set picks from the same shortest-path distances with the same
// tie-break (the link order XPlus..ZMinus), so each hop is one step
// closer to the destination and routes cannot loop. While nodes disagree
// (a declaration still travelling) a packet can go round; the torus
// header's hop count bounds it.
//
// With nothing down, Detour is exactly [Shape.NextHop]. Its state is the
// dead set and one distance table per destination routed to since the
// set last changed (4 bytes per node each): small machines, the daemons'
// own, not the 65,536-node simulations. Not safe for concurrent use.
type Detour struct {
	shape Shape
	down  map[NodeID]bool
	dist  map[NodeID][]int32 // destination -> hops from every node, -1: cut off
}

// NewDetour makes a router for s with every node up.
func NewDetour(s Shape) *Detour {
	return &Detour{shape: s, down: map[NodeID]bool{}, dist: map[NodeID][]int32{}}
}

// SetDown marks node id down (routes avoid it) or up again.
func (r *Detour) SetDown(id NodeID, down bool) {
	if r.down[id] == down {
		return
	}
	if down {
		r.down[id] = true
	} else {
		delete(r.down, id)
	}
	clear(r.dist)
}

// Down reports whether id is marked down.
func (r *Detour) Down(id NodeID) bool { return r.down[id] }

// NextHop is the link a packet at `at` takes towards dst; ok is false when
// at == dst. When dst cannot be reached over the nodes that are up (or is
// itself down) it is the dimension-order link: the packet goes the way it
// would have and is lost where the machine is broken, as without Detour.
func (r *Detour) NextHop(at, dst Coord) (d Dir, ok bool) {
	return r.NextHopRoute(at, dst, 0)
}

// NextHopRoute is NextHop for a packet with route rt: with nothing down,
// the route it asks for (Shape.NextHopRoute); with nodes down, the
// detour, whatever it asked.
func (r *Detour) NextHopRoute(at, dst Coord, rt Route) (d Dir, ok bool) {
	if len(r.down) == 0 || at == dst {
		return r.shape.NextHopRoute(at, dst, rt)
	}
	dist := r.distances(dst)
	here := dist[r.shape.ID(at)]
	if here > 0 {
		for d := range NumDirs {
			if dist[r.shape.ID(r.shape.Neighbour(at, d))] == here-1 {
				return d, true
			}
		}
	}
	return r.shape.NextHop(at, dst)
}

// distances is the hop count from every node to dst over the nodes that
// are up (a breadth-first search from dst; links are symmetric).
func (r *Detour) distances(dst Coord) []int32 {
	id := r.shape.ID(dst)
	if d, ok := r.dist[id]; ok {
		return d
	}
	d := make([]int32, r.shape.Nodes())
	for i := range d {
		d[i] = -1
	}
	if !r.down[id] {
		d[id] = 0
		queue := []NodeID{id}
		for len(queue) > 0 {
			n := queue[0]
			queue = queue[1:]
			c := r.shape.Coord(n)
			for dir := range NumDirs {
				m := r.shape.ID(r.shape.Neighbour(c, dir))
				if d[m] < 0 && !r.down[m] {
					d[m] = d[n] + 1
					queue = append(queue, m)
				}
			}
		}
	}
	r.dist[id] = d
	return d
}
