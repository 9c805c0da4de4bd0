package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/radic-project/radic/internal/cluster"
)

func init() {
	register("exec-on", "(virtual cluster) run a command on a node, as ssh would: radic exec-on NODE CMD...", execOnCmd)
	register("mpirun", "(virtual cluster) Open MPI's mpirun across the nodes, under radic: radic mpirun [--no-radic] -np N PROG", func(a []string) error {
		return mpiCmd(cluster.OpenMPI, a)
	})
	register("mpiexec", "(virtual cluster) MPICH's mpiexec (hydra) across the nodes, under radic: radic mpiexec [--no-radic] -n N PROG", func(a []string) error {
		return mpiCmd(cluster.MPICH, a)
	})
}

const execOnHelp = `usage: radic exec-on [SSH-OPTIONS] NODE CMD [ARGS...]

Runs CMD ARGS..., joined by spaces, through ` + "`sh -c`" + ` inside node NODE of the
virtual cluster: its network namespace, its job cgroup (so kill-node and
freeze reach it) and a UTS namespace whose host name is the node's name.
It stands in for ssh: stdin, stdout, stderr and the exit status are the
command's own (radic execs it in place), signals reach it directly, and no
descriptor of the caller's other than 0, 1 and 2 is passed on. Leading
ssh options (-x, -T, -q, -o OPT, -p PORT, ...) are accepted and ignored,
and NODE may be user@node. NODE is a node's name (n2), id (2) or address.

In a radic job (RADIC_JOB set, as ` + "`radic mpirun`" + ` and ` + "`radic mpiexec`" + ` set it)
the command gets the job's environment with RADIC_NODE and RADIC_DAEMON
of NODE, so that an MPI launcher's daemons and ranks are managed there.

This is a convenience of the virtual cluster: it reads the cluster's state
($RADIC_STATE_DIR, default ` + "%s" + `). On real hosts use ssh, with
libradic.so and the job's RADIC_* variables passed on by the launcher.
Use it as Open MPI's rsh agent (--mca plm_rsh_agent "radic exec-on") or
as hydra's (-launcher ssh -launcher-exec WRAPPER, WRAPPER a script that
execs ` + "`radic exec-on \"$@\"`" + `); radic mpirun and radic mpiexec do both.
`

// sshValueOpts are ssh's options that take a value.
const sshValueOpts = "BbcDEeFIiJLlmOoPpQRSWw"

func execOnCmd(args []string) error {
	i := 0
	for i < len(args) && strings.HasPrefix(args[i], "-") && len(args[i]) > 1 {
		a := args[i]
		if a == "-h" || a == "--help" {
			fmt.Fprintf(os.Stderr, execOnHelp, cluster.DefaultStateDir())
			return nil
		}
		i++
		if a == "--" {
			break
		}
		// -oOPT carries its value; -o OPT takes the next argument.
		if len(a) == 2 && strings.ContainsRune(sshValueOpts, rune(a[1])) {
			i++
		}
	}
	if len(args)-i < 2 {
		fmt.Fprintf(os.Stderr, execOnHelp, cluster.DefaultStateDir())
		return exitError{255}
	}
	node, cmd := args[i], strings.Join(args[i+1:], " ")
	s, err := cluster.Load(cluster.DefaultStateDir())
	if err != nil {
		return sshFail(err)
	}
	n, err := s.NodeNamed(node)
	if err != nil {
		return sshFail(err)
	}
	env := cluster.NodeEnv(s, n, os.Environ())
	if err := cluster.EnterNode(s, n); err != nil {
		return sshFail(err)
	}
	err = syscall.Exec("/bin/sh", []string{"sh", "-c", cmd}, env)
	return sshFail(fmt.Errorf("exec /bin/sh: %w", err))
}

// sshFail: ssh's own failures exit 255.
func sshFail(err error) error {
	fmt.Fprintf(os.Stderr, "radic exec-on: %v\n", err)
	return exitError{255}
}

func mpiUsage(kind string) {
	cmd, what, daemons, np, prog, launcher := "mpirun", "Open MPI's mpirun", "orted", "-np", "ompi", "mpirun"
	if kind == cluster.MPICH {
		cmd, what, daemons, np, prog, launcher = "mpiexec", "MPICH's mpiexec (hydra)", "hydra_pmi_proxy", "-n", "mpich", "mpiexec.mpich"
	}
	fmt.Fprintf(os.Stderr, `usage: radic %[1]s [RADIC-OPTIONS] [--] %[1]s-ARGS... PROG [ARGS...]

Runs %[2]s across the virtual cluster's nodes: the launcher on the first
node (its namespace, job cgroup and host name), a hostfile naming the nodes,
"radic exec-on" as the launcher's remote shell, the nodes' interface
(eth0) and TCP-only transports, and, under radic, libradic.so and the job's
RADIC_* variables for the launcher and every process it starts (%[3]s,
the ranks). Every TCP connection between nodes of the job is then a
managed safe socket; connections inside a node stay plain.
Example: radic %[1]s %[4]s 4 build/mpi/%[5]s-mpicheck

This is a convenience of the virtual cluster: it reads the cluster's state
($RADIC_STATE_DIR, default %[6]s). Its exit status is the launcher's;
SIGINT, SIGTERM and SIGHUP are passed on to the launcher.

RADIC-OPTIONS (before the launcher's own):
  --no-radic        run bare: no preload, no job (the same hostfile and transports)
  --nodes LIST      the nodes of the hostfile, e.g. 0-3 or 1,3 (default every live compute node)
  --per-node K      K slots per node in the hostfile (default 1)
  --launcher PROG   the launcher (default %[7]s)
  --lib PATH        the preload library (default $RADIC_LIB, or lib/libradic.so beside bin/)
`, cmd, what, daemons, np, prog, cluster.DefaultStateDir(), launcher)
}

func mpiCmd(kind string, args []string) error {
	o := cluster.MPIOptions{Dir: cluster.DefaultStateDir(), Kind: kind, Logf: stderrf}
	bare := false
	lib := ""
	value := func(i int) (string, error) {
		if i+1 >= len(args) {
			return "", fmt.Errorf("%s needs a value", args[i])
		}
		return args[i+1], nil
	}
	i := 0
loop:
	for ; i < len(args); i++ {
		var err error
		var v string
		switch args[i] {
		case "-h", "--help":
			mpiUsage(kind)
			return nil
		case "--":
			i++
			break loop
		case "--no-radic":
			bare = true
		case "--nodes":
			if v, err = value(i); err == nil {
				o.Nodes, err = parseNodeList(v)
			}
			i++
		case "--per-node":
			if v, err = value(i); err == nil {
				o.PerNode, err = strconv.Atoi(v)
			}
			i++
		case "--launcher":
			o.Launcher, err = value(i)
			i++
		case "--lib":
			lib, err = value(i)
			i++
		default:
			break loop
		}
		if err != nil {
			return err
		}
	}
	o.Args = args[i:]
	if len(o.Args) == 0 {
		mpiUsage(kind)
		return exitError{2}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if strings.ContainsAny(self, " \t'\"") {
		return errors.New("radic's path " + self + " contains a space or quote: the launchers split their agent's command line on spaces")
	}
	o.Radic = self
	if !bare {
		if o.Preload, err = findLib(lib); err != nil {
			return err
		}
	}
	code, err := cluster.RunMPI(o)
	if err != nil {
		return err
	}
	if code != 0 {
		return exitError{code}
	}
	return nil
}
