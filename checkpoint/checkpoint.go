package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/radic-project/radic/checkpoint/image"
	"github.com/radic-project/radic/internal/launch"
)

// A Backend checkpoints a node's group of processes and restores it.
//
// A backend is safe for concurrent use by several goroutines, but a group
// is checkpointed or restored by one call at a time (radicd's checkpoint
// routine of the node owns its group).
type Backend interface {
	// Name is the backend's name: "exec", "criu".
	Name() string
	// Usable is nil when the backend can work on this node, else why not
	// (wrapping ErrUnusable). Callers fall back to another backend then.
	Usable() error
	// Checkpoint takes one image of the whole group: a consistent cut of
	// all its processes together.
	Checkpoint(ctx context.Context, req Request) (*Image, error)
	// Restore starts the group again from img and returns the pids of its
	// restored (or re-executed) root processes, in the order of
	// img.Launch / the group's roots.
	Restore(ctx context.Context, img *Image, target Target) ([]int, error)
}

// Group is one node's processes, checkpointed and restored together
// (DESIGN.md contract 7: semi-coordinated checkpoints).
type Group struct {
	Node int
	// Roots are the group's process trees (a node's ranks); each root and
	// all its descendants are in the image.
	Roots []int
	// Launch are the ranks' launch records, what the exec backend
	// restores from; the criu backend keeps them in the image too, so a
	// restore knows which rank each root was.
	Launch []launch.Record
}

// Request asks for one checkpoint.
type Request struct {
	Group Group
	// Dir is where the image is written: a directory that does not exist
	// yet, beside Parent's (images of a group are sibling directories of
	// one store). Unused by the exec backend.
	Dir string
	// Parent is the group's previous complete image, or nil. Data it
	// already holds is referenced, not written again (incremental).
	Parent *Image
	// LeaveRunning keeps the group running after the checkpoint (the
	// periodic case); otherwise its processes are killed once the image is
	// complete (a migration).
	LeaveRunning bool
}

// Target says where a group is restored.
type Target struct {
	// Cgroup is the cgroup v2 directory the restored processes are created
	// in (the node's job cgroup, which fencing kills); "" keeps the
	// caller's.
	Cgroup string
	// NetNS is a network namespace file (/proc/PID/ns/net, /run/netns/X)
	// the processes are restored into; "" keeps the caller's.
	NetNS string
	// Inherit hands files of the restorer to the restored processes in
	// place of files that were outside the group at checkpoint time (the
	// rank's output pipes to radicd): key is the image's name for the
	// file, as recorded in image.Proc.Fds ("pipe:[1234]").
	Inherit map[string]*os.File
	// Launch re-creates a rank from its launch record (radicd's launcher)
	// and returns its pid; the exec backend's only way to restore.
	Launch func(ctx context.Context, rec launch.Record) (int, error)
}

// Image is a complete checkpoint of a group.
type Image struct {
	Backend string
	// Dir holds the image (criu); "" for exec, whose image is the launch
	// records alone.
	Dir string
	// Manifest describes Dir's contents (criu); nil for exec.
	Manifest *image.Manifest
	// Launch are the group's launch records at checkpoint time.
	Launch []launch.Record
	// Stats says what taking it cost (zero for an image read back).
	Stats Stats
}

// Stats is what one checkpoint cost.
type Stats struct {
	Dump      time.Duration // the group stopped or frozen, CRIU dumping
	Pack      time.Duration // compressing and checksumming into the image
	Bytes     int64         // the raw dump
	PackBytes int64         // stored for this image (new data, compressed)
}

// ErrUnusable wraps every reason a backend cannot work on this node.
var ErrUnusable = errors.New("checkpoint: backend unusable")

// PidsInUseError says a restore cannot run because pids that the image's
// processes must have again are taken on this node.
type PidsInUseError struct {
	Image string
	InUse []PidUse
}

// PidUse is one pid of an image that a live process holds.
type PidUse struct {
	Pid  int
	Comm string // the holder's command name
}

func (e *PidsInUseError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "restore %s: %d pid(s) of the image are in use on this node:", e.Image, len(e.InUse))
	for i, u := range e.InUse {
		if i == 8 {
			fmt.Fprintf(&b, " and %d more", len(e.InUse)-i)
			break
		}
		fmt.Fprintf(&b, " %d (held by %q)", u.Pid, u.Comm)
	}
	b.WriteString("; processes are restored with the pids they had, so restore where those pids are free (a node with its own pid namespace) or once their holders have ended")
	return b.String()
}

// Choose returns the first usable backend of bs and, for every one passed
// over, why: the caller logs them (exec is the last resort and always
// usable).
func Choose(bs ...Backend) (Backend, []error) {
	var why []error
	for _, b := range bs {
		err := b.Usable()
		if err == nil {
			return b, why
		}
		why = append(why, fmt.Errorf("%s: %w", b.Name(), err))
	}
	return nil, why
}
