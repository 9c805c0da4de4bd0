package main

import (
	"slices"
	"testing"
)

func TestParseNodeList(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want []int
		ok   bool
	}{
		{"0", []int{0}, true},
		{"0,2,5-7", []int{0, 2, 5, 6, 7}, true},
		{"3-3", []int{3}, true},
		{"7-5", nil, false},
		{"a", nil, false},
		{"1,,2", nil, false},
	} {
		got, err := parseNodeList(tt.in)
		if (err == nil) != tt.ok || !slices.Equal(got, tt.want) {
			t.Errorf("parseNodeList(%q) = %v, %v; want %v, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}
