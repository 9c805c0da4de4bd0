package radicd

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The sweep at start removes the replay files of radicds and the log rings
// of processes that are gone, and nothing else.
func TestSweepReplayFiles(t *testing.T) {
	dir := t.TempDir()
	old := replayDir
	replayDir = dir
	defer func() { replayDir = old }()
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
	sweepReplayFiles(slog.New(slog.DiscardHandler))
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
