package outbuf

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

func read(t *testing.T, b *Buffer, from uint64, max int) ([]byte, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	d, eof, err := b.Read(ctx, from, max)
	if err != nil {
		t.Fatalf("Read(%d, %d): %v", from, max, err)
	}
	return d, eof
}

// A reader that lost its connection asks again from the last offset it
// wrote out and gets exactly the rest; a Read releases what precedes it.
func TestReconnectingReaderGetsTheRest(t *testing.T) {
	b := New(1 << 10)
	ctx := context.Background()
	b.Write(ctx, []byte("hello, "))
	b.Write(ctx, []byte("world\n"))
	d, eof := read(t, b, 0, 5)
	if string(d) != "hello" || eof {
		t.Fatalf("Read(0, 5) = %q, %v; want \"hello\", false", d, eof)
	}
	// The reply was lost: ask again from 0, then from 3 (3 bytes arrived).
	if d, _ := read(t, b, 0, 100); string(d) != "hello, world\n" {
		t.Fatalf("Read(0) again = %q", d)
	}
	if d, _ := read(t, b, 3, 100); string(d) != "lo, world\n" {
		t.Fatalf("Read(3) = %q; want the rest from 3", d)
	}
	if low, end, _ := b.Window(); low != 3 || end != 13 {
		t.Errorf("Window() = %d, %d; want 3, 13 (Read(3) released [0,3))", low, end)
	}
	_, _, err := b.Read(ctx, 2, 100)
	if !errors.Is(err, ErrReleased) {
		t.Errorf("Read(2) after Read(3) = %v; want ErrReleased", err)
	}
	_, _, err = b.Read(ctx, 14, 100)
	if !errors.Is(err, ErrBeyond) {
		t.Errorf("Read(14) with End 13 = %v; want ErrBeyond", err)
	}
	b.Close()
	d, eof = read(t, b, 7, 100)
	if string(d) != "world\n" || !eof {
		t.Errorf("Read(7) after Close = %q, %v; want \"world\\n\", true", d, eof)
	}
	d, eof = read(t, b, 13, 100)
	if len(d) != 0 || !eof {
		t.Errorf("Read(End) after Close = %q, %v; want \"\", true", d, eof)
	}
}

// A full window makes the writer wait until a reader releases bytes:
// nothing is dropped.
func TestFullWindowHoldsTheWriter(t *testing.T) {
	b := New(4)
	ctx := context.Background()
	done := make(chan int)
	go func() {
		n, _ := b.Write(ctx, []byte("abcdefghij"))
		done <- n
	}()
	var got []byte
	var off uint64
	for len(got) < 10 {
		d, _ := read(t, b, off, 3)
		if len(d) > 4 {
			t.Fatalf("read %d bytes from a 4-byte window", len(d))
		}
		got = append(got, d...)
		off += uint64(len(d))
	}
	if n := <-done; n != 10 || string(got) != "abcdefghij" {
		t.Errorf("writer wrote %d, reader got %q; want 10 and every byte in order", n, got)
	}
}

// A read with nothing new waits until the writer writes, or until the
// context ends (then: nothing, no error).
func TestReadWaits(t *testing.T) {
	b := New(64)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if d, eof, err := b.Read(ctx, 0, 10); len(d) != 0 || eof || err != nil {
		t.Errorf("Read on an empty buffer = %q, %v, %v; want nothing after the timeout", d, eof, err)
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		b.Write(context.Background(), []byte("x"))
	}()
	if d, _ := read(t, b, 0, 10); string(d) != "x" {
		t.Errorf("Read = %q; want the byte written while it waited", d)
	}
}

// After Discard a full window no longer holds the writer.
func TestDiscardFreesTheWriter(t *testing.T) {
	b := New(2)
	done := make(chan error)
	go func() {
		_, err := b.Write(context.Background(), bytes.Repeat([]byte("z"), 100))
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	b.Discard()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Write after Discard: %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("the writer still waits after Discard")
	}
	if _, end, _ := b.Window(); end != 100 {
		t.Errorf("End = %d after 100 bytes written; want 100 (offsets still count)", end)
	}
}
