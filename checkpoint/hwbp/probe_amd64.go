package hwbp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// x86-64 layout of struct user (sys/user.h): u_debugreg[8] at 848.
const (
	offDebugReg = 848
	dr7L0       = 1 // DR7: breakpoint 0 enabled locally; R/W0 = 00 (execute), LEN0 = 00
	dr6B0       = 1 // DR6: breakpoint 0 hit
	atEntry     = 9 // auxv AT_ENTRY
)

func probe() (Result, error) {
	// ptrace requests must come from the thread that is the tracer: the
	// one that started the child.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Ptrace: true}
	if err := cmd.Start(); err != nil {
		return Result{}, fmt.Errorf("hwbp: start /bin/true under ptrace: %w", err)
	}
	pid := cmd.Process.Pid
	ended := false
	defer func() {
		if !ended {
			unix.Kill(pid, unix.SIGKILL)
			var ws unix.WaitStatus
			unix.Wait4(pid, &ws, 0, nil)
		}
	}()
	ws, err := wait(pid, 2*time.Second)
	if err != nil {
		return Result{}, err
	}
	if !ws.Stopped() || ws.StopSignal() != unix.SIGTRAP {
		return Result{}, fmt.Errorf("hwbp: /bin/true did not stop at its exec (status %v)", ws)
	}
	entry, err := auxEntry(pid)
	if err != nil {
		return Result{}, err
	}
	if err := pokeUser(pid, offDebugReg, entry); err != nil {
		return Result{}, fmt.Errorf("hwbp: set DR0: %w", err)
	}
	if err := pokeUser(pid, offDebugReg+7*8, dr7L0); err != nil {
		return Result{}, fmt.Errorf("hwbp: set DR7: %w", err)
	}
	dr0, err0 := peekUser(pid, offDebugReg)
	dr7, err7 := peekUser(pid, offDebugReg+7*8)
	if err := errors.Join(err0, err7); err != nil {
		return Result{}, fmt.Errorf("hwbp: read the debug registers back: %w", err)
	}
	if dr0 != entry || dr7&dr7L0 == 0 {
		return Result{}, fmt.Errorf("hwbp: debug registers read back as DR0=%#x DR7=%#x, set %#x and %#x", dr0, dr7, entry, dr7L0)
	}
	if err := unix.PtraceCont(pid, 0); err != nil {
		return Result{}, fmt.Errorf("hwbp: continue: %w", err)
	}
	ws, err = wait(pid, 2*time.Second)
	if err != nil {
		return Result{}, err
	}
	switch {
	case ws.Exited() || ws.Signaled():
		ended = true
		return Result{Trap: false, Detail: fmt.Sprintf("DR0=%#x DR7=%#x set and read back; /bin/true ran past it to its exit", entry, dr7)}, nil
	case ws.Stopped() && ws.StopSignal() == unix.SIGTRAP:
		var regs unix.PtraceRegs
		if err := unix.PtraceGetRegs(pid, &regs); err != nil {
			return Result{}, fmt.Errorf("hwbp: registers at the trap: %w", err)
		}
		dr6, err := peekUser(pid, offDebugReg+6*8)
		if err != nil {
			return Result{}, fmt.Errorf("hwbp: read DR6: %w", err)
		}
		if regs.Rip != entry || dr6&dr6B0 == 0 {
			return Result{}, fmt.Errorf("hwbp: SIGTRAP at %#x with DR6=%#x, not the breakpoint at %#x", regs.Rip, dr6, entry)
		}
		return Result{Trap: true, Detail: fmt.Sprintf("SIGTRAP at the entry %#x, DR6=%#x", entry, dr6)}, nil
	default:
		return Result{}, fmt.Errorf("hwbp: unexpected status %v after continuing", ws)
	}
}

// wait waits for pid's next stop or exit, up to d.
func wait(pid int, d time.Duration) (unix.WaitStatus, error) {
	deadline := time.Now().Add(d)
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG|unix.WALL, nil)
		if err != nil && err != unix.EINTR {
			return 0, fmt.Errorf("hwbp: wait for %d: %w", pid, err)
		}
		if got == pid {
			return ws, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("hwbp: /bin/true (pid %d) neither stopped nor exited within %v", pid, d)
		}
		time.Sleep(time.Millisecond)
	}
}

func auxEntry(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/auxv")
	if err != nil {
		return 0, fmt.Errorf("hwbp: %w", err)
	}
	for i := 0; i+16 <= len(b); i += 16 {
		if binary.LittleEndian.Uint64(b[i:]) == atEntry {
			return binary.LittleEndian.Uint64(b[i+8:]), nil
		}
	}
	return 0, errors.New("hwbp: no AT_ENTRY in /bin/true's auxv")
}

func pokeUser(pid int, off uintptr, v uint64) error {
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_POKEUSR, uintptr(pid), off, uintptr(v), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func peekUser(pid int, off uintptr) (uint64, error) {
	var v uint64
	// PTRACE_PEEKUSR through the raw syscall stores the word at the
	// address passed as data.
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_PEEKUSR, uintptr(pid), off, uintptr(unsafePointer(&v)), 0, 0)
	if e != 0 {
		return 0, e
	}
	return v, nil
}
