package cluster

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/radic-project/radic/internal/cluster/proc"
)

func TestPlacement(t *testing.T) {
	for _, tt := range []struct {
		np, perNode int
		nodes       []int
		want        []int
		err         string
	}{
		{np: 5, nodes: []int{0, 1, 2}, want: []int{0, 1, 2, 0, 1}},
		{np: 4, perNode: 2, nodes: []int{3, 5}, want: []int{3, 3, 5, 5}},
		{np: 5, perNode: 2, nodes: []int{3, 5}, err: "needs 3 nodes"},
		{np: 1, nodes: nil, err: "no node"},
	} {
		got, err := placement(tt.np, tt.perNode, tt.nodes)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("placement(%d, %d, %v) error = %v, want %q", tt.np, tt.perNode, tt.nodes, err, tt.err)
			}
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" || err != nil {
			t.Errorf("placement(%d, %d, %v) = %v, %v (-want +got):\n%s", tt.np, tt.perNode, tt.nodes, got, err, diff)
		}
	}
}

func TestRankEnv(t *testing.T) {
	job := &Job{ID: "c-3", Ranks: []Rank{{Rank: 0, Node: 2, Addr: "10.0.0.3:20000"}, {Rank: 1, Node: 0, Addr: "10.0.0.1:20001"}}}
	base := []string{"PATH=/bin", "RADIC_RANK=9", "LD_PRELOAD=/other.so", "NOTIFY_SOCKET=/x", "RADIC_DAEMON=1.2.3.4:5"}
	got := RankEnv(base, job, 1, 2, "/st", "", "")
	want := []string{"PATH=/bin", "LD_PRELOAD=/other.so", "RADIC_RANK=1", "RADIC_SIZE=2", "RADIC_NODE=0",
		"RADIC_PEERS=10.0.0.3:20000,10.0.0.1:20001", "RADIC_JOB=c-3", "RADIC_STATE_DIR=/st"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("RankEnv without preload or daemon (-want +got):\n%s", diff)
	}
	got = RankEnv(base, job, 0, 2, "/st", "127.0.0.1:7470", "/lib/libradic.so")
	if !slices.Contains(got, "LD_PRELOAD=/lib/libradic.so:/other.so") || slices.Contains(got, "LD_PRELOAD=/other.so") {
		t.Errorf("RankEnv with preload = %v, want libradic.so in front of the old LD_PRELOAD", got)
	}
	if !slices.Contains(got, "RADIC_DAEMON=127.0.0.1:7470") || slices.Contains(got, "RADIC_DAEMON=1.2.3.4:5") {
		t.Errorf("RankEnv with a daemon = %v, want RADIC_DAEMON=127.0.0.1:7470 only", got)
	}
}

func TestDaemonAddr(t *testing.T) {
	n := &Node{ID: 1, Addr: "10.1.3.2", LogicalAddr: "10.1.0.2", RadicdAddr: "10.1.0.2:7470"}
	for _, tc := range []struct {
		mode    string
		daemons bool
		want    string
	}{
		{ModeNetns, true, "127.0.0.1:7470"},
		{ModeLoopback, true, "10.1.0.2:7470"},
		{ModeNetns, false, ""},
		{ModeLoopback, false, ""},
	} {
		if got := DaemonAddr(&State{Mode: tc.mode, Daemons: tc.daemons}, n); got != tc.want {
			t.Errorf("DaemonAddr(%s, daemons %v) = %q, want %q", tc.mode, tc.daemons, got, tc.want)
		}
	}
}

func TestAddresses(t *testing.T) {
	base := netip.MustParseAddr("10.77.0.0")
	for _, tt := range []struct {
		id, gen int
		want    string
	}{{0, 0, "10.77.0.1"}, {9, 0, "10.77.0.10"}, {3, 2, "10.77.2.4"}} {
		if got := nodeAddr(base, tt.id, tt.gen); got != tt.want {
			t.Errorf("nodeAddr(%v, %d, %d) = %s, want %s", base, tt.id, tt.gen, got, tt.want)
		}
	}
	for _, tt := range []struct {
		subnet, mode string
		ok           bool
	}{
		{"10.77.0.0/16", ModeNetns, true},
		{"10.77.3.0/16", ModeNetns, true}, // masked
		{"10.77.0.0/24", ModeNetns, false},
		{"127.77.0.0/16", ModeNetns, false},
		{"127.77.0.0/16", ModeLoopback, true},
		{"10.77.0.0/16", ModeLoopback, false},
		{"fd00::/16", ModeNetns, false},
	} {
		_, err := parseSubnet(tt.subnet, tt.mode)
		if (err == nil) != tt.ok {
			t.Errorf("parseSubnet(%q, %s) error = %v, want ok=%v", tt.subnet, tt.mode, err, tt.ok)
		}
	}
}

func TestRadicdArgs(t *testing.T) {
	s := &State{FenceKill: true, Nodes: []Node{
		{ID: 0, RadicdAddr: "10.1.0.1:7470", MetricsAddr: "10.1.0.1:9470", StateDir: "/d/nodes/n0", JobCg: "/cg/n0/job"},
		{ID: 1, Spare: true, RadicdAddr: "10.1.0.2:7470", MetricsAddr: "10.1.0.2:9470", StateDir: "/d/nodes/n1"},
	}}
	want0 := []string{"--node", "0", "--listen", "10.1.0.1:7470", "--peers", "0=10.1.0.1:7470,1=10.1.0.2:7470",
		"--state-dir", "/d/nodes/n0", "--metrics-addr", "10.1.0.1:9470", "--job-cgroup", "/cg/n0/job"}
	if diff := cmp.Diff(want0, RadicdArgs(s, &s.Nodes[0])); diff != "" {
		t.Errorf("RadicdArgs(node 0) (-want +got):\n%s", diff)
	}
	want1 := []string{"--node", "1", "--listen", "10.1.0.2:7470", "--peers", "0=10.1.0.1:7470,1=10.1.0.2:7470",
		"--spare", "--state-dir", "/d/nodes/n1", "--metrics-addr", "10.1.0.2:9470"}
	if diff := cmp.Diff(want1, RadicdArgs(s, &s.Nodes[1])); diff != "" {
		t.Errorf("RadicdArgs(spare) (-want +got):\n%s", diff)
	}
	s.Nodes[0].Netns = "c-n0" // netns mode: wildcard sockets, which survive a readdress
	want0 = append(want0[:6:6], append([]string{"--bind", "0.0.0.0"}, want0[6:]...)...)
	if diff := cmp.Diff(want0, RadicdArgs(s, &s.Nodes[0])); diff != "" {
		t.Errorf("RadicdArgs(netns node) (-want +got):\n%s", diff)
	}
	s.FenceKill = false // the default of `radic cluster up`
	if got := RadicdArgs(s, &s.Nodes[0]); got[len(got)-1] != "--fence-kill=false" {
		t.Errorf("RadicdArgs without FenceKill = %q; want --fence-kill=false last", got)
	}
}

// The state round-trips through its file, and Update saves only when fn
// succeeds.
func TestStateUpdate(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir); err == nil {
		t.Fatal("Load of an empty dir succeeded")
	}
	s := &State{Name: "x", Dir: dir, Phase: "up", Nodes: []Node{{ID: 0, Addr: "127.1.0.1"}}}
	if err := save(dir, s); err != nil {
		t.Fatal(err)
	}
	if err := Update(dir, func(s *State) error { s.NextJob = 7; return nil }); err != nil {
		t.Fatal(err)
	}
	_ = Update(dir, func(s *State) error { s.NextJob = 8; return os.ErrInvalid })
	got, err := Load(dir)
	if err != nil || got.NextJob != 7 {
		t.Errorf("after Update: NextJob = %d, %v; want 7", got.NextJob, err)
	}
	if _, err := os.Stat(filepath.Join(dir, StateFile+".tmp")); !os.IsNotExist(err) {
		t.Errorf("temporary state file left: %v", err)
	}
}

// A recorded pid whose start time does not match (pid reuse) is never
// signalled.
func TestProcIdentity(t *testing.T) {
	me := proc.Of(os.Getpid())
	if !me.Alive() {
		t.Fatalf("this process is not alive according to %+v", me)
	}
	other := me
	other.Start++
	if other.Alive() {
		t.Errorf("a different start time still counts as the same process")
	}
	if (proc.ID{Pid: 1 << 30}).Alive() {
		t.Errorf("a pid that cannot exist is alive")
	}
}
