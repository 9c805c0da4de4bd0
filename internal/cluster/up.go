package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/radic-project/radic/internal/cluster/cgroup"
	"github.com/radic-project/radic/internal/cluster/netns"
	"github.com/radic-project/radic/internal/cluster/nft"
	"github.com/radic-project/radic/internal/cluster/proc"
)

// Default subnets of the two modes.
const (
	DefaultNetnsSubnet    = "10.77.0.0/16"
	DefaultLoopbackSubnet = "127.77.0.0/16"
	DefaultName           = "radic"
	MaxNodes              = 250
)

// UpOptions are the settings of `radic cluster up`.
type UpOptions struct {
	Dir          string        // state directory
	Name         string        // cluster name: prefix of every resource name
	Nodes        int           // compute nodes
	Spares       int           // spare nodes (ids after the compute nodes)
	Mode         string        // ModeNetns or ModeLoopback; "" = netns when root
	Subnet       string        // a /16; "" = the mode's default
	Daemons      bool          // start radicd on every node
	FenceKill    bool          // radicd kills the job of a node cut off from the ring
	Fabric       string        // radicd --fabric (bg or ip); "" = radicd's default
	Radicd       string        // radicd binary; "" = next to this executable or $RADIC_RADICD
	ReadyTimeout time.Duration // how long to wait for READY=1 from each radicd
	Logf         func(format string, args ...any)
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,7}$`)

// RadicdPath is where radicd is found: $RADIC_RADICD, else next to this
// executable.
func RadicdPath() string {
	if p := os.Getenv("RADIC_RADICD"); p != "" {
		return p
	}
	self, err := os.Executable()
	if err != nil {
		return "radicd"
	}
	return filepath.Join(filepath.Dir(self), "radicd")
}

// nodeAddr is the address of node id after gen readdresses: the third byte
// of the /16 is the generation, the fourth is id+1.
func nodeAddr(base netip.Addr, id, gen int) string {
	b := base.As4()
	b[2] = byte(gen)
	b[3] = byte(id + 1)
	return netip.AddrFrom4(b).String()
}

func parseSubnet(s, mode string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return p, fmt.Errorf("--subnet %q: %w", s, err)
	}
	if !p.Addr().Is4() || p.Bits() != 16 {
		return p, fmt.Errorf("--subnet %q: want an IPv4 /16 (nodes get .G.(ID+1), G the readdress generation)", s)
	}
	p = p.Masked()
	lo := netip.MustParsePrefix("127.0.0.0/8")
	if mode == ModeLoopback && !lo.Overlaps(p) {
		return p, fmt.Errorf("--subnet %s: loopback mode needs a subnet of 127.0.0.0/8", p)
	}
	if mode == ModeNetns && lo.Overlaps(p) {
		return p, fmt.Errorf("--subnet %s: netns mode needs a private range outside 127.0.0.0/8 (e.g. %s)", p, DefaultNetnsSubnet)
	}
	return p, nil
}

// checkRoutes refuses a subnet that the host already routes (another
// cluster, a VPN, the host's own network).
func checkRoutes(p netip.Prefix) error {
	routes, err := netns.Routes()
	if err != nil {
		return err
	}
	types := map[string]bool{"local": true, "broadcast": true, "unicast": true, "unreachable": true,
		"blackhole": true, "prohibit": true, "throw": true, "multicast": true, "anycast": true, "nat": true}
	for _, r := range routes {
		f := strings.Fields(r)
		if len(f) == 0 {
			continue
		}
		dst := f[0]
		if types[dst] && len(f) > 1 {
			dst = f[1]
		}
		if dst == "default" {
			continue
		}
		var q netip.Prefix
		if strings.Contains(dst, "/") {
			q, err = netip.ParsePrefix(dst)
		} else {
			var a netip.Addr
			a, err = netip.ParseAddr(dst)
			if err == nil {
				q = netip.PrefixFrom(a, 32)
			}
		}
		if err != nil || !q.Addr().Is4() {
			continue
		}
		if q.Overlaps(p) {
			return fmt.Errorf("subnet %s overlaps a route the host already has (%q): another cluster or network uses it; pick another with --subnet", p, r)
		}
	}
	return nil
}

func (o *UpOptions) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
	}
}

// Up creates a cluster. On failure it removes whatever it created.
func Up(o UpOptions) (*State, error) {
	if o.Name == "" {
		o.Name = DefaultName
	}
	if !nameRE.MatchString(o.Name) {
		return nil, fmt.Errorf("--name %q: want 1-8 lowercase letters and digits, starting with a letter (it prefixes interface names, which are limited to 15 bytes)", o.Name)
	}
	if o.Fabric != "" && o.Fabric != "bg" && o.Fabric != "ip" {
		return nil, fmt.Errorf("--fabric %q: want bg or ip", o.Fabric)
	}
	if o.Nodes < 1 || o.Spares < 0 || o.Nodes+o.Spares > MaxNodes {
		return nil, fmt.Errorf("--nodes %d --spares %d: want 1 <= nodes and nodes+spares <= %d", o.Nodes, o.Spares, MaxNodes)
	}
	root := os.Geteuid() == 0
	switch o.Mode {
	case "":
		o.Mode = ModeLoopback
		if root {
			o.Mode = ModeNetns
		}
	case ModeNetns:
		if !root {
			return nil, errors.New("--mode netns needs root (namespaces, cgroups, nftables); use --mode loopback")
		}
	case ModeLoopback:
	default:
		return nil, fmt.Errorf("--mode %q: want netns or loopback", o.Mode)
	}
	if o.Subnet == "" {
		o.Subnet = DefaultNetnsSubnet
		if o.Mode == ModeLoopback {
			o.Subnet = DefaultLoopbackSubnet
		}
	}
	subnet, err := parseSubnet(o.Subnet, o.Mode)
	if err != nil {
		return nil, err
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 10 * time.Second
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	unlock, err := lock(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if old, err := Load(dir); err == nil {
		return nil, fmt.Errorf("a cluster %q (%s, %d nodes, created %s, phase %s) is already recorded in %s: run `radic cluster down` to remove it first",
			old.Name, old.Mode, len(old.Nodes), old.Created.Format(time.RFC3339), old.Phase, dir)
	} else if !errors.Is(err, ErrNoCluster) {
		return nil, fmt.Errorf("%v: remove %s by hand or run `radic cluster down`", err, filepath.Join(dir, StateFile))
	}

	s := &State{
		Version: 1, Name: o.Name, Mode: o.Mode, Dir: dir, Subnet: subnet.String(),
		Daemons: o.Daemons, FenceKill: o.FenceKill, Fabric: o.Fabric, Phase: "creating", Created: time.Now().UTC(), NextJob: 1, NextFault: 1,
	}
	base := subnet.Addr()
	var cgMount string
	if o.Mode == ModeNetns {
		if cgMount, err = cgroup.Mount(); err != nil {
			return nil, err
		}
		s.Bridge = o.Name + "-br"
		s.NftTable = "radic_" + o.Name // a bare name may be an nft keyword ("rt2")
		s.Cgroup = filepath.Join(cgMount, "radic", o.Name)
		s.HostAddr = netip.AddrFrom4([4]byte{base.As4()[0], base.As4()[1], 255, 254}).String()
	}
	for id := 0; id < o.Nodes+o.Spares; id++ {
		n := Node{ID: id, Name: "n" + strconv.Itoa(id), Spare: id >= o.Nodes}
		n.Addr = nodeAddr(base, id, 0)
		n.LogicalAddr = n.Addr
		n.RadicdAddr = net.JoinHostPort(n.Addr, strconv.Itoa(RadicdPort))
		n.MetricsAddr = net.JoinHostPort(n.Addr, strconv.Itoa(MetricsPort))
		n.StateDir = filepath.Join(dir, "nodes", n.Name)
		if o.Mode == ModeNetns {
			n.Netns = fmt.Sprintf("%s-n%d", o.Name, id)
			n.Veth = fmt.Sprintf("%s-v%d", o.Name, id)
			n.Cgroup = filepath.Join(s.Cgroup, n.Name)
			n.DaemonCg = filepath.Join(n.Cgroup, "daemon")
			n.JobCg = filepath.Join(n.Cgroup, "job")
		}
		s.Nodes = append(s.Nodes, n)
	}

	// Refuse to adopt anything that already exists: it is someone else's,
	// and our `down` would remove it.
	if o.Mode == ModeNetns {
		if err := checkRoutes(subnet); err != nil {
			return nil, err
		}
		var taken []string
		if netns.LinkExists(s.Bridge) {
			taken = append(taken, "link "+s.Bridge)
		}
		if nft.TableExists(s.NftTable) {
			taken = append(taken, "nft table "+nft.Family+" "+s.NftTable)
		}
		if cgroup.Exists(s.Cgroup) {
			taken = append(taken, "cgroup "+s.Cgroup)
		}
		for _, n := range s.Nodes {
			if netns.Exists(n.Netns) {
				taken = append(taken, "netns "+n.Netns)
			}
			if netns.LinkExists(n.Veth) {
				taken = append(taken, "link "+n.Veth)
			}
		}
		if len(taken) > 0 {
			return nil, fmt.Errorf("cluster name %q is in use outside %s (%s): pick another --name, or remove them", o.Name, dir, strings.Join(taken, ", "))
		}
	}

	if err := create(s, &o); err != nil {
		o.logf("radic cluster up failed; removing what it created")
		if derr := down(s, o.logf); derr != nil {
			_ = save(dir, s)
			return nil, fmt.Errorf("%w; and removing it failed too: %v (run `radic cluster down`)", err, derr)
		}
		removeStateFiles(dir)
		return nil, err
	}
	s.Phase = "up"
	if err := save(dir, s); err != nil {
		return nil, err
	}
	return s, nil
}

// create makes every resource of s, recording each before making it.
func create(s *State, o *UpOptions) error {
	// Record the whole plan first: down removes only what exists.
	s.Resources = append(s.Resources, Resource{Kind: ResDir, Name: filepath.Join(s.Dir, "nodes")})
	if s.Mode == ModeNetns {
		s.Resources = append(s.Resources,
			Resource{Kind: ResCgroup, Name: s.Cgroup},
			Resource{Kind: ResNft, Name: s.NftTable})
		for _, n := range s.Nodes {
			s.Resources = append(s.Resources, Resource{Kind: ResNetns, Name: n.Netns})
		}
		s.Resources = append(s.Resources, Resource{Kind: ResLink, Name: s.Bridge})
		for _, n := range s.Nodes {
			s.Resources = append(s.Resources, Resource{Kind: ResLink, Name: n.Veth})
		}
	}
	if err := save(s.Dir, s); err != nil {
		return err
	}
	for _, n := range s.Nodes {
		if err := os.MkdirAll(n.StateDir, 0o755); err != nil {
			return err
		}
	}
	if s.Mode == ModeNetns {
		for _, n := range s.Nodes {
			for _, d := range []string{n.DaemonCg, n.JobCg} {
				if err := cgroup.Create(d); err != nil {
					return err
				}
			}
		}
		if err := nft.CreateTable(s.NftTable); err != nil {
			return err
		}
		if err := buildNetwork(s); err != nil {
			return err
		}
	}
	if !o.Daemons {
		return nil
	}
	radicd := o.Radicd
	if radicd == "" {
		radicd = RadicdPath()
	}
	if _, err := os.Stat(radicd); err != nil {
		o.logf("warning: radicd not found (%v): starting the cluster without daemons, as with --no-daemons", err)
		s.Daemons = false
		return nil
	}
	return startDaemons(s, o, radicd)
}

func buildNetwork(s *State) error {
	var host []string
	for _, n := range s.Nodes {
		host = append(host, "netns add "+n.Netns)
	}
	host = append(host,
		"link add "+s.Bridge+" type bridge",
		"addr add "+s.HostAddr+"/16 dev "+s.Bridge)
	for _, n := range s.Nodes {
		host = append(host,
			fmt.Sprintf("link add %s type veth peer name eth0 netns %s", n.Veth, n.Netns),
			fmt.Sprintf("link set %s master %s", n.Veth, s.Bridge))
	}
	if err := netns.Batch("", host); err != nil {
		return err
	}
	// Keep the cluster's wires quiet: no IPv6 autoconfiguration on our
	// host-side links.
	for _, l := range append([]string{s.Bridge}, vethNames(s)...) {
		_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+l+"/disable_ipv6", []byte("1"), 0)
	}
	up := []string{"link set " + s.Bridge + " up"}
	for _, n := range s.Nodes {
		up = append(up, "link set "+n.Veth+" up")
	}
	if err := netns.Batch("", up); err != nil {
		return err
	}
	for _, n := range s.Nodes {
		// No IPv6 inside the nodes: no link-local addresses, router
		// solicitations or DAD on the wire; the cluster is IPv4.
		for _, k := range []string{"ipv6/conf/all/disable_ipv6", "ipv6/conf/default/disable_ipv6"} {
			if err := netns.Sysctl(n.Netns, k, "1"); err != nil {
				return err
			}
		}
		// A cluster fabric re-resolves a neighbour fast: with the
		// kernel's default (an ARP probe a second) a healed link stays
		// dark for up to a second after it is back.
		if err := netns.Sysctl(n.Netns, "ipv4/neigh/eth0/retrans_time_ms", "100"); err != nil {
			return err
		}
		if err := netns.Batch(n.Netns, []string{
			"link set lo up",
			"addr add " + n.Addr + "/16 dev eth0",
			"link set eth0 up",
		}); err != nil {
			return err
		}
	}
	return nil
}

func vethNames(s *State) []string {
	var v []string
	for _, n := range s.Nodes {
		v = append(v, n.Veth)
	}
	return v
}

// peersFlag is radicd's --peers value: every node, spares included, in
// ring (id) order.
func peersFlag(s *State) string {
	var p []string
	for _, n := range s.Nodes {
		p = append(p, fmt.Sprintf("%d=%s", n.ID, n.RadicdAddr))
	}
	return strings.Join(p, ",")
}

// RadicdArgs is the exact command line radicd gets on node n.
func RadicdArgs(s *State, n *Node) []string {
	args := []string{"--node", strconv.Itoa(n.ID), "--listen", n.RadicdAddr, "--peers", peersFlag(s)}
	if n.Netns != "" {
		// Wildcard sockets in the node's own namespace: radicd stays
		// reachable when the node is readdressed (it follows the new
		// address and announces it), and ranks reach it on 127.0.0.1.
		args = append(args, "--bind", "0.0.0.0")
	}
	if n.Spare {
		args = append(args, "--spare")
	}
	if s.Fabric != "" {
		args = append(args, "--fabric", s.Fabric)
	}
	args = append(args, "--state-dir", n.StateDir, "--metrics-addr", n.MetricsAddr)
	if n.JobCg != "" {
		args = append(args, "--job-cgroup", n.JobCg)
	}
	if !s.FenceKill {
		// Nothing restarts a fenced node's processes elsewhere yet, so
		// killing them would only lose the job; safe sockets ride out
		// the cut instead.
		args = append(args, "--fence-kill=false")
	}
	return args
}

// DaemonAddr is RADIC_DAEMON for the ranks of node n: where they reach
// their node's radicd, from inside the node's network namespace, at an
// address that stays valid when the node is readdressed. In netns mode that
// is 127.0.0.1 (radicd binds the wildcard address in the node's namespace);
// in loopback mode, where nodes share the host's namespace and a readdress
// is only recorded, the node's radicd address. It is empty when the cluster
// runs without daemons.
func DaemonAddr(s *State, n *Node) string {
	if !s.Daemons || n.RadicdAddr == "" {
		return ""
	}
	if s.Mode == ModeNetns {
		port := strconv.Itoa(RadicdPort)
		if _, p, err := net.SplitHostPort(n.RadicdAddr); err == nil {
			port = p
		}
		return net.JoinHostPort("127.0.0.1", port)
	}
	return n.RadicdAddr
}

// filterEnv drops the variables named in drop from env.
func filterEnv(env []string, drop ...string) []string {
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, d := range drop {
			if k == d {
				keep = false
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}

type daemonResult struct {
	node  int
	err   error
	noImp bool
}

func startDaemons(s *State, o *UpOptions, radicd string) error {
	type started struct {
		cmd    *exec.Cmd
		sock   *net.UnixConn
		log    string
		exited chan error
	}
	all := make([]*started, len(s.Nodes))
	defer func() {
		for _, st := range all {
			if st != nil && st.sock != nil {
				st.sock.Close()
			}
		}
	}()
	for i := range s.Nodes {
		n := &s.Nodes[i]
		sockPath := filepath.Join(n.StateDir, "notify.sock")
		if len(sockPath) >= 108 {
			return fmt.Errorf("node %d: notify socket path %s is longer than a unix socket allows (107 bytes): use a shorter state directory", n.ID, sockPath)
		}
		os.Remove(sockPath)
		sock, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sockPath, Net: "unixgram"})
		if err != nil {
			return fmt.Errorf("node %d: notify socket: %w", n.ID, err)
		}
		logPath := filepath.Join(n.StateDir, "radicd.log")
		logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o644)
		if err != nil {
			sock.Close()
			return err
		}
		env := append(filterEnv(os.Environ(), "NOTIFY_SOCKET", "LD_PRELOAD", "LISTEN_FDS", "LISTEN_PID", "RADIC_STATE_DIR"),
			"NOTIFY_SOCKET="+sockPath, "RADIC_STATE_DIR="+s.Dir)
		spec := proc.Spec{
			Path: radicd, Args: append([]string{radicd}, RadicdArgs(s, n)...), Env: env,
			Dir: n.StateDir, Netns: netnsPath(n), Cgroup: n.DaemonCg, Setsid: true,
			Hostname: nodeHostname(n),
			Stdout:   logf, Stderr: logf,
		}
		cmd, err := proc.Start(spec, func(id proc.ID) error {
			n.Radicd = &id
			return s.record(Resource{Kind: ResProc, Proc: &id, What: "radicd " + n.Name})
		})
		logf.Close()
		if err != nil {
			sock.Close()
			return fmt.Errorf("node %d: start radicd: %w", n.ID, err)
		}
		st := &started{cmd: cmd, sock: sock, log: logPath, exited: make(chan error, 1)}
		go func() { st.exited <- cmd.Wait() }()
		all[i] = st
	}

	results := make(chan daemonResult, len(all))
	deadline := time.Now().Add(o.ReadyTimeout)
	for i, st := range all {
		ready := make(chan error, 1)
		go func() {
			buf := make([]byte, 4096)
			st.sock.SetReadDeadline(deadline)
			for {
				k, err := st.sock.Read(buf)
				if err != nil {
					ready <- err
					return
				}
				for _, l := range strings.Split(string(buf[:k]), "\n") {
					if strings.TrimSpace(l) == "READY=1" {
						ready <- nil
						return
					}
				}
			}
		}()
		go func() {
			id := s.Nodes[i].ID
			select {
			case err := <-ready:
				if err != nil {
					results <- daemonResult{node: id, err: fmt.Errorf("radicd on node %d sent no READY=1 within %v (log %s):\n%s", id, o.ReadyTimeout, st.log, tail(st.log))}
					return
				}
				results <- daemonResult{node: id}
			case err := <-st.exited:
				t := tail(st.log)
				results <- daemonResult{node: id,
					noImp: strings.Contains(strings.ToLower(t), "not implemented"),
					err:   fmt.Errorf("radicd on node %d exited before it was ready (%v; log %s):\n%s", id, err, st.log, t)}
			}
		}()
	}
	var errs []error
	noImp := 0
	for range all {
		r := <-results
		if r.err != nil {
			errs = append(errs, r.err)
			if r.noImp {
				noImp++
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	if noImp == len(errs) {
		o.logf("warning: %s says it is not implemented yet; starting the cluster without daemons, as with --no-daemons", radicd)
		for _, n := range s.Nodes {
			if n.Radicd != nil {
				_ = n.Radicd.Signal(syscall.SIGKILL, true)
			}
		}
		for i := range s.Nodes {
			s.Nodes[i].Radicd = nil
		}
		s.Daemons = false
		return nil
	}
	return errors.Join(errs...)
}

// nodeHostname is the host name the programs of node n see: its name, in
// a UTS namespace of their own, where the node is a network namespace
// (as real hosts have distinct names, and a rank restarted on another
// node must be given its first one's); "" in loopback mode, where the
// nodes share the host and its name.
func nodeHostname(n *Node) string {
	if n.Netns == "" {
		return ""
	}
	return n.Name
}

func netnsPath(n *Node) string {
	if n.Netns == "" {
		return ""
	}
	return netns.Path(n.Netns)
}

// tail returns the last lines of a log file, indented.
func tail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "    (no log: " + err.Error() + ")"
	}
	defer f.Close()
	const max = 4096
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		f.Seek(fi.Size()-max, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return "    (the log is empty)"
	}
	return "    " + strings.Join(lines, "\n    ")
}
