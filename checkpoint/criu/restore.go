package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/radic-project/radic/checkpoint"
	"github.com/radic-project/radic/checkpoint/image"
)

// Restore implements checkpoint.Backend.
func (b *Backend) Restore(ctx context.Context, img *checkpoint.Image, target checkpoint.Target) ([]int, error) {
	if err := b.Usable(); err != nil {
		return nil, err
	}
	if img.Backend != Name || img.Dir == "" {
		return nil, fmt.Errorf("criu restore: image of backend %q", img.Backend)
	}
	// The manifest on disk is what counts, not one held in memory: it is
	// checked again, and every chunk while extracting.
	m, err := image.Open(img.Dir)
	if err != nil {
		return nil, fmt.Errorf("criu restore: %w", err)
	}
	var roots []image.Proc
	for _, p := range m.Procs {
		if p.Root == len(roots) { // each tree's root comes first
			roots = append(roots, p)
		}
	}
	if len(roots) == 0 {
		return nil, fmt.Errorf("criu restore: %w: %s lists no processes", image.ErrCorrupt, img.Dir)
	}
	work, err := os.MkdirTemp(b.cfg.WorkDir, "radic-criu-restore-")
	if err != nil {
		return nil, fmt.Errorf("criu restore: %w", err)
	}
	defer os.RemoveAll(work)
	files := filepath.Join(work, "img")
	if err := image.Extract(img.Dir, m, files); err != nil {
		return nil, fmt.Errorf("criu restore: %w", err)
	}
	ids := m.Pids()
	for i := range roots {
		more, err := pstreeIDs(filepath.Join(files, "r"+strconv.Itoa(i)))
		if err != nil {
			return nil, fmt.Errorf("criu restore: %w: %v", image.ErrCorrupt, err)
		}
		ids = append(ids, more...)
	}
	slices.Sort(ids)
	if err := PidsFree(img.Dir, slices.Compact(ids)); err != nil {
		return nil, err
	}
	shellJobs := strings.Split(m.Meta[metaShellJob], ",")
	// Files handed in for the ones that were outside the group.
	var extra []*os.File
	var inherit []string
	keys := make([]string, 0, len(target.Inherit))
	for k := range target.Inherit {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		f := target.Inherit[k]
		inherit = append(inherit, "--inherit-fd", fmt.Sprintf("fd[%d]:%s", 3+len(extra), k))
		extra = append(extra, f)
	}
	var pids []int
	for i, root := range roots {
		args := []string{"restore", "-D", filepath.Join(files, "r"+strconv.Itoa(i)), "-W", work,
			"-d", "--tcp-close", "--manage-cgroups=ignore",
			"--pidfile", filepath.Join(work, "pid-"+strconv.Itoa(i))}
		if slices.Contains(shellJobs, strconv.Itoa(i)) {
			args = append(args, "--shell-job")
		}
		args = append(args, inherit...)
		logPath := filepath.Join(work, "restore-"+strconv.Itoa(i)+".log")
		if err := b.runCriu(ctx, args, logPath, &target, extra); err != nil {
			// Trees already back are ours: a group is restored whole or
			// not at all.
			for _, p := range m.Procs {
				if p.Root < i {
					syscall.Kill(p.Pid, syscall.SIGKILL)
				}
			}
			return nil, fmt.Errorf("criu restore of process %d (%s) from %s: %w", root.Pid, root.Comm, img.Dir, err)
		}
		b, err := os.ReadFile(filepath.Join(work, "pid-"+strconv.Itoa(i)))
		pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || perr != nil || pid != root.Pid {
			return nil, fmt.Errorf("criu restore of process %d from %s: restored as pid %q", root.Pid, img.Dir, strings.TrimSpace(string(b)))
		}
		pids = append(pids, pid)
	}
	if m.Meta[metaStopped] == "1" {
		for _, p := range m.Procs {
			syscall.Kill(p.Pid, syscall.SIGCONT)
		}
	}
	return pids, nil
}

// PidsFree says whether every one of ids (the pids and thread ids of the
// image in dir) is free on this node: CRIU restores processes with the ids
// they had. It returns a *checkpoint.PidsInUseError naming the holders
// when not.
func PidsFree(dir string, ids []int) error {
	var inUse []checkpoint.PidUse
	for _, id := range ids {
		// /proc/ID answers for thread ids too (they are just not listed).
		if _, err := os.Stat(procDir(id)); err == nil {
			inUse = append(inUse, checkpoint.PidUse{Pid: id, Comm: comm(id)})
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("criu restore: pid %d: %w", id, err)
		}
	}
	if len(inUse) > 0 {
		return &checkpoint.PidsInUseError{Image: dir, InUse: inUse}
	}
	return nil
}
