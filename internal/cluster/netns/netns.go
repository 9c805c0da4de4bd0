// Package netns builds the virtual cluster's network with iproute2: named
// network namespaces (/run/netns/NAME), a bridge in the host namespace and a
// veth pair per node. It shells out to `ip`, which every Linux host with
// namespaces has; `ip -batch` keeps the number of processes small.
package netns

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Dir is where iproute2 keeps named namespaces.
const Dir = "/run/netns"

// Path returns the file that names namespace name.
func Path(name string) string { return filepath.Join(Dir, name) }

// Exists reports whether the named namespace exists.
func Exists(name string) bool {
	_, err := os.Stat(Path(name))
	return err == nil
}

// LinkExists reports whether a link of that name exists in the host namespace.
func LinkExists(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", name))
	return err == nil
}

// IP runs `ip ARGS...` and returns its error with its stderr.
func IP(args ...string) error {
	_, err := run("", args...)
	return err
}

// Output runs `ip ARGS...` and returns its stdout.
func Output(args ...string) (string, error) { return run("", args...) }

// Batch runs several ip commands (one per line, without the leading "ip")
// in one process; nsName, when set, runs them inside that namespace.
func Batch(nsName string, lines []string) error {
	if len(lines) == 0 {
		return nil
	}
	args := []string{"-batch", "-"}
	if nsName != "" {
		args = append([]string{"-n", nsName}, args...)
	}
	_, err := run(strings.Join(lines, "\n")+"\n", args...)
	return err
}

// ForceBatch is Batch in the host namespace that carries on past failing
// lines (`ip -force -batch`).
func ForceBatch(lines []string) error {
	_, err := run(strings.Join(lines, "\n")+"\n", "-force", "-batch", "-")
	return err
}

func run(stdin string, args ...string) (string, error) {
	cmd := exec.Command("ip", args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String())
		if msg == "" {
			msg = err.Error()
		}
		return out.String(), fmt.Errorf("ip %s: %s", strings.Join(args, " "), msg)
	}
	return out.String(), nil
}

// Pids lists the processes whose network namespace is the named one (as
// `ip netns pids` does: by comparing namespace inodes).
func Pids(name string) ([]int, error) {
	var want syscall.Stat_t
	if err := syscall.Stat(Path(name), &want); err != nil {
		return nil, nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat("/proc/"+e.Name()+"/ns/net", &st) == nil && st.Ino == want.Ino && st.Dev == want.Dev {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// Delete removes a named namespace; a missing one is not an error.
func Delete(name string) error {
	if !Exists(name) {
		return nil
	}
	return IP("netns", "delete", name)
}

// DeleteLink removes a link from the host namespace; a missing one is not
// an error. Deleting one end of a veth pair deletes both.
func DeleteLink(name string) error {
	if !LinkExists(name) {
		return nil
	}
	err := IP("link", "delete", name)
	if err != nil && !LinkExists(name) {
		return nil
	}
	return err
}

// SetLink sets a host link up or down.
func SetLink(name string, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	return IP("link", "set", name, state)
}

// LinkUp reports whether a host link is administratively up.
func LinkUp(name string) (bool, error) {
	b, err := os.ReadFile(filepath.Join("/sys/class/net", name, "flags"))
	if err != nil {
		return false, err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 0, 32)
	if err != nil {
		return false, err
	}
	return v&1 != 0, nil
}

// Routes returns the host's IPv4 routes, one line each (`ip -4 route show
// table all`).
func Routes() ([]string, error) {
	out, err := Output("-4", "route", "show", "table", "all")
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimSpace(out), "\n"), nil
}

// Sysctl writes a net.* sysctl inside the named namespace, for example
// Sysctl(ns, "ipv6/conf/all/disable_ipv6", "1"). /proc/sys/net belongs to
// the network namespace of the thread that opens it, so this runs on a
// locked thread that enters the namespace, writes, and goes back.
func Sysctl(name, key, value string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		f, err := os.Open(Path(name))
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", name, err)
			return
		}
		werr := os.WriteFile("/proc/sys/net/"+key, []byte(value), 0)
		// Back to our own namespace. This may be the main thread, which
		// the runtime cannot discard and whose namespace is the one
		// /proc/PID/ns/net shows. If going back fails, the goroutine
		// ends with the thread locked and the runtime retires it.
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("return from namespace %s: %w", name, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- werr
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("sysctl net/%s in %s: %w", key, name, err)
	}
	return nil
}
