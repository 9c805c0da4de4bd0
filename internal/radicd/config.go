package radicd

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/internal/fabric"
	"github.com/radic-project/radic/msglog"
	"github.com/radic-project/radic/netsim"
)

// Config is every radicd setting. Each field is a flag and a config-file
// key of the same name.
type Config struct {
	Node        int                                 // --node
	Listen      netip.AddrPort                      // --listen: heartbeat UDP and store TCP
	Bind        netip.Addr                          // --bind: bind this IP instead (0.0.0.0: survive readdressing)
	Peers       map[heartbeat.NodeID]netip.AddrPort // --peers
	Spare       bool                                // --spare
	StateDir    string                              // --state-dir
	MetricsAddr string                              // --metrics-addr
	JobCgroup   string                              // --job-cgroup
	FenceKill   bool                                // --fence-kill
	Period      time.Duration                       // --heartbeat-period
	Timeout     time.Duration                       // --heartbeat-timeout
	Probe       time.Duration                       // --probe-timeout
	Fence       time.Duration                       // --fence-timeout
	Probers     int                                 // --probers
	Protectors  int                                 // --protectors
	StoreSync   msglog.SyncPolicy                   // --store-sync
	LogStable   LogStable                           // --log-stable
	Pprof       string                              // --pprof
	StoreMax    int64                               // --store-max-bytes
	StoreMemory int64                               // --store-memory
	LogLevel    string                              // --log-level
	LogFormat   string                              // --log-format
	Fabric      string                              // --fabric: bg or ip
	Torus       netsim.Shape                        // --torus (zero: a ring of all nodes)
	Pcap        string                              // --pcap
	peerOrder   []heartbeat.NodeID
}

// setting is one flag/key.
type setting struct {
	name, usage string
	set         func(c *Config, v string) error
	boolean     bool
}

var settings = []setting{
	{name: "config", usage: "read settings from `FILE`: one `key = value` per line, keys named as these flags without dashes, # comments; flags given on the command line win"},
	{name: "node", usage: "this node's `ID` (a number; the ring is ordered by id)", set: func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n >= int(heartbeat.None) {
			return fmt.Errorf("not a node id: %q", v)
		}
		c.Node = n
		return nil
	}},
	{name: "listen", usage: "`ADDR:PORT` for the heartbeat (UDP) and the store and status protocol (TCP)", set: func(c *Config, v string) error {
		a, err := netip.ParseAddrPort(v)
		if err != nil {
			return err
		}
		c.Listen = a
		return nil
	}},
	{name: "bind", usage: "bind the heartbeat, protocol and metrics sockets to `IP` (with the ports of --listen and --metrics-addr) instead of the addresses those name; 0.0.0.0 keeps radicd reachable when the node's address changes: it then watches the interface that holds the --listen address and announces its new address to every peer (radic cluster up uses it in netns mode)", set: func(c *Config, v string) error {
		a, err := netip.ParseAddr(v)
		if err != nil {
			return fmt.Errorf("not an IP address: %q", v)
		}
		c.Bind = a.Unmap()
		return nil
	}},
	{name: "peers", usage: "every node, spares and this one included: `ID=ADDR:PORT,...` in ring order", set: func(c *Config, v string) error {
		c.Peers = map[heartbeat.NodeID]netip.AddrPort{}
		c.peerOrder = nil
		for p := range strings.SplitSeq(v, ",") {
			p = strings.TrimSpace(p)
			if p == "" {
				continue
			}
			ids, addr, ok := strings.Cut(p, "=")
			if !ok {
				return fmt.Errorf("peer %q: want ID=ADDR:PORT", p)
			}
			id, err := strconv.Atoi(strings.TrimSpace(ids))
			if err != nil || id < 0 || id >= int(heartbeat.None) {
				return fmt.Errorf("peer %q: bad id", p)
			}
			a, err := netip.ParseAddrPort(strings.TrimSpace(addr))
			if err != nil {
				return fmt.Errorf("peer %q: %v", p, err)
			}
			if _, dup := c.Peers[heartbeat.NodeID(id)]; dup {
				return fmt.Errorf("peer %d listed twice", id)
			}
			c.Peers[heartbeat.NodeID(id)] = a
			c.peerOrder = append(c.peerOrder, heartbeat.NodeID(id))
		}
		return nil
	}},
	{name: "spare", boolean: true, usage: "start as a spare: watched, but protecting nobody until promoted", set: func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		c.Spare = b
		return err
	}},
	{name: "state-dir", usage: "`DIR` for the incarnation counter and the critical-data store", set: func(c *Config, v string) error { c.StateDir = v; return nil }},
	{name: "metrics-addr", usage: "`ADDR:PORT` serving /metrics (Prometheus), /status (JSON) and /healthz; empty: off", set: func(c *Config, v string) error { c.MetricsAddr = v; return nil }},
	{name: "job-cgroup", usage: "cgroup v2 `DIR` holding this node's managed processes, killed (cgroup.kill) when the node fences itself", set: func(c *Config, v string) error { c.JobCgroup = v; return nil }},
	{name: "fence-kill", boolean: true, usage: "when fencing, kill the processes in --job-cgroup (default true), which lets recovery restart them elsewhere; false only records the fence, and recovery restarts nothing (a fenced node's ranks could wake and run twice)", set: func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		c.FenceKill = b
		return err
	}},
	{name: "heartbeat-period", usage: "time between heartbeats to each ring neighbour", set: durSetter(func(c *Config) *time.Duration { return &c.Period })},
	{name: "heartbeat-timeout", usage: "silence of the watched neighbour before the watchdog fires and probes start", set: durSetter(func(c *Config) *time.Duration { return &c.Timeout })},
	{name: "probe-timeout", usage: "time the direct and indirect probes get before the node is declared dead", set: durSetter(func(c *Config) *time.Duration { return &c.Probe })},
	{name: "fence-timeout", usage: "silence from the whole ring after which this node fences itself (default heartbeat-timeout + probe-timeout - 2 periods = 400ms; must stay below heartbeat-timeout + probe-timeout - period)", set: durSetter(func(c *Config) *time.Duration { return &c.Fence })},
	{name: "probers", usage: "ring members asked to probe a suspect indirectly", set: intSetter(func(c *Config) *int { return &c.Probers })},
	{name: "protectors", usage: "k: how many ring successors keep a copy of a node's critical data", set: intSetter(func(c *Config) *int { return &c.Protectors })},
	{name: "store-sync", usage: "fsync policy of the store: always, interval or never", set: func(c *Config, v string) error {
		p, err := msglog.ParseSyncPolicy(v)
		c.StoreSync = p
		return err
	}},
	{name: "log-stable", usage: "when a process's received bytes count as logged: memory (once its k protectors have them in memory; their stores write and fsync behind, per --store-sync: survives any one node's failure) or disk (once the protectors' stores have written them, fsynced with --store-sync always)", set: func(c *Config, v string) error {
		p, err := ParseLogStable(v)
		c.LogStable = p
		return err
	}},
	{name: "pprof", usage: "`ADDR:PORT` serving Go's /debug/pprof/ (profiles and execution traces of radicd); empty: off", set: func(c *Config, v string) error { c.Pprof = v; return nil }},
	{name: "store-max-bytes", usage: "quota on the store's files in bytes (0: none, the disk is the limit)", set: func(c *Config, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("not a byte count: %q", v)
		}
		c.StoreMax = n
		return nil
	}},
	{name: "store-memory", usage: "memory for the store's index and cache of recent records, in bytes", set: func(c *Config, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("not a byte count: %q", v)
		}
		c.StoreMemory = n
		return nil
	}},
	{name: "log-level", usage: "debug, info, warn or error", set: func(c *Config, v string) error {
		switch v {
		case "debug", "info", "warn", "error":
			c.LogLevel = v
			return nil
		}
		return fmt.Errorf("want debug, info, warn or error, not %q", v)
	}},
	{name: "fabric", usage: "the network radicd's heartbeats and probes travel on: bg (the emulated Blue Gene torus over UDP, every radicd a torus node forwarding for the others: bulktransport/PROTOCOL.md) or ip (plain UDP datagrams straight to each peer)", set: func(c *Config, v string) error {
		if v != "bg" && v != "ip" {
			return fmt.Errorf("want bg or ip, not %q", v)
		}
		c.Fabric = v
		return nil
	}},
	{name: "torus", usage: "with --fabric bg, the torus `XxYxZ` (like 4x2x1); nodes take their places in id order, X fastest, and the product must be the number of --peers; default: a ring of all the nodes (Nx1x1), so that heartbeat neighbours are torus neighbours", set: func(c *Config, v string) error {
		sh, err := fabric.ParseShape(v)
		c.Torus = sh
		return err
	}},
	{name: "pcap", usage: "with --fabric bg, write every torus packet this node sends, receives and forwards to pcap `FILE` (decoded by deploy/radic-bg.lua in Wireshark or tshark)", set: func(c *Config, v string) error { c.Pcap = v; return nil }},
	{name: "log-format", usage: "text or json (slog handlers, on stderr)", set: func(c *Config, v string) error {
		if v != "text" && v != "json" {
			return fmt.Errorf("want text or json, not %q", v)
		}
		c.LogFormat = v
		return nil
	}},
}

func durSetter(f func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return fmt.Errorf("not a positive duration (like 100ms): %q", v)
		}
		*f(c) = d
		return nil
	}
}

func intSetter(f func(*Config) *int) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("not a count: %q", v)
		}
		*f(c) = n
		return nil
	}
}

func defaultConfig() Config {
	var hb heartbeat.Config
	hb.SetDefaults()
	return Config{
		Node: -1, Period: hb.Period, Timeout: hb.Timeout, Probe: hb.ProbeTimeout,
		Probers: hb.Probers, Protectors: hb.Protectors, StoreSync: msglog.SyncAlways,
		StoreMemory: 64 << 20, LogLevel: "info", LogFormat: "text", FenceKill: true, Fabric: "ip",
	}
}

// ErrHelp is returned by ParseArgs for -h/--help (the usage is printed).
var ErrHelp = flag.ErrHelp

// ParseArgs reads the command line (and the config file it names). Usage
// and errors go to stderr.
func ParseArgs(args []string, stderr io.Writer) (Config, error) {
	c := defaultConfig()
	fs := flag.NewFlagSet("radicd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `usage: radicd --node ID --listen ADDR:PORT --peers ID=ADDR:PORT,... [flags]

radicd is the per-node radic daemon: a protector in the heartbeat ring
(watchdog on its predecessor, indirect probes, self-fencing), the store of
its protected nodes' critical data (replicated to k ring successors), and a
Prometheus/status endpoint. It tells systemd (or radic cluster up) READY=1
on $NOTIFY_SOCKET once it serves, and STOPPING=1 when it shuts down.

Every flag is also a config-file key of the same name (see --config).

flags:
`)
		fs.PrintDefaults()
	}
	var cfgFile string
	for _, s := range settings {
		s := s
		if s.name == "config" {
			fs.StringVar(&cfgFile, "config", "", s.usage)
			continue
		}
		fn := func(v string) error { return s.set(&c, v) }
		if s.boolean {
			fs.BoolFunc(s.name, s.usage, fn)
		} else {
			fs.Func(s.name, s.usage+defaultNote(s.name), fn)
		}
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q (radicd takes only flags)", fs.Arg(0))
	}
	if cfgFile != "" {
		// The file fills what the command line did not set: parse it into
		// a fresh config, then re-apply the command line.
		f, err := os.Open(cfgFile)
		if err != nil {
			return c, fmt.Errorf("config: %w", err)
		}
		defer f.Close()
		fromFile := defaultConfig()
		if err := parseFile(&fromFile, cfgFile, f); err != nil {
			return c, err
		}
		c = fromFile
		fs2 := flag.NewFlagSet("radicd", flag.ContinueOnError)
		fs2.SetOutput(io.Discard)
		// Re-parse the command line over the file's values.
		for _, s := range settings {
			s := s
			if s.name == "config" {
				fs2.String("config", "", "")
				continue
			}
			fn := func(v string) error { return s.set(&c, v) }
			if s.boolean {
				fs2.BoolFunc(s.name, "", fn)
			} else {
				fs2.Func(s.name, "", fn)
			}
		}
		if err := fs2.Parse(args); err != nil {
			return c, err
		}
	}
	return c, c.validate()
}

func defaultNote(name string) string {
	d := defaultConfig()
	switch name {
	case "heartbeat-period":
		return fmt.Sprintf(" (default %v)", d.Period)
	case "heartbeat-timeout":
		return fmt.Sprintf(" (default %v)", d.Timeout)
	case "probe-timeout":
		return fmt.Sprintf(" (default %v)", d.Probe)
	case "probers":
		return fmt.Sprintf(" (default %d)", d.Probers)
	case "protectors":
		return fmt.Sprintf(" (default %d)", d.Protectors)
	case "store-sync":
		return " (default always)"
	case "log-stable":
		return " (default memory)"
	case "store-memory":
		return fmt.Sprintf(" (default %d)", d.StoreMemory)
	case "log-level":
		return " (default info)"
	case "log-format":
		return " (default text)"
	case "fabric":
		return " (default ip)"
	}
	return ""
}

// parseFile reads `key = value` lines.
func parseFile(c *Config, name string, r io.Reader) error {
	sc := bufio.NewScanner(r)
	line := 0
	seen := map[string]int{}
	for sc.Scan() {
		line++
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		k, v, ok := strings.Cut(t, "=")
		if !ok {
			return fmt.Errorf("%s:%d: want `key = value`, got %q", name, line, t)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		v = strings.Trim(v, `"`)
		i := slices.IndexFunc(settings, func(s setting) bool { return s.name == k })
		if i < 0 || k == "config" {
			return fmt.Errorf("%s:%d: unknown key %q%s", name, line, k, suggest(k))
		}
		if prev, dup := seen[k]; dup {
			return fmt.Errorf("%s:%d: key %q already set on line %d", name, line, k, prev)
		}
		seen[k] = line
		if err := settings[i].set(c, v); err != nil {
			return fmt.Errorf("%s:%d: key %q: %v", name, line, k, err)
		}
	}
	return sc.Err()
}

// suggest names the closest known key, for typos.
func suggest(k string) string {
	best, bestD := "", 4
	for _, s := range settings {
		if d := editDistance(k, s.name); d < bestD && s.name != "config" {
			best, bestD = s.name, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func (c *Config) validate() error {
	var errs []error
	if c.Node < 0 {
		errs = append(errs, errors.New("--node is required"))
	}
	if !c.Listen.IsValid() {
		errs = append(errs, errors.New("--listen is required"))
	}
	if len(c.Peers) == 0 {
		errs = append(errs, errors.New("--peers is required"))
	} else if a, ok := c.Peers[heartbeat.NodeID(c.Node)]; c.Node >= 0 && !ok {
		errs = append(errs, fmt.Errorf("--peers does not list this node (%d)", c.Node))
	} else if ok && c.Listen.IsValid() && a != c.Listen {
		errs = append(errs, fmt.Errorf("--peers gives node %d the address %v, but --listen is %v", c.Node, a, c.Listen))
	}
	if c.StateDir == "" {
		errs = append(errs, errors.New("--state-dir is required"))
	}
	if c.Fabric != "bg" && (c.Torus != (netsim.Shape{}) || c.Pcap != "") {
		errs = append(errs, errors.New("--torus and --pcap need --fabric bg"))
	}
	if c.Torus != (netsim.Shape{}) && len(c.Peers) > 0 && c.Torus.Nodes() != len(c.Peers) {
		errs = append(errs, fmt.Errorf("--torus %dx%dx%d has %d nodes, but --peers names %d", c.Torus.X, c.Torus.Y, c.Torus.Z, c.Torus.Nodes(), len(c.Peers)))
	}
	if _, err := c.metricsBind(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		hb := c.HeartbeatConfig(1)
		hb.SetDefaults()
		if err := hb.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// bindAddr is where the heartbeat (UDP) and protocol (TCP) sockets bind:
// --listen, or --bind with --listen's port.
func (c *Config) bindAddr() netip.AddrPort {
	if c.Bind.IsValid() {
		return netip.AddrPortFrom(c.Bind, c.Listen.Port())
	}
	return c.Listen
}

// metricsBind is where the metrics server binds: --metrics-addr, or --bind
// with its port.
func (c *Config) metricsBind() (string, error) {
	if !c.Bind.IsValid() || c.MetricsAddr == "" {
		return c.MetricsAddr, nil
	}
	_, port, err := net.SplitHostPort(c.MetricsAddr)
	if err != nil {
		return "", fmt.Errorf("--metrics-addr %q: %v", c.MetricsAddr, err)
	}
	return net.JoinHostPort(c.Bind.String(), port), nil
}

// watchesAddress reports whether radicd follows its node's address: only
// when bound to the wildcard address can its sockets outlive that address.
func (c *Config) watchesAddress() bool { return c.Bind.IsValid() && c.Bind.IsUnspecified() }

// HeartbeatConfig is the ring configuration at incarnation inc.
func (c *Config) HeartbeatConfig(inc uint64) heartbeat.Config {
	members := make([]heartbeat.NodeID, 0, len(c.Peers))
	for id := range c.Peers {
		members = append(members, id)
	}
	slices.Sort(members)
	return heartbeat.Config{
		Self: heartbeat.NodeID(c.Node), Members: members, Spare: c.Spare, Incarnation: inc,
		Period: c.Period, Timeout: c.Timeout, ProbeTimeout: c.Probe, FenceTimeout: c.Fence,
		Probers: c.Probers, Protectors: c.Protectors,
	}
}
