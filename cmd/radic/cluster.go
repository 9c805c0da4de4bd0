package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/radic-project/radic/internal/cluster"
	"github.com/radic-project/radic/internal/cluster/proc"
)

func init() {
	register("cluster", "a virtual cluster on this machine: up, down, status", clusterCmd)
	register("nsexec", "(internal) start a process inside a node; used by radic itself", func([]string) error {
		proc.HelperMain()
		return nil
	})
}

func stderrf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

func clusterUsage() {
	fmt.Fprint(os.Stderr, `usage:
  radic cluster up --nodes N [--spares S] [--mode netns|loopback] [--name NAME] [--subnet CIDR] [--no-daemons]
  radic cluster down
  radic cluster status [--json]

The cluster's state lives in $RADIC_STATE_DIR (default `+cluster.DefaultStateDir()+`).
`)
}

func clusterCmd(args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		clusterUsage()
		if len(args) == 0 {
			return exitError{2}
		}
		return nil
	}
	switch args[0] {
	case "up":
		return clusterUp(args[1:])
	case "down":
		return clusterDown(args[1:])
	case "status":
		return clusterStatus(args[1:])
	}
	clusterUsage()
	return fmt.Errorf("unknown subcommand %q", args[0])
}

func clusterUp(args []string) error {
	fs := flag.NewFlagSet("radic cluster up", flag.ContinueOnError)
	var o cluster.UpOptions
	fs.IntVar(&o.Nodes, "nodes", 4, "compute `nodes`")
	fs.IntVar(&o.Spares, "spares", 0, "spare `nodes` (ids after the compute nodes)")
	fs.StringVar(&o.Mode, "mode", "", "netns (root; default as root) or loopback")
	fs.StringVar(&o.Name, "name", cluster.DefaultName, "cluster `name` (1-8 of [a-z0-9]): prefixes namespaces, links, the nft table and the cgroup")
	fs.StringVar(&o.Subnet, "subnet", "", "node addresses, an IPv4 /16 (default "+cluster.DefaultNetnsSubnet+", loopback "+cluster.DefaultLoopbackSubnet+")")
	noDaemons := fs.Bool("no-daemons", false, "do not start radicd on the nodes")
	fs.BoolVar(&o.FenceKill, "fence-kill", false, "radicd kills the job of a node cut off from the ring, so that recovery (radic run --recovery) may restart its ranks elsewhere (off: a lost node's ranks are not restarted, as a frozen node's could wake and run twice)")
	fs.StringVar(&o.Fabric, "fabric", "", "the daemons' network, radicd --fabric: bg (the emulated Blue Gene torus) or ip (default: radicd's)")
	fs.StringVar(&o.Radicd, "radicd", "", "radicd `binary` (default $RADIC_RADICD or next to radic)")
	fs.DurationVar(&o.ReadyTimeout, "ready-timeout", 10*time.Second, "how long each radicd has to send READY=1")
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	o.Daemons = !*noDaemons
	o.Dir = cluster.DefaultStateDir()
	o.Logf = stderrf
	t0 := time.Now()
	s, err := cluster.Up(o)
	if err != nil {
		return err
	}
	took := time.Since(t0)
	printNodes(s)
	spares := 0
	for _, n := range s.Nodes {
		if n.Spare {
			spares++
		}
	}
	daemons := "radicd on every node"
	if !s.Daemons {
		daemons = "no daemons"
	}
	fmt.Printf("cluster %s up: %d nodes + %d spares, %s mode, %s, %s, in %v (state %s)\n",
		s.Name, len(s.Nodes)-spares, spares, s.Mode, s.Subnet, daemons, took.Round(time.Millisecond), s.Dir)
	return nil
}

func clusterDown(args []string) error {
	fs := flag.NewFlagSet("radic cluster down", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	dir := cluster.DefaultStateDir()
	t0 := time.Now()
	ok, err := cluster.Down(dir, func(f string, a ...any) { fmt.Printf(f+"\n", a...) })
	if err != nil {
		return fmt.Errorf("%w\n(what is left is still recorded in %s; run `radic cluster down` again)", err, dir)
	}
	if !ok {
		fmt.Printf("no cluster in %s: nothing to do\n", dir)
		return nil
	}
	fmt.Printf("took %v\n", time.Since(t0).Round(time.Millisecond))
	return nil
}

func printNodes(s *cluster.State) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tROLE\tADDR\tNETNS\tRADICD\tSTATE")
	for _, n := range s.Nodes {
		role := "compute"
		if n.Spare {
			role = "spare"
		}
		addr := n.Addr
		if n.Addr != n.LogicalAddr {
			addr = n.LogicalAddr + "->" + n.Addr
		}
		rd := "-"
		if n.Radicd != nil {
			rd = fmt.Sprintf("pid %d", n.Radicd.Pid)
			if !n.Radicd.Alive() {
				rd += " (gone)"
			}
		}
		var st []string
		if n.Dead {
			st = append(st, "dead")
		}
		if n.LinkDown && !n.Dead {
			st = append(st, "link-down")
		}
		if n.Frozen {
			st = append(st, "frozen")
		}
		if len(st) == 0 {
			st = []string{"ok"}
		}
		ns := n.Netns
		if ns == "" {
			ns = "-"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", n.ID, role, addr, ns, rd, strings.Join(st, ","))
	}
	w.Flush()
}

func clusterStatus(args []string) error {
	fs := flag.NewFlagSet("radic cluster status", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the state file")
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	s, err := cluster.Load(cluster.DefaultStateDir())
	if err != nil {
		if errors.Is(err, cluster.ErrNoCluster) {
			fmt.Println(err)
			return exitError{3}
		}
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	fmt.Printf("cluster %s (%s mode, %s, phase %s, created %s, state %s)\n",
		s.Name, s.Mode, s.Subnet, s.Phase, s.Created.Local().Format(time.RFC3339), s.Dir)
	printNodes(s)
	for _, j := range s.Jobs {
		alive := 0
		for _, r := range j.Ranks {
			if r.Proc.Alive() {
				alive++
			}
		}
		fmt.Printf("job %s: %d ranks (%d running), launcher pid %d, %s\n", j.ID, len(j.Ranks), alive, j.Launcher.Pid, strings.Join(j.Argv, " "))
	}
	for _, f := range s.Faults {
		until := "until healed"
		if !f.Until.IsZero() {
			until = "until " + f.Until.Local().Format("15:04:05.000")
		}
		fmt.Printf("fault %d: %s on %v since %s, %s\n", f.ID, f.Kind, f.Nodes, f.Since.Local().Format("15:04:05.000"), until)
	}
	return nil
}
