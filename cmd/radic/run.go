package main

import (
	"flag"
	"fmt"
	"os"
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

func runCmd(args []string) error {
	fs := flag.NewFlagSet("radic run", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: radic run --np P [--per-node K] [--nodes LIST] [--tag-output] -- CMD ARGS...")
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
	if err := fs.Parse(args); err != nil {
		return exitError{2}
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
