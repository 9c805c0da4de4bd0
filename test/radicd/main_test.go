// Package radicd_test holds the system tests of radicd: real daemons on
// loopback addresses 127.78.0.N, killed, frozen and cut off for real, the
// location table pushed and looked up between them, a netns cluster whose
// node is readdressed under its daemon, and the deploy/ files checked with
// systemd-analyze, promtool and a real Prometheus. Every process a test
// starts is killed by pid in its cleanup.
package radicd_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

var (
	radicdBin string // built once by TestMain
	radicBin  string
	// testFabric is the daemons' network the tests run on
	// (RADIC_TEST_FABRIC: bg or ip; empty: radicd's default): `make
	// test` runs the ring and recovery tests on both.
	testFabric = os.Getenv("RADIC_TEST_FABRIC")
)

// fabricArgs are the `radic cluster up` flags for testFabric.
func fabricArgs() []string {
	if testFabric == "" {
		return nil
	}
	return []string{"--fabric", testFabric}
}

func TestMain(m *testing.M) {
	if h := os.Getenv("RADICD_TEST_HELPER"); h != "" {
		os.Exit(helperMain(h)) // a rank of a location test (location_test.go)
	}
	dir, err := os.MkdirTemp("", "radicd-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	radicdBin = filepath.Join(dir, "radicd")
	radicBin = filepath.Join(dir, "radic")
	for bin, pkg := range map[string]string{radicdBin: "../../cmd/radicd", radicBin: "../../cmd/radic"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n", pkg, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
