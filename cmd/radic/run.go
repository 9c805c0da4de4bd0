package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/radic-project/radic/internal/cluster"
)

func init() {
	register("run", "run a job's ranks on the cluster: radic run --np P -- CMD ARGS...", runCmd)
}

// parseNodeList parses "0,2,5-7".
func parseNodeList(s string) ([]int, error) {
	var ids []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(strings.TrimSpace(lo))
		if err != nil {
			return nil, fmt.Errorf("--nodes %q: %q is not a node id", s, part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(strings.TrimSpace(hi)); err != nil || b < a {
				return nil, fmt.Errorf("--nodes %q: bad range %q", s, part)
			}
		}
		for i := a; i <= b; i++ {
			ids = append(ids, i)
		}
	}
	return ids, nil
}

// findLib locates libradic.so: the flag, then $RADIC_LIB, then
// ../lib/libradic.so relative to this binary (the layout `make` builds).
// The ranks' libradic.so loads its Go half, libradic-go.so, from beside it
// (or $RADIC_GO_LIB), so that must be there too.
func findLib(flagValue string) (string, error) {
	lib, err := findCLib(flagValue)
	if err != nil {
		return "", err
	}
	goLib := os.Getenv("RADIC_GO_LIB")
	if goLib == "" {
		goLib = filepath.Join(filepath.Dir(lib), "libradic-go.so")
	}
	if _, err := os.Stat(goLib); err != nil {
		return "", fmt.Errorf("the Go half of %s: %w (build it with `make`)", lib, err)
	}
	return lib, nil
}

func findCLib(flagValue string) (string, error) {
	var tried []string
	for _, p := range []string{flagValue, os.Getenv("RADIC_LIB")} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("preload library %s: %w", p, err)
		}
		return filepath.Abs(p)
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(filepath.Dir(exe)), "lib", "libradic.so")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		tried = append(tried, p)
	}
	return "", fmt.Errorf("libradic.so not found (looked at %s); build it with `make`, pass --lib, or run bare with --no-radic",
		strings.Join(tried, ", "))
}

func runCmd(args []string) error {
	fs := flag.NewFlagSet("radic run", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: radic run --np P [--per-node K] [--nodes LIST] [--tag-output] [--no-radic] [--recovery|--no-recovery] -- CMD ARGS...")
		fs.PrintDefaults()
	}
	var o cluster.RunOptions
	fs.IntVar(&o.NP, "np", 1, "number of ranks")
	fs.IntVar(&o.PerNode, "per-node", 0, "`K` consecutive ranks per node (default: round robin)")
	nodes := fs.String("nodes", "", "node ids to run on, e.g. 0,2,4-6 (default: every live compute node)")
	fs.BoolVar(&o.TagOutput, "tag-output", false, "prefix each output line with [rank R]")
	fs.IntVar(&o.PortBase, "port-base", 0, "rank r listens on `port` base+r (default: chosen per job, 20000 and up)")
	fs.BoolVar(&o.Stdin, "stdin", false, "give rank 0 radic's stdin (default /dev/null for every rank)")
	fs.DurationVar(&o.Grace, "grace", 0, "time between SIGTERM and SIGKILL when the job is stopped (default 3s)")
	noRadic := fs.Bool("no-radic", false, "run the ranks bare, without libradic.so in front of them")
	// Recovery's pessimistic log (RADIC_RECOVERY=1 in the ranks, passed
	// through the launcher's environment). Off by default for now: with it
	// a rank's sends wait until its protectors hold what it received, so a
	// cut or partition that isolates a protector stalls the job, which the
	// safe-socket suites (recovery not built yet) do not expect.
	recovery := fs.Bool("recovery", false, "log every received byte on the ranks' protectors before anything that depends on it leaves (pessimistic logging, RADIC_RECOVERY=1)")
	noRecovery := fs.Bool("no-recovery", false, "no logging (today's default; wins over --recovery)")
	lib := fs.String("lib", "", "the preload `library` (default $RADIC_LIB, or lib/libradic.so beside radic's bin/)")
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	switch {
	case *noRecovery:
		os.Setenv("RADIC_RECOVERY", "0")
	case *recovery:
		os.Setenv("RADIC_RECOVERY", "1")
	}
	if !*noRadic {
		p, err := findLib(*lib)
		if err != nil {
			return err
		}
		o.Preload = p
	}
	if *nodes != "" {
		ids, err := parseNodeList(*nodes)
		if err != nil {
			return err
		}
		o.Nodes = ids
	}
	o.Argv = fs.Args()
	o.Dir = cluster.DefaultStateDir()
	o.Stdout, o.Stderr = os.Stdout, os.Stderr
	o.Logf = stderrf
	code, err := cluster.Run(o)
	if err != nil {
		return err
	}
	if code != 0 {
		return exitError{code}
	}
	return nil
}
