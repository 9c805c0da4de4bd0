package observer

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// stream returns n deterministic pseudo-random bytes.
func stream(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// chunks cuts b at random boundaries (at most max bytes each).
func chunks(r *rand.Rand, b []byte, max int) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		n := min(len(b), 1+r.IntN(max))
		out = append(out, b[:n])
		b = b[n:]
	}
	return out
}

func TestHashComposes(t *testing.T) {
	b := stream(1, 10000)
	for _, cut := range []int{0, 1, 4095, 4096, 9999, 10000} {
		if got, want := HashOf(b[:cut]).update(b[cut:]), HashOf(b); got != want {
			t.Errorf("HashOf(b[:%d]).update(b[%d:]) = %#x, want HashOf(b) = %#x", cut, cut, got, want)
		}
	}
	if HashOf(nil) != 0 {
		t.Errorf("HashOf(nil) = %#x, want 0", HashOf(nil))
	}
}

func TestStreamHashPoints(t *testing.T) {
	const block = MinBlock
	b := stream(2, 5*block+100)
	r := rand.New(rand.NewPCG(2, 2))
	h, err := NewStreamHash(block, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chunks(r, b, 3000) {
		h.Write(c)
	}
	want := Summary{Block: block, End: uint64(len(b)), Sum: HashOf(b), First: 1}
	for k := 1; k <= 5; k++ {
		want.Points = append(want.Points, HashOf(b[:k*block]))
	}
	if diff := cmp.Diff(want, h.Summary()); diff != "" {
		t.Errorf("Summary after %d bytes (-want +got):\n%s", len(b), diff)
	}

	// A hash started at a checkpoint with its seed agrees.
	h2, _ := NewStreamHash(block, 2*block+7, HashOf(b[:2*block+7]))
	h2.Write(b[2*block+7:])
	s2 := h2.Summary()
	if s2.Sum != want.Sum || s2.First != 3 || !cmp.Equal(s2.Points, want.Points[2:]) {
		t.Errorf("Summary of a hash started at %d = %+v, want First 3 and the points from 3", 2*block+7, s2)
	}

	h.Forget(3*block + 1)
	if s := h.Summary(); s.First != 3 || !cmp.Equal(s.Points, want.Points[2:]) {
		t.Errorf("after Forget(3·block+1): First %d, %d points; want 3, %d", s.First, len(s.Points), len(want.Points[2:]))
	}
	h.Forget(0) // no-op
	if s := h.Summary(); s.First != 3 {
		t.Errorf("Forget(0) moved First to %d", s.First)
	}
}

func TestNewStreamHashBadBlock(t *testing.T) {
	for _, block := range []uint64{0, 1, MinBlock - 1, MinBlock + 1, 3 * MinBlock, MaxBlock * 2} {
		if _, err := NewStreamHash(block, 0, 0); err == nil {
			t.Errorf("NewStreamHash(%d) error = nil, want one", block)
		}
	}
}

// summaryOf is what a receiver that got b tells the restarted sender.
func summaryOf(t *testing.T, block uint64, b []byte) Summary {
	t.Helper()
	h, err := NewStreamHash(block, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	h.Write(b)
	return h.Summary()
}

// A restarted sender regenerates the same bytes with other send
// boundaries: everything the peer has is dropped, the rest is fresh.
func TestOutputCheckSameBytes(t *testing.T) {
	const block = MinBlock
	orig := stream(3, 7*block+321)
	for _, peerHas := range []int{0, 1, block, 3*block + 5, len(orig)} {
		for seed := range uint64(5) {
			r := rand.New(rand.NewPCG(seed, uint64(peerHas)))
			c, err := NewOutputCheck(3, conn31, 0, 0, summaryOf(t, block, orig[:peerHas]))
			if err != nil {
				t.Fatal(err)
			}
			var fresh []byte
			for _, ch := range chunks(r, orig, 2*block) {
				f, err := c.Write(ch)
				if err != nil {
					t.Fatalf("peer has %d, seed %d: Write error: %v", peerHas, seed, err)
				}
				fresh = append(fresh, f...)
			}
			if !bytes.Equal(fresh, orig[peerHas:]) || !c.Caught() || c.Offset() != uint64(len(orig)) {
				t.Errorf("peer has %d, seed %d: fresh = %d bytes, caught %v; want the last %d bytes, caught", peerHas, seed, len(fresh), c.Caught(), len(orig)-peerHas)
			}
			if err := c.Close(); err != nil {
				t.Errorf("Close() = %v", err)
			}
		}
	}
}

func TestOutputCheckDiverges(t *testing.T) {
	const block = MinBlock
	orig := stream(4, 6*block)
	peer := summaryOf(t, block, orig[:5*block+10])
	for _, tt := range []struct {
		name     string
		flip     int // byte changed in the regenerated stream
		from, to uint64
	}{
		{"first byte", 0, 0, block},
		{"in block 2", 2*block + 17, 2 * block, 3 * block},
		{"last byte of a block", 3*block - 1, 2 * block, 3 * block},
		{"in the partial tail", 5*block + 9, 5 * block, 5*block + 10},
	} {
		t.Run(tt.name, func(t *testing.T) {
			regen := bytes.Clone(orig)
			regen[tt.flip] ^= 0x40
			c, _ := NewOutputCheck(3, conn31, 0, 0, peer)
			var err error
			for _, ch := range chunks(rand.New(rand.NewPCG(9, 9)), regen, 1000) {
				if _, err = c.Write(ch); err != nil {
					break
				}
			}
			want := &OutputError{Owner: 3, Conn: conn31, From: tt.from, To: tt.to, PeerEnd: 5*block + 10}
			var oe *OutputError
			if !errors.As(err, &oe) || !errors.Is(err, ErrDiverged) {
				t.Fatalf("Write(byte %d changed) error = %v, want an *OutputError", tt.flip, err)
			}
			if diff := cmp.Diff(want, oe); diff != "" {
				t.Errorf("OutputError (-want +got):\n%s", diff)
			}
			if _, err2 := c.Write([]byte{1}); err2 != err {
				t.Errorf("Write after a divergence = %v, want the same error", err2)
			}
		})
	}
}

// Changed bytes past what the peer has are new output, not a divergence.
func TestOutputCheckBeyondPeer(t *testing.T) {
	orig := stream(5, 3*MinBlock)
	c, _ := NewOutputCheck(1, 2, 0, 0, summaryOf(t, MinBlock, orig[:MinBlock+1]))
	regen := bytes.Clone(orig)
	regen[MinBlock+1] ^= 1
	fresh, err := c.Write(regen)
	if err != nil || !bytes.Equal(fresh, regen[MinBlock+1:]) {
		t.Errorf("Write = %d bytes, %v; want the %d bytes past the peer's end", len(fresh), err, len(regen)-MinBlock-1)
	}
}

func TestOutputCheckShort(t *testing.T) {
	orig := stream(6, 2*MinBlock)
	c, _ := NewOutputCheck(7, conn31, 0, 0, summaryOf(t, MinBlock, orig))
	if _, err := c.Write(orig[:MinBlock+3]); err != nil {
		t.Fatal(err)
	}
	err := c.Close()
	want := &OutputError{Owner: 7, Conn: conn31, From: MinBlock, To: MinBlock + 3, PeerEnd: 2 * MinBlock, Short: true}
	var oe *OutputError
	if !errors.As(err, &oe) || !cmp.Equal(oe, want) {
		t.Errorf("Close() after %d of %d bytes = %v, want %v", MinBlock+3, 2*MinBlock, err, want)
	}
}

// A sender restored from a checkpoint regenerates from its offset there,
// seeded with its hash there.
func TestOutputCheckFromCheckpoint(t *testing.T) {
	orig := stream(7, 4*MinBlock)
	peer := summaryOf(t, MinBlock, orig[:3*MinBlock])
	from := uint64(MinBlock + 100)
	c, err := NewOutputCheck(1, 2, from, HashOf(orig[:from]), peer)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := c.Write(orig[from:])
	if err != nil || !bytes.Equal(fresh, orig[3*MinBlock:]) {
		t.Errorf("Write from a checkpoint = %d fresh bytes, %v; want %d, nil", len(fresh), err, MinBlock)
	}
	if _, err := NewOutputCheck(1, 2, 3*MinBlock+1, 0, peer); err == nil {
		t.Errorf("NewOutputCheck(from past the peer's end) error = nil, want one")
	}
	if _, err := NewOutputCheck(1, 2, 0, 0, Summary{Block: 3}); err == nil {
		t.Errorf("NewOutputCheck(bad block) error = nil, want one")
	}
}

func TestSummaryRoundTrip(t *testing.T) {
	for _, s := range []Summary{
		{Block: MinBlock},
		{Block: MaxBlock, End: 1 << 40, Sum: 0x1234},
		summaryOf(t, MinBlock, stream(8, 5*MinBlock+1)),
		{Block: MinBlock, End: 3 * MinBlock, First: 3, Points: []Hash{7}},
	} {
		b, err := AppendSummary([]byte("p"), &s)
		if err != nil {
			t.Fatalf("AppendSummary(%+v) error: %v", s, err)
		}
		got, n, err := DecodeSummary(b[1:])
		if err != nil || n != len(b)-1 {
			t.Fatalf("DecodeSummary(AppendSummary(%+v)) = %d, %v", s, n, err)
		}
		if diff := cmp.Diff(s, got, equateEmpty); diff != "" {
			t.Errorf("round trip (-want +got):\n%s", diff)
		}
		for k := 1; k < len(b)-1; k++ {
			if _, _, err := DecodeSummary(b[1 : 1+k]); !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("DecodeSummary(%d of %d bytes) error = %v, want a truncation", k, len(b)-1, err)
			}
		}
	}
}

func TestDecodeSummaryBad(t *testing.T) {
	good, _ := AppendSummary(nil, &Summary{Block: MinBlock, End: 2 * MinBlock, First: 1, Points: []Hash{1, 2}})
	for _, tt := range []struct {
		name  string
		edit  func(b []byte)
		field string
	}{
		{"magic", func(b []byte) { b[1] = 'X' }, "magic"},
		{"version", func(b []byte) { b[4] = 2 }, "version"},
		{"block too small", func(b []byte) { b[5] = 11 }, "block (log2)"},
		{"block too large", func(b []byte) { b[5] = 63 }, "block (log2)"},
		{"reserved", func(b []byte) { b[7] = 1 }, "reserved"},
		{"reserved after count", func(b []byte) { b[39] = 1 }, "reserved"},
		{"points past end", func(b []byte) { b[8] = 1; b[9] = 0 }, "count (points past end)"},
		{"first zero", func(b []byte) { b[24] = 0 }, "first"},
	} {
		b := bytes.Clone(good)
		tt.edit(b)
		_, _, err := DecodeSummary(b)
		var fe *FormatError
		if !errors.As(err, &fe) || fe.Field != tt.field || !errors.Is(err, ErrFormat) {
			t.Errorf("%s: DecodeSummary error = %v, want a bad %q", tt.name, err, tt.field)
		}
	}
}

func FuzzDecodeSummary(f *testing.F) {
	for _, s := range []Summary{{Block: MinBlock}, {Block: MinBlock, End: 3 * MinBlock, First: 1, Points: []Hash{1, 2, 3}}} {
		b, _ := AppendSummary(nil, &s)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, n, err := DecodeSummary(b)
		if err != nil {
			var fe *FormatError
			if err != io.EOF && !errors.As(err, &fe) {
				t.Fatalf("DecodeSummary error %v is neither io.EOF nor a *FormatError", err)
			}
			return
		}
		again, err := AppendSummary(nil, &s)
		if err != nil || !bytes.Equal(again, b[:n]) {
			t.Fatalf("re-encoding = % x, %v; decoded from % x", again, err, b[:n])
		}
		// A check against any valid summary never panics.
		c, err := NewOutputCheck(1, 1, 0, 0, s)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(b)
		c.Close()
	})
}

// FuzzOutputCheck: identical bytes never diverge whatever the boundaries,
// and a changed byte below the peer's end always does (CRCs detect every
// change of one byte).
func FuzzOutputCheck(f *testing.F) {
	f.Add(uint64(1), uint16(5000), uint16(100), uint8(7), false)
	f.Add(uint64(2), uint16(0), uint16(1), uint8(1), true)
	f.Fuzz(func(t *testing.T, seed uint64, peerHas, flip uint16, maxChunk uint8, change bool) {
		orig := stream(seed, 3*MinBlock)
		has := int(peerHas) % (len(orig) + 1)
		c, err := NewOutputCheck(1, 1, 0, 0, summaryOf(t, MinBlock, orig[:has]))
		if err != nil {
			t.Fatal(err)
		}
		regen := bytes.Clone(orig)
		pos := int(flip) % len(orig)
		if change {
			regen[pos] ^= 0x80
		}
		var fresh []byte
		for _, ch := range chunks(rand.New(rand.NewPCG(seed, 1)), regen, int(maxChunk)+1) {
			fr, err := c.Write(ch)
			if err != nil {
				if !change || pos >= has {
					t.Fatalf("Write diverged (change %v at %d, peer has %d): %v", change, pos, has, err)
				}
				var oe *OutputError
				if !errors.As(err, &oe) || uint64(pos) < oe.From || uint64(pos) >= oe.To {
					t.Fatalf("divergence at byte %d reported as %v", pos, err)
				}
				return
			}
			fresh = append(fresh, fr...)
		}
		if change && pos < has {
			t.Fatalf("a change at byte %d (peer has %d) was not detected", pos, has)
		}
		if !bytes.Equal(fresh, regen[has:]) {
			t.Fatalf("fresh = %d bytes, want %d", len(fresh), len(regen)-has)
		}
	})
}

func BenchmarkStreamHash(b *testing.B) {
	buf := stream(1, 64<<10)
	h, _ := NewStreamHash(DefaultBlock, 0, 0)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		h.Write(buf)
	}
}

func BenchmarkOutputCheck(b *testing.B) {
	buf := stream(1, 64<<10)
	peer := Summary{Block: DefaultBlock, End: 1 << 62, Sum: 0}
	c, _ := NewOutputCheck(1, 1, 0, 0, peer)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		c.Write(buf)
	}
}
