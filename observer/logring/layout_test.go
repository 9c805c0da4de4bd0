package logring

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestLayoutMatchesC compiles a probe against the shim's C header
// (shim/c/logring.h) and checks that its offsets and constants are this
// package's: the ring is shared memory between the two.
func TestLayoutMatchesC(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	hdr, err := filepath.Abs("../../shim/c/logring.h")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src := `#include <stdio.h>
#include "` + hdr + `"
#define O(f) printf("%zu\n", offsetof(struct radic_log_hdr, f))
int main(void) {
	O(magic); O(version); O(hdr_size); O(data_size); O(owner); O(pid); O(job);
	O(head); O(stable); O(stable_seq); O(producer_waiting); O(doorbell);
	O(consumer_waiting); O(last_error);
	printf("%zu\n%u\n%u\n%u\n%d\n%d\n%d\n%d\n", sizeof(((struct radic_log_hdr *)0)->last_error),
	       RADIC_LOG_MAGIC, RADIC_LOG_VERSION, RADIC_LOG_HDR, RADIC_LOG_REC_HDR,
	       RADIC_LOG_DATA, RADIC_LOG_RECV, RADIC_LOG_RECV_DATA);
	return 0;
}
`
	if err := os.WriteFile(filepath.Join(dir, "probe.c"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "probe")
	if out, err := exec.Command(cc, "-o", bin, filepath.Join(dir, "probe.c")).CombinedOutput(); err != nil {
		t.Fatalf("compile the probe: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := []uint64{OffMagic, OffVersion, OffHeaderSize, OffDataSize, OffOwner, OffPid, OffJob,
		OffHead, OffStable, OffStableSeq, OffProducerWaiting, OffDoorbell, OffConsumerWaiting, OffLastError,
		LastErrorLen, Magic, Version, HeaderSize, RecHeaderLen,
		uint64(TypeData), uint64(TypeRecv), uint64(TypeRecvData)}
	names := []string{"magic", "version", "hdr_size", "data_size", "owner", "pid", "job", "head", "stable",
		"stable_seq", "producer_waiting", "doorbell", "consumer_waiting", "last_error", "sizeof last_error",
		"RADIC_LOG_MAGIC", "RADIC_LOG_VERSION", "RADIC_LOG_HDR", "RADIC_LOG_REC_HDR",
		"RADIC_LOG_DATA", "RADIC_LOG_RECV", "RADIC_LOG_RECV_DATA"}
	got := strings.Fields(string(out))
	if len(got) != len(want) {
		t.Fatalf("probe printed %d values, want %d", len(got), len(want))
	}
	for i := range want {
		if v, _ := strconv.ParseUint(got[i], 10, 64); v != want[i] {
			t.Errorf("%s: C says %d, Go %d", names[i], v, want[i])
		}
	}
}
