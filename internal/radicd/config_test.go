package radicd

import (
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/msglog"
)

var clusterArgs = []string{"--node", "1", "--listen", "10.77.0.2:7470",
	"--peers", "0=10.77.0.1:7470,1=10.77.0.2:7470,2=10.77.0.3:7470", "--spare",
	"--state-dir", "/var/lib/radic", "--metrics-addr", "10.77.0.2:9470", "--job-cgroup", "/sys/fs/cgroup/radic/n1/job"}

// TestParseClusterFlags parses exactly what `radic cluster up` passes.
func TestParseClusterFlags(t *testing.T) {
	c, err := ParseArgs(clusterArgs, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Node != 1 || !c.Spare || c.StateDir != "/var/lib/radic" || c.MetricsAddr != "10.77.0.2:9470" ||
		c.JobCgroup != "/sys/fs/cgroup/radic/n1/job" || c.Listen != netip.MustParseAddrPort("10.77.0.2:7470") {
		t.Errorf("ParseArgs(cluster flags) = %+v", c)
	}
	if len(c.Peers) != 3 || c.Peers[2] != netip.MustParseAddrPort("10.77.0.3:7470") {
		t.Errorf("peers = %v", c.Peers)
	}
	hb := c.HeartbeatConfig(5)
	hb.SetDefaults()
	if err := hb.Validate(); err != nil || hb.Self != 1 || len(hb.Members) != 3 || !hb.Spare {
		t.Errorf("HeartbeatConfig = %+v, %v", hb, err)
	}
	if c.Period != heartbeat.DefaultPeriod || c.StoreSync != msglog.SyncAlways || c.Protectors != 1 {
		t.Errorf("defaults: period %v sync %v k %d", c.Period, c.StoreSync, c.Protectors)
	}
}

// TestBind: `radic cluster up` adds --bind 0.0.0.0 in netns mode; the
// sockets then bind the wildcard address with the ports of --listen and
// --metrics-addr, and radicd follows its node's address.
func TestBind(t *testing.T) {
	c, err := ParseArgs(append(slices.Clone(clusterArgs), "--bind", "0.0.0.0"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	mb, err := c.metricsBind()
	if c.bindAddr() != netip.MustParseAddrPort("0.0.0.0:7470") || mb != "0.0.0.0:9470" || err != nil || !c.watchesAddress() {
		t.Errorf("--bind 0.0.0.0: bind %v, metrics %q (%v), watches %v", c.bindAddr(), mb, err, c.watchesAddress())
	}
	c, _ = ParseArgs(clusterArgs, io.Discard)
	if mb, _ := c.metricsBind(); c.bindAddr() != c.Listen || mb != c.MetricsAddr || c.watchesAddress() {
		t.Errorf("without --bind: bind %v, metrics %q, watches %v", c.bindAddr(), mb, c.watchesAddress())
	}
	c, _ = ParseArgs(append(slices.Clone(clusterArgs), "--bind", "10.77.0.2"), io.Discard)
	if c.watchesAddress() {
		t.Errorf("--bind to a specific address follows the node's address")
	}
	for args, want := range map[string]string{
		"--bind 10.77.0.2:7470":                   "not an IP address",
		"--bind 0.0.0.0 --metrics-addr localhost": "--metrics-addr",
	} {
		_, err := ParseArgs(append(slices.Clone(clusterArgs), strings.Fields(args)...), io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error containing %q", args, err, want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "--node is required"},
		{[]string{"--node", "x"}, "not a node id"},
		{[]string{"--node", "3", "--listen", "1.2.3.4:5", "--peers", "0=1.2.3.4:5", "--state-dir", "/d"}, "does not list this node (3)"},
		{[]string{"--node", "0", "--listen", "1.2.3.4:6", "--peers", "0=1.2.3.4:5", "--state-dir", "/d"}, "but --listen is"},
		{[]string{"--node", "0", "--listen", "1.2.3.4:5", "--peers", "0=1.2.3.4:5,0=1.2.3.5:5", "--state-dir", "/d"}, "listed twice"},
		{[]string{"--heartbeat-period", "fast"}, "not a positive duration"},
		{[]string{"--store-sync", "sometimes"}, "sometimes"},
		{[]string{"--node", "0", "--listen", "1.2.3.4:5", "--peers", "0=1.2.3.4:5", "--state-dir", "/d", "--fence-timeout", "2s"}, "fence timeout"},
		{[]string{"--node", "0", "extra"}, "unexpected argument"},
		{[]string{"--fabric", "torus"}, `want bg or ip, not "torus"`},
		{[]string{"--torus", "4x4"}, "want XxYxZ"},
		{append(slices.Clone(clusterArgs), "--torus", "3x1x1"), "--torus and --pcap need --fabric bg"},
		{append(slices.Clone(clusterArgs), "--fabric", "bg", "--torus", "2x2x1"), "--torus 2x2x1 has 4 nodes, but --peers names 3"},
	} {
		_, err := ParseArgs(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseArgs(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "radicd.conf")
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := write(`# a comment
node = 0
listen = 127.78.0.1:7470
peers = 0=127.78.0.1:7470, 1=127.78.0.2:7470
state-dir = "/tmp/x"
spare = true
heartbeat-period = 50ms
heartbeat-timeout = 200ms
probe-timeout = 200ms
`)
	c, err := ParseArgs([]string{"--config", p, "--node", "1", "--listen", "127.78.0.2:7470"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Node != 1 || c.Period != 50*time.Millisecond || !c.Spare || c.StateDir != "/tmp/x" {
		t.Errorf("file + flags = %+v; want node 1 from the flags, the rest from the file", c)
	}
	for _, tc := range []struct{ file, want string }{
		{"node = 0\nlsiten = 1.2.3.4:5\n", `radicd.conf:2: unknown key "lsiten" (did you mean "listen"?)`},
		{"node = 0\nnode = 1\n", `radicd.conf:2: key "node" already set on line 1`},
		{"node\n", "radicd.conf:1: want `key = value`"},
		{"probers = many\n", `radicd.conf:1: key "probers": not a count`},
		{"config = other.conf\n", `unknown key "config"`},
	} {
		_, err := ParseArgs([]string{"--config", write(tc.file)}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %q: %v, want %q", tc.file, err, tc.want)
		}
	}
}

func TestHelpListsEverySetting(t *testing.T) {
	var b strings.Builder
	w := &b
	_, err := ParseArgs([]string{"--help"}, writerFunc(func(p []byte) (int, error) { return w.Write(p) }))
	if err != ErrHelp {
		t.Fatalf("--help: %v", err)
	}
	for _, s := range settings {
		if !strings.Contains(b.String(), "-"+s.name) {
			t.Errorf("--help does not mention -%s", s.name)
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestIncarnationGrows(t *testing.T) {
	dir := t.TempDir()
	a, err := nextIncarnation(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := nextIncarnation(dir)
	if err != nil || b <= a {
		t.Fatalf("incarnations %d then %d (%v), want growing", a, b, err)
	}
	// A counter ahead of the clock still grows.
	os.WriteFile(filepath.Join(dir, "incarnation"), []byte("99999999999999999\n"), 0o600)
	c, _ := nextIncarnation(dir)
	if c != 100000000000000000 {
		t.Errorf("after 99999999999999999: %d", c)
	}
}
