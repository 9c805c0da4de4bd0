package observer

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	msgrec "github.com/radic-project/radic/msglog/record"
)

func dets(t *testing.T, ds ...Determinant) []byte {
	t.Helper()
	var b []byte
	for i := range ds {
		var err error
		if b, err = AppendDeterminant(b, &ds[i]); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func TestSplitReceives(t *testing.T) {
	const c1, c2 = 1<<32 | 0, 2<<32 | 5
	d := dets(t,
		Determinant{Kind: KindRecv, Conn: c1, N: 3},
		Determinant{Kind: KindRecv, Conn: c2, Errno: syscall.EAGAIN},
		Determinant{Kind: KindRecv, Conn: c1, N: 2},
		Determinant{Kind: KindRecv, Conn: c2, N: 1},
		Determinant{Kind: KindRecv, Conn: c1},
	)
	recs := []msgrec.Record{
		{Kind: msgrec.KindData, Stream: c1, Offset: 0, Payload: []byte("abc")},
		{Kind: msgrec.KindData, Stream: c1, Offset: 2, Payload: []byte("cdefg")}, // overlap, and 2 bytes past the counts
		{Kind: msgrec.KindDeterminant, Stream: DeterminantStream, Offset: 0, Payload: d[:4]},
		{Kind: msgrec.KindDeterminant, Stream: DeterminantStream, Offset: 4, Payload: d[4:]},
		{Kind: msgrec.KindData, Stream: c2, Offset: 0, Payload: []byte("z")},
	}
	got, err := SplitReceives(recs)
	if err != nil {
		t.Fatal(err)
	}
	want := &ReceiveLog{DetLen: uint64(len(d)), Conns: map[uint64]*ConnReceives{
		c1: {Data: []byte("abcdefg"), Results: []int64{3, 2, 0}},
		c2: {Data: []byte("z"), Results: []int64{-int64(syscall.EAGAIN), 1}},
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("SplitReceives (-want +got):\n%s", diff)
	}
}

// A connection the earlier run made or accepted is in the log even if
// nothing was received on it: its peer holds it, and the restarted process
// must resume it (TestReplayDivergence: rank 1 killed after its connect,
// before its first receive, opened a second connection 1:0 that its peer
// never took).
func TestSplitReceivesConnections(t *testing.T) {
	const c1, c2, c3, c4 = 1<<32 | 0, 2<<32 | 3, 3<<32 | 0, 4<<32 | 1
	d := dets(t,
		Determinant{Kind: KindConnect, Conn: c1, Peer: netip.MustParseAddrPort("10.1.0.1:20100")},
		Determinant{Kind: KindAccept, Conn: c4, Port: 20200},
		Determinant{Kind: KindConnect, Conn: 9, Errno: syscall.ECONNREFUSED},
		Determinant{Kind: KindAccept, Port: 20200, Errno: syscall.EAGAIN},
		Determinant{Kind: KindAccept, Conn: c3, Port: 20300},
		Determinant{Kind: KindReady, ReadyCall: ReadyPoll, Ready: []ReadyFd{{Fd: 4, Events: 1}}},
		Determinant{Kind: KindAccept, Conn: c2, Port: 20200},
		Determinant{Kind: KindReady, ReadyCall: ReadyPoll, Errno: syscall.EINTR},
	)
	got, err := SplitReceives([]msgrec.Record{{Kind: msgrec.KindDeterminant, Stream: DeterminantStream, Payload: d}})
	if err != nil {
		t.Fatal(err)
	}
	want := &ReceiveLog{DetLen: uint64(len(d)), Conns: map[uint64]*ConnReceives{c1: {}, c2: {}, c3: {}, c4: {}},
		// In accept order, per port (not in id order); a failed accept
		// returned no connection.
		Accepts: map[uint16][]uint64{20200: {c4, c2}, 20300: {c3}},
		// Connects, made and failed, in call order.
		Connects: []Determinant{
			{Kind: KindConnect, Conn: c1, Peer: netip.MustParseAddrPort("10.1.0.1:20100")},
			{Kind: KindConnect, Conn: 9, Errno: syscall.ECONNREFUSED},
		},
		// Polls in call order.
		Ready: []Determinant{
			{Kind: KindReady, ReadyCall: ReadyPoll, Ready: []ReadyFd{{Fd: 4, Events: 1}}},
			{Kind: KindReady, ReadyCall: ReadyPoll, Errno: syscall.EINTR},
		}}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
		t.Errorf("SplitReceives (-want +got):\n%s", diff)
	}
}

// The identity the first run logged is the log's; a later one (a process
// restarted twice logs none, but a log may hold two) does not replace it.
// A connection's bytes come from ReceivesFrom's data as they are.
func TestReceivesFromIdentity(t *testing.T) {
	d := dets(t,
		Determinant{Kind: KindValue, ValueCall: ValueGetpid, Value: []byte{1, 2, 3, 4, 0, 0, 0, 0}},
		Determinant{Kind: KindValue, ValueCall: ValueGethostname, Value: []byte("n1")},
		Determinant{Kind: KindRecv, Conn: 5, N: 3},
		Determinant{Kind: KindValue, ValueCall: ValueGethostname, Value: []byte("n2")},
	)
	data := []byte("abc")
	got, err := ReceivesFrom(d, map[uint64][]byte{5: data})
	if err != nil {
		t.Fatal(err)
	}
	want := &ReceiveLog{DetLen: uint64(len(d)), Conns: map[uint64]*ConnReceives{5: {Data: data, Results: []int64{3}}},
		Identity: map[ValueCall][]byte{ValueGetpid: {1, 2, 3, 4, 0, 0, 0, 0}, ValueGethostname: []byte("n1")}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ReceivesFrom (-want +got):\n%s", diff)
	}
	if &got.Conns[5].Data[0] != &data[0] {
		t.Errorf("ReceivesFrom copied a connection's bytes")
	}
	// Other values (a socket's name) are not replayed yet: refused.
	bad := dets(t, Determinant{Kind: KindValue, ValueCall: ValueGetsockname, Ref: 5, Value: []byte("x")})
	if _, err := ReceivesFrom(bad, nil); !errors.Is(err, ErrReceiveLog) {
		t.Errorf("ReceivesFrom(getsockname value) = %v, want ErrReceiveLog", err)
	}
}

func TestSplitReceivesRefuses(t *testing.T) {
	const c1 = 7
	for _, tc := range []struct {
		name string
		recs []msgrec.Record
	}{
		{"gap", []msgrec.Record{{Kind: msgrec.KindData, Stream: c1, Offset: 1, Payload: []byte("x")}}},
		{"count past data", []msgrec.Record{
			{Kind: msgrec.KindData, Stream: c1, Payload: []byte("ab")},
			{Kind: msgrec.KindDeterminant, Stream: DeterminantStream, Payload: dets(t, Determinant{Kind: KindRecv, Conn: c1, N: 3})},
		}},
		{"not a receive", []msgrec.Record{
			{Kind: msgrec.KindDeterminant, Stream: DeterminantStream, Payload: dets(t, Determinant{Kind: KindSend, Conn: c1, N: 3})},
		}},
		{"truncated determinant", []msgrec.Record{
			{Kind: msgrec.KindDeterminant, Stream: DeterminantStream, Payload: dets(t, Determinant{Kind: KindRecv, Conn: c1, N: 300})[:3]},
		}},
		{"launch record", []msgrec.Record{{Kind: msgrec.KindLaunch, Stream: 1}}},
	} {
		if _, err := SplitReceives(tc.recs); !errors.Is(err, ErrReceiveLog) {
			t.Errorf("%s: SplitReceives = %v, want ErrReceiveLog", tc.name, err)
		}
	}
}

// FuzzSplitReceives: any decoded records give a log or ErrReceiveLog,
// never a panic, and the counts never exceed the data.
func FuzzSplitReceives(f *testing.F) {
	f.Add([]byte{0x11, 0x07, 0x00, 0x02}, []byte("ab"), uint8(0))
	f.Fuzz(func(t *testing.T, det, data []byte, off uint8) {
		recs := []msgrec.Record{
			{Kind: msgrec.KindData, Stream: 7, Offset: uint64(off % 4), Payload: data},
			{Kind: msgrec.KindDeterminant, Stream: DeterminantStream, Payload: det},
		}
		log, err := SplitReceives(recs)
		if err != nil {
			if !errors.Is(err, ErrReceiveLog) {
				t.Fatalf("error %v does not wrap ErrReceiveLog", err)
			}
			return
		}
		for conn, c := range log.Conns {
			var n int64
			for _, r := range c.Results {
				n += max(r, 0)
			}
			if n > int64(len(c.Data)) {
				t.Fatalf("connection %d: counts %d > %d bytes", conn, n, len(c.Data))
			}
		}
	})
}
