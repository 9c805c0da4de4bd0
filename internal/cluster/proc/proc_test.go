package proc

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary is its own nsexec helper.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "nsexec" {
		HelperMain()
		return
	}
	os.Exit(m.Run())
}

func launch(t *testing.T, args ...string) *Pending {
	t.Helper()
	p, err := Launch(Spec{Path: args[0], Args: args})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.ID.Signal(syscall.SIGKILL, false) })
	return p
}

func TestLaunchRuns(t *testing.T) {
	p := launch(t, "/bin/sh", "-c", "exit 3")
	cmd, err := p.Go()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); cmd.ProcessState.ExitCode() != 3 {
		t.Errorf("exit %v (%v), want status 3", cmd.ProcessState, err)
	}
}

// A helper killed at its gate (a kill-rank between the launcher's record
// of the pid and its opening the gate) is a rank killed by that signal,
// not a launch failure: in CI the job said "open the gate of pid N: write
// |1: broken pipe" and exited 1 instead of 137.
func TestKilledAtTheGate(t *testing.T) {
	p := launch(t, "/bin/sleep", "60")
	if err := syscall.Kill(p.ID.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !zombie(p.ID.Pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not die of SIGKILL", p.ID.Pid)
		}
	}
	cmd, err := p.Go()
	if err != nil {
		t.Fatalf("Go on a helper killed at its gate: %v, want its exit to be the rank's", err)
	}
	cmd.Wait()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("exit %v, want killed by SIGKILL", cmd.ProcessState)
	}
}

func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] == 'Z'
}
