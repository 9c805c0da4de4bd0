package radicd_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/radic-project/radic/msglog/record"
)

// logRecords posts records of node i's own processes to its radicd, which
// acknowledges once every protector stored them.
func (r *ring) logRecords(i int, recs []record.Record) (protectors string, err error) {
	var body []byte
	for k := range recs {
		body = record.AppendRecord(body, &recs[k])
	}
	resp, err := http.Post("http://"+r.listen(i)+"/v1/log", "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusNoContent {
		return resp.Header.Get("X-Radic-Protectors"), fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	return resp.Header.Get("X-Radic-Protectors"), nil
}

// readReplica reads stream (owner, stream) of node `of` held on node i.
func (r *ring) readReplica(i, of int, owner, stream uint64) ([]byte, error) {
	resp, err := http.Get(fmt.Sprintf("http://%s/v1/replica/read?node=%d&owner=%d&stream=%d&from=0", r.listen(i), of, owner, stream))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, b)
	}
	var data []byte
	for len(b) > 0 {
		rec, n, err := record.Decode(b)
		if err != nil {
			return nil, err
		}
		data = append(data, rec.Payload...)
		b = b[n:]
	}
	return data, nil
}

func records(owner, stream uint64, from, n, size int) ([]record.Record, []byte) {
	var recs []record.Record
	var all []byte
	off := uint64(from * size)
	for k := range n {
		p := bytes.Repeat([]byte{byte(from + k)}, size)
		recs = append(recs, record.Record{Kind: record.KindData, Owner: owner, Stream: stream, Offset: off, Payload: p})
		all = append(all, p...)
		off += uint64(size)
	}
	return recs, all
}

// TestReplicationToProtectors: with k=2, a node's records are on its next
// two ring members when the write is acknowledged; when one protector dies,
// the ring repairs, the survivor copies the data to the new second
// protector, and new writes go to the new pair.
func TestReplicationToProtectors(t *testing.T) {
	const n = 4
	r := startRing(t, 61, n, func(int) []string { return []string{"--protectors", "2", "--store-sync", "always"} })
	recs, want := records(7, 1, 0, 50, 1000)
	prots, err := r.logRecords(0, recs)
	if err != nil {
		t.Fatal(err)
	}
	if prots != "1,2" {
		t.Errorf("node 0's records went to %q, want its next two ring members 1,2", prots)
	}
	for _, p := range []int{1, 2} {
		got, err := r.readReplica(p, 0, 7, 1)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("replica on node %d: %d bytes (%v), want %d identical bytes", p, len(got), err, len(want))
		}
		if v := r.metric(p, "radic_store_records_total", ""); v != 50 {
			t.Errorf("node %d radic_store_records_total = %v, want 50", p, v)
		}
		if v := r.metric(p, "radic_store_bytes", ""); v < float64(len(want)) {
			t.Errorf("node %d radic_store_bytes = %v, want >= %d", p, v, len(want))
		}
	}
	if got, _ := r.readReplica(3, 0, 7, 1); len(got) != 0 {
		t.Errorf("node 3 (not a protector of 0) holds %d bytes of node 0", len(got))
	}

	// Protector 1 dies: 0's protectors become 2 and 3; 2 re-protects on 3.
	r.kill(1)
	if _, ok := r.waitDeclared(2, 1, 3*time.Second); !ok {
		t.Fatal("node 1 not declared")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, _ := r.readReplica(3, 0, 7, 1)
		if bytes.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 3 was not re-protected with node 0's data: %d of %d bytes", len(got), len(want))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("re-protection: node 2 copied %v records of node 0 to node 3", r.metric(2, "radic_reprotected_records_total", ""))
	more, want2 := records(7, 1, 50, 10, 1000)
	prots, err = r.logRecords(0, more)
	if err != nil || prots != "2,3" {
		t.Fatalf("after repair, node 0's records went to %q (%v), want 2,3", prots, err)
	}
	want = append(want, want2...)
	for _, p := range []int{2, 3} {
		got, err := r.readReplica(p, 0, 7, 1)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("replica on node %d after repair: %d bytes (%v), want %d", p, len(got), err, len(want))
		}
	}
}

// TestStoreFullIsBackPressure: a protector whose quota is reached refuses
// with 507 and a clear error; nothing is corrupted and what was stored is
// served intact.
func TestStoreFullIsBackPressure(t *testing.T) {
	r := startRing(t, 66, 3, func(int) []string { return []string{"--store-max-bytes", "200000"} })
	var want []byte
	var lastErr error
	for k := 0; k < 100; k++ {
		recs, data := records(9, 2, k, 1, 10000)
		if _, err := r.logRecords(0, recs); err != nil {
			lastErr = err
			break
		}
		want = append(want, data...)
	}
	if lastErr == nil || !strings.Contains(lastErr.Error(), "507") || !strings.Contains(lastErr.Error(), "full") {
		t.Fatalf("writing past the quota: %v; want 507 and a 'full' error", lastErr)
	}
	t.Logf("after %d bytes: %v", len(want), lastErr)
	got, err := r.readReplica(1, 0, 9, 2)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after the refusal the protector serves %d bytes (%v), want the %d acknowledged ones", len(got), err, len(want))
	}
	if v := r.metric(1, "radic_store_full_errors_total", ""); v < 1 {
		t.Errorf("radic_store_full_errors_total = %v", v)
	}
	if v := r.metric(0, "radic_replication_errors_total", ""); v < 1 {
		t.Errorf("radic_replication_errors_total on the writer = %v", v)
	}
}
