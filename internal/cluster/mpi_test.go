package cluster

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// A node of the MPI job declared dead is said once, with when and why; a
// dead node outside the job, and an alive one, are not.
func TestWatchNodeLoss(t *testing.T) {
	const status = `{"ring": {"members": [
		{"id": 0, "state": "alive"},
		{"id": 2, "state": "dead", "cause": "no heartbeat for 600ms", "declared_at": "2026-12-07T03:19:01.250Z"},
		{"id": 5, "state": "dead", "cause": "no heartbeat for 600ms", "declared_at": "2026-12-07T03:19:01.250Z"}]}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/status" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, status)
	}))
	defer srv.Close()
	var mu sync.Mutex
	var said []string
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		watchNodeLoss(done, strings.TrimPrefix(srv.URL, "http://"), []int{0, 1, 2, 3}, "mpiexec.mpich", func(f string, a ...any) {
			mu.Lock()
			said = append(said, fmt.Sprintf(f, a...))
			mu.Unlock()
		})
		close(stopped)
	}()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(said)
	}
	for deadline := time.Now().Add(10 * time.Second); count() == 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(1100 * time.Millisecond) // two more polls, which must not say it again
	close(done)
	<-stopped
	mu.Lock()
	defer mu.Unlock()
	if len(said) != 1 {
		t.Fatalf("said %d lines, want 1 (node 2, once): %q", len(said), said)
	}
	for _, want := range []string{"node 2 of the job was declared dead", "no heartbeat for 600ms", "radic does not restart the processes of MPI jobs", "mpiexec.mpich stops the job"} {
		if !strings.Contains(said[0], want) {
			t.Errorf("%q does not say %q", said[0], want)
		}
	}
}
