package radicd

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/radic-project/radic/msglog"
	"github.com/radic-project/radic/observer"
	"github.com/radic-project/radic/observer/replayfile"
)

// The sweep at start removes the replay files of radicds and the log rings
// of processes that are gone, and nothing else.
func TestSweepReplayFiles(t *testing.T) {
	dir := t.TempDir()
	const gone = 1 << 30 // above any pid_max: no such process
	live := os.Getpid()
	names := map[string]bool{ // name: removed
		fmt.Sprintf("radic-replay-%d-e4be4f5e00000001-1", gone): true,
		fmt.Sprintf("radic-replay-%d-e4be4f5e00000001-1", live): false,
		fmt.Sprintf("radic-log.9f64e7f231560111.3.%d", gone):    true,
		fmt.Sprintf("radic-log.9f64e7f231560111.3.%d", live):    false,
		"radic-log.odd":    false,
		"radic-replay-x-1": false,
		"other-file-1":     false,
	}
	for n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sweepReplayFiles(slog.New(slog.DiscardHandler), dir, filepath.Join(dir, "missing"))
	ents, _ := os.ReadDir(dir)
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	for n, removed := range names {
		if slices.Contains(left, n) == removed {
			t.Errorf("%s: removed %v, want %v", n, !removed, removed)
		}
	}
}

// A rank's log in a local store (overlapping records, two connections and
// its determinants) becomes a replay file whose regions hold each stream
// exactly; with its tmpfs missing, the file goes to the state dir.
func TestPlaceReplayFile(t *testing.T) {
	st, err := openStores(t.TempDir(), msglog.Options{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const group, owner = 1, 0xe4be4f5e00000001
	g, err := st.get(group)
	if err != nil {
		t.Fatal(err)
	}
	dets, err := observer.AppendDeterminant(nil, &observer.Determinant{Kind: observer.KindRecv, Conn: 7, N: 6})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []msglog.Record{
		{Kind: msglog.KindData, Owner: owner, Stream: 7, Offset: 0, Payload: []byte("abcd")},
		{Kind: msglog.KindData, Owner: owner, Stream: 7, Offset: 2, Payload: []byte("cdef")},
		{Kind: msglog.KindData, Owner: owner, Stream: 9, Offset: 0, Payload: []byte("xyz")},
		{Kind: msglog.KindDeterminant, Owner: owner, Stream: observer.DeterminantStream, Payload: dets},
		{Kind: msglog.KindData, Owner: owner + 1, Stream: 7, Payload: []byte("other rank")},
	} {
		if err := g.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	state := t.TempDir()
	d := &Daemon{cfg: Config{Node: 0, StateDir: state}, stores: st, log: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		name, first, want string
	}{
		{"tmpfs", t.TempDir(), ""},
		{"tmpfs missing", filepath.Join(state, "no-such-dir"), state},
	} {
		if tc.want == "" {
			tc.want = tc.first
		}
		path, h, err := d.placeReplayFile(context.Background(), []string{tc.first, state}, "radic-replay-1-x-1", 0, group, owner)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if filepath.Dir(path) != tc.want {
			t.Errorf("%s: the file went to %s, want %s", tc.name, path, tc.want)
		}
		file, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := replayfile.Decode(file)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if d := cmp.Diff(h, got); d != "" {
			t.Errorf("%s: header (-returned +in the file):\n%s", tc.name, d)
		}
		for _, want := range []struct {
			r    replayfile.Region
			data string
		}{{got.Dets, string(dets)}, {got.Conns[0], "abcdef"}, {got.Conns[1], "xyz"}} {
			if b := string(want.r.Bytes(file)); b != want.data {
				t.Errorf("%s: stream %d holds %q, want %q", tc.name, want.r.Conn, b, want.data)
			}
		}
	}
	// Nothing logged: no file.
	if path, h, err := d.placeReplayFile(context.Background(), []string{state}, "radic-replay-1-y-1", 0, group, owner+9); err != nil || h != nil || path != "" {
		t.Errorf("an owner with nothing logged: %q, %v, %v; want no file", path, h, err)
	}
}
