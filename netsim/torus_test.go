package netsim

import (
	"testing"
)

// Dimension-order routing: X first, then Y, then Z, each the shorter way
// round the ring; the route length is the sum of the wrapped distances.
func TestDimensionOrderRoute(t *testing.T) {
	sh := Shape{8, 4, 4}
	tests := []struct {
		from, to Coord
		dirs     []Dir
	}{
		{Coord{0, 0, 0}, Coord{0, 0, 0}, nil},
		{Coord{0, 0, 0}, Coord{2, 1, 0}, []Dir{XPlus, XPlus, YPlus}},
		{Coord{0, 0, 0}, Coord{7, 0, 0}, []Dir{XMinus}},                     // wraparound
		{Coord{0, 0, 0}, Coord{4, 0, 0}, []Dir{XPlus, XPlus, XPlus, XPlus}}, // tie: plus
		{Coord{1, 3, 0}, Coord{1, 0, 3}, []Dir{YPlus, ZMinus}},
		{Coord{6, 2, 1}, Coord{1, 1, 1}, []Dir{XPlus, XPlus, XPlus, YMinus}},
	}
	for _, tc := range tests {
		var got []Dir
		at := tc.from
		for range 100 {
			d, ok := sh.NextHop(at, tc.to)
			if !ok {
				break
			}
			got = append(got, d)
			at = sh.Neighbour(at, d)
		}
		if at != tc.to || !equalDirs(got, tc.dirs) {
			t.Errorf("route %v -> %v = %v ending at %v, want %v", tc.from, tc.to, got, at, tc.dirs)
		}
		if h := sh.Hops(tc.from, tc.to); h != len(tc.dirs) {
			t.Errorf("Hops(%v, %v) = %d, want %d", tc.from, tc.to, h, len(tc.dirs))
		}
	}
}

func equalDirs(a, b []Dir) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestIDCoordRoundTrip(t *testing.T) {
	sh := Shape{5, 3, 7}
	for i := range sh.Nodes() {
		c := sh.Coord(NodeID(i))
		if !sh.Contains(c) || sh.ID(c) != NodeID(i) {
			t.Fatalf("ID(Coord(%d)) = %d via %v", i, sh.ID(c), c)
		}
	}
	// Ring neighbours in id order are torus neighbours along X.
	if d, _ := sh.NextHop(sh.Coord(1), sh.Coord(2)); d != XPlus {
		t.Errorf("1 -> 2 leaves on %v, want x+", d)
	}
}

func TestReverse(t *testing.T) {
	sh := Shape{3, 3, 3}
	c := Coord{1, 2, 0}
	for d := range NumDirs {
		if back := sh.Neighbour(sh.Neighbour(c, d), d.Reverse()); back != c {
			t.Errorf("%v then %v ends at %v", d, d.Reverse(), back)
		}
	}
}

func TestShapeValidate(t *testing.T) {
	for _, sh := range []Shape{{0, 1, 1}, {1, 1, MaxDim + 1}} {
		if sh.Validate() == nil {
			t.Errorf("%v valid", sh)
		}
	}
	if err := (Shape{16, 16, 16}).Validate(); err != nil {
		t.Error(err)
	}
}
