package fabricbench_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

// The workloads.
const (
	firstSize   = 64  // bytes of the first message
	firstTrials = 500 // first messages per run, each to a fresh peer; the run's figure is their median
	firstWarmup = 20  // per transport, before the runs, not counted

	bulkTotal = 64 << 20 // bytes per bulk run
	bulkSize  = 64 << 10 // bytes per message
	// bulkInflight is the unacknowledged bulk writes the sender keeps.
	// The receiver's window is per sending peer (bulk.Config.Window
	// chunks over all its transfers), so several in flight keep the
	// link busy between one transfer's last chunk and the next one's
	// first without overflowing the receiver's socket buffer.
	bulkInflight = 4

	rateCount = 100_000 // 64-byte messages per rate run
	rateSize  = 64
	// rateInflight is the unacknowledged Short writes the sender keeps
	// queued; delta-t puts its window of them (64 segments) on the wire.
	rateInflight = 1024
)

// nodes are the four peers of the network benchmarks: the delta-t
// endpoints (node 0 sends, node 1 receives) and the TCP client (node 0)
// and server (node 1).
type nodes struct {
	*pair
	dt   [2]*peer
	tcpc *peer
	tcps *peer
	id   int // the id the next message carries
}

func newNodes(b *testing.B) *nodes {
	b.Helper()
	n := &nodes{pair: newPair(b)}
	for i := range n.dt {
		n.dt[i] = n.start(i, fmt.Sprintf("fabric%d", i), "fabric", "-self", fmt.Sprint(i),
			"-addr0", addr0+":"+udpPort, "-addr1", addr1+":"+udpPort)
	}
	n.tcps = n.start(1, "tcpserver", "tcp", "-listen", addr1+":"+tcpPort)
	n.tcpc = n.start(0, "tcpclient", "tcp", "-connect", addr1+":"+tcpPort)
	// Both fabric peers answer only once their sockets are bound.
	for _, p := range n.dt {
		p.do("reset")
		p.want("ok", 10*time.Second)
	}
	return n
}

// dtMessages sends count messages of size bytes from node 0 to node 1
// over fresh endpoints (no state for the peer on either side) and returns
// the Unix ns of the first WriteMsg and of the receiver's last ReadMsg.
func (n *nodes) dtMessages(count, size, inflight int, timeout time.Duration) (start, last int64) {
	b := n.b
	b.Helper()
	n.id++
	// The sender first, so that nothing of its old endpoint (a
	// retransmission) can reach the receiver's new one.
	for _, p := range n.dt {
		p.do("reset")
		p.want("ok", 10*time.Second)
	}
	n.dt[1].do("expect %d", count)
	n.dt[1].want("ready", 10*time.Second)
	n.dt[0].do("send %d %d %d %d", count, size, inflight, n.id)
	s := n.dt[0].want("start", 10*time.Second)
	g := n.dt[1].want("got", timeout) // count first last bytes id
	if g[0] != int64(count) || g[3] != int64(count*size) || g[4] != int64(n.id) {
		b.Fatalf("delta-t: got %d messages, %d bytes, first id %d; want %d, %d, id %d", g[0], g[3], g[4], count, count*size, n.id)
	}
	return s[0], g[2]
}

// tcpBytes sends count writes of size bytes over a new TCP connection
// from node 0 to node 1 and returns the Unix ns of the start of the
// connect, of its end, and of the server's last read.
func (n *nodes) tcpBytes(count, size int, timeout time.Duration) (dialed, connected, last int64) {
	b := n.b
	b.Helper()
	n.id++
	n.tcps.do("expect %d", count*size)
	n.tcps.want("ready", 10*time.Second)
	n.tcpc.do("send %d %d 1 %d", count, size, n.id)
	s := n.tcpc.want("sent", timeout) // dialed connected done
	g := n.tcps.want("got", timeout)  // 1 first last bytes id
	if g[3] != int64(count*size) || g[4] != int64(n.id) {
		b.Fatalf("tcp: got %d bytes, first id %d; want %d, id %d", g[3], g[4], count*size, n.id)
	}
	return s[0], s[1], g[2]
}

// dtStats logs the endpoints' counters and the receiver's UDP drops.
func (n *nodes) dtStats(what string, drops0 int64) {
	for _, p := range n.dt {
		p.do("stats")
		fmt.Printf("%s, %s after the last run: %s\n", what, p.name, p.wantLine("stats", 10*time.Second))
	}
	fmt.Printf("%s: UDP datagrams node 1 dropped for a full socket buffer during the runs: %d\n", what, n.udpRcvbufErrors(1)-drops0)
}

// BenchmarkFirstMessage: the first message to a peer. Delta-t needs no
// handshake: the first segment carries the data and opens the receiver's
// record. TCP connects first (SYN, SYN-ACK, ACK) and sends after. Each
// trial uses a fresh Endpoint pair (no record on either side) or a new
// TCP connection to the listening server.
func BenchmarkFirstMessage(b *testing.B) {
	requireBench(b)
	requireNetns(b)
	runs := testenv.EnvCount(b, "RADIC_BENCH_RUNS", 5, 1)
	n := newNodes(b)
	t0, load := time.Now(), loadAvg()
	trial := func(tcp bool) float64 {
		if tcp {
			dialed, _, last := n.tcpBytes(1, firstSize, 10*time.Second)
			return float64(last-dialed) / 1e3
		}
		start, last := n.dtMessages(1, firstSize, 1, 10*time.Second)
		return float64(last-start) / 1e3
	}
	for range firstWarmup {
		trial(false)
		trial(true)
	}
	v := sideBySide(runs, func(tcp bool) float64 {
		t := make([]float64, firstTrials)
		for i := range t {
			t[i] = trial(tcp)
		}
		return testenv.Median(t)
	})
	r := row{metric: fmt.Sprintf("first %d B message to a new peer (median of %d per run)", firstSize, firstTrials),
		dt: v[0], tcp: v[1], unit: "us", prec: 1, ratioOf: "delta-t/TCP",
		goal: "delta-t faster (< 1)", met: func(x float64) bool { return x < 1 }}
	report(b, table("First message to a new peer: delta-t (WriteMsg to ReadMsg) vs TCP (connect + send)", runs, t0, load, r)+
		"\nDelta-t: from WriteMsg on a fresh endpoint to the fresh receiving endpoint's ReadMsg. "+
		"TCP: from the start of net.Dial to the server's read returning the 64 bytes (TCP_NODELAY).\n")
	b.ReportMetric(testenv.Median(v[0]), "dt-first-us")
	b.ReportMetric(testenv.Median(v[1]), "tcp-first-us")
	b.ReportMetric(r.ratio(), "first-ratio")
}

// BenchmarkBulkThroughput: 64 MiB in 64 KiB messages from node 0 to
// node 1, by the Bulk protocol (the receiver pulls each message with
// remote gets of 232-byte chunks, one torus packet, one UDP datagram
// each), against one TCP connection on the same link (64 KiB writes).
// Delta-t: from the first WriteMsg to the last ReadMsg; TCP: from the
// connection being up to the server's last read.
func BenchmarkBulkThroughput(b *testing.B) {
	requireBench(b)
	requireNetns(b)
	runs := testenv.EnvCount(b, "RADIC_BENCH_RUNS", 5, 1)
	inflight := testenv.EnvCount(b, "RADIC_BENCH_BULK_INFLIGHT", bulkInflight, 1)
	n := newNodes(b)
	count := bulkTotal / bulkSize
	measure := func(tcp bool) float64 {
		if tcp {
			_, connected, last := n.tcpBytes(count, bulkSize, 2*time.Minute)
			return bulkTotal / (float64(last-connected) / 1e9) / 1e6
		}
		start, last := n.dtMessages(count, bulkSize, inflight, 2*time.Minute)
		return bulkTotal / (float64(last-start) / 1e9) / 1e6
	}
	measure(false) // warm up both
	measure(true)
	drops := n.udpRcvbufErrors(1)
	t0, load := time.Now(), loadAvg()
	v := sideBySide(runs, measure)
	r := row{metric: fmt.Sprintf("bulk throughput, %d MiB in %d KiB messages", bulkTotal>>20, bulkSize>>10),
		dt: v[0], tcp: v[1], unit: "MB/s", prec: 1, ratioOf: "delta-t/TCP",
		goal: ">= 0.9", met: func(x float64) bool { return x >= 0.9 }}
	report(b, table("Bulk throughput: delta-t Bulk protocol vs TCP on the same link", runs, t0, load, r)+
		fmt.Sprintf("\nDelta-t keeps %d writes unacknowledged; MB = 10^6 bytes.\n", inflight))
	n.dtStats("bulk", drops)
	b.ReportMetric(testenv.Median(v[0]), "dt-MB/s")
	b.ReportMetric(testenv.Median(v[1]), "tcp-MB/s")
	b.ReportMetric(r.ratio(), "bulk-ratio")
}

// BenchmarkSmallMessageRate: 64-byte messages per second from node 0 to
// node 1: Short messages (one delta-t segment, one torus packet, one UDP
// datagram each) against TCP with TCP_NODELAY and one write per message.
// Delta-t: from the first WriteMsg to the last ReadMsg; TCP: from the
// connection being up to the server's last read.
func BenchmarkSmallMessageRate(b *testing.B) {
	requireBench(b)
	requireNetns(b)
	runs := testenv.EnvCount(b, "RADIC_BENCH_RUNS", 5, 1)
	n := newNodes(b)
	measure := func(tcp bool) float64 {
		if tcp {
			_, connected, last := n.tcpBytes(rateCount, rateSize, 2*time.Minute)
			return rateCount / (float64(last-connected) / 1e9)
		}
		start, last := n.dtMessages(rateCount, rateSize, rateInflight, 2*time.Minute)
		return rateCount / (float64(last-start) / 1e9)
	}
	measure(false)
	measure(true)
	drops := n.udpRcvbufErrors(1)
	t0, load := time.Now(), loadAvg()
	v := sideBySide(runs, measure)
	r := row{metric: fmt.Sprintf("%d B messages per second (%d per run)", rateSize, rateCount),
		dt: v[0], tcp: v[1], unit: "msg/s", prec: 0, ratioOf: "delta-t/TCP",
		goal: "none in issue 12"}
	report(b, table("Small-message rate: delta-t Short protocol vs TCP (TCP_NODELAY, one write per message)", runs, t0, load, r)+
		fmt.Sprintf("\nDelta-t keeps at most %d writes unacknowledged (its window puts 64 segments on the wire).\n", rateInflight))
	n.dtStats("rate", drops)
	b.ReportMetric(testenv.Median(v[0]), "dt-msg/s")
	b.ReportMetric(testenv.Median(v[1]), "tcp-msg/s")
	b.ReportMetric(r.ratio(), "rate-ratio")
}
