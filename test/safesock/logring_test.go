package safesock_test

// Recovery's pessimistic log (RADIC_RECOVERY=1): what a rank received is on
// its protectors before anything that depends on it leaves the rank.
//
// RADIC_TEST_ACK_BEFORE_LOG=1 in the ranks' environment (shim/logring.go)
// breaks the pessimism on purpose: sends leave and bytes are acknowledged
// before they are logged. TestRecoveryHoldsSends fails with it (its
// subtest "broken" runs it and expects the send to leave), and so must
// every recovery test to come.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/radic-project/radic/msglog"
	"github.com/radic-project/radic/msglog/record"
	"github.com/radic-project/radic/observer"
	"github.com/radic-project/radic/observer/logring"
)

const recoveryEnv = "RADIC_RECOVERY=1"

// daemonGet asks node id's radicd for path, from inside its namespace.
func (c *tc) daemonGet(id int, path string) ([]byte, error) {
	n, err := c.state().Node(id)
	if err != nil {
		return nil, err
	}
	out, err := exec.Command("ip", "netns", "exec", n.Netns, "curl", "-sS", "-f", "--max-time", "20",
		"http://"+n.RadicdAddr+path).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%v: %s", err, ee.Stderr)
		}
		return nil, fmt.Errorf("node %d GET %s: %w", id, path, err)
	}
	return out, nil
}

// protectedLog is one process's log as a protector holds it.
type protectedLog struct {
	data map[uint64][]byte // connection id -> bytes received, from offset 0
	dets []observer.Determinant
}

// readLog reads owner's streams (of node of) from node at's store.
func (c *tc) readLog(at, of int, owner uint64) (*protectedLog, error) {
	b, err := c.daemonGet(at, fmt.Sprintf("/v1/replica/streams?node=%d", of))
	if err != nil {
		return nil, err
	}
	var infos []msglog.StreamInfo
	if err := json.Unmarshal(b, &infos); err != nil {
		return nil, fmt.Errorf("streams: %v", err)
	}
	l := &protectedLog{data: map[uint64][]byte{}}
	for _, in := range infos {
		if in.Owner != owner {
			continue
		}
		if in.Low != 0 {
			return nil, fmt.Errorf("stream %d starts at %d, want 0", in.Stream, in.Low)
		}
		body, err := c.daemonGet(at, fmt.Sprintf("/v1/replica/read?node=%d&owner=%d&stream=%d&from=0", of, owner, in.Stream))
		if err != nil {
			return nil, err
		}
		var bytes []byte
		for len(body) > 0 {
			r, n, err := record.Decode(body)
			if err != nil {
				return nil, fmt.Errorf("stream %d: %v", in.Stream, err)
			}
			if r.Offset != uint64(len(bytes)) {
				return nil, fmt.Errorf("stream %d: record at %d, want %d", in.Stream, r.Offset, len(bytes))
			}
			bytes = append(bytes, r.Payload...)
			body = body[n:]
		}
		if in.Stream != observer.DeterminantStream {
			l.data[in.Stream] = bytes
			continue
		}
		for len(bytes) > 0 {
			d, n, err := observer.DecodeDeterminant(bytes)
			if err != nil {
				return nil, fmt.Errorf("determinant %d: %v", len(l.dets), err)
			}
			l.dets = append(l.dets, d)
			bytes = bytes[n:]
		}
	}
	if len(l.data) == 0 && len(l.dets) == 0 {
		return nil, nil
	}
	return l, nil
}

func jobOwner(job string, lpid int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(job))
	return logring.Owner(h.Sum64(), uint32(lpid))
}

// TestRecoveryLogsWhatPeersSent runs stream (2 connections, both
// directions at once) under recovery and reads both ranks' logs back from
// their protectors: for each rank and connection the logged bytes are
// exactly what its peer sent (stream's specification regenerates them),
// and the receive determinants add up to them and end with the end of
// stream.
func TestRecoveryLogsWhatPeersSent(t *testing.T) {
	if bare() {
		t.Skip("bare mode: nothing is logged")
	}
	c := newCluster(t, 3)
	s := streamSpec{conns: 2, bytes: 3 << 20, mode: "poll", seed: 77}
	ref := reference(t, s)
	j := c.startStream(s, recoveryEnv)
	jb := c.waitRanks(2)
	checkStream(t, j, j.wait(s.timeout(0)), ref)
	if t.Failed() {
		return
	}
	for rank := range 2 {
		owner := jobOwner(jb.ID, rank)
		var logs []*protectedLog
		var at []int
		for node := range 3 {
			l, err := c.readLog(node, rank, owner)
			if err != nil {
				t.Fatal(err)
			}
			if l != nil {
				logs, at = append(logs, l), append(at, node)
			}
		}
		if len(logs) == 0 || slices.Contains(at, rank) {
			t.Fatalf("rank %d (node %d): its log is on nodes %v; want it on its protectors, other nodes", rank, rank, at)
		}
		t.Logf("rank %d: log on node(s) %v", rank, at)
		for i, l := range logs {
			checkLoggedStream(t, rank, at[i], l, s)
		}
	}
}

// checkLoggedStream checks one protector's copy of rank's log.
func checkLoggedStream(t *testing.T, rank, node int, l *protectedLog, s streamSpec) {
	t.Helper()
	if len(l.data) != s.conns {
		t.Errorf("rank %d on node %d: %d data streams, want %d", rank, node, len(l.data), s.conns)
	}
	ids := make([]uint64, 0, len(l.data))
	for id := range l.data {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for i, id := range ids {
		got := l.data[id]
		// Rank 1 connected: its connections' numbers are its connect
		// order, it receives direction 1. Rank 0 receives direction 0,
		// after rank 1's 8-byte hello naming the connection.
		var want []byte
		if rank == 0 {
			if len(got) < 8 {
				t.Errorf("rank 0 connection %s: %d bytes logged", observer.ConnString(id), len(got))
				continue
			}
			idx := binary.BigEndian.Uint32(got[4:8])
			want = make([]byte, 8+s.bytes)
			binary.BigEndian.PutUint32(want[:4], 1)
			binary.BigEndian.PutUint32(want[4:8], idx)
			streamGen(streamKey(s.seed, idx, 0), 0, want[8:])
		} else {
			want = make([]byte, s.bytes)
			streamGen(streamKey(s.seed, uint32(i), 1), 0, want)
		}
		if !bytes.Equal(got, want) {
			at := 0
			for at < min(len(got), len(want)) && got[at] == want[at] {
				at++
			}
			t.Errorf("rank %d connection %s on node %d: %d bytes logged, want %d; first difference at %d",
				rank, observer.ConnString(id), node, len(got), len(want), at)
		}
		var sum uint64
		var last *observer.Determinant
		for k := range l.dets {
			d := &l.dets[k]
			if d.Kind != observer.KindRecv || d.Conn != id {
				continue
			}
			if d.Errno == 0 {
				sum += d.N
			}
			last = d
		}
		if sum != uint64(len(want)) {
			t.Errorf("rank %d connection %s on node %d: receive determinants add up to %d bytes, want %d",
				rank, observer.ConnString(id), node, sum, len(want))
		}
		if last == nil || last.N != 0 || last.Errno != 0 {
			t.Errorf("rank %d connection %s on node %d: last receive determinant %v, want the end of stream",
				rank, observer.ConnString(id), node, last)
		}
	}
	if !t.Failed() {
		t.Logf("rank %d on node %d: %d connections, logged bytes equal what the peer sent; %d determinants", rank, node, len(ids), len(l.dets))
	}
}

// lastReceived is rank's last progress figure, in MiB (-1: none yet).
func lastReceived(j *job, rank int) float64 {
	got := -1.0
	for _, m := range progressRE.FindAllStringSubmatch(j.out.String(), -1) {
		if m[1] == strconv.Itoa(rank) {
			got, _ = strconv.ParseFloat(m[2], 64)
		}
	}
	return got
}

// TestRecoveryHoldsSends stops rank 0's radicd (SIGSTOP) mid-stream: rank 0
// keeps receiving (into its log ring), but what it sends no longer leaves,
// since it may depend on bytes that are not logged; rank 1, which receives
// what rank 0 sends, makes no progress until radicd is continued. Then the
// stream ends as a bare run does. With RADIC_TEST_ACK_BEFORE_LOG=1 (the
// subtest "broken") rank 0's sends leave and the check must see it.
func TestRecoveryHoldsSends(t *testing.T) {
	if bare() {
		t.Skip("bare mode: nothing is logged")
	}
	c := newCluster(t, 3)
	for _, broken := range []bool{false, true} {
		name := "pessimistic"
		env := []string{recoveryEnv}
		if broken {
			name = "broken"
			env = append(env, "RADIC_TEST_ACK_BEFORE_LOG=1")
		}
		t.Run(name, func(t *testing.T) {
			c := c.with(t)
			s := streamSpec{conns: 1, bytes: 24 << 20, mode: "blocking", seed: 5, secs: 8} // a receiving thread beside the held sender
			ref := reference(t, s)
			j := c.startStream(s, env...)
			j.waitReceived(1, 4, 60*time.Second)
			rank0 := c.waitRanks(2).Ranks[0].Proc.Pid
			n, err := c.state().Node(0)
			if err != nil || n.Radicd == nil {
				t.Fatalf("node 0's radicd: %v", err)
			}
			pid := n.Radicd.Pid
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			stopped := true
			cont := func() {
				if stopped {
					syscall.Kill(pid, syscall.SIGCONT)
					stopped = false
				}
			}
			defer cont()
			// What had passed the hold drains from the kernel's buffers
			// and the peer's; then rank 1 must stand still.
			// Rank 0's own output goes through the radicd that is
			// stopped, so what it received is read off its log ring.
			time.Sleep(700 * time.Millisecond)
			r0, r1 := ringHead(t, rank0), lastReceived(j, 1)
			time.Sleep(2 * time.Second)
			r0b, r1b := ringHead(t, rank0), lastReceived(j, 1)
			cont()
			t.Logf("radicd of node 0 stopped: rank 0's log ring %.1f -> %.1f MiB, rank 1 received (rank 0's sends) %.1f -> %.1f MiB in 2 s", mib(r0), mib(r0b), r1, r1b)
			held := r1b == r1
			switch {
			case !broken && !held:
				t.Errorf("rank 1 received %.1f MiB more while rank 0's log could not be stored: rank 0's sends were not held", r1b-r1)
			case !broken && r0b <= r0:
				t.Errorf("rank 0 logged nothing while its radicd was stopped (its ring at %.1f MiB): the test shows nothing about unlogged bytes", mib(r0))
			case broken && held:
				t.Errorf("with RADIC_TEST_ACK_BEFORE_LOG=1 rank 0's sends were held all the same: the switch does not break pessimism")
			}
			checkStream(t, j, j.wait(s.timeout(3*time.Second)), ref)
		})
	}
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }

// ringHead is how many bytes process pid has appended to its log ring (the
// header's head, observer/logring), read through /proc/PID/map_files: the
// ring's file is unlinked once radicd has mapped it.
func ringHead(t *testing.T, pid int) uint64 {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatalf("rank 0's mappings: %v", err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		if !strings.Contains(line, "/radic-log.") {
			continue
		}
		span, _, _ := strings.Cut(line, " ")
		f, err := os.Open(fmt.Sprintf("/proc/%d/map_files/%s", pid, span))
		if err != nil {
			t.Fatalf("rank 0's log ring: %v", err)
		}
		defer f.Close()
		var b [8]byte
		if _, err := f.ReadAt(b[:], logring.OffHead); err != nil {
			t.Fatalf("rank 0's log ring header: %v", err)
		}
		return binary.LittleEndian.Uint64(b[:])
	}
	t.Fatalf("process %d has no log ring mapped", pid)
	return 0
}
