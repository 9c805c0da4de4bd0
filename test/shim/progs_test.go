package shim_test

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

// cPrograms are the self-checking C programs of test/progs and what each
// covers. Each prints a deterministic transcript and exits non-zero on any
// wrong result.
var cPrograms = []struct {
	name, covers string
	args         []string
}{
	{"sockio", "read write readv writev send sendto sendmsg recv recvfrom recvmsg sendmmsg recvmmsg sendfile sendfile64 splice; partial I/O, MSG_*, EAGAIN, EPIPE", nil},
	{"fortify", "__read_chk __recv_chk __recvfrom_chk", nil},
	{"lifecycle", "socket connect accept accept4 bind listen shutdown close close_range closefrom dup dup2 dup3 fcntl fcntl64 ioctl setsockopt getsockopt getpeername getsockname; EINPROGRESS", nil},
	{"waiting", "poll ppoll select pselect epoll_create1 epoll_ctl epoll_wait epoll_pwait epoll_pwait2", nil},
	{"procs", "fork (no exec) + socket I/O, exec* family, vfork, posix_spawn(p), popen, _exit", nil},
	{"closeall", "closefrom, close_range, close() loop to RLIMIT_NOFILE, then socket I/O", nil},
	{"stress", "4 threads of checked socket I/O", nil},
	{"forksig", "fork while threads do socket I/O and a signal handler writes to a pipe", nil},
}

// TestProgs runs every C program bare, preloaded (pass-through), and
// preloaded in the shim's test mode where every TCP socket is managed and
// its calls go through Go; all three must print the same transcript.
func TestProgs(t *testing.T) {
	lib := shimLib(t)
	for _, p := range cPrograms {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			argv := append([]string{prog(t, p.name)}, p.args...)
			checkSymbols(t, p.name)
			bare := run(t, 2*time.Minute, nil, argv...)
			if !bare.ok() {
				t.Fatalf("bare run failed (the program or the machine is broken, not the shim):\n%v", bare)
			}
			t.Run("passthrough", func(t *testing.T) {
				checkSame(t, bare, run(t, 2*time.Minute, []string{preloadEnv(lib)}, argv...))
			})
			t.Run("managed", func(t *testing.T) {
				checkSame(t, bare, run(t, 2*time.Minute,
					[]string{preloadEnv(lib), "RADIC_TEST_MANAGE=1"}, argv...))
			})
		})
	}
}

// symbols are the libc entry points each program must reference, so that
// a run really goes through those trampolines: in particular the fortify
// program must call the _chk variants and not the plain calls.
var symbols = map[string][]string{
	"fortify":   {"__read_chk", "__recv_chk", "__recvfrom_chk"},
	"sockio":    {"read", "write", "readv", "writev", "send", "sendto", "sendmsg", "recv", "recvfrom", "recvmsg", "sendmmsg", "recvmmsg", "sendfile", "sendfile64", "splice"},
	"lifecycle": {"socket", "connect", "accept", "accept4", "bind", "listen", "shutdown", "close", "close_range", "closefrom", "dup", "dup2", "dup3", "fcntl", "fcntl64", "ioctl", "setsockopt", "getsockopt", "getpeername", "getsockname"},
	"waiting":   {"poll", "ppoll", "select", "pselect", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2"},
	"procs":     {"fork", "vfork", "posix_spawn", "posix_spawnp", "execve", "execv", "execvp", "execvpe", "execl", "execlp", "execle", "fexecve", "_exit", "popen"},
	"closeall":  {"closefrom", "close_range", "close"},
}

func checkSymbols(t *testing.T, name string) {
	t.Helper()
	syms := symbols[name]
	if syms == nil {
		return
	}
	out, err := exec.Command("nm", "-D", "--undefined-only", prog(t, name)).Output()
	if err != nil {
		t.Fatalf("nm %s: %v", name, err)
	}
	have := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			have[strings.SplitN(f[1], "@", 2)[0]] = true
		}
	}
	for _, s := range syms {
		if !have[s] {
			t.Errorf("build/progs/%s does not reference %s", name, s)
		}
	}
	if name == "fortify" {
		for _, s := range []string{"read", "recv", "recvfrom"} {
			if have[s] {
				t.Errorf("build/progs/fortify references plain %s: fortify is not in effect", s)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}
