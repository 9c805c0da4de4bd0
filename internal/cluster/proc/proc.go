// Package proc identifies the cluster's processes safely and starts them
// inside a node.
//
// A process is recorded as a pid plus its start time (field 22 of
// /proc/PID/stat), so that a recorded pid reused by an unrelated process is
// never signalled.
//
// Start launches a process through a small helper (the radic binary itself,
// subcommand "nsexec") that the launcher can record before the real program
// runs: the helper is created directly in the node's cgroup (clone3 with
// CLONE_INTO_CGROUP), waits on a gate pipe until the launcher has recorded
// its pid, then enters the node's network namespace and execs the program
// with the program's environment. If the launcher dies before opening the
// gate, the helper sees EOF and exits without running anything. The helper
// itself runs with an empty environment, so an LD_PRELOAD meant for the
// program never loads into it.
package proc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ID is a process as recorded in the cluster state.
type ID struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"` // start time in clock ticks since boot
}

// StartTime reads the start time of pid; ok is false when pid is gone (or
// a zombie).
func StartTime(pid int) (uint64, bool) {
	st, zombie, ok := stat(pid)
	return st, ok && !zombie
}

// stat reads the start time and zombie state of pid.
func stat(pid int) (start uint64, zombie, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false, false
	}
	// The command name (field 2) may hold spaces and parentheses: skip past
	// the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false, false
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); field 22 is f[19].
	if len(f) < 20 {
		return 0, false, false
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	return v, f[0] == "Z" || f[0] == "X", err == nil
}

// Of returns the ID of a running pid.
func Of(pid int) ID {
	st, _ := StartTime(pid)
	return ID{Pid: pid, Start: st}
}

// Alive reports whether the recorded process still runs (and is the same
// process).
func (p ID) Alive() bool {
	if p.Pid <= 0 {
		return false
	}
	st, ok := StartTime(p.Pid)
	return ok && st == p.Start
}

// Signal sends sig to the recorded process if it is still the same one.
// With group set it signals the process group the process leads (our
// processes are started as group leaders); when the leader is gone (or an
// unreaped zombie) and its pid is not reused, what is left of its group
// (children that outlived it) is signalled: the kernel never gives a new
// process a pid that is still some group's id, so that group can only be
// ours. A process that is gone is
// not an error.
func (p ID) Signal(sig syscall.Signal, group bool) error {
	if p.Pid <= 0 {
		return nil
	}
	if !p.Alive() {
		// The leader is gone or a zombie not yet reaped (its parent, a
		// killed launcher, is gone too): its group may live on.
		st, zombie, ok := stat(p.Pid)
		if group && (!ok || (zombie && st == p.Start)) {
			_ = syscall.Kill(-p.Pid, sig)
		}
		return nil
	}
	target := p.Pid
	if group {
		target = -p.Pid
	}
	err := syscall.Kill(target, sig)
	if group && errors.Is(err, syscall.ESRCH) {
		err = syscall.Kill(p.Pid, sig)
	}
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// WaitGone polls until the recorded process is gone or the timeout passes.
func (p ID) WaitGone(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for p.Alive() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// Cmdline returns the argv of pid joined by spaces ("" when gone).
func Cmdline(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	return strings.TrimRight(strings.ReplaceAll(string(b), "\x00", " "), " ")
}

// Spec describes a process to start inside a node.
type Spec struct {
	Path   string   // absolute path of the program
	Args   []string // argv, Args[0] included
	Env    []string // the program's whole environment
	Dir    string   // working directory ("" = the launcher's)
	Netns  string   // path of the network namespace to enter ("" = stay)
	Cgroup string   // cgroup v2 directory to start in ("" = the launcher's)
	Setsid bool     // new session (daemons); otherwise a new process group
	// Hostname, when set, gives the program a UTS namespace of its own
	// with that host name (a node's name: MPI libraries key session
	// directories and shared-memory segments on it).
	Hostname string

	Stdin, Stdout, Stderr *os.File // nil = /dev/null
}

// gateMsg is what the launcher sends the helper through the gate.
type gateMsg struct {
	Path  string   `json:"path"`
	Args  []string `json:"args"`
	Env   []string `json:"env"`
	Dir   string   `json:"dir"`
	Netns string   `json:"netns"`
	Host  string   `json:"host,omitempty"`
}

// Helper is the program and leading arguments that run the helper; by
// default this executable with subcommand "nsexec".
var Helper = func() ([]string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return []string{self, "nsexec"}, nil
}

// Pending is a helper started and held at its gate: its pid exists, the
// program has not run yet.
type Pending struct {
	ID    ID
	cmd   *exec.Cmd
	gateW *os.File
	statR *os.File
	msg   []byte
}

// Launch starts the helper for spec and leaves it waiting at the gate. The
// caller records p.ID, then calls Go (or Abort).
func Launch(spec Spec) (*Pending, error) {
	helper, err := Helper()
	if err != nil {
		return nil, fmt.Errorf("find the nsexec helper: %w", err)
	}
	gateR, gateW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	statR, statW, err := os.Pipe()
	if err != nil {
		gateR.Close()
		gateW.Close()
		return nil, err
	}
	defer gateR.Close()
	defer statW.Close()
	cmd := exec.Command(helper[0], helper[1:]...)
	cmd.Env = []string{}
	// A nil *os.File in an io.Writer would not be nil: assign only real
	// files, leaving /dev/null for the others.
	if spec.Stdin != nil {
		cmd.Stdin = spec.Stdin
	}
	if spec.Stdout != nil {
		cmd.Stdout = spec.Stdout
	}
	if spec.Stderr != nil {
		cmd.Stderr = spec.Stderr
	}
	cmd.ExtraFiles = []*os.File{gateR, statW} // fds 3 and 4
	attr := &syscall.SysProcAttr{}
	if spec.Setsid {
		attr.Setsid = true
	} else {
		attr.Setpgid = true
	}
	if spec.Cgroup != "" {
		cg, err := os.Open(spec.Cgroup)
		if err != nil {
			gateW.Close()
			statR.Close()
			return nil, fmt.Errorf("open cgroup: %w", err)
		}
		defer cg.Close()
		attr.UseCgroupFD = true
		attr.CgroupFD = int(cg.Fd())
	}
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		gateW.Close()
		statR.Close()
		return nil, fmt.Errorf("start %s: %w", spec.Path, err)
	}
	msg, _ := json.Marshal(gateMsg{Path: spec.Path, Args: spec.Args, Env: spec.Env, Dir: spec.Dir, Netns: spec.Netns, Host: spec.Hostname})
	return &Pending{ID: Of(cmd.Process.Pid), cmd: cmd, gateW: gateW, statR: statR, msg: msg}, nil
}

// Abort ends a helper that was never let through its gate.
func (p *Pending) Abort() {
	p.gateW.Close()
	p.statR.Close()
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// Go opens the gate: the helper enters the node and execs the program.
// It returns once the exec has succeeded or failed; the caller must Wait
// for the returned Cmd.
func (p *Pending) Go() (*exec.Cmd, error) {
	defer p.statR.Close()
	_, err := p.gateW.Write(p.msg)
	p.gateW.Close()
	if errors.Is(err, syscall.EPIPE) {
		// Only the helper holds the gate's read end: it is dead already,
		// killed while it waited (its pid was in the state, so a
		// kill-rank could reach it). How it died is the rank's exit,
		// which the caller's Wait reports, as for a program killed later.
		return p.cmd, nil
	}
	if err != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		return nil, fmt.Errorf("open the gate of pid %d: %w", p.ID.Pid, err)
	}
	// The status pipe is close-on-exec in the helper: EOF with no data
	// means the exec succeeded.
	st, _ := io.ReadAll(p.statR)
	if len(st) > 0 {
		_ = p.cmd.Wait()
		return nil, errors.New(strings.TrimSpace(string(st)))
	}
	return p.cmd, nil
}

// Start starts spec. record is called with the new process's ID before the
// program runs; if it fails, the process is ended and never runs the
// program. The returned Cmd has been started; the caller must Wait for it.
func Start(spec Spec, record func(ID) error) (*exec.Cmd, error) {
	p, err := Launch(spec)
	if err != nil {
		return nil, err
	}
	if err := record(p.ID); err != nil {
		p.Abort()
		return nil, fmt.Errorf("record pid %d: %w", p.ID.Pid, err)
	}
	return p.Go()
}

// HelperMain is the body of `radic nsexec`: read the program from the gate
// (fd 3), enter the namespace, exec. Errors go to the status pipe (fd 4).
// It never returns on success.
func HelperMain() {
	gate := os.NewFile(3, "gate")
	status := os.NewFile(4, "status")
	if gate == nil || status == nil {
		fmt.Fprintln(os.Stderr, "radic nsexec: internal command, started by radic only")
		os.Exit(125)
	}
	syscall.CloseOnExec(4)
	fail := func(format string, a ...any) {
		fmt.Fprintf(status, format+"\n", a...)
		os.Exit(127)
	}
	b, err := io.ReadAll(gate)
	gate.Close()
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		// The launcher went away before recording us: run nothing.
		os.Exit(125)
	}
	var m gateMsg
	if err := json.Unmarshal(b, &m); err != nil {
		fail("nsexec: bad gate message: %v", err)
	}
	// Namespaces are per thread: stay on this one until execve, which
	// keeps the calling thread's namespaces for the new program.
	runtime.LockOSThread()
	if m.Netns != "" {
		f, err := os.Open(m.Netns)
		if err != nil {
			fail("enter network namespace %s: %v", m.Netns, err)
		}
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			fail("enter network namespace %s: setns: %v", m.Netns, err)
		}
		f.Close()
	}
	if m.Host != "" {
		if err := SetHostname(m.Host); err != nil {
			fail("%v", err)
		}
	}
	if m.Dir != "" {
		if err := os.Chdir(m.Dir); err != nil {
			fail("chdir %s: %v", m.Dir, err)
		}
	}
	err = syscall.Exec(m.Path, m.Args, m.Env)
	fail("exec %s: %v", m.Path, err)
}

// SetHostname moves the calling thread into a UTS namespace of its own
// named name. The caller has locked its OS thread and execs from it next
// (execve keeps the calling thread's namespaces).
func SetHostname(name string) error {
	if err := unix.Unshare(unix.CLONE_NEWUTS); err != nil {
		return fmt.Errorf("new UTS namespace for host name %s: %w", name, err)
	}
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("set host name %s: %w", name, err)
	}
	return nil
}
