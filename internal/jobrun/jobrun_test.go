package jobrun

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

// --tag-output: every line prefixed, a last line without a newline ended
// with one, however the stream was cut into writes.
func TestTagThroughSink(t *testing.T) {
	for _, cuts := range [][]string{
		{"a\nb\nc"},
		{"a", "\nb", "\n", "c"},
		{"a\nb\n", "c"},
	} {
		var out bytes.Buffer
		o := newOutput(true, &out, &out)
		w := o.sink(2, "stdout")
		for _, c := range cuts {
			w.Write([]byte(c))
		}
		w.Close() // returns once the last line is out
		if got, want := out.String(), "[rank 2] a\n[rank 2] b\n[rank 2] c\n"; got != want {
			t.Errorf("writes %q: output %q; want %q", cuts, got, want)
		}
	}
}

// Untagged, bytes go through as written.
func TestUntaggedSink(t *testing.T) {
	var out bytes.Buffer
	o := newOutput(false, &out, &out)
	w := o.sink(0, "stderr")
	w.Write([]byte("no newline"))
	w.Close()
	if out.String() != "no newline" {
		t.Errorf("output %q; want the bytes as written", out.String())
	}
}

func TestTag(t *testing.T) {
	var out bytes.Buffer
	var mu sync.Mutex
	Tag(7, strings.NewReader("x\n\ny"), &out, &mu)
	if got, want := out.String(), "[rank 7] x\n[rank 7] \n[rank 7] y\n"; got != want {
		t.Errorf("Tag = %q; want %q", got, want)
	}
}

// A poll made to a node's old address is told when the node moved.
func TestBookMoved(t *testing.T) {
	where := "10.0.0.1:7470"
	b := newBook(func(int) (string, error) { return where, nil })
	a, err := b.daemon(3)
	if err != nil || a != where {
		t.Fatalf("daemon(3) = %q, %v", a, err)
	}
	ch := b.movedFrom(3, a)
	select {
	case <-ch:
		t.Fatal("moved before the node moved")
	default:
	}
	b.set(3, a) // the same address: no move
	select {
	case <-ch:
		t.Fatal("moved on a refresh that found the same address")
	default:
	}
	b.set(3, "10.0.1.1:7470")
	select {
	case <-ch:
	default:
		t.Fatal("not told of the move")
	}
	select {
	case <-b.movedFrom(3, a):
	default:
		t.Error("movedFrom(old address) after the move is not closed")
	}
}
