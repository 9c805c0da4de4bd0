package observer

import (
	"errors"
	"io"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/radic-project/radic/msglog"
)

// memSource serves a stream from memory, cut into records of at most cut
// bytes, starting at offset from.
type memSource struct {
	b    []byte
	off  uint64
	cut  int
	err  error // returned instead of io.EOF at the end, if set
	left []byte
}

func newMem(b []byte, from uint64, cut int) *memSource {
	if from > uint64(len(b)) {
		from = uint64(len(b))
	}
	return &memSource{b: b, off: from, cut: cut, left: b[from:]}
}

func (m *memSource) Next() (msglog.Record, error) {
	if len(m.left) == 0 {
		if m.err != nil {
			return msglog.Record{}, m.err
		}
		return msglog.Record{}, io.EOF
	}
	n := min(len(m.left), m.cut)
	r := msglog.Record{Kind: msglog.KindData, Offset: m.off, Payload: m.left[:n]}
	m.left, m.off = m.left[n:], m.off+uint64(n)
	return r, nil
}

func encodeAll(t *testing.T, ds ...Determinant) []byte {
	t.Helper()
	var b []byte
	for _, d := range ds {
		var err error
		if b, err = AppendDeterminant(b, &d); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// memLog is a process's log in memory: determinants and received bytes.
type memLog struct {
	dets []byte
	data map[uint64][]byte
	cut  int
}

func (l *memLog) replay(owner uint64, cp Checkpoint) *Replay {
	return NewReplay(owner, newMem(l.dets, cp.Determinants, l.cut), func(conn, from uint64) Source {
		b, ok := l.data[conn]
		if !ok {
			return nil
		}
		return newMem(b, from, l.cut)
	}, cp)
}

const conn32 = 3<<32 | 2

var server = netip.MustParseAddrPort("10.77.0.2:5000")

func TestReplayAnswers(t *testing.T) {
	dets := []Determinant{
		{Kind: KindValue, ValueCall: ValueGetpid, Value: []byte("1234")},
		{Kind: KindConnect, Errno: syscall.ECONNREFUSED, Peer: server},
		{Kind: KindConnect, Errno: syscall.ECONNREFUSED, Peer: server},
		{Kind: KindConnect, Conn: conn31, Peer: server},
		{Kind: KindAccept, Port: 6000, Conn: conn32},
		{Kind: KindReady, ReadyCall: ReadyPoll, Ready: []ReadyFd{{Fd: 4, Events: 1}}},
		{Kind: KindRecv, Conn: conn31, N: 5},
		{Kind: KindRecv, Conn: conn31, Errno: syscall.EAGAIN},
		{Kind: KindSend, Conn: conn32, N: 3},
		{Kind: KindRecv, Conn: conn32, N: 2},
		{Kind: KindRecv, Conn: conn31, N: 6},
	}
	for _, cut := range []int{1, 2, 7, 1000} {
		l := &memLog{dets: encodeAll(t, dets...), cut: cut, data: map[uint64][]byte{
			conn31: []byte("hello world!!"), // 11 delivered, 2 logged but not delivered
			conn32: []byte("ok"),
		}}
		r := l.replay(3, Checkpoint{})
		var got []Determinant
		var data []string
		step := func(d Determinant, err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("cut %d, determinant %d: %v", cut, len(got), err)
			}
			got = append(got, d)
		}
		step(r.Value(ValueGetpid, 0))
		step(r.Connect(server))
		step(r.Connect(server))
		step(r.Connect(server))
		step(r.Accept(6000))
		step(r.Ready(ReadyPoll))
		recv := func(conn uint64, size int) {
			t.Helper()
			d, b, err := r.Recv(conn, size)
			step(d, err)
			data = append(data, string(b))
		}
		recv(conn31, 100)
		recv(conn31, 100)
		step(r.Send(conn32, 10))
		recv(conn32, 2)
		recv(conn31, 6)
		if diff := cmp.Diff(dets, got, equateEmpty); diff != "" {
			t.Errorf("cut %d: answers (-want +got):\n%s", cut, diff)
		}
		if diff := cmp.Diff([]string{"hello", "", "ok", " world"}, data); diff != "" {
			t.Errorf("cut %d: received bytes (-want +got):\n%s", cut, diff)
		}
		// The log is exhausted: the next call runs live.
		if _, _, err := r.Recv(conn31, 100); err != ErrLive {
			t.Fatalf("cut %d: Recv after the log = %v, want ErrLive", cut, err)
		}
		if _, err := r.Ready(ReadyPoll); err != ErrLive {
			t.Errorf("cut %d: Ready after ErrLive = %v, want ErrLive", cut, err)
		}
		live, ok := r.Live()
		want := Live{Determinants: uint64(len(l.dets)), Replayed: uint64(len(dets)), Conns: []ConnState{
			{Conn: conn31, Delivered: 11, Logged: 13},
			{Conn: conn32, Delivered: 2, Sent: 3, Logged: 2},
		}}
		if diff := cmp.Diff(want, live); !ok || diff != "" {
			t.Errorf("cut %d: Live() (-want +got):\n%s", cut, diff)
		}
	}
}

func TestReplayDiverges(t *testing.T) {
	dets := []Determinant{
		{Kind: KindConnect, Conn: conn31, Peer: server},
		{Kind: KindRecv, Conn: conn31, N: 5},
	}
	log := func() *Replay {
		l := &memLog{dets: encodeAll(t, dets...), cut: 3, data: map[uint64][]byte{conn31: []byte("hello")}}
		r := l.replay(3, Checkpoint{})
		if _, err := r.Connect(server); err != nil {
			t.Fatal(err)
		}
		return r
	}
	offset := uint64(len(encodeAll(t, dets[0])))
	for _, tt := range []struct {
		name string
		call func(r *Replay) error
		msg  string
	}{
		{"other connection", func(r *Replay) error { _, _, err := r.Recv(conn32, 100); return err },
			"process 3 diverged at determinant 1 (determinant stream offset 14): it called recv on connection 3:2 (up to 100 bytes), the log has recv on connection 3:1 returned 5"},
		{"smaller buffer", func(r *Replay) error { _, _, err := r.Recv(conn31, 4); return err },
			"it called recv on connection 3:1 (up to 4 bytes), the log has recv on connection 3:1 returned 5"},
		{"another call", func(r *Replay) error { _, err := r.Send(conn31, 5); return err },
			"it called send on connection 3:1 (5 bytes), the log has recv"},
		{"poll", func(r *Replay) error { _, err := r.Ready(ReadySelect); return err }, "it called select, the log has recv"},
		{"value", func(r *Replay) error { _, err := r.Value(ValueGethostname, 0); return err }, "it called gethostname(0)"},
		{"connect", func(r *Replay) error { _, err := r.Connect(netip.MustParseAddrPort("10.0.0.9:1")); return err }, "it called connect to 10.0.0.9:1"},
		{"accept", func(r *Replay) error { _, err := r.Accept(1); return err }, "it called accept on port 1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := log()
			err := tt.call(r)
			var pe *PathError
			if !errors.As(err, &pe) || !errors.Is(err, ErrDiverged) {
				t.Fatalf("error = %v, want a *PathError", err)
			}
			if pe.Owner != 3 || pe.Index != 1 || pe.Offset != offset || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error = %v (owner %d, index %d, offset %d); want owner 3, index 1, offset %d, with %q", err, pe.Owner, pe.Index, pe.Offset, offset, tt.msg)
			}
			if _, _, err2 := r.Recv(conn31, 5); err2 != err {
				t.Errorf("call after a divergence = %v, want the same error", err2)
			}
			if _, ok := r.Live(); ok {
				t.Errorf("Live() ok after a divergence")
			}
		})
	}
}

func TestReplayIncompleteLog(t *testing.T) {
	full := encodeAll(t, Determinant{Kind: KindRecv, Conn: conn31, N: 5}, Determinant{Kind: KindRecv, Conn: conn31, N: 5})
	for _, tt := range []struct {
		name string
		l    *memLog
		msg  string
	}{
		{"data missing", &memLog{dets: full, cut: 2, data: map[uint64][]byte{conn31: []byte("hello wor")}},
			"observer: log incomplete: replay of process 3: determinant 1 (recv on connection 3:1 returned 5) needs bytes [5, 10) of connection 3:1: stream ends at offset 9, 1 bytes short"},
		{"determinant cut", &memLog{dets: full[:len(full)-1], cut: 2, data: map[uint64][]byte{conn31: []byte("hello world")}},
			"observer: log incomplete: replay of process 3: the determinant stream ends inside a determinant at offset 8: observer: determinant recv: truncated in field n"},
	} {
		r := tt.l.replay(3, Checkpoint{})
		_, _, err := r.Recv(conn31, 10)
		if err != nil {
			t.Fatalf("%s: first Recv: %v", tt.name, err)
		}
		_, _, err = r.Recv(conn31, 10)
		if !errors.Is(err, ErrIncomplete) || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: second Recv error = %v, want ErrIncomplete with %q", tt.name, err, tt.msg)
		}
	}

	// Garbage in the determinant stream, and a failing source.
	r := (&memLog{dets: []byte{0x1f}, cut: 9}).replay(3, Checkpoint{})
	if _, err := r.Ready(ReadyPoll); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "determinant stream offset 0") {
		t.Errorf("Ready on garbage = %v, want ErrFormat at offset 0", err)
	}
	boom := errors.New("disk on fire")
	src := newMem(full[:3], 0, 1)
	src.err = boom
	r = NewReplay(3, src, func(uint64, uint64) Source { return nil }, Checkpoint{})
	if _, _, err := r.Recv(conn31, 10); !errors.Is(err, boom) {
		t.Errorf("Recv with a failing source = %v, want it wrapped", err)
	}
}

// A connection whose bytes are not logged (inside the checkpoint group):
// the replay gives the count, the caller reads them live.
func TestReplayUnlogged(t *testing.T) {
	l := &memLog{dets: encodeAll(t, Determinant{Kind: KindRecv, Conn: conn31, N: 4}), cut: 100, data: map[uint64][]byte{}}
	r := l.replay(3, Checkpoint{})
	d, data, err := r.Recv(conn31, 10)
	if err != nil || d.N != 4 || data != nil {
		t.Fatalf("Recv(unlogged) = %v, %q, %v; want N 4, no data", &d, data, err)
	}
	r.Recv(conn31, 1)
	live, _ := r.Live()
	if diff := cmp.Diff([]ConnState{{Conn: conn31, Delivered: 4, Logged: 4, Unlogged: true}}, live.Conns); diff != "" {
		t.Errorf("Live().Conns (-want +got):\n%s", diff)
	}
}

// A replay from a checkpoint starts at its offsets.
func TestReplayFromCheckpoint(t *testing.T) {
	first := encodeAll(t, Determinant{Kind: KindRecv, Conn: conn31, N: 3})
	l := &memLog{dets: append(first, encodeAll(t, Determinant{Kind: KindRecv, Conn: conn31, N: 2})...), cut: 1,
		data: map[uint64][]byte{conn31: []byte("abcde")}}
	r := l.replay(3, Checkpoint{Determinants: uint64(len(first)), Conns: []ConnState{{Conn: conn31, Delivered: 3, Sent: 7}}})
	d, data, err := r.Recv(conn31, 10)
	if err != nil || string(data) != "de" {
		t.Fatalf("Recv from a checkpoint = %v, %q, %v; want \"de\"", &d, data, err)
	}
	r.Recv(conn31, 10)
	live, _ := r.Live()
	if diff := cmp.Diff(Live{Determinants: uint64(len(l.dets)), Replayed: 1, Conns: []ConnState{{Conn: conn31, Delivered: 5, Sent: 7, Logged: 5}}}, live); diff != "" {
		t.Errorf("Live() (-want +got):\n%s", diff)
	}
}

// An empty log goes live at the first call.
func TestReplayEmpty(t *testing.T) {
	r := (&memLog{cut: 1}).replay(3, Checkpoint{})
	if _, err := r.Value(ValueGetpid, 0); err != ErrLive {
		t.Fatalf("first call on an empty log = %v, want ErrLive", err)
	}
	if live, ok := r.Live(); !ok || !cmp.Equal(live, Live{}) {
		t.Errorf("Live() = %+v, %v; want zero, true", live, ok)
	}
}

func TestStreamKeys(t *testing.T) {
	if k, err := DataKey(3, conn31); err != nil || k != (msglog.Key{Owner: 3, Stream: conn31}) {
		t.Errorf("DataKey(3, 3:1) = %v, %v", k, err)
	}
	if _, err := DataKey(3, DeterminantStream); !errors.Is(err, ErrReservedConn) {
		t.Errorf("DataKey(3, 2^64-1) error = %v, want ErrReservedConn", err)
	}
	if k := DeterminantKey(3); k != (msglog.Key{Owner: 3, Stream: DeterminantStream}) {
		t.Errorf("DeterminantKey(3) = %v", k)
	}
}

// A source whose records are not contiguous is refused.
type gapSource struct{ n int }

func (g *gapSource) Next() (msglog.Record, error) {
	g.n++
	return msglog.Record{Offset: uint64(g.n * 10), Payload: []byte{0x11}}, nil
}

func TestReplayGap(t *testing.T) {
	r := NewReplay(3, &gapSource{}, func(uint64, uint64) Source { return nil }, Checkpoint{})
	if _, err := r.Ready(ReadyPoll); err == nil || !strings.Contains(err.Error(), "not contiguous") {
		t.Errorf("Ready over a gap = %v, want a contiguity error", err)
	}
}

// FuzzReplay: a replay over any determinant stream, cut anywhere, asked
// any calls, never panics; it answers, diverges, goes live or reports a
// bad log.
func FuzzReplay(f *testing.F) {
	var seed []byte
	for _, d := range samples {
		seed, _ = AppendDeterminant(seed, &d)
	}
	f.Add(seed, []byte("hello world"), uint8(3), []byte{0, 1, 2, 3, 4, 5, 0, 0})
	f.Fuzz(func(t *testing.T, dets, data []byte, cut uint8, calls []byte) {
		l := &memLog{dets: dets, cut: int(cut) + 1, data: map[uint64][]byte{conn31: data}}
		r := l.replay(3, Checkpoint{})
		for _, c := range calls {
			var err error
			switch c % 7 {
			case 0:
				_, _, err = r.Recv(conn31, int(c))
			case 1:
				_, err = r.Send(conn31, int(c))
			case 2:
				_, err = r.Connect(netip.AddrPort{})
			case 3:
				_, err = r.Accept(uint16(c))
			case 4:
				_, err = r.Ready(ReadyCall(c%4 + 1))
			case 5:
				_, err = r.Value(ValueCall(c%5+1), 0)
			case 6:
				_, _, err = r.Recv(0, 1<<20)
			}
			if err != nil {
				if _, ok := r.Live(); ok != (err == ErrLive) {
					t.Fatalf("error %v with Live() ok = %v", err, ok)
				}
				return
			}
		}
	})
}

// BenchmarkReplayRecv: the replay core's cost per byte, over records of
// 64 KiB in memory, answering receives of 16 KiB.
func BenchmarkReplayRecv(b *testing.B) {
	const size, total = 16 << 10, 64 << 20
	var dets []byte
	for range total / size {
		dets, _ = AppendDeterminant(dets, &Determinant{Kind: KindRecv, Conn: conn31, N: size})
	}
	data := make([]byte, total)
	b.SetBytes(total)
	for b.Loop() {
		r := (&memLog{dets: dets, cut: 64 << 10, data: map[uint64][]byte{conn31: data}}).replay(3, Checkpoint{})
		for {
			if _, _, err := r.Recv(conn31, size); err != nil {
				if err != ErrLive {
					b.Fatal(err)
				}
				break
			}
		}
	}
}
