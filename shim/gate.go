// The runtime must keep no files open behind the program's back: with
// container-aware GOMAXPROCS it holds two cgroup files open (fds 3 and 4 in
// most processes), which a program that closes or reuses "all its fds" (a
// shell's `exec 3>file`, closefrom) would pull out from under it.

//go:debug containermaxprocs=0
//go:debug updatemaxprocs=0

package main

/*
#cgo CFLAGS: -I${SRCDIR}/c -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -Wno-unused-parameter
#cgo LDFLAGS: -L${SRCDIR}/../lib -lradic -ldl
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"
)

// A c-shared library still needs a main; it never runs.
func main() {}

// gate is the Go side's view of the process: the policy it announced to C
// and, in test mode, how many calls of each kind it was handed.
var gate struct {
	policy     C.int
	countsPath string
	counts     [C.RADIC_OP_COUNT]atomic.Uint64
}

// init runs while libradic.so waits for it in radic_load_go, before the
// program's main(), with every signal blocked and the low fd numbers held:
// whatever fds Go makes here land above them.
func init() {
	gate.policy = C.RADIC_MANAGE_NONE
	if os.Getenv("RADIC_TEST_MANAGE") != "1" && os.Getenv("RADIC_JOB") != "" {
		// A rank of a radic job: its connections to the job's other
		// processes become safe sockets.
		safe = newSafeSockets()
		if safe != nil {
			gate.policy = C.RADIC_MANAGE_JOB
		}
	} else if os.Getenv("RADIC_TEST_MANAGE") == "1" {
		gate.policy = C.RADIC_MANAGE_INET_STREAM
		gate.countsPath = os.Getenv("RADIC_TEST_COUNTS")
		// Managed sockets will need Go's poller, whose fds the process
		// must not be able to close or replace. Start it now (a timer
		// does), while the low fd numbers are held, so that
		// libradic.so protects its fds and tests exercise that.
		time.AfterFunc(time.Hour, func() {})
	}
	C.radic_set_ready(gate.policy)
}

// radicGoCall is where C hands Go a call on a managed fd (or tells it of a
// new fd: socket, accept, dup). It returns RADIC_DONE with c.ret/c.err set
// when Go performed the call, RADIC_PASS to have C make the real call.
//
//export radicGoCall
func radicGoCall(c *C.struct_radic_call) C.int {
	op := int(c.op)
	if op < 0 || op >= len(gate.counts) {
		return C.RADIC_PASS
	}
	if safe != nil {
		return safe.dispatch(c)
	}
	gate.counts[op].Add(1)
	switch op {
	case C.RADIC_OP_socket:
		// In test mode every TCP socket is managed from birth.
		C.radic_fd_set(c.fd, C.RADIC_FD_MANAGED)
	case C.RADIC_OP_accept, C.RADIC_OP_dup:
		// args[0] is the new fd; it is the same kind of socket as c.fd.
		C.radic_fd_set(C.int(c.args[0]), C.RADIC_FD_MANAGED)
	}
	return C.RADIC_PASS
}

// radicGoPing does nothing: calling it from C waits until Go's package
// init has run (cgo holds every call into Go until then). libradic.so
// calls it right after loading this library.
//
//export radicGoPing
func radicGoPing() {}

// radicGoExit runs at process end (a destructor, or just before exec or
// _exit), in the process that owns the runtime.
//
//export radicGoExit
func radicGoExit() {
	if safe != nil {
		safe.exit()
	}
	if gate.countsPath == "" {
		return
	}
	var lines []string
	for op := range gate.counts {
		if n := gate.counts[op].Swap(0); n > 0 {
			name := C.GoString(C.radic_op_name(C.int(op)))
			lines = append(lines, fmt.Sprintf("%s %d\n", name, n))
		}
	}
	if len(lines) == 0 {
		return
	}
	sort.Strings(lines)
	writeAll(gate.countsPath, strings.Join(lines, ""))
}

// writeAll appends to a file through the real libc calls: os.File would go
// through the runtime poller, and the interposed write would be pointless.
func writeAll(path, s string) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	fd := C.radic_open_append(cpath)
	if fd < 0 {
		return
	}
	defer C.radic_real_close(fd)
	C.radic_real_write_all(fd, unsafe.Pointer(unsafe.StringData(s)), C.size_t(len(s)))
}
