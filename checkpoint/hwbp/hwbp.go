// Package hwbp probes whether hardware breakpoints trap on this machine.
//
// CRIU catches the end of its parasite code in a dumped process with a
// hardware breakpoint. Some virtual machines (this project's kernel 6.18
// guests among them) accept the debug registers and read them back but
// never trap, and `criu dump` then waits for ever ("Waiting for PID to
// trap"). CRIU's fault-injection knob CRIU_FAULT=130 (FI_NO_BREAKPOINTS)
// makes it step with PTRACE_SYSCALL instead: slower, but it works
// everywhere. The criu backend sets it only where [Probe] says breakpoints
// do not trap, never by default (../shared/notes/checkpoint.md).
//
// The probe starts /bin/true under ptrace, stopped at its exec, sets an
// execute breakpoint on the program's entry point (AT_ENTRY: the loader
// always jumps there), reads the debug registers back, and lets it run:
// a SIGTRAP at the entry with DR6 naming breakpoint 0 means they work; the
// program running to its exit means they do not.
package hwbp

import (
	"fmt"
	"time"
)

// Result is what the probe found.
type Result struct {
	// Trap: a hardware breakpoint stopped the program.
	Trap bool
	// Detail says what was seen, for logs.
	Detail string
	// Took is how long the probe ran.
	Took time.Duration
}

func (r Result) String() string {
	if r.Trap {
		return fmt.Sprintf("hardware breakpoints trap (%s)", r.Detail)
	}
	return fmt.Sprintf("hardware breakpoints do not trap (%s)", r.Detail)
}

// Probe runs the probe (a few milliseconds). An error means it could not
// tell (no ptrace, no /bin/true, an architecture it does not know): the
// caller should then act as if breakpoints did not trap, the choice that
// works either way.
func Probe() (Result, error) {
	start := time.Now()
	r, err := probe()
	r.Took = time.Since(start)
	return r, err
}
