package heartbeat

import (
	"errors"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func sampleMessage() Message {
	return Message{
		Type: MsgProbeResp, From: 3, To: 7, FromInc: 1 << 40, Seq: 99,
		Target: 5, TargetInc: 12, Origin: 7, Nonce: 0xdeadbeef, Fenced: true, Spare: true,
		View: []Entry{{ID: 0, Inc: 4, State: Alive, Role: RoleActive}, {ID: 5, Inc: 12, State: Dead, Role: RoleSpare}},
	}
}

func TestWireRoundTrip(t *testing.T) {
	m := sampleMessage()
	b := m.Append(nil)
	if len(b) != m.Length() {
		t.Fatalf("len(Append()) = %d, Length() = %d", len(b), m.Length())
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(m, got); diff != "" {
		t.Errorf("Decode(Append(m)) (-want +got):\n%s", diff)
	}
}

func TestWireTruncation(t *testing.T) {
	m := sampleMessage()
	b := m.Append(nil)
	for i := range len(b) {
		_, err := Decode(b[:i])
		want := io.ErrUnexpectedEOF
		if i == 0 {
			want = io.EOF
		}
		if !errors.Is(err, want) {
			t.Errorf("Decode(%d of %d bytes) = %v, want %v", i, len(b), err, want)
		}
	}
	if _, err := Decode(append(b, 0)); !errors.Is(err, ErrBadMessage) {
		t.Errorf("Decode(trailing byte) = %v, want ErrBadMessage", err)
	}
}

func TestMaxDatagram(t *testing.T) {
	m := Message{Type: MsgHeartbeat, View: make([]Entry, MaxViewEntries)}
	if n := len(m.Append(nil)); n > 1400 || n != MaxDatagram {
		t.Errorf("largest datagram %d bytes, want %d <= 1400", n, MaxDatagram)
	}
}

func FuzzDecode(f *testing.F) {
	m := sampleMessage()
	f.Add(m.Append(nil))
	f.Add([]byte("RH\x01\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			return
		}
		again := m.Append(nil)
		if !cmp.Equal(again, b) {
			t.Fatalf("Append(Decode(b)) != b\n%x\n%x", again, b)
		}
	})
}
