// Package reexec is the exec checkpoint backend: re-execution from the
// launch records. Its checkpoint takes no image (the launch records are
// the whole of it, and radicd already keeps them with the protectors), and
// its restore hands each record to radicd's launcher (Target.Launch), which
// creates the rank as it was first created; the log is then replayed from
// its start. It works wherever radic runs, so it is the fallback when the
// criu backend is not usable, but it never lets a log shrink.
package reexec

import (
	"context"
	"errors"
	"fmt"

	"github.com/radic-project/radic/checkpoint"
	"github.com/radic-project/radic/internal/launch"
)

// Name is the backend's name.
const Name = "exec"

// Backend is the exec backend.
type Backend struct{}

var _ checkpoint.Backend = Backend{}

// Name implements checkpoint.Backend.
func (Backend) Name() string { return Name }

// Usable implements checkpoint.Backend: always.
func (Backend) Usable() error { return nil }

// Checkpoint implements checkpoint.Backend: the image is the group's launch
// records; no process is stopped or touched.
func (Backend) Checkpoint(_ context.Context, req checkpoint.Request) (*checkpoint.Image, error) {
	if len(req.Group.Launch) == 0 {
		return nil, errors.New("exec checkpoint: the group has no launch records")
	}
	if !req.LeaveRunning {
		return nil, errors.New("exec checkpoint: cannot stop a group for a migration (its image holds no state)")
	}
	return &checkpoint.Image{Backend: Name, Launch: append([]launch.Record(nil), req.Group.Launch...)}, nil
}

// Restore implements checkpoint.Backend: each launch record is launched
// again, in order; on an error the ranks already launched are the
// caller's to stop (their pids are returned with it).
func (Backend) Restore(ctx context.Context, img *checkpoint.Image, target checkpoint.Target) ([]int, error) {
	if img.Backend != Name {
		return nil, fmt.Errorf("exec restore: image of backend %q", img.Backend)
	}
	if target.Launch == nil {
		return nil, errors.New("exec restore: no launcher (Target.Launch)")
	}
	var pids []int
	for _, rec := range img.Launch {
		pid, err := target.Launch(ctx, rec)
		if err != nil {
			return pids, fmt.Errorf("exec restore: rank %d of job %s: %w", rec.Rank, rec.Job, err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}
