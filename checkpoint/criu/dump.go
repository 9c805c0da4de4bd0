package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/radic-project/radic/checkpoint"
	"github.com/radic-project/radic/checkpoint/image"
)

// Meta keys of an image's manifest.
const (
	metaShellJob = "shell_job" // comma-separated root indexes dumped with --shell-job
	metaStopped  = "stopped"   // "1": the group was stopped for its cut; continue it after restore
	metaFault    = "criu_fault"
	metaProbe    = "breakpoints"
)

// Checkpoint implements checkpoint.Backend.
func (b *Backend) Checkpoint(ctx context.Context, req checkpoint.Request) (img *checkpoint.Image, err error) {
	if err := b.Usable(); err != nil {
		return nil, err
	}
	g := req.Group
	if len(g.Roots) == 0 {
		return nil, errors.New("criu checkpoint: the group has no processes")
	}
	if req.Dir == "" {
		return nil, errors.New("criu checkpoint: no image directory")
	}
	if _, err := os.Lstat(req.Dir); err == nil {
		return nil, fmt.Errorf("criu checkpoint: %s exists (an image is never written over)", req.Dir)
	}
	var parent *image.Manifest
	parentName := ""
	if req.Parent != nil {
		if req.Parent.Backend != Name || req.Parent.Dir == "" {
			return nil, fmt.Errorf("criu checkpoint: parent image of backend %q", req.Parent.Backend)
		}
		if filepath.Dir(filepath.Clean(req.Parent.Dir)) != filepath.Dir(filepath.Clean(req.Dir)) {
			return nil, fmt.Errorf("criu checkpoint: parent %s is not beside %s", req.Parent.Dir, req.Dir)
		}
		if parent, err = image.Open(req.Parent.Dir); err != nil {
			return nil, fmt.Errorf("criu checkpoint: parent: %w", err)
		}
		parentName = filepath.Base(req.Parent.Dir)
	}
	work, err := os.MkdirTemp(b.cfg.WorkDir, "radic-criu-dump-")
	if err != nil {
		return nil, fmt.Errorf("criu checkpoint: %w", err)
	}
	defer os.RemoveAll(work)

	start := time.Now()
	// The cut: CRIU freezes one tree itself; several trees are stopped
	// together first, so that none runs while another is dumped.
	var procs []image.Proc
	stopped := len(g.Roots) > 1
	if stopped {
		procs, err = stopGroup(ctx, g.Roots)
		// Whatever happens, a group stopped here runs again unless it is
		// to be killed (and then only once its image is complete).
		defer func() {
			if req.LeaveRunning || err != nil {
				signalAll(procs, syscall.SIGCONT)
			}
		}()
	} else {
		procs, err = group(g.Roots)
	}
	if err != nil {
		return nil, fmt.Errorf("criu checkpoint of node %d: %w", g.Node, err)
	}
	var shellJobs []string
	for i, root := range g.Roots {
		dir := filepath.Join(work, "r"+strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, fmt.Errorf("criu checkpoint: %w", err)
		}
		args := []string{"dump", "-t", strconv.Itoa(root), "-D", dir, "-W", work,
			"--tcp-close", "--leave-running"}
		// A root that does not lead its own session belongs to someone
		// else's job control (a shell's, a launcher's): CRIU must be told.
		if st, ok := readStat(root); ok && st.session != root {
			args = append(args, "--shell-job")
			shellJobs = append(shellJobs, strconv.Itoa(i))
		}
		logPath := filepath.Join(work, "dump-"+strconv.Itoa(i)+".log")
		if err := b.runCriu(ctx, args, logPath, nil, nil); err != nil {
			return nil, fmt.Errorf("criu dump of process %d (%s) on node %d: %w", root, comm(root), g.Node, err)
		}
	}
	dumped := time.Since(start)
	// CRIU's statistics are about this run, not part of what a restore
	// needs (it may write them beside the images).
	for i := range g.Roots {
		os.Remove(filepath.Join(work, "r"+strconv.Itoa(i), "stats-dump"))
	}
	m := &image.Manifest{
		Backend: Name, Tool: b.version, Node: g.Node, Created: time.Now().UTC(),
		Parent: parentName, Procs: procs,
		Meta: map[string]string{metaShellJob: strings.Join(shellJobs, ","), metaFault: b.fault, metaProbe: b.probe},
	}
	if stopped {
		m.Meta[metaStopped] = "1"
	}
	raw := filepath.Join(work, "raw")
	if err := os.Mkdir(raw, 0o700); err != nil {
		return nil, err
	}
	for i := range g.Roots {
		if err := os.Rename(filepath.Join(work, "r"+strconv.Itoa(i)), filepath.Join(raw, "r"+strconv.Itoa(i))); err != nil {
			return nil, err
		}
	}
	packStart := time.Now()
	if err := image.Write(raw, req.Dir, m, parent); err != nil {
		return nil, fmt.Errorf("criu checkpoint of node %d: %w", g.Node, err)
	}
	img = &checkpoint.Image{Backend: Name, Dir: req.Dir, Manifest: m, Launch: g.Launch,
		Stats: checkpoint.Stats{Dump: dumped, Pack: time.Since(packStart), Bytes: m.Bytes, PackBytes: m.PackBytes}}
	if !req.LeaveRunning {
		// The image is complete: only now may the group go.
		signalAll(procs, syscall.SIGKILL)
	}
	return img, nil
}
