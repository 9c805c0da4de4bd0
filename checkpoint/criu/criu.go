package criu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/radic-project/radic/checkpoint"
	"github.com/radic-project/radic/checkpoint/hwbp"
	"github.com/radic-project/radic/checkpoint/image"
	"github.com/radic-project/radic/internal/cluster/proc"
)

// Name is the backend's name.
const Name = "criu"

// DefaultPath is where scripts/criu.sh installs CRIU's wrapper.
const DefaultPath = "/opt/radic/criu/bin/criu"

// faultNoBreakpoints is CRIU's FI_NO_BREAKPOINTS fault-injection code.
const faultNoBreakpoints = "130"

// Config configures a Backend.
type Config struct {
	// Criu is the criu executable; "" means DefaultPath, else "criu" on
	// PATH.
	Criu string
	// WorkDir holds raw dumps and extracted images while they are in use;
	// "" means os.TempDir().
	WorkDir string
	// Probe tells whether hardware breakpoints trap; nil means hwbp.Probe.
	Probe func() (hwbp.Result, error)
	// Logf logs what the backend decided (nil: nothing).
	Logf func(format string, args ...any)
	// Timeout bounds one criu run (0: 2 minutes).
	Timeout time.Duration
}

// Backend is the criu backend. Make it with New.
type Backend struct {
	cfg Config

	once sync.Once
	// Set once by detect.
	path     string
	usable   error
	fault    string // CRIU_FAULT value, or ""
	probe    string // what the probe said, for logs
	version  string
	memTrack bool
}

var _ checkpoint.Backend = (*Backend)(nil)

// New returns a criu backend; nothing is probed until first used.
func New(cfg Config) *Backend {
	if cfg.Probe == nil {
		cfg.Probe = hwbp.Probe
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.WorkDir == "" {
		cfg.WorkDir = os.TempDir()
	}
	return &Backend{cfg: cfg}
}

// Name implements checkpoint.Backend.
func (b *Backend) Name() string { return Name }

// Usable implements checkpoint.Backend.
func (b *Backend) Usable() error {
	b.once.Do(b.detect)
	return b.usable
}

// Fault is the CRIU_FAULT value this node's dumps and restores use ("" if
// none), and Probe what the breakpoint probe said.
func (b *Backend) Fault() (fault, probe string) {
	b.once.Do(b.detect)
	return b.fault, b.probe
}

// Version is criu's version line ("Version: 4.1.1").
func (b *Backend) Version() string {
	b.once.Do(b.detect)
	return b.version
}

// MemTrack says whether the kernel lets CRIU track dirty memory (what its
// pre-dump incremental mode needs).
func (b *Backend) MemTrack() bool {
	b.once.Do(b.detect)
	return b.memTrack
}

func unusable(format string, args ...any) error {
	return fmt.Errorf("%w: %s", checkpoint.ErrUnusable, fmt.Sprintf(format, args...))
}

func (b *Backend) detect() {
	if os.Geteuid() != 0 {
		b.usable = unusable("criu needs root (it ptraces the processes and restores their pids); running as uid %d", os.Geteuid())
		return
	}
	b.path = b.cfg.Criu
	if b.path == "" {
		b.path = DefaultPath
		if _, err := os.Stat(b.path); err != nil {
			p, lerr := exec.LookPath("criu")
			if lerr != nil {
				b.usable = unusable("no criu: %s is missing (scripts/criu.sh installs it) and none is on PATH", DefaultPath)
				return
			}
			b.path = p
		}
	}
	// The knob goes on unless the probe saw a breakpoint trap: stepping
	// works on every machine, a breakpoint only where it traps.
	r, err := b.cfg.Probe()
	switch {
	case err != nil:
		b.fault, b.probe = faultNoBreakpoints, fmt.Sprintf("breakpoint probe failed (%v): using CRIU_FAULT=%s", err, faultNoBreakpoints)
	case !r.Trap:
		b.fault, b.probe = faultNoBreakpoints, fmt.Sprintf("%v: using CRIU_FAULT=%s", r, faultNoBreakpoints)
	default:
		b.probe = r.String()
	}
	b.cfg.Logf("criu: %s", b.probe)
	out, err := b.output(context.Background(), "--version")
	if err != nil {
		b.usable = unusable("%s --version: %v%s", b.path, err, detail(out))
		return
	}
	b.version = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	if out, err := b.output(context.Background(), "check"); err != nil {
		b.usable = unusable("`%s check` fails on this kernel (%s): %v%s", b.path, b.version, err, detail(out))
		return
	}
	_, err = b.output(context.Background(), "check", "--feature", "mem_dirty_track")
	b.memTrack = err == nil
	b.cfg.Logf("criu: %s at %s usable; dirty memory tracking %v", b.version, b.path, b.memTrack)
}

// env is criu's environment: minimal, plus the knob.
func (b *Backend) env() []string {
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}
	if b.fault != "" {
		env = append(env, "CRIU_FAULT="+b.fault)
	}
	return env
}

func (b *Backend) output(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.path, args...)
	cmd.Env = b.env()
	cmd.Dir = "/"
	return cmd.CombinedOutput()
}

// lastLines is the last n non-empty lines of b, on one line.
func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// detail is ": " and the tail of a command's output, or "" if it said
// nothing.
func detail(out []byte) string {
	if len(bytes.TrimSpace(out)) == 0 {
		return ""
	}
	return ": " + lastLines(out, 3)
}

// logErrors is the Error lines of a criu log (the last few), or its tail.
func logErrors(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	var errs []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "Error") {
			errs = append(errs, strings.TrimSpace(l))
		}
	}
	if len(errs) == 0 {
		return lastLines(b, 3)
	}
	if len(errs) > 4 {
		errs = errs[len(errs)-4:]
	}
	return strings.Join(errs, " | ")
}

// runCriu runs criu with args (its log to logPath), in the target cgroup
// and network namespace when given.
func (b *Backend) runCriu(ctx context.Context, args []string, logPath string, target *checkpoint.Target, extra []*os.File) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	args = append(args, "-o", logPath, "-v2")
	name := b.path
	if target != nil && target.NetNS != "" {
		args = append([]string{"--net=" + target.NetNS, "--", b.path}, args...)
		name = "nsenter"
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = b.env()
	cmd.Dir = "/"
	cmd.ExtraFiles = extra
	// A criu killed by the context must not leave Wait on its output
	// pipe, held by whatever it had forked.
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if target != nil && target.Cgroup != "" {
		cg, err := os.Open(target.Cgroup)
		if err != nil {
			return fmt.Errorf("target cgroup: %w", err)
		}
		defer cg.Close()
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	}
	if err := cmd.Run(); err != nil {
		msg := logErrors(logPath)
		if o := strings.TrimSpace(out.String()); o != "" {
			msg += " | " + lastLines(out.Bytes(), 2)
		}
		return fmt.Errorf("%w: %s", err, msg)
	}
	return nil
}

// procDir is /proc/PID.
func procDir(pid int) string { return "/proc/" + strconv.Itoa(pid) }

// stat fields of pid: state, ppid, pgrp, session.
type procStat struct {
	state               string
	ppid, pgrp, session int
}

func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile(procDir(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 4 {
		return procStat{}, false
	}
	var st procStat
	st.state = f[0]
	st.ppid, _ = strconv.Atoi(f[1])
	st.pgrp, _ = strconv.Atoi(f[2])
	st.session, _ = strconv.Atoi(f[3])
	return st, true
}

func comm(pid int) string {
	b, _ := os.ReadFile(procDir(pid) + "/comm")
	return strings.TrimSpace(string(b))
}

// tree lists root and its descendants (root first), with their threads.
func tree(root, index int) ([]image.Proc, error) {
	var procs []image.Proc
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		ents, err := os.ReadDir(procDir(pid) + "/task")
		if err != nil {
			if pid == root {
				return nil, fmt.Errorf("process %d: %w", root, err)
			}
			continue // it ended meanwhile
		}
		p := image.Proc{Pid: pid, Root: index, Comm: comm(pid), Start: proc.Of(pid).Start, Fds: map[int]string{}}
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			p.Tids = append(p.Tids, tid)
			kids, _ := os.ReadFile(procDir(pid) + "/task/" + e.Name() + "/children")
			for _, k := range strings.Fields(string(kids)) {
				if c, err := strconv.Atoi(k); err == nil {
					queue = append(queue, c)
				}
			}
		}
		for fd := 0; fd <= 2; fd++ {
			if l, err := os.Readlink(procDir(pid) + "/fd/" + strconv.Itoa(fd)); err == nil {
				p.Fds[fd] = l
			}
		}
		procs = append(procs, p)
	}
	return procs, nil
}

// group lists every process of roots.
func group(roots []int) ([]image.Proc, error) {
	var all []image.Proc
	for i, r := range roots {
		ps, err := tree(r, i)
		if err != nil {
			return nil, err
		}
		all = append(all, ps...)
	}
	return all, nil
}

// stopGroup stops every process of roots (SIGSTOP), including children
// forked meanwhile, and waits until all are stopped; it returns them.
func stopGroup(ctx context.Context, roots []int) ([]image.Proc, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		procs, err := group(roots)
		if err != nil {
			return procs, err
		}
		all := true
		for _, p := range procs {
			st, ok := readStat(p.Pid)
			if !ok {
				continue
			}
			if st.state != "T" {
				all = false
				syscall.Kill(p.Pid, syscall.SIGSTOP)
			}
		}
		if all {
			return procs, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return procs, errors.New("the group did not stop within 5s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// signalAll signals every process of procs that is still the one recorded.
func signalAll(procs []image.Proc, sig syscall.Signal) {
	for _, p := range procs {
		proc.ID{Pid: p.Pid, Start: p.Start}.Signal(sig, false)
	}
}
