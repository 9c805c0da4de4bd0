package shim_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// tcpCalls is what build/progs/counts does on TCP sockets, call by call
// (see the comments in test/progs/counts.c). Its calls on pipes, unix
// sockets, UDP sockets and a memfd must not reach Go at all.
var tcpCalls = map[string]int{
	"socket": 3, "setsockopt": 1, "bind": 1, "listen": 1, "getsockname": 1,
	"connect": 2, "accept": 1, "accept4": 1, "getpeername": 1, "getsockopt": 1,
	"fcntl": 1, "fcntl64": 1, "ioctl": 2,
	"write": 21, "read": 22, "writev": 20, "readv": 20, "send": 22, "recv": 23,
	"sendto": 20, "recvfrom": 20, "sendmsg": 20, "recvmsg": 20,
	"sendmmsg": 1, "recvmmsg": 1, "sendfile": 1, "splice": 2,
	"poll": 4, "ppoll": 1, "select": 2, "pselect": 1,
	"epoll_ctl": 2, "epoll_wait": 2, "epoll_pwait": 1, "epoll_pwait2": 1,
	"dup": 1, "dup2": 1, "dup3": 1, "shutdown": 1, "close": 8,
}

// countedAs is how the shim names each libc call in its counts file: it
// counts call families under one name (shim/shim.h RADIC_OPS).
var countedAs = map[string]string{
	"accept4": "accept", "fcntl64": "fcntl", "ppoll": "poll", "pselect": "select",
	"epoll_pwait": "epoll_wait", "epoll_pwait2": "epoll_wait",
	"dup2": "dup", "dup3": "dup", "sendfile64": "sendfile",
	"__read_chk": "read", "__recv_chk": "recv", "__recvfrom_chk": "recvfrom",
}

// TestManagedCallsReachGo proves the switch into Go: in the shim's test
// mode (RADIC_TEST_MANAGE=1) every TCP socket is managed, Go counts each
// call it is handed, and writes the counts at exit (RADIC_TEST_COUNTS).
// Go must have seen exactly the program's TCP calls, none of its pipe, unix
// or UDP calls, and the program's output must not change.
func TestManagedCallsReachGo(t *testing.T) {
	lib := shimLib(t)
	counts := filepath.Join(t.TempDir(), "counts")
	sameAsBare(t, time.Minute,
		[]string{preloadEnv(lib), "RADIC_TEST_MANAGE=1", "RADIC_TEST_COUNTS=" + counts},
		prog(t, "counts"))

	want := map[string]int{}
	for call, n := range tcpCalls {
		op := call
		if o, ok := countedAs[call]; ok {
			op = o
		}
		want[op] += n
	}
	got := readCounts(t, counts)
	var bad []string
	for _, op := range sortedKeys(want, got) {
		if got[op] != want[op] {
			bad = append(bad, fmt.Sprintf("  %-12s Go saw %d, want %d", op, got[op], want[op]))
		}
	}
	if len(bad) > 0 {
		t.Errorf("calls Go saw on managed fds differ from the program's TCP calls "+
			"(a surplus means pipe/unix/UDP calls entered Go, a deficit means TCP calls bypassed it):\n%s",
			strings.Join(bad, "\n"))
	}

	// Not in test mode, nothing is managed and nothing is counted.
	none := filepath.Join(t.TempDir(), "none")
	r := run(t, time.Minute, []string{preloadEnv(lib), "RADIC_TEST_COUNTS=" + none}, prog(t, "counts"))
	if !r.ok() {
		t.Fatalf("preloaded run without test mode failed:\n%v", r)
	}
	if c := readCountsIfAny(t, none); len(c) > 0 {
		t.Errorf("without RADIC_TEST_MANAGE, Go was handed calls: %v", c)
	}
}

func readCounts(t *testing.T, path string) map[string]int {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the shim wrote no counts file (RADIC_TEST_COUNTS=%s): %v", path, err)
	}
	return readCountsIfAny(t, path)
}

// readCountsIfAny parses lines "OP COUNT"; a missing file is no counts.
func readCountsIfAny(t *testing.T, path string) map[string]int {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("counts file %s: bad line %q (want \"OP COUNT\")", path, line)
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatalf("counts file %s: bad count in %q", path, line)
		}
		m[f[0]] += n
	}
	return m
}

func sortedKeys(ms ...map[string]int) []string {
	seen := map[string]bool{}
	var keys []string
	for _, m := range ms {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	return keys
}
