package reexec

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/radic-project/radic/checkpoint"
	"github.com/radic-project/radic/internal/launch"
)

func TestCheckpointIsTheLaunchRecordsAndRestoreRelaunchesThem(t *testing.T) {
	recs := []launch.Record{{Job: "j", Rank: 0, Argv: []string{"a"}}, {Job: "j", Rank: 2, Argv: []string{"b"}}}
	img, err := Backend{}.Checkpoint(context.Background(), checkpoint.Request{Group: checkpoint.Group{Node: 1, Roots: []int{10, 11}, Launch: recs}, LeaveRunning: true})
	if err != nil {
		t.Fatal(err)
	}
	var launched []int
	pids, err := Backend{}.Restore(context.Background(), img, checkpoint.Target{Launch: func(_ context.Context, r launch.Record) (int, error) {
		launched = append(launched, r.Rank)
		return 100 + r.Rank, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int{0, 2}, launched); diff != "" {
		t.Errorf("ranks launched (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{100, 102}, pids); diff != "" {
		t.Errorf("Restore pids (-want +got):\n%s", diff)
	}
}

func TestRestoreStopsAtTheFirstFailure(t *testing.T) {
	img := &checkpoint.Image{Backend: Name, Launch: []launch.Record{{Job: "j", Rank: 0}, {Job: "j", Rank: 1}, {Job: "j", Rank: 2}}}
	boom := errors.New("boom")
	pids, err := Backend{}.Restore(context.Background(), img, checkpoint.Target{Launch: func(_ context.Context, r launch.Record) (int, error) {
		if r.Rank == 1 {
			return 0, boom
		}
		return 7, nil
	}})
	if !errors.Is(err, boom) || len(pids) != 1 {
		t.Errorf("Restore = %v, %v; want [7] and the launcher's error", pids, err)
	}
}

func TestNoStopWithoutState(t *testing.T) {
	_, err := Backend{}.Checkpoint(context.Background(), checkpoint.Request{Group: checkpoint.Group{Launch: []launch.Record{{Job: "j"}}}})
	if err == nil {
		t.Error("exec Checkpoint without LeaveRunning succeeded: it would kill a group it cannot bring back with its state")
	}
}

func TestChooseFallsBackToExec(t *testing.T) {
	b, why := checkpoint.Choose(unusable{}, Backend{})
	if b == nil || b.Name() != Name || len(why) != 1 || !errors.Is(why[0], checkpoint.ErrUnusable) {
		t.Errorf("Choose(unusable, exec) = %v, %v; want exec and one reason", b, why)
	}
}

type unusable struct{ Backend }

func (unusable) Name() string  { return "never" }
func (unusable) Usable() error { return checkpoint.ErrUnusable }
