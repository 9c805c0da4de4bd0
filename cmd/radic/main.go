// Command radic is the user's entry point to radic: run a job under radic,
// look at the daemons, build a virtual cluster on one machine and inject
// faults into it.
//
// Each subcommand lives in its own file and registers itself in init, so that
// the parts stay independent.
package main

import (
	"errors"
	"fmt"
	"os"
	"sort"
)

// command is one subcommand: `radic NAME ARGS...`.
type command struct {
	summary string                    // one line for `radic help`
	run     func(args []string) error // args exclude the subcommand name
}

var commands = map[string]command{}

func register(name, summary string, run func(args []string) error) {
	if _, dup := commands[name]; dup {
		panic("radic: subcommand registered twice: " + name)
	}
	commands[name] = command{summary: summary, run: run}
}

// exitError carries a process exit status through to main, for `radic run`,
// whose status is the job's.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func usage() {
	fmt.Fprintln(os.Stderr, "usage: radic COMMAND [ARGS...]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(os.Stderr, "\n`radic COMMAND -h` shows a command's flags.")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "help" || os.Args[1] == "-h" || os.Args[1] == "--help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "radic: unknown command %q\n\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err := cmd.run(os.Args[2:]); err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		fmt.Fprintf(os.Stderr, "radic %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
