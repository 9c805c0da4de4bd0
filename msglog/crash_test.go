package msglog

import (
	"bufio"
	"fmt"

	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/testenv"
)

const (
	crashDirEnv  = "MSGLOG_CRASH_DIR"
	crashSeedEnv = "MSGLOG_CRASH_SEED"
	crashStreams = 4
	crashSegSize = 32 << 10
)

// TestCrashChild is the child of TestCrash: it appends (fsync always) and
// truncates until killed, printing
//
//	w <stream> <end>    before Append of bytes up to end
//	A <stream> <end>    after Append returned nil (acknowledged)
//	t <stream> <below>  before Truncate
//	T <stream> <below>  after Truncate returned nil
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("child of TestCrash only")
	}
	seed, _ := strconv.ParseUint(os.Getenv(crashSeedEnv), 10, 64)
	rng := rand.New(rand.NewPCG(seed, 1))
	s, err := Open(dir, Options{Sync: SyncAlways, SegmentSize: crashSegSize, MemoryLimit: 16 << 10})
	if err != nil {
		fmt.Printf("E open: %v\n", err)
		os.Exit(2)
	}
	out := os.Stdout
	fmt.Fprintln(out, "ready")
	for i := 0; ; i++ {
		k := Key{1, uint64(rng.IntN(crashStreams))}
		info, _ := s.Stream(k.Owner, k.Stream)
		if i%40 == 39 && info.End > info.Low {
			below := info.Low + rng.Uint64N(info.End-info.Low+1)
			fmt.Fprintf(out, "t %d %d\n", k.Stream, below)
			if err := s.Truncate(k.Owner, k.Stream, below); err != nil {
				fmt.Fprintf(out, "E truncate: %v\n", err)
				os.Exit(2)
			}
			fmt.Fprintf(out, "T %d %d\n", k.Stream, below)
			continue
		}
		n := 1 + rng.IntN(3000)
		if rng.IntN(20) == 0 {
			n = 100_000 + rng.IntN(900_000) // now and then a large one, many pages long
		}
		end := info.End + uint64(n)
		fmt.Fprintf(out, "w %d %d\n", k.Stream, end)
		if err := s.Append(rec(k, info.End, n)); err != nil {
			fmt.Fprintf(out, "E append: %v\n", err)
			os.Exit(2)
		}
		fmt.Fprintf(out, "A %d %d\n", k.Stream, end)
	}
}

type crashState struct {
	ackedEnd, maxEnd [crashStreams]uint64 // acknowledged, and ever attempted
	ackedLow, maxLow [crashStreams]uint64
}

// TestCrash kills a writing child at random moments and checks, after each
// kill, that every acknowledged byte is served intact, that nothing never
// written is served, and that truncation marks are as acknowledged.
func TestCrash(t *testing.T) {
	if os.Getenv(crashDirEnv) != "" {
		t.Skip("in the child")
	}
	kills := 50
	if testing.Short() {
		kills = 10
	}
	rng := testenv.Rand(t)
	dir := t.TempDir()
	var st crashState
	var appends, torn int
	start := time.Now()
	for round := range kills {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashDirEnv+"="+dir, crashSeedEnv+"="+strconv.FormatUint(rng.Uint64(), 10))
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 1024)
		go func() {
			defer close(lines)
			r := bufio.NewReader(stdout)
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					return // a partial last line was never printed
				}
				lines <- strings.TrimSuffix(l, "\n")
			}
		}()
		if l := <-lines; l != "ready" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("round %d: child said %q, want ready", round, l)
		}
		time.Sleep(time.Duration(rng.IntN(120_000)) * time.Microsecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for l := range lines {
			if st.apply(t, l) {
				appends++
			}
		}
		if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
			t.Fatalf("round %d: child exited with %v, want killed (it failed on its own?)", round, err)
		}
		torn += st.verify(t, dir, round)
	}
	t.Logf("%d kills, %d acknowledged appends, %d recoveries dropped a torn tail, %v",
		kills, appends, torn, time.Since(start).Round(time.Millisecond))
}

// apply records one line of the child; it reports an acknowledged append.
func (st *crashState) apply(t *testing.T, l string) bool {
	var op string
	var k, v uint64
	if _, err := fmt.Sscanf(l, "%s %d %d", &op, &k, &v); err != nil || k >= crashStreams {
		t.Fatalf("child: %q", l)
	}
	switch op {
	case "w":
		st.maxEnd[k] = max(st.maxEnd[k], v)
	case "A":
		st.ackedEnd[k] = max(st.ackedEnd[k], v)
		return true
	case "t":
		st.maxLow[k] = max(st.maxLow[k], v)
	case "T":
		st.ackedLow[k] = max(st.ackedLow[k], v)
	default:
		t.Fatalf("child: %q", l)
	}
	return false
}

// verify reopens the store and checks it; it returns 1 if recovery dropped
// a torn tail.
func (st *crashState) verify(t *testing.T, dir string, round int) int {
	t.Helper()
	s, err := Open(dir, Options{SegmentSize: crashSegSize, MemoryLimit: 16 << 10})
	if err != nil {
		t.Fatalf("round %d: reopen after kill: %v", round, err)
	}
	defer s.Close()
	for k := range uint64(crashStreams) {
		info, ok := s.Stream(1, k)
		if !ok {
			if st.ackedEnd[k] > 0 {
				t.Fatalf("round %d: stream %d with acknowledged bytes is gone", round, k)
			}
			continue
		}
		if info.End < st.ackedEnd[k] || info.End > max(st.maxEnd[k], st.maxLow[k]) {
			t.Fatalf("round %d: stream %d ends at %d; acknowledged %d, ever written %d",
				round, k, info.End, st.ackedEnd[k], st.maxEnd[k])
		}
		if info.Low < st.ackedLow[k] || info.Low > st.maxLow[k] {
			t.Fatalf("round %d: stream %d low mark %d; acknowledged %d, ever asked %d",
				round, k, info.Low, st.ackedLow[k], st.maxLow[k])
		}
		// Every byte from Low to End is served, contiguous and intact.
		if got := readAll(t, s, Key{1, k}, info.Low); got != info.End {
			t.Fatalf("round %d: stream %d read to %d, End %d", round, k, got, info.End)
		}
		// What survived is now the baseline (an unacknowledged write that
		// made it is as good as acknowledged from here on).
		st.ackedEnd[k], st.maxEnd[k] = info.End, info.End
		st.ackedLow[k], st.maxLow[k] = info.Low, info.Low
	}
	if s.Stats().TornBytes.Load() > 0 {
		return 1
	}
	return 0
}
