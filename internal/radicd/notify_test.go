package radicd

import (
	"net"
	"path/filepath"
	"testing"
	"time"
)

func TestNotify(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify.sock")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	if err := newNotifier().Notify("READY=1\nSTATUS=x"); err != nil {
		t.Fatal(err)
	}
	ln.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 100)
	n, err := ln.Read(buf)
	if err != nil || string(buf[:n]) != "READY=1\nSTATUS=x" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	t.Setenv("NOTIFY_SOCKET", "")
	if err := newNotifier().Notify("READY=1"); err != nil {
		t.Errorf("without NOTIFY_SOCKET: %v, want a no-op", err)
	}
	t.Setenv("WATCHDOG_USEC", "2000000")
	t.Setenv("WATCHDOG_PID", "")
	if d := watchdogInterval(); d != time.Second {
		t.Errorf("watchdogInterval() = %v, want 1s", d)
	}
}

func TestKillCgroupWithoutCgroup(t *testing.T) {
	if n, err := killCgroup("", time.Second); n != 0 || err != nil {
		t.Errorf("killCgroup(\"\") = %d, %v; want a no-op", n, err)
	}
	if _, err := killCgroup(t.TempDir(), time.Second); err == nil {
		t.Errorf("killCgroup(not a cgroup) = nil, want an error")
	}
}
