package cluster

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/radic-project/radic/internal/cluster/cgroup"
	"github.com/radic-project/radic/internal/cluster/netns"
	"github.com/radic-project/radic/internal/cluster/nft"
	"github.com/radic-project/radic/internal/cluster/proc"
)

// TimerCommand is the program and leading arguments of the fault timer;
// by default this executable with subcommand "fault-timer".
var TimerCommand = func() ([]string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return []string{self, "fault-timer"}, nil
}

// loopbackProcs returns the recorded processes of node id (loopback mode,
// where there is no cgroup to ask).
func loopbackProcs(s *State, id int) []proc.ID {
	var ps []proc.ID
	n, _ := s.Node(id)
	if n != nil && n.Radicd != nil {
		ps = append(ps, *n.Radicd)
	}
	for _, j := range s.Jobs {
		for _, r := range j.Ranks {
			if r.Node == id && r.Proc.Pid > 0 {
				ps = append(ps, r.Proc)
			}
		}
	}
	return ps
}

// KillNode kills every process of a node at once and takes its address
// away (netns: cgroup.kill and its link down). It returns what it did.
func KillNode(dir string, id int) (string, error) {
	var msg string
	err := Update(dir, func(s *State) error {
		n, err := s.Node(id)
		if err != nil {
			return err
		}
		if n.Dead {
			return fmt.Errorf("node %d is already dead", id)
		}
		n.Dead = true
		n.Frozen = false
		if err := save(dir, s); err != nil { // recorded before done
			return err
		}
		s.Faults = slices.DeleteFunc(s.Faults, func(f Fault) bool {
			if (f.Kind == FaultFreeze || f.Kind == FaultCutLink) && slices.Contains(f.Nodes, id) {
				stopTimer(f)
				return true
			}
			return false
		})
		if s.Mode == ModeLoopback {
			ps := loopbackProcs(s, id)
			count := 0
			for _, p := range ps {
				if p.Alive() {
					count++
				}
				_ = p.Signal(syscall.SIGKILL, true)
				_ = p.Signal(syscall.SIGCONT, true)
			}
			for _, p := range ps {
				p.WaitGone(killTimeout)
			}
			msg = fmt.Sprintf("kill-node %d: SIGKILL to the %d processes of node %s (their process groups); loopback mode: %s stays routable but nothing of the node listens on it",
				id, count, n.Name, n.Addr)
			return nil
		}
		n.LinkDown = true
		pids, _ := cgroup.AllProcs(n.Cgroup)
		if err := cgroup.Kill(n.Cgroup, killTimeout); err != nil {
			return err
		}
		others, _ := netns.Pids(n.Netns)
		for _, pid := range others {
			if pid != os.Getpid() {
				_ = proc.Of(pid).Signal(syscall.SIGKILL, false)
			}
		}
		if err := netns.SetLink(n.Veth, false); err != nil {
			return err
		}
		msg = fmt.Sprintf("kill-node %d: cgroup.kill on %s (%d processes) and %d others in netns %s; link %s down: address %s is gone",
			id, n.Cgroup, len(pids), len(others), n.Netns, n.Veth, n.Addr)
		return nil
	})
	return msg, err
}

// KillRank sends SIGKILL to one rank of a job (the newest job when jobID is
// empty).
func KillRank(dir string, rank int, jobID string) (string, error) {
	s, err := Load(dir)
	if err != nil {
		return "", err
	}
	if len(s.Jobs) == 0 {
		return "", errors.New("no job is running on the cluster")
	}
	job := &s.Jobs[len(s.Jobs)-1]
	if jobID != "" {
		job = nil
		for i := range s.Jobs {
			if s.Jobs[i].ID == jobID {
				job = &s.Jobs[i]
			}
		}
		if job == nil {
			return "", fmt.Errorf("no job %q on the cluster", jobID)
		}
	}
	if rank < 0 || rank >= len(job.Ranks) {
		return "", fmt.Errorf("job %s has ranks 0..%d, not %d", job.ID, len(job.Ranks)-1, rank)
	}
	r := job.Ranks[rank]
	if !r.Proc.Alive() {
		return "", fmt.Errorf("rank %d of job %s (pid %d) is not running", rank, job.ID, r.Proc.Pid)
	}
	if err := r.Proc.Signal(syscall.SIGKILL, false); err != nil {
		return "", err
	}
	return fmt.Sprintf("kill-rank %d: SIGKILL to pid %d (rank %d of job %s, node %d)", rank, r.Proc.Pid, rank, job.ID, r.Node), nil
}

// inject records a fault, applies it with do and, for dur > 0, starts the
// timer that undoes it.
func inject(dir string, f Fault, dur time.Duration, do func(s *State, f *Fault) (string, error)) (string, error) {
	var msg string
	err := Update(dir, func(s *State) error {
		f.ID = s.NextFault
		s.NextFault++
		f.Since = time.Now().UTC()
		if dur > 0 {
			f.Until = f.Since.Add(dur)
		}
		if f.Kind == FaultPartition {
			f.Chain = "p" + strconv.Itoa(f.ID)
		}
		s.Faults = append(s.Faults, f)
		if err := save(dir, s); err != nil { // recorded before done
			return err
		}
		m, err := do(s, &s.Faults[len(s.Faults)-1])
		if err != nil {
			// Not applied: forget it again.
			s.Faults = s.Faults[:len(s.Faults)-1]
			_ = save(dir, s)
			return err
		}
		msg = fmt.Sprintf("fault %d: %s", f.ID, m)
		if dur > 0 {
			msg += fmt.Sprintf(" for %v (undone at %s)", dur, f.Until.Local().Format("15:04:05.000"))
		}
		return nil
	})
	if err != nil || dur == 0 {
		return msg, err
	}
	tid, err := startTimer(dir, f.ID)
	if err != nil {
		return msg, fmt.Errorf("%s, but its timer did not start: %w (undo it with `radic fault heal %d`)", msg, err, f.ID)
	}
	msg += fmt.Sprintf(" [timer pid %d]", tid.Pid)
	return msg, nil
}

func startTimer(dir string, id int) (proc.ID, error) {
	argv, err := TimerCommand()
	if err != nil {
		return proc.ID{}, err
	}
	cmd := exec.Command(argv[0], append(argv[1:], "--state-dir", dir, "--fault", strconv.Itoa(id))...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return proc.ID{}, err
	}
	tid := proc.Of(cmd.Process.Pid)
	err = Update(dir, func(s *State) error {
		for i := range s.Faults {
			if s.Faults[i].ID == id {
				s.Faults[i].Timer = &tid
				return nil
			}
		}
		return nil // already healed
	})
	_ = cmd.Process.Release()
	return tid, err
}

func stopTimer(f Fault) {
	if f.Timer != nil && f.Timer.Pid != os.Getpid() && strings.Contains(proc.Cmdline(f.Timer.Pid), "fault-timer") {
		_ = f.Timer.Signal(syscall.SIGKILL, false)
	}
}

// CutLink takes node id's link down (both directions) for dur (0: until
// healed).
func CutLink(dir string, id int, dur time.Duration) (string, error) {
	return inject(dir, Fault{Kind: FaultCutLink, Nodes: []int{id}}, dur, func(s *State, f *Fault) (string, error) {
		n, err := s.Node(id)
		if err != nil {
			return "", err
		}
		if s.Mode != ModeNetns {
			return "", errors.New("cut-link needs netns mode (a link per node); a loopback cluster has none")
		}
		if n.Dead {
			return "", fmt.Errorf("node %d is dead", id)
		}
		if err := netns.SetLink(n.Veth, false); err != nil {
			return "", err
		}
		n.LinkDown = true
		return fmt.Sprintf("cut-link %d: link %s (node %s, %s) down", id, n.Veth, n.Name, n.Addr), nil
	})
}

// Partition drops all traffic between the nodes in side and every other
// node, for dur (0: until healed).
func Partition(dir string, side []int, dur time.Duration) (string, error) {
	return inject(dir, Fault{Kind: FaultPartition, Nodes: side}, dur, func(s *State, f *Fault) (string, error) {
		if s.Mode != ModeNetns {
			return "", errors.New("partition needs netns mode (nftables rules on the bridge); a loopback cluster has none")
		}
		var a, b []string
		var rest []int
		for _, id := range side {
			n, err := s.Node(id)
			if err != nil {
				return "", err
			}
			a = append(a, n.Veth)
		}
		for _, n := range s.Nodes {
			if !slices.Contains(side, n.ID) {
				b = append(b, n.Veth)
				rest = append(rest, n.ID)
			}
		}
		if len(b) == 0 {
			return "", errors.New("partition: every node is on the listed side; list a proper subset")
		}
		if err := nft.AddPartition(s.NftTable, f.Chain, a, b); err != nil {
			return "", err
		}
		return fmt.Sprintf("partition %s | %s: drop rules in nft table %s %s chain %s", ints(side), ints(rest), nft.Family, s.NftTable, f.Chain), nil
	})
}

// Freeze stops every process of node id (cgroup.freeze; SIGSTOP in
// loopback mode) for dur (0: until healed).
func Freeze(dir string, id int, dur time.Duration) (string, error) {
	return inject(dir, Fault{Kind: FaultFreeze, Nodes: []int{id}}, dur, func(s *State, f *Fault) (string, error) {
		n, err := s.Node(id)
		if err != nil {
			return "", err
		}
		if n.Dead {
			return "", fmt.Errorf("node %d is dead", id)
		}
		if n.Frozen {
			return "", fmt.Errorf("node %d is already frozen", id)
		}
		if s.Mode == ModeLoopback {
			ps := loopbackProcs(s, id)
			for _, p := range ps {
				_ = p.Signal(syscall.SIGSTOP, true)
			}
			n.Frozen = true
			return fmt.Sprintf("freeze %d: SIGSTOP to the %d process groups of node %s", id, len(ps), n.Name), nil
		}
		if err := cgroup.Freeze(n.Cgroup, killTimeout); err != nil {
			_ = cgroup.Thaw(n.Cgroup)
			return "", err
		}
		n.Frozen = true
		return fmt.Sprintf("freeze %d: cgroup %s frozen", id, n.Cgroup), nil
	})
}

// Readdress gives node id a new address; the first one stays its logical
// address.
func Readdress(dir string, id int) (string, error) {
	var msg string
	err := Update(dir, func(s *State) error {
		n, err := s.Node(id)
		if err != nil {
			return err
		}
		if n.Generation >= 254 {
			return fmt.Errorf("node %d has been readdressed %d times: no address left", id, n.Generation)
		}
		p, err := netip.ParsePrefix(s.Subnet)
		if err != nil {
			return err
		}
		old := n.Addr
		n.Generation++
		n.Addr = nodeAddr(p.Addr(), id, n.Generation)
		if err := save(dir, s); err != nil { // recorded before done
			return err
		}
		if s.Mode == ModeLoopback {
			msg = fmt.Sprintf("readdress %d: %s -> %s (logical %s); loopback mode: recorded only, all of 127/8 stays routable", id, old, n.Addr, n.LogicalAddr)
			return nil
		}
		// Delete first: deleting a primary address would take the
		// secondary (the new one) with it.
		if err := netns.Batch(n.Netns, []string{
			"addr del " + old + "/16 dev eth0",
			"addr add " + n.Addr + "/16 dev eth0",
		}); err != nil {
			return err
		}
		msg = fmt.Sprintf("readdress %d: %s -> %s on %s eth0 (logical address %s)", id, old, n.Addr, n.Netns, n.LogicalAddr)
		return nil
	})
	return msg, err
}

// undo reverts one fault's effect (the caller removes it from s.Faults).
func undo(s *State, f Fault) error {
	others := func(kind string, id int) bool {
		for _, g := range s.Faults {
			if g.ID != f.ID && g.Kind == kind && slices.Contains(g.Nodes, id) {
				return true
			}
		}
		return false
	}
	switch f.Kind {
	case FaultCutLink:
		for _, id := range f.Nodes {
			n, err := s.Node(id)
			if err != nil || n.Dead || others(FaultCutLink, id) {
				continue
			}
			if err := netns.SetLink(n.Veth, true); err != nil {
				return err
			}
			n.LinkDown = false
		}
	case FaultPartition:
		return nft.DeleteChain(s.NftTable, f.Chain)
	case FaultFreeze:
		for _, id := range f.Nodes {
			n, err := s.Node(id)
			if err != nil || n.Dead || others(FaultFreeze, id) {
				continue
			}
			if s.Mode == ModeLoopback {
				for _, p := range loopbackProcs(s, id) {
					_ = p.Signal(syscall.SIGCONT, true)
				}
			} else if err := cgroup.Thaw(n.Cgroup); err != nil {
				return err
			}
			n.Frozen = false
		}
	}
	return nil
}

func describeFault(f Fault) string {
	return fmt.Sprintf("%s %s (fault %d)", f.Kind, ints(f.Nodes), f.ID)
}

// Heal undoes the faults with the given ids (all when ids is empty).
func Heal(dir string, ids []int) ([]string, error) {
	var msgs []string
	err := Update(dir, func(s *State) error {
		var errs []error
		kept := s.Faults[:0:0]
		for _, f := range s.Faults {
			if len(ids) > 0 && !slices.Contains(ids, f.ID) {
				kept = append(kept, f)
				continue
			}
			stopTimer(f)
			if err := undo(s, f); err != nil {
				errs = append(errs, fmt.Errorf("heal %s: %w", describeFault(f), err))
				kept = append(kept, f)
				continue
			}
			msgs = append(msgs, "healed "+describeFault(f))
		}
		for _, id := range ids {
			if !slices.ContainsFunc(s.Faults, func(f Fault) bool { return f.ID == id }) {
				errs = append(errs, fmt.Errorf("no active fault %d", id))
			}
		}
		s.Faults = kept
		return errors.Join(errs...)
	})
	return msgs, err
}

// TimerMain is the body of `radic fault-timer`: wait until the fault's
// deadline, then undo it. It first waits (briefly) to see itself recorded
// in the state; a timer that nobody recorded (its starter died) exits at
// once, so that no unrecorded process is ever left behind.
func TimerMain(dir string, id int) error {
	me := os.Getpid()
	var until time.Time
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		s, err := Load(dir)
		if err != nil {
			return nil // cluster gone
		}
		i := slices.IndexFunc(s.Faults, func(f Fault) bool { return f.ID == id })
		if i < 0 {
			return nil // healed already
		}
		if t := s.Faults[i].Timer; t != nil && t.Pid == me {
			until = s.Faults[i].Until
			break
		}
		if time.Since(start) > 5*time.Second {
			return fmt.Errorf("fault %d: this timer was never recorded in %s", id, dir)
		}
	}
	time.Sleep(time.Until(until))
	var done string
	err := Update(dir, func(s *State) error {
		i := slices.IndexFunc(s.Faults, func(f Fault) bool { return f.ID == id })
		if i < 0 || s.Faults[i].Timer == nil || s.Faults[i].Timer.Pid != me {
			return nil
		}
		f := s.Faults[i]
		if err := undo(s, f); err != nil {
			return err
		}
		s.Faults = append(s.Faults[:i], s.Faults[i+1:]...)
		done = describeFault(f)
		return nil
	})
	if done != "" {
		logTo(dir, "%s healed by its timer", done)
	}
	if err != nil {
		logTo(dir, "fault %d: timer could not undo it: %v", id, err)
	}
	return err
}

// logTo appends a line to the cluster's fault log.
func logTo(dir, format string, args ...any) {
	f, err := os.OpenFile(filepath.Join(dir, "faults.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s %s\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
}

func ints(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
