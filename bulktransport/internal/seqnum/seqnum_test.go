package seqnum

import "testing"

func TestWraparound(t *testing.T) {
	tests := []struct {
		v, w Value
		less bool
	}{
		{1, 2, true},
		{2, 1, false},
		{0xffffffff, 0, true}, // 0 follows the largest value
		{0, 0xffffffff, false},
		{5, 5, false},
	}
	for _, tc := range tests {
		if got := tc.v.LessThan(tc.w); got != tc.less {
			t.Errorf("%d.LessThan(%d) = %v, want %v", tc.v, tc.w, got, tc.less)
		}
	}
	if !Value(0xfffffffe).InWindow(0xfffffffd, 4) || Value(2).InWindow(0xfffffffd, 4) {
		t.Error("InWindow across the wrap")
	}
	if Value(0xfffffffe).Size(3) != 5 {
		t.Error("Size across the wrap")
	}
}
