package testenv

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The benchmarks' arithmetic: every table reports medians of several runs
// side by side with a baseline, and says whether a goal is met.

// Median is the median of v (0 for none); v is not changed.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// MinOf is the smallest of v (which must not be empty).
func MinOf(v []float64) float64 { return slices.Min(v) }

// MaxOf is the largest of v (which must not be empty).
func MaxOf(v []float64) float64 { return slices.Max(v) }

// Fmts formats a list of figures for a table or a log, prec decimals.
func Fmts(v []float64, prec int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.FormatFloat(x, 'f', prec, 64)
	}
	return strings.Join(s, " ")
}

// YesNo is a table's "met" column: a miss stands out in bold.
func YesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// EnvCount reads a benchmark's count setting from the environment (runs,
// sizes): def when unset, and at least min.
func EnvCount(tb testing.TB, name string, def, min int) int {
	tb.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < min {
		tb.Fatalf("%s=%q: want a number >= %d", name, s, min)
	}
	return v
}
