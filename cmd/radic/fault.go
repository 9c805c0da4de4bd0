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
	register("fault", "inject a fault into the cluster: kill-node, kill-rank, cut-link, partition, freeze, readdress, heal", faultCmd)
	register("fault-timer", "(internal) undo a fault when its --for expires; started by `radic fault`", faultTimerCmd)
}

func faultUsage() {
	fmt.Fprint(os.Stderr, `usage:
  radic fault kill-node N              every process of node N killed at once, its address gone
  radic fault kill-rank R [--job ID]   SIGKILL to rank R (of the newest job by default)
  radic fault cut-link N [--for DUR]   node N's link down, both directions
  radic fault partition A,B[,..] [--for DUR]
                                       drop all traffic between the listed nodes and the others
  radic fault freeze N [--for DUR]     node N hung (cgroup freezer)
  radic fault readdress N              node N gets a new address
  radic fault heal [ID...]             undo active faults (all by default)
Without --for a fault lasts until healed or until `+"`radic cluster down`"+`.
`)
}

// parseInterleaved parses flags that may come before or after positional
// arguments ("cut-link 2 --for 3s").
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func nodeArg(pos []string, what string) (int, error) {
	if len(pos) != 1 {
		return 0, fmt.Errorf("want exactly one %s, got %q", what, strings.Join(pos, " "))
	}
	n, err := strconv.Atoi(pos[0])
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s %q is not a number", what, pos[0])
	}
	return n, nil
}

func faultCmd(args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		faultUsage()
		if len(args) == 0 {
			return exitError{2}
		}
		return nil
	}
	kind := args[0]
	fs := flag.NewFlagSet("radic fault "+kind, flag.ContinueOnError)
	fs.Usage = faultUsage
	dur := fs.Duration("for", 0, "undo the fault after this long (default: until healed)")
	job := fs.String("job", "", "job id for kill-rank (default: the newest job)")
	pos, err := parseInterleaved(fs, args[1:])
	if err != nil {
		return exitError{2}
	}
	if *dur < 0 {
		return fmt.Errorf("--for %v: want a positive duration", *dur)
	}
	dir := cluster.DefaultStateDir()
	var msg string
	noDur := func() error {
		if *dur != 0 {
			return fmt.Errorf("%s takes no --for", kind)
		}
		return nil
	}
	switch kind {
	case cluster.FaultKillNode:
		n, err := nodeArg(pos, "node")
		if err == nil {
			err = noDur()
		}
		if err != nil {
			return err
		}
		msg, err = cluster.KillNode(dir, n)
		if err != nil {
			return err
		}
	case cluster.FaultKillRank:
		r, err := nodeArg(pos, "rank")
		if err == nil {
			err = noDur()
		}
		if err != nil {
			return err
		}
		if msg, err = cluster.KillRank(dir, r, *job); err != nil {
			return err
		}
	case cluster.FaultCutLink:
		n, err := nodeArg(pos, "node")
		if err != nil {
			return err
		}
		if msg, err = cluster.CutLink(dir, n, *dur); err != nil {
			return err
		}
	case cluster.FaultFreeze:
		n, err := nodeArg(pos, "node")
		if err != nil {
			return err
		}
		if msg, err = cluster.Freeze(dir, n, *dur); err != nil {
			return err
		}
	case cluster.FaultReaddress:
		n, err := nodeArg(pos, "node")
		if err == nil {
			err = noDur()
		}
		if err != nil {
			return err
		}
		if msg, err = cluster.Readdress(dir, n); err != nil {
			return err
		}
	case cluster.FaultPartition:
		if len(pos) != 1 {
			return fmt.Errorf("want one comma-separated node list, e.g. partition 0,1")
		}
		ids, err := parseNodeList(pos[0])
		if err != nil {
			return err
		}
		if msg, err = cluster.Partition(dir, ids, *dur); err != nil {
			return err
		}
	case "heal":
		var ids []int
		for _, p := range pos {
			if p == "all" {
				ids = nil
				break
			}
			id, err := strconv.Atoi(p)
			if err != nil {
				return fmt.Errorf("fault id %q is not a number", p)
			}
			ids = append(ids, id)
		}
		msgs, err := cluster.Heal(dir, ids)
		for _, m := range msgs {
			fmt.Println(m)
		}
		if err != nil {
			return err
		}
		if len(msgs) == 0 {
			fmt.Println("no active fault")
		}
		return nil
	default:
		faultUsage()
		return fmt.Errorf("unknown fault %q", kind)
	}
	fmt.Println(msg)
	return nil
}

func faultTimerCmd(args []string) error {
	fs := flag.NewFlagSet("radic fault-timer", flag.ContinueOnError)
	dir := fs.String("state-dir", "", "cluster state directory")
	id := fs.Int("fault", 0, "fault id")
	if err := fs.Parse(args); err != nil || *dir == "" || *id == 0 {
		return exitError{2}
	}
	return cluster.TimerMain(*dir, *id)
}
