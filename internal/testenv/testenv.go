// Package testenv finds the artifacts that system tests need (the preload
// library, the binaries, the C test programs) and states the conditions under
// which a test can run at all (root, a package, a long-run mode).
//
// A missing artifact fails the test with the command that builds it: a test
// that silently skipped because `make` was not run would hide a broken build.
package testenv

import (
	"bytes"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

var (
	rootOnce sync.Once
	rootDir  string
)

// Root returns the repository's top directory (the one holding go.mod).
func Root(t testing.TB) string {
	t.Helper()
	rootOnce.Do(func() {
		if d := os.Getenv("RADIC_ROOT"); d != "" {
			rootDir = d
			return
		}
		d, err := os.Getwd()
		if err != nil {
			return
		}
		for {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				rootDir = d
				return
			}
			parent := filepath.Dir(d)
			if parent == d {
				return
			}
			d = parent
		}
	})
	if rootDir == "" {
		t.Fatal("testenv: cannot find the repository root (no go.mod above the working directory; set RADIC_ROOT)")
	}
	return rootDir
}

// Artifact returns the absolute path of a built file, relative to the root
// (for example "lib/libradic.so"), failing the test if it was not built.
func Artifact(t testing.TB, rel string) string {
	t.Helper()
	p := filepath.Join(Root(t), rel)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("testenv: %s is not built (run `make` in %s first): %v", rel, Root(t), err)
	}
	return p
}

// Lib is the path of the preload library, lib/libradic.so. Its Go half,
// lib/libradic-go.so, which it loads beside itself in managed processes,
// must be built too.
func Lib(t testing.TB) string {
	t.Helper()
	GoLib(t)
	return Artifact(t, "lib/libradic.so")
}

// GoLib is the path of the preload library's Go control plane.
func GoLib(t testing.TB) string { return Artifact(t, "lib/libradic-go.so") }

// RequireRoot skips the test, saying why, when not running as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, cgroups, nftables); run `make test` as root")
	}
}

// RequireCommand skips the test when a program is not installed.
func RequireCommand(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not installed (scripts/deps.sh installs it)", name)
	}
	return p
}

// Long reports whether long soak/scale runs were asked for (`make soak`).
func Long() bool { return os.Getenv("RADIC_SOAK") != "" }

// Bench reports whether benchmarks were asked for (`make bench`).
func Bench() bool { return os.Getenv("RADIC_BENCH") != "" }

// Rand returns a seeded generator and logs the seed, so that a failure can be
// replayed with TEST_SEED=<seed>.
func Rand(t testing.TB) *rand.Rand {
	t.Helper()
	seed := Seed(t, "TEST_SEED")
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// Seed is the number in the environment variable name, or the clock's; it
// is logged, so that a failure can be replayed with name=<seed>.
func Seed(t testing.TB, name string) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(name); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("testenv: %s=%q is not a number: %v", name, s, err)
		}
		seed = v
	}
	t.Logf("%s=%d (set it to replay this run)", name, seed)
	return seed
}

// Buffer is a bytes.Buffer that one writer (a command's output) and
// readers (a test polling that output) may use at once.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
