package fabric

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

func accept(t *testing.T, ch <-chan Accepted) Accepted {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(5 * time.Second):
		t.Fatal("no stream accepted within 5s")
		return Accepted{}
	}
}

// A stream carries bytes in order both ways, whatever the write sizes
// (short messages, fragmented copies and bulk remote gets), between two
// nodes with one forwarding between them, and ends in EOF.
func TestStreamCarriesBytes(t *testing.T) {
	fs := ring(t, 4, nil)
	ln := fs[2].Listen(ServiceReplica)
	s, err := fs[0].Dial(30, ServiceReplica, []byte("node=10"))
	if err != nil {
		t.Fatal(err)
	}
	a := accept(t, ln)
	if string(a.Hello) != "node=10" || a.Stream.Peer() != 10 {
		t.Fatalf("accepted %q from %d, want node=10 from 10", a.Hello, a.Stream.Peer())
	}
	rng := rand.New(rand.NewPCG(1, 2))
	want := make([]byte, 3<<20)
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	go func() {
		for rest := want; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(200<<10))
			if _, err := s.Write(rest[:n]); err != nil {
				t.Errorf("write: %v", err)
				return
			}
			rest = rest[n:]
		}
		s.Close()
	}()
	a.Stream.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(a.Stream)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes (%v), want the %d written", len(got), err, len(want))
	}
	if fs[1].Stats().Forwarded.Load() == 0 {
		t.Error("nothing forwarded through node 20")
	}
	// And back, after the other way closed.
	if _, err := a.Stream.Write([]byte("ack")); err != nil {
		t.Fatal(err)
	}
}

// Opening a service nobody accepts is refused; a deadline ends a read.
func TestStreamRefusedAndDeadline(t *testing.T) {
	fs := ring(t, 2, nil)
	s, err := fs[0].Dial(20, ServiceReplica, []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, ErrRefused) {
		t.Fatalf("read from a refused stream: %v, want ErrRefused", err)
	}
	ln := fs[1].Listen(ServiceReplica)
	s, _ = fs[0].Dial(20, ServiceReplica, []byte("hello"))
	accept(t, ln)
	s.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
}

// A stream whose other node dies breaks once delta-t gives up on it.
func TestStreamBreaksWhenThePeerDies(t *testing.T) {
	fs := ring(t, 2, nil)
	ln := fs[1].Listen(ServiceReplica)
	s, err := fs[0].Dial(20, ServiceReplica, []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	accept(t, ln)
	fs[1].Close()
	t0 := time.Now()
	buf := make([]byte, 64<<10)
	for time.Since(t0) < 10*time.Second {
		if _, err = s.Write(buf); err != nil {
			break
		}
	}
	if err == nil {
		t.Fatal("writes to a dead node still succeed after 10s")
	}
	t.Logf("broken after %v: %v", time.Since(t0).Round(time.Millisecond), err)
}

// BenchmarkStreamPingPong is a round trip of a request (one short
// message, or a fragmented copy) and a 24-byte answer on a stream between
// two nodes on loopback: the latency a log hold adds on the fabric,
// before radicd's own work. (A Go TCP ping-pong on loopback takes 20-21
// us here.)
func BenchmarkStreamPingPong(b *testing.B) {
	for _, size := range []int{100, 4000} {
		b.Run(fmt.Sprint(size), func(b *testing.B) { streamPingPong(b, size) })
	}
}

func streamPingPong(b *testing.B, reqSize int) {
	fs := ring(b, 2, nil)
	ln := fs[1].Listen(ServiceReplica)
	s, err := fs[0].Dial(20, ServiceReplica, []byte("hello"))
	if err != nil {
		b.Fatal(err)
	}
	a := <-ln
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := a.Stream.Read(buf)
			if err != nil {
				return
			}
			a.Stream.Write(buf[:min(n, 24)])
		}
	}()
	req, buf := make([]byte, reqSize), make([]byte, 4096)
	b.ResetTimer()
	for range b.N {
		s.Write(req)
		if _, err := s.Read(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// HTTP between two nodes on the fabric: a server on a Listener, a client
// whose dialer opens streams; a large body comes back by bulk messaging,
// and a node declared dead fails at once.
func TestHTTPOverStreams(t *testing.T) {
	fs := ring(t, 3, nil)
	body := bytes.Repeat([]byte("log record "), 100_000)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(append([]byte(r.URL.Path+"\n"), body...))
	})}
	ln := fs[2].Listener(ServiceHTTP)
	go srv.Serve(ln)
	defer srv.Close()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return fs[0].Dial(30, ServiceHTTP, nil)
		}}}
	for i := range 3 { // the second and third reuse the stream
		resp, err := client.Get(fmt.Sprintf("http://node30/v1/replica/read/%d", i))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := append([]byte(fmt.Sprintf("/v1/replica/read/%d\n", i)), body...)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("request %d: %d bytes (%v), want %d", i, len(got), err, len(want))
		}
	}
	fs[0].SetDown(30, true)
	t0 := time.Now()
	client.CloseIdleConnections()
	if _, err := client.Get("http://node30/"); err == nil || time.Since(t0) > time.Second {
		t.Fatalf("a request to a node declared dead: %v after %v, want an error at once", err, time.Since(t0))
	}
}
