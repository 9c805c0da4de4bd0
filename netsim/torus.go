package netsim

import (
	"errors"
	"fmt"
)

// NodeID numbers a torus node: X fastest, then Y, then Z, so that ring
// neighbours in id order are mostly torus neighbours along X.
type NodeID uint32

// Coord is a node's position on the torus.
type Coord struct{ X, Y, Z uint16 }

func (c Coord) String() string { return fmt.Sprintf("(%d,%d,%d)", c.X, c.Y, c.Z) }

// Shape is the size of the torus in each dimension. Every dimension wraps
// around.
type Shape struct{ X, Y, Z int }

// MaxDim bounds each dimension so that a coordinate fits the 16-bit fields
// of the torus header.
const MaxDim = 1 << 16

// ErrShape prefixes invalid torus shapes.
var ErrShape = errors.New("netsim: shape")

// Validate checks that every dimension is between 1 and MaxDim and that
// the node count fits a NodeID.
func (s Shape) Validate() error {
	for _, d := range []int{s.X, s.Y, s.Z} {
		if d < 1 || d > MaxDim {
			return fmt.Errorf("%w: dimension %d outside 1..%d", ErrShape, d, MaxDim)
		}
	}
	if uint64(s.X)*uint64(s.Y)*uint64(s.Z) > 1<<32 {
		return fmt.Errorf("%w: %dx%dx%d nodes do not fit a 32-bit id", ErrShape, s.X, s.Y, s.Z)
	}
	return nil
}

// Nodes is the number of nodes.
func (s Shape) Nodes() int { return s.X * s.Y * s.Z }

// ID numbers c.
func (s Shape) ID(c Coord) NodeID {
	return NodeID(int(c.X) + s.X*(int(c.Y)+s.Y*int(c.Z)))
}

// Coord is the position of id.
func (s Shape) Coord(id NodeID) Coord {
	i := int(id)
	return Coord{X: uint16(i % s.X), Y: uint16(i / s.X % s.Y), Z: uint16(i / (s.X * s.Y))}
}

// Contains reports whether c is on the torus.
func (s Shape) Contains(c Coord) bool {
	return int(c.X) < s.X && int(c.Y) < s.Y && int(c.Z) < s.Z
}

// Dir is one of a node's six torus links.
type Dir uint8

// The six links, in the order dimension-order routing tries them.
const (
	XPlus Dir = iota
	XMinus
	YPlus
	YMinus
	ZPlus
	ZMinus
	NumDirs
)

func (d Dir) String() string {
	if d < NumDirs {
		return [...]string{"x+", "x-", "y+", "y-", "z+", "z-"}[d]
	}
	return fmt.Sprintf("Dir(%d)", uint8(d))
}

// Reverse is the link that arrives back: XPlus from one node is XMinus at
// the next.
func (d Dir) Reverse() Dir { return d ^ 1 }

// Neighbour is the node at the other end of link d of c.
func (s Shape) Neighbour(c Coord, d Dir) Coord {
	step := func(v uint16, n int, plus bool) uint16 {
		if plus {
			return uint16((int(v) + 1) % n)
		}
		return uint16((int(v) - 1 + n) % n)
	}
	switch d {
	case XPlus, XMinus:
		c.X = step(c.X, s.X, d == XPlus)
	case YPlus, YMinus:
		c.Y = step(c.Y, s.Y, d == YPlus)
	case ZPlus, ZMinus:
		c.Z = step(c.Z, s.Z, d == ZPlus)
	}
	return c
}

// axis returns the direction and number of hops along one wrapped
// dimension of size n from a to b: the shorter way round, plus on a tie so
// that both ends of a route agree on one path.
func axis(a, b uint16, n int) (plus bool, hops int) {
	fwd := (int(b) - int(a) + n) % n
	if fwd == 0 {
		return true, 0
	}
	if fwd <= n-fwd {
		return true, fwd
	}
	return false, n - fwd
}

// NextHop is the link a packet at `at` takes towards dst under
// dimension-order routing: X until the X coordinate matches, then Y, then
// Z, each the shorter way round the ring. ok is false when at == dst.
// Dimension order is deadlock-free on the hardware and gives every
// (source, destination) pair one fixed path, so packets of one flow are
// not reordered by routing.
func (s Shape) NextHop(at, dst Coord) (d Dir, ok bool) {
	if plus, n := axis(at.X, dst.X, s.X); n > 0 {
		return pick(plus, XPlus), true
	}
	if plus, n := axis(at.Y, dst.Y, s.Y); n > 0 {
		return pick(plus, YPlus), true
	}
	if plus, n := axis(at.Z, dst.Z, s.Z); n > 0 {
		return pick(plus, ZPlus), true
	}
	return 0, false
}

func pick(plus bool, d Dir) Dir {
	if plus {
		return d
	}
	return d + 1
}

// Hops is the length of the dimension-order route from a to b.
func (s Shape) Hops(a, b Coord) int {
	_, x := axis(a.X, b.X, s.X)
	_, y := axis(a.Y, b.Y, s.Y)
	_, z := axis(a.Z, b.Z, s.Z)
	return x + y + z
}

// Route is how a torus packet is routed (the high nibble of the header's
// second byte). Zero is dimension order. With RouteAlt set, the packet
// takes the alternate route: Z, then Y, then X, each dimension the way
// its bit names (set: minus), fixed by the sender (AltRoute) so that
// every hop agrees. The alternate route goes the other way round every
// ring the dimension-order route crosses, so the two share no link on a
// ring and few on a torus: a packet sent both ways survives one cut link
// or dead node on either path, which is what the failure detector's
// probes need (a probe exists to find a path the heartbeats did not).
type Route uint8

// Route bits.
const (
	RouteXMinus Route = 1 << iota
	RouteYMinus
	RouteZMinus
	RouteAlt
)

// AltRoute is the alternate route from src to dst: in every dimension the
// two differ, the opposite way round from the dimension-order route.
func (s Shape) AltRoute(src, dst Coord) Route {
	r := RouteAlt
	for i, n := range [3]int{s.X, s.Y, s.Z} {
		a, b := [3]uint16{src.X, src.Y, src.Z}[i], [3]uint16{dst.X, dst.Y, dst.Z}[i]
		if plus, hops := axis(a, b, n); hops > 0 && plus {
			r |= RouteXMinus << i
		}
	}
	return r
}

// NextHopRoute is the link a packet at `at` with route r takes towards
// dst: NextHop for dimension order, else the alternate route's link.
func (s Shape) NextHopRoute(at, dst Coord, r Route) (d Dir, ok bool) {
	if r&RouteAlt == 0 {
		return s.NextHop(at, dst)
	}
	if at.Z != dst.Z {
		return pick(r&RouteZMinus == 0, ZPlus), true
	}
	if at.Y != dst.Y {
		return pick(r&RouteYMinus == 0, YPlus), true
	}
	if at.X != dst.X {
		return pick(r&RouteXMinus == 0, XPlus), true
	}
	return 0, false
}
