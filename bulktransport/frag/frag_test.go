package frag

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

var t0 = time.Unix(1000, 0)

func split(t testing.TB, s *Sender, msg []byte) [][]byte {
	var out [][]byte
	if err := s.Split(msg, func(f []byte) { out = append(out, bytes.Clone(f)) }); err != nil {
		t.Fatal(err)
	}
	return out
}

// Fragmentation: a datagram of n bytes takes ceil(n/232) fragments, each
// fitting one 240-byte torus payload, and the largest is 64 KiB.
func TestSplitSizes(t *testing.T) {
	var s Sender
	for _, n := range []int{0, 1, FragData, FragData + 1, MaxDatagram} {
		frags := split(t, &s, make([]byte, n))
		if len(frags) != Count(n) {
			t.Errorf("Split(%d bytes) = %d fragments, want %d", n, len(frags), Count(n))
		}
		for _, f := range frags {
			if len(f) > 240 {
				t.Errorf("fragment of %d bytes", len(f))
			}
		}
	}
	if err := s.Split(make([]byte, MaxDatagram+1), func([]byte) {}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Split(64 KiB + 1) = %v, want ErrTooLarge", err)
	}
}

// Reassembly with many senders to one receiver: 32 senders all using the
// same msgids, fragments interleaved in a seeded random order with
// duplicates; every datagram arrives intact, nothing that was not sent
// is delivered, and late duplicates leave only partials that expire.
// (frag is unreliable like UDP: a datagram whose every fragment was
// duplicated may be delivered twice; delta-t suppresses that.)
func TestManySendersOneReceiver(t *testing.T) {
	rng := testenv.Rand(t)
	type frag struct {
		src uint32
		b   []byte
	}
	var all []frag
	want := map[[2]uint32][]byte{} // (src, n) -> datagram
	for src := range uint32(32) {
		var s Sender // every sender starts at msgid 0: keys collide unless src is used
		for n := range uint32(3) {
			msg := make([]byte, 1+rng.IntN(MaxDatagram))
			for i := range msg {
				msg[i] = byte(src) ^ byte(n<<4) ^ byte(i)
			}
			want[[2]uint32{src, n}] = msg
			for _, f := range split(t, &s, msg) {
				all = append(all, frag{src, f})
				if rng.IntN(10) == 0 {
					all = append(all, frag{src, f})
				}
			}
		}
	}
	sent := maps.Clone(want)
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	r := NewReassembler()
	r.MaxPending = 1 << 30
	got := 0
	for _, f := range all {
		msg, done, err := r.Step(t0, f.src, f.b)
		if err != nil {
			t.Fatal(err)
		}
		if !done {
			continue
		}
		got++
		found := false
		for n := range uint32(3) {
			if bytes.Equal(msg, sent[[2]uint32{f.src, n}]) {
				delete(want, [2]uint32{f.src, n})
				found = true
			}
		}
		if !found {
			t.Fatalf("sender %d: delivered a %d-byte datagram that was never sent", f.src, len(msg))
		}
	}
	if len(want) != 0 {
		t.Fatalf("%d datagrams not delivered", len(want))
	}
	if r.Tick(t0.Add(r.Timeout)); r.Pending() != 0 {
		t.Fatalf("%d partials left after the timeout", r.Pending())
	}
}

// A lost fragment loses the datagram; its partial state is dropped after
// Timeout and the receiver holds nothing.
func TestPartialExpires(t *testing.T) {
	var s Sender
	frags := split(t, &s, make([]byte, 1000))
	r := NewReassembler()
	for _, f := range frags[1:] {
		r.Step(t0, 1, f)
	}
	if r.Pending() != 1 {
		t.Fatalf("pending %d", r.Pending())
	}
	if next := r.Tick(t0.Add(DefaultTimeout - 1)); r.Pending() != 1 || !next.Equal(t0.Add(DefaultTimeout)) {
		t.Fatalf("expired early (next %v)", next)
	}
	if next := r.Tick(t0.Add(DefaultTimeout)); r.Pending() != 0 || !next.IsZero() || r.pending != nil || r.held != 0 {
		t.Fatalf("not expired: pending %d held %d", r.Pending(), r.held)
	}
}

// The pending-bytes bound refuses a new datagram rather than growing.
func TestMaxPending(t *testing.T) {
	var s Sender
	r := NewReassembler()
	r.MaxPending = MaxDatagram
	a := split(t, &s, make([]byte, MaxDatagram))
	b := split(t, &s, make([]byte, 1000))
	r.Step(t0, 1, a[0])
	if _, _, err := r.Step(t0, 1, b[0]); err != nil || r.Pending() != 1 || r.Stats.Refused != 1 {
		t.Fatalf("pending %d refused %d", r.Pending(), r.Stats.Refused)
	}
}

// A one-fragment datagram is handed up by reference: no copy.
func TestSingleFragmentByReference(t *testing.T) {
	var s Sender
	f := split(t, &s, []byte("short"))[0]
	msg, done, _ := NewReassembler().Step(t0, 1, f)
	if !done || &msg[0] != &f[HeaderLen] {
		t.Fatal("single-fragment datagram was copied")
	}
}

func TestDecodeTruncation(t *testing.T) {
	f := AppendFragment(nil, 7, make([]byte, 500), 2)
	for n := range len(f) {
		_, _, err := Decode(f[:n])
		want := io.ErrUnexpectedEOF
		if n == 0 {
			want = io.EOF
		}
		if !errors.Is(err, want) {
			t.Errorf("Decode(%d of %d bytes) = %v, want %v", n, len(f), err, want)
		}
	}
	bad := AppendFragment(nil, 7, make([]byte, 500), 2)
	bad[3] = 3 // index beyond the last fragment
	if _, _, err := Decode(bad); !errors.Is(err, ErrBadFragment) {
		t.Errorf("index 3 of 3: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(AppendFragment(nil, 1, make([]byte, 300), 1))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, data, err := Decode(b)
		if err != nil {
			return
		}
		if _, n := span(int(h.Index), int(h.Total)); len(data) != n || len(data) > FragData {
			t.Fatalf("%+v with %d bytes", h, len(data))
		}
	})
}

// FuzzReassembler feeds arbitrary fragments from a few senders: it never
// panics, never holds more than MaxPending, and every datagram it delivers
// has the length its fragments announced.
func FuzzReassembler(f *testing.F) {
	var seed []byte
	for _, fr := range split(f, new(Sender), make([]byte, 600)) {
		seed = append(seed, byte(len(fr)))
		seed = append(seed, fr...)
	}
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewReassembler()
		r.MaxPending = 8 << 10
		now := t0
		for len(b) > 1 {
			n := min(int(b[0]), len(b)-1)
			fr := b[1 : 1+n]
			src := uint32(b[0] & 3)
			b = b[1+n:]
			msg, done, err := r.Step(now, src, fr)
			if done {
				h, _, _ := Decode(fr)
				if err != nil || len(msg) != int(h.Total) {
					t.Fatalf("delivered %d bytes of a %d-byte datagram", len(msg), h.Total)
				}
			}
			if r.held > r.MaxPending {
				t.Fatalf("holding %d bytes", r.held)
			}
			now = now.Add(time.Millisecond)
			r.Tick(now)
		}
	})
}

func BenchmarkReassemble64K(b *testing.B) {
	var s Sender
	frags := split(b, &s, make([]byte, MaxDatagram))
	r := NewReassembler()
	b.SetBytes(MaxDatagram)
	b.ReportAllocs()
	for b.Loop() {
		for _, f := range frags {
			r.Step(t0, 1, f)
		}
	}
}

// Partials' timers are in a heap: NextTick looks at none of them and
// Tick only at those due. With 50 partials begun 1 ms apart, NextTick
// after every fragment looks at none, and a Tick when the first is due
// expires it alone, looking at it alone.
func TestTimersVisitOnlyDue(t *testing.T) {
	r := NewReassembler()
	var s Sender
	for i := range 50 {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		f := split(t, &s, make([]byte, 1000))
		r.Step(now, uint32(i), f[0])
		if next := r.NextTick(); !next.Equal(t0.Add(r.Timeout)) {
			t.Fatalf("NextTick = %v, want the first partial's expiry", next.Sub(t0))
		}
	}
	if r.visits != 0 {
		t.Fatalf("50 fragments and NextTicks looked at %d partials", r.visits)
	}
	next := r.Tick(t0.Add(r.Timeout))
	if r.visits != 1 || r.Pending() != 49 || r.Stats.Expired != 1 || !next.Equal(t0.Add(r.Timeout+time.Millisecond)) {
		t.Fatalf("Tick with one due looked at %d partials, left %d, next %v", r.visits, r.Pending(), next.Sub(t0))
	}
}
