package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/internal/cluster"
	"github.com/radic-project/radic/internal/jobrun"
	"github.com/radic-project/radic/internal/launch"
	"github.com/radic-project/radic/internal/radicd"
)

func init() {
	register("status", "the radicd ring: nodes, ring order, who protects whom, health, heartbeat ages, recoveries under way and recent", statusCmd)
}

// statusNode is one radicd as `radic status` saw it.
type statusNode struct {
	Addr   string             `json:"addr"`
	Error  string             `json:"error,omitempty"`
	Status *radicd.NodeStatus `json:"status,omitempty"`
}

// statusRow is the merged view of one node.
type statusRow struct {
	ID         heartbeat.NodeID   `json:"id"`
	Addr       string             `json:"addr,omitempty"`
	Health     string             `json:"health"` // ok, suspect, fenced, dead, unreachable, absent
	Role       string             `json:"role"`
	Inc        uint64             `json:"incarnation,omitempty"`
	Protectors []heartbeat.NodeID `json:"protectors"`
	Protects   []heartbeat.NodeID `json:"protects"`
	Monitor    *heartbeat.NodeID  `json:"monitor,omitempty"`
	// LastHeartbeatMS is the age of its last heartbeat at its monitor.
	LastHeartbeatMS *float64 `json:"last_heartbeat_ms,omitempty"`
	StoreBytes      int64    `json:"store_bytes"`
	Why             string   `json:"why,omitempty"`
}

type statusReport struct {
	Ring       []heartbeat.NodeID `json:"ring"`
	Rows       []statusRow        `json:"nodes"`
	Recoveries recoveryReport     `json:"recoveries"`
	Daems      []statusNode       `json:"daemons"`
}

// recoveryReport is the recoveries every answering daemon knows of: each
// recovery under way as its latest report says, and the last finished.
type recoveryReport struct {
	InProgress []recoveryRow          `json:"in_progress"`
	Recent     []launch.RecoveryEvent `json:"recent"`
}

type recoveryRow struct {
	launch.RecoveryProgress
	// Elapsed and InPhase are measured on the clock of the daemon that
	// answered (Now in its status).
	Elapsed time.Duration `json:"elapsed_ns"`
	InPhase time.Duration `json:"in_phase_ns"`
}

// recentShown bounds the finished recoveries radic status prints.
const recentShown = 5

// mergeRecoveries merges what the daemons said: per group the newest
// report under way, and the union of the finished ones, oldest first.
func mergeRecoveries(daems []statusNode) recoveryReport {
	rep := recoveryReport{InProgress: []recoveryRow{}, Recent: []launch.RecoveryEvent{}}
	byGroup := map[int]recoveryRow{}
	type evKey struct {
		group  int
		epoch  uint64
		start  int64
		failed string
	}
	seen := map[evKey]bool{}
	for _, d := range daems {
		if d.Status == nil || d.Status.Recovery == nil {
			continue
		}
		now := d.Status.Now
		for _, p := range d.Status.Recovery.InProgress {
			if old, ok := byGroup[p.Group]; ok && !p.Updated.After(old.Updated) {
				continue
			}
			byGroup[p.Group] = recoveryRow{RecoveryProgress: p, Elapsed: max(now.Sub(p.Start), 0), InPhase: max(now.Sub(p.Since), 0)}
		}
		for _, ev := range d.Status.Recovery.Recent {
			k := evKey{ev.Group, ev.Epoch, ev.Start.UnixNano(), ev.Error + ev.Warning}
			if !seen[k] {
				seen[k] = true
				rep.Recent = append(rep.Recent, ev)
			}
		}
	}
	for _, r := range byGroup {
		rep.InProgress = append(rep.InProgress, r)
	}
	slices.SortFunc(rep.InProgress, func(a, b recoveryRow) int { return a.Group - b.Group })
	slices.SortStableFunc(rep.Recent, func(a, b launch.RecoveryEvent) int { return a.Start.Compare(b.Start) })
	rep.Recent = rep.Recent[max(len(rep.Recent)-recentShown, 0):]
	return rep
}

// printRecoveries is radic status's recovery section.
func printRecoveries(w io.Writer, rep recoveryReport) {
	if len(rep.InProgress) > 0 {
		fmt.Fprintf(w, "\nrecoveries in progress:\n")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "GROUP\tCAUSE\tFROM -> TO\tPHASE\tELAPSED\tIN PHASE\tATTEMPTS\tREPLAYED\tDRIVEN BY\t")
		for _, r := range rep.InProgress {
			to := "?"
			if r.To >= 0 {
				to = strconv.Itoa(r.To)
			}
			fmt.Fprintf(tw, "%d\t%s\t%d -> %s\t%s\t%.1f s\t%.1f s\t%d\t%s\tnode %d\t\n", r.Group, r.Cause, r.From, to, r.Phase,
				r.Elapsed.Seconds(), r.InPhase.Seconds(), r.Attempts, replayProgress(r.RecoveryProgress), r.By)
		}
		tw.Flush()
	}
	if len(rep.Recent) > 0 {
		fmt.Fprintf(w, "\nrecent recoveries:\n")
		for _, ev := range rep.Recent {
			fmt.Fprintf(w, "  %s\n", jobrun.DescribeRecovery(ev, nil))
		}
	}
}

// replayProgress is "12 MB of 38 MB (31%)", "12 MB", or "-" (not known).
func replayProgress(p launch.RecoveryProgress) string {
	if p.Replayed == nil {
		return "-"
	}
	n := *p.Replayed
	if p.ReplayTotal == 0 {
		return jobrun.SizeSI(n)
	}
	return fmt.Sprintf("%s of %s (%.0f%%)", jobrun.SizeSI(n), jobrun.SizeSI(p.ReplayTotal), 100*float64(n)/float64(p.ReplayTotal))
}

func statusCmd(args []string) error {
	fs := flag.NewFlagSet("radic status", flag.ContinueOnError)
	var addrs []string
	fs.Func("addr", "a radicd status `ADDR:PORT` (its --metrics-addr or --listen); repeat or comma-separate. Default: the nodes of the cluster in --state-dir", func(v string) error {
		for a := range strings.SplitSeq(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, a)
			}
		}
		return nil
	})
	stateDir := fs.String("state-dir", cluster.DefaultStateDir(), "the cluster's state `DIR`, read when no --addr is given")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	timeout := fs.Duration("timeout", 2*time.Second, "per-node request timeout")
	if err := fs.Parse(args); err != nil {
		return err
	}
	known := map[heartbeat.NodeID]string{}
	if len(addrs) == 0 {
		s, err := cluster.Load(*stateDir)
		if err != nil {
			return fmt.Errorf("no --addr given and no cluster: %w", err)
		}
		for _, n := range s.Nodes {
			a := n.MetricsAddr
			if a == "" {
				a = n.RadicdAddr
			}
			// A readdressed netns node's radicd follows its new address
			// (in loopback mode a readdress is only recorded).
			if _, port, err := net.SplitHostPort(a); err == nil && s.Mode == cluster.ModeNetns && n.Addr != "" {
				a = net.JoinHostPort(n.Addr, port)
			}
			addrs = append(addrs, a)
			known[heartbeat.NodeID(n.ID)] = a
		}
	}
	rep := collectStatus(addrs, *timeout)
	for i := range rep.Rows {
		if rep.Rows[i].Addr == "" {
			rep.Rows[i].Addr = known[rep.Rows[i].ID]
		}
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printStatus(os.Stdout, rep)
	for _, r := range rep.Rows {
		if r.Health != "ok" {
			return exitError{code: 3}
		}
	}
	return nil
}

func fetchStatus(ctx context.Context, addr string) (*radicd.NodeStatus, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/status", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	var st radicd.NodeStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, fmt.Errorf("decode status: %w", err)
	}
	return &st, nil
}

func collectStatus(addrs []string, timeout time.Duration) statusReport {
	var rep statusReport
	rep.Daems = make([]statusNode, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			st, err := fetchStatus(ctx, a)
			rep.Daems[i] = statusNode{Addr: a, Status: st}
			if errors.Is(err, context.DeadlineExceeded) {
				rep.Daems[i].Error = fmt.Sprintf("no answer within %v", timeout)
			} else if err != nil {
				rep.Daems[i].Error = err.Error()
			}
		})
	}
	wg.Wait()

	// Who is there: every member any daemon knows, plus the daemons.
	byID := map[heartbeat.NodeID]*radicd.NodeStatus{}
	addrOf := map[heartbeat.NodeID]string{}
	var ids []heartbeat.NodeID
	addID := func(id heartbeat.NodeID) {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	for _, d := range rep.Daems {
		if d.Status != nil {
			id := heartbeat.NodeID(d.Status.Node)
			byID[id], addrOf[id] = d.Status, d.Addr
			for _, m := range d.Status.Ring.Members {
				addID(m.ID)
			}
		}
	}
	for id := range byID {
		addID(id)
	}
	slices.Sort(ids)

	// The reference view: the first healthy, unfenced daemon's.
	var ref *radicd.NodeStatus
	for _, id := range ids {
		if st := byID[id]; st != nil && !st.Ring.Fenced {
			ref = st
			break
		}
	}
	if ref != nil {
		rep.Ring = ref.Ring.Ring
	}
	member := func(st *radicd.NodeStatus, id heartbeat.NodeID) *heartbeat.MemberStatus {
		if st == nil {
			return nil
		}
		for i := range st.Ring.Members {
			if st.Ring.Members[i].ID == id {
				return &st.Ring.Members[i]
			}
		}
		return nil
	}
	for _, id := range ids {
		row := statusRow{ID: id, Addr: addrOf[id], Health: "ok"}
		self := byID[id]
		if m := member(ref, id); m != nil {
			row.Role, row.Inc = m.Role, m.Inc
			row.Protectors, row.Protects = m.Protectors, m.Protects
			switch m.State {
			case "dead":
				row.Health, row.Why = "dead", "declared"
				for _, st := range byID {
					if mm := member(st, id); mm != nil && mm.State == "dead" && mm.Cause != "" {
						row.Why = "declared " + mm.Cause + " by node " + strconv.Itoa(st.Node)
					}
				}
			case "suspect":
				row.Health = "suspect"
			case "unknown":
				row.Health = "absent"
			}
			if m.Monitor != heartbeat.None {
				mon := m.Monitor
				row.Monitor = &mon
				if mm := member(byID[mon], id); mm != nil && mm.LastHeardMS >= 0 {
					age := mm.LastHeardMS
					row.LastHeartbeatMS = &age
				}
			}
		}
		if self != nil {
			row.StoreBytes = self.Store.Bytes
			if row.Role == "" {
				row.Role = self.Ring.Role
			}
			if self.Ring.Fenced {
				row.Health, row.Why = "fenced", "cut off from the ring"
			}
		} else if row.Health == "ok" {
			row.Health = "unreachable"
			row.Why = "its radicd did not answer"
			if row.Role == "" {
				row.Role = "-"
			}
		}
		rep.Rows = append(rep.Rows, row)
	}
	for _, d := range rep.Daems {
		if d.Status == nil && len(ids) == 0 {
			rep.Rows = append(rep.Rows, statusRow{Addr: d.Addr, Health: "unreachable", Why: d.Error})
		}
	}
	rep.Recoveries = mergeRecoveries(rep.Daems)
	return rep
}

func printStatus(w io.Writer, rep statusReport) {
	ring := make([]string, len(rep.Ring))
	for i, id := range rep.Ring {
		ring[i] = strconv.Itoa(int(id))
	}
	if len(ring) > 0 {
		fmt.Fprintf(w, "ring: %s -> %s\n\n", strings.Join(ring, " -> "), ring[0])
	} else {
		fmt.Fprintf(w, "ring: (no daemon answered)\n\n")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDR\tHEALTH\tROLE\tPROTECTED BY\tPROTECTS\tWATCHED BY\tLAST HEARTBEAT\tSTORE\t")
	ids := func(v []heartbeat.NodeID) string {
		if len(v) == 0 {
			return "-"
		}
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = strconv.Itoa(int(x))
		}
		return strings.Join(s, ",")
	}
	for _, r := range rep.Rows {
		mon, age := "-", "-"
		if r.Monitor != nil {
			mon = strconv.Itoa(int(*r.Monitor))
		}
		if r.LastHeartbeatMS != nil {
			age = fmt.Sprintf("%.0fms ago", *r.LastHeartbeatMS)
		}
		health := r.Health
		if r.Why != "" {
			health += " (" + r.Why + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.ID, r.Addr, health, r.Role,
			ids(r.Protectors), ids(r.Protects), mon, age, humanBytes(r.StoreBytes))
	}
	tw.Flush()
	printRecoveries(w, rep.Recoveries)
	// The daemons that did not answer, with what the ring says of their
	// node (a dead node's silence is no news; a live one's is).
	var silent []string
	for _, d := range rep.Daems {
		if d.Error == "" {
			continue
		}
		node := ""
		for _, r := range rep.Rows {
			if r.Addr == d.Addr {
				node = fmt.Sprintf(" (node %d, %s)", r.ID, r.Health)
			}
		}
		silent = append(silent, fmt.Sprintf("  %s%s: %s\n", d.Addr, node, d.Error))
	}
	if len(silent) > 0 {
		fmt.Fprintf(w, "\ndaemons that did not answer:\n%s", strings.Join(silent, ""))
	}
	fmt.Fprintln(w)
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
