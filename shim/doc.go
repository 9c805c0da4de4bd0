// Command shim builds libradic-go.so, the Go control plane of the LD_PRELOAD
// library that puts a process under radic (`go build -buildmode=c-shared`,
// see the Makefile).
//
// The library has two halves, each a shared object. The C half,
// libradic.so (c/: shim.h, core.c, trampolines.c, process.c, conn.c), is
// what LD_PRELOAD names, and loads this Go half only in a process that is
// to be managed (RADIC_JOB or RADIC_TEST_MANAGE=1), before main(), with
// every signal blocked (see radic_load_go in c/core.c). It interposes libc: socket, connect, accept, send/recv and
// read/write families, close and dup, fcntl, ioctl, poll/select/epoll, fork,
// exec and signals. Each trampoline looks the fd up in a C table and, when
// the fd is not managed, makes the real libc call at once: pipes, files,
// eventfds, unix sockets and connections to programs outside the job never
// enter Go, so the library costs nothing measurable on them.
//
// The Go half is the control plane. It is entered only for managed inet
// sockets, only once the runtime is up, never re-entrantly, and never in a
// fork or vfork child (Go's threads do not exist there). For each call it is
// given (struct radic_call) it either handles the call or hands it back to C
// ("pass"), which then makes the real call.
//
// In this first version nothing is managed in production: the library is a
// transparent pass-through. RADIC_TEST_MANAGE=1 marks every TCP socket
// managed, so that tests can prove the switch into Go and back works for
// every call; RADIC_TEST_COUNTS=FILE then receives, at process end, how many
// calls of each kind Go saw (lines "OP COUNT").
package main
