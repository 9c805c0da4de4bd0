package shim_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Issue 9: job control in an interactive shell. bash -i on a real
// terminal runs a foreground job in its own process group; ^Z must stop
// it (status 148), fg must give it the terminal back, ^C must end it
// (status 130), and a background job that reads the terminal must be
// stopped (SIGTTIN) and continue when brought to the foreground. Every shell and job is preloaded
// (LD_PRELOAD is inherited), so the Go threads of managed mode sit in
// every process that takes these signals.
func TestJobControl(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash:", err)
	}
	modes := append([]struct {
		name string
		env  []string
	}{{"bare", nil}}, preloadModes(shimLib(t))...)
	const rounds = 10
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			sh := startTerminalShell(t, bash, m.env)
			for i := range rounds {
				sh.jobControlRound(t, i)
				if t.Failed() {
					return
				}
			}
			sh.send(t, "exit\n")
		})
	}
}

// terminalShell is bash -i on the slave side of a pty; the test types on
// the master side and reads the terminal's output there.
type terminalShell struct {
	master *os.File
	cmd    *exec.Cmd
	mu     sync.Mutex
	out    bytes.Buffer // everything the terminal printed
	seen   int          // out is searched from here on
}

func startTerminalShell(t *testing.T, bash string, env []string) *terminalShell {
	t.Helper()
	master, slave := openPTY(t)
	cmd := exec.Command(bash, "--norc", "--noprofile", "-i")
	cmd.Env = append(baseEnv(), append([]string{"PS1=", "TERM=dumb", "HISTFILE=/dev/null"}, env...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	sh := &terminalShell{master: master, cmd: cmd}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			sh.mu.Lock()
			sh.out.Write(buf[:n])
			sh.mu.Unlock()
			if err != nil {
				return // EIO once the shell and its jobs are gone
			}
		}
	}()
	t.Cleanup(func() {
		// The shell's session: bash, and any job it left behind in a
		// process group of its own.
		for _, pid := range sessionMembers(cmd.Process.Pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = cmd.Wait()
		master.Close()
		<-done
	})
	sh.send(t, "stty -echo\n")
	sh.mark(t, "ready", "")
	return sh
}

// openPTY opens a pseudo-terminal pair (posix_openpt, unlockpt, ptsname).
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	// Non-blocking, so that the runtime's poller reads it and Close
	// ends a pending Read.
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skip("no pseudo-terminals here:", err)
	}
	m := os.NewFile(uintptr(fd), "/dev/ptmx")
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal("unlockpt:", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal("ptsname:", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return m, s
}

func (sh *terminalShell) send(t *testing.T, s string) {
	t.Helper()
	if _, err := sh.master.WriteString(s); err != nil {
		t.Fatalf("typing %q: %v", s, err)
	}
}

// expect waits for re in what the terminal printed since the last match
// and returns its submatches; a shell that never prints it fails the test
// with the transcript (the 10 s bound is a hang guard, not a timing check).
func (sh *terminalShell) expect(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		sh.mu.Lock()
		rest := sh.out.String()[sh.seen:]
		loc := re.FindStringSubmatchIndex(rest)
		if loc != nil {
			sh.seen += loc[1]
			sh.mu.Unlock()
			var sub []string
			for i := 0; i < len(loc); i += 2 {
				sub = append(sub, rest[loc[i]:loc[i+1]])
			}
			return sub
		}
		all := sh.out.String()
		sh.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("the terminal never printed %q; it printed:\n%s", re, tail(all, 40)+fmt.Sprintf("\n(raw tail %q)", all[max(0, len(all)-300):]))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// mark has the shell print a marker with the value of expr and returns it:
// typed commands and the job messages before it have all been handled.
func (sh *terminalShell) mark(t *testing.T, name, expr string) string {
	t.Helper()
	sh.send(t, fmt.Sprintf("echo '@@%s='%s\n", name, expr))
	return sh.expect(t, regexp.MustCompile(`@@`+name+`=(\S*)\r?\n`))[1]
}

// foreground waits until the terminal's foreground process group is led
// by a process named comm (the job has the terminal), and returns it.
func (sh *terminalShell) foreground(t *testing.T, comm string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pgrp, err := unix.IoctlGetInt(int(sh.master.Fd()), unix.TIOCGPGRP)
		if err == nil && pgrp != sh.cmd.Process.Pid {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pgrp)); strings.TrimSpace(string(b)) == comm {
				return pgrp
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never became the terminal's foreground job (foreground group %d, err %v)", comm, pgrp, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// jobs runs `jobs -p` with flags in the shell itself (a command
// substitution would list a copy of the job table taken at its fork) and
// returns the process group ids it lists (the job notices bash prints
// before a prompt are left out). A command runs first: bash may leave a child's
// SIGCHLD to the next command it reads when it arrives while the shell is
// idle at its prompt, so the table is current only after one.
func (sh *terminalShell) jobs(t *testing.T, flags string) []int {
	t.Helper()
	sh.mark(t, "sync", "")
	sh.send(t, "jobs -p "+flags+"; echo @@jobs-end\n")
	out := sh.expect(t, regexp.MustCompile(`(?s)^(.*?)@@jobs-end\r?\n`))[1]
	var pids []int
	for _, l := range strings.Split(strings.ReplaceAll(out, "\r", ""), "\n") {
		if pid, err := strconv.Atoi(strings.TrimSpace(l)); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// shellHasTerminal waits until the shell is the terminal's foreground
// group again. What is typed before that can be lost: the line discipline
// flushes its input on ^C and ^Z, and bash flushes it when it takes the
// terminal back (a user waits for the prompt; so does the test).
func (sh *terminalShell) shellHasTerminal(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pgrp, err := unix.IoctlGetInt(int(sh.master.Fd()), unix.TIOCGPGRP)
		if err == nil && pgrp == sh.cmd.Process.Pid {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shell never took the terminal back (foreground group %d, err %v)", pgrp, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// transcript is the end of what the terminal printed.
func (sh *terminalShell) transcript() string {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return tail(sh.out.String(), 30)
}

// continued waits until the stopped pid runs again.
func (sh *terminalShell) continued(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); procState(pid) == "T"; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d was never continued; the terminal:\n%s", pid, sh.transcript())
		}
	}
}

// sessionMembers lists the processes of session sid.
func sessionMembers(sid int) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := unix.Getsid(pid); err == nil && s == sid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// stopped reports whether every thread of pid is stopped. The kernel
// tells the parent (SIGCHLD, waitpid) only once the whole thread group has
// stopped, and a preloaded process has the Go runtime's threads besides
// its main one: its main thread alone can be stopped a moment earlier.
func stopped(pid int) bool {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i < 0 || i+2 >= len(s) || s[i+2] != 'T' {
			return false
		}
	}
	return len(tasks) > 0
}

func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "gone"
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2 : i+3]
	}
	return "?"
}

// jobControlRound: ^Z, jobs, fg, ^C on a foreground sleep; then a
// background cat stopped by SIGTTIN, fg and ^C.
func (sh *terminalShell) jobControlRound(t *testing.T, round int) {
	t.Helper()
	sh.send(t, "sleep 60\n")
	pid := sh.foreground(t, "sleep")
	sh.send(t, "\x1a") // ^Z: the terminal sends SIGTSTP to the foreground group
	sh.shellHasTerminal(t)
	if got := sh.mark(t, "tstp", "$?"); got != "148" {
		t.Errorf("round %d: status after ^Z = %s, want 148 (stopped by SIGTSTP)", round, got)
	}
	if !stopped(pid) {
		t.Errorf("round %d: sleep %d is in state %s after ^Z, want every thread stopped", round, pid, procState(pid))
	}
	if got := sh.jobs(t, "-s"); !slices.Equal(got, []int{pid}) {
		t.Errorf("round %d: stopped jobs after ^Z: %v, want the sleep %d", round, got, pid)
	}
	sh.send(t, "fg\n")
	if got := sh.foreground(t, "sleep"); got != pid {
		t.Errorf("round %d: fg gave the terminal to %d, want the stopped sleep %d", round, got, pid)
	}
	sh.continued(t, pid) // SIGCONT is sent after the terminal is given
	sh.send(t, "\x03")   // ^C: SIGINT to the foreground group
	sh.shellHasTerminal(t)
	if got := sh.mark(t, "int", "$?"); got != "130" {
		t.Errorf("round %d: status after fg and ^C = %s, want 130 (killed by SIGINT)", round, got)
	}
	if got := sh.jobs(t, ""); len(got) != 0 {
		t.Errorf("round %d: jobs left after ^C: %v, want none", round, got)
	}

	// A background job that reads the terminal is stopped by SIGTTIN.
	sh.send(t, "cat &\n")
	bg, err := strconv.Atoi(sh.mark(t, "bgpid", "$!"))
	if err != nil {
		t.Fatalf("round %d: no pid for the background cat: %v", round, err)
	}
	for deadline := time.Now().Add(10 * time.Second); !stopped(bg); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("round %d: the background cat %d reading the terminal is in state %s, want T (SIGTTIN)", round, bg, procState(bg))
		}
	}
	if got := sh.jobs(t, "-s"); !slices.Equal(got, []int{bg}) {
		t.Errorf("round %d: stopped jobs after a background read of the terminal: %v, want the cat %d; the terminal:\n%s", round, got, bg, sh.transcript())
	}
	// fg continues it with the terminal; ^C ends it.
	sh.send(t, "fg\n")
	if got := sh.foreground(t, "cat"); got != bg {
		t.Errorf("round %d: fg gave the terminal to %d, want the stopped cat %d", round, got, bg)
	}
	sh.continued(t, bg)
	sh.send(t, "\x03")
	sh.shellHasTerminal(t)
	if got := sh.mark(t, "int2", "$?"); got != "130" {
		t.Errorf("round %d: status of the cat after fg and ^C = %s, want 130", round, got)
	}
	if got := sh.jobs(t, ""); len(got) != 0 {
		t.Errorf("round %d: jobs left: %v, want none", round, got)
	}
}
