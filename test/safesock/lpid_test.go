package safesock_test

import (
	"strings"
	"testing"
	"time"
)

// TestChildLogicalIDs: a program a rank starts gets its own logical process
// id, derived from its parent's and its place among the parent's children
// (never from a pid), so that the connections of two children of one rank
// cannot share ids; an exec without a fork keeps the id.
func TestChildLogicalIDs(t *testing.T) {
	if bare() {
		t.Skip("bare mode: logical ids come from libradic.so")
	}
	c := newCluster(t, 1)
	script := `echo "self=${RADIC_LPID:-none}"; env | grep '^RADIC_LPID='; sh -c 'env | grep "^RADIC_LPID="; exec sh -c "echo exec=\$RADIC_LPID"'`
	j := c.start(runOpts{np: 1, what: "lpid"}, "/bin/sh", "-c", script)
	if code := j.wait(time.Minute); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	out := j.out.String()
	for _, want := range []string{
		"self=none",          // the rank itself: its rank is its id
		"RADIC_LPID=0.1\n",   // its first child (env)
		"RADIC_LPID=0.3.1\n", // the first child of its third (sh; grep was the second)
		"exec=0.3\n",         // an exec keeps the id
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", strings.TrimSpace(want), out)
		}
	}
}
