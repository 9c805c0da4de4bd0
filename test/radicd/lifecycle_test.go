package radicd_test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestNotifyReadyAndStopping: radicd speaks the sd_notify protocol itself:
// READY=1 once serving, STOPPING=1 on SIGTERM, then a clean exit.
func TestNotifyReadyAndStopping(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "notify.sock")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd := exec.Command(radicdBin, "--node", "0", "--listen", "127.78.0.81:7470", "--peers", "0=127.78.0.81:7470,1=127.78.0.82:7470",
		"--state-dir", filepath.Join(dir, "state"), "--metrics-addr", "127.78.0.81:9470")
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	logf, _ := os.Create(filepath.Join(dir, "log"))
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-done
	})
	read := func(want string) string {
		t.Helper()
		ln.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 4096)
		for {
			n, err := ln.Read(buf)
			if err != nil {
				b, _ := os.ReadFile(filepath.Join(dir, "log"))
				t.Fatalf("waiting for %s: %v\n%s", want, err, b)
			}
			if strings.Contains(string(buf[:n]), want) {
				return string(buf[:n])
			}
		}
	}
	ready := read("READY=1")
	if !strings.Contains(ready, "STATUS=") {
		t.Errorf("READY message %q carries no STATUS", ready)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	read("STOPPING=1")
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Errorf("radicd exit after SIGTERM: %v, want 0", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("radicd did not exit 10s after SIGTERM")
	}
}

// TestQuickRestartIsDetected: a radicd killed and restarted at once (as
// systemd's Restart=on-failure does) comes back as a new incarnation before
// its monitor's watchdog fires; the monitor declares the old incarnation
// (kind "restarted") so its processes are recovered, and the ring is whole.
func TestQuickRestartIsDetected(t *testing.T) {
	const n = 3
	r := startRing(t, 86, n, nil)
	before, _ := r.status(2)
	old := member(before, 1).Inc
	r.kill(1)
	r.start(1)
	r.waitRing(n, 5*time.Second)
	deadline := time.Now().Add(3 * time.Second)
	for r.metric(2, "radic_failures_detected_total", `kind="restarted"`) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("monitor's radic_failures_detected_total{kind=restarted} = %v, want 1",
				r.metric(2, "radic_failures_detected_total", `kind="restarted"`))
		}
		time.Sleep(20 * time.Millisecond)
	}
	after, _ := r.status(2)
	if m := member(after, 1); m.Inc <= old || m.State != "alive" {
		t.Errorf("node 1 after restart: %+v, want alive with incarnation > %d", m, old)
	}
	if u := r.metric(2, "radic_failures_detected_total", `kind="unreachable"`); u != 0 {
		t.Errorf("the quick restart was also counted as unreachable (%v)", u)
	}
}
