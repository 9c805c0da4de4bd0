// Package seqnum compares 32-bit sequence numbers that wrap around, as in
// RFC 1982 serial number arithmetic: a is before b when b is less than
// 2^31 ahead of a. Exactly 2^31 apart is undefined (RFC 1982); windows stay far
// below that.
package seqnum

// Value is a wrapping sequence number.
type Value uint32

// LessThan reports whether v comes before w.
func (v Value) LessThan(w Value) bool { return int32(v-w) < 0 }

// LessThanEq reports whether v comes before w or equals it.
func (v Value) LessThanEq(w Value) bool { return v == w || v.LessThan(w) }

// InWindow reports whether v lies in [first, first+size).
func (v Value) InWindow(first Value, size uint32) bool { return uint32(v-first) < size }

// Add returns v+n.
func (v Value) Add(n uint32) Value { return v + Value(n) }

// Size is the distance from v to w (w must not be before v).
func (v Value) Size(w Value) uint32 { return uint32(w - v) }
