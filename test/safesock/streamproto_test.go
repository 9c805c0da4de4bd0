package safesock_test

// A bare stream peer in Go, written from the specification at the top of
// test/apps/stream.c: the same streams, hello, greeting and digest, so that
// it can stand on either side of a stream connection. It runs without
// radic (a Go program cannot be preloaded), which makes it the plain peer
// of TestPlainPeer; TestStreamLoopback checks it against the C program.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	golden     = 0x9e3779b97f4a7c15
	streamSalt = 0x53545245414d0001
	greeting   = "STREAM!\n"
	maxChunk   = 256 << 10
)

// mix64 is splitmix64's finalizer (common.c).
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

func streamKey(seed uint64, conn uint32, dir int) uint64 {
	return mix64(mix64(seed^streamSalt) + (uint64(conn)*2+uint64(dir))*golden)
}

// streamGen fills p with bytes [off, off+len(p)) of the stream of key.
func streamGen(key, off uint64, p []byte) {
	var w uint64
	wi := ^uint64(0)
	for i := range p {
		o := off + uint64(i)
		if o>>3 != wi {
			wi = o >> 3
			w = mix64(key + (wi+1)*golden)
		}
		p[i] = byte(w >> (8 * (o & 7)))
	}
}

// peerConfig is what the Go peer does; it comes from the environment
// (STREAMPEER_*) when the test binary runs as a helper.
type peerConfig struct {
	role        string // "listen" (rank 0), "connect" (rank 1) or "rank" (RADIC_RANK, RADIC_PEERS)
	addr        string // for listen and connect
	conns       int
	bytes       uint64
	seed        uint64
	serverFirst bool
}

func (p peerConfig) environ() []string {
	sf := ""
	if p.serverFirst {
		sf = "1"
	}
	return []string{"RADIC_TEST_HELPER=streampeer", "STREAMPEER_ROLE=" + p.role, "STREAMPEER_ADDR=" + p.addr,
		"STREAMPEER_CONNS=" + strconv.Itoa(p.conns), "STREAMPEER_BYTES=" + strconv.FormatUint(p.bytes, 10),
		"STREAMPEER_SEED=" + strconv.FormatUint(p.seed, 10), "STREAMPEER_SERVER_FIRST=" + sf}
}

// peerError carries stream's exit status: 3 wrong data, 4 connection.
type peerError struct {
	code int
	msg  string
}

func (e *peerError) Error() string { return e.msg }

func peerMain() int {
	var p peerConfig
	var err error
	p.role = os.Getenv("STREAMPEER_ROLE")
	p.addr = os.Getenv("STREAMPEER_ADDR")
	p.serverFirst = os.Getenv("STREAMPEER_SERVER_FIRST") != ""
	p.conns, err = strconv.Atoi(os.Getenv("STREAMPEER_CONNS"))
	if err == nil {
		p.bytes, err = strconv.ParseUint(os.Getenv("STREAMPEER_BYTES"), 10, 64)
	}
	if err == nil {
		p.seed, err = strconv.ParseUint(os.Getenv("STREAMPEER_SEED"), 10, 64)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "streampeer: bad STREAMPEER_* settings:", err)
		return 2
	}
	line, err := runPeer(p)
	if err != nil {
		fmt.Fprintln(os.Stderr, "streampeer:", err)
		var pe *peerError
		if errors.As(err, &pe) {
			return pe.code
		}
		return 1
	}
	fmt.Println(line)
	return 0
}

// runPeer plays one side of a two-process stream and returns its "stream
// ok" line.
func runPeer(p peerConfig) (string, error) {
	rank := 0
	addr := p.addr
	switch p.role {
	case "listen":
	case "connect":
		rank = 1
	case "rank":
		rank, _ = strconv.Atoi(os.Getenv("RADIC_RANK"))
		peers := strings.Split(os.Getenv("RADIC_PEERS"), ",")
		if rank != 1 || len(peers) != 2 {
			return "", fmt.Errorf("role rank: want rank 1 of a two-rank job, have RADIC_RANK=%s RADIC_PEERS=%s", os.Getenv("RADIC_RANK"), os.Getenv("RADIC_PEERS"))
		}
		addr = peers[0]
	default:
		return "", fmt.Errorf("unknown role %q", p.role)
	}
	conns := make([]*net.TCPConn, p.conns)
	if rank == 0 {
		l, err := net.Listen("tcp4", addr)
		if err != nil {
			return "", err
		}
		for range p.conns {
			c, err := l.Accept()
			if err != nil {
				return "", err
			}
			tc := c.(*net.TCPConn)
			if p.serverFirst {
				if _, err := tc.Write([]byte(greeting)); err != nil {
					return "", fmt.Errorf("greeting: %w", err)
				}
			}
			var hello [8]byte
			if _, err := io.ReadFull(tc, hello[:]); err != nil {
				return "", fmt.Errorf("hello: %w", err)
			}
			from, idx := binary.BigEndian.Uint32(hello[:4]), binary.BigEndian.Uint32(hello[4:])
			if from != 1 || int(idx) >= p.conns || conns[idx] != nil {
				return "", fmt.Errorf("unexpected hello: rank %d connection %d", from, idx)
			}
			conns[idx] = tc
		}
		l.Close()
	} else {
		for i := range p.conns {
			tc, err := dialRetry(addr, 60*time.Second)
			if err != nil {
				return "", err
			}
			if p.serverFirst {
				g := make([]byte, len(greeting))
				if _, err := io.ReadFull(tc, g); err != nil || string(g) != greeting {
					return "", fmt.Errorf("connection %d: greeting %q: %v", i, g, err)
				}
			}
			var hello [8]byte
			binary.BigEndian.PutUint32(hello[:4], 1)
			binary.BigEndian.PutUint32(hello[4:], uint32(i))
			if _, err := tc.Write(hello[:]); err != nil {
				return "", fmt.Errorf("hello: %w", err)
			}
			conns[i] = tc
		}
	}
	txdir := 0
	if rank == 0 {
		txdir = 1
	}
	hashes := make([]uint64, p.conns)
	errs := make(chan error, 2*p.conns)
	var wg sync.WaitGroup
	for i, c := range conns {
		id := uint32(i) // rank 1's connections are numbered from 0
		wg.Add(2)
		go func() { defer wg.Done(); errs <- peerSend(c, id, streamKey(p.seed, id, txdir), p.bytes) }()
		go func() {
			defer wg.Done()
			h, err := peerRecv(c, id, 1-txdir, streamKey(p.seed, id, 1-txdir), p.bytes)
			hashes[i] = h
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return "", err
		}
	}
	d := fnv.New64a()
	for i, h := range hashes {
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:8], uint64(i))
		binary.LittleEndian.PutUint64(b[8:], h)
		d.Write(b[:])
		conns[i].Close()
	}
	return fmt.Sprintf("stream ok rank %d conns %d bytes %d digest %016x", rank, p.conns, p.bytes, d.Sum64()), nil
}

func dialRetry(addr string, timeout time.Duration) (*net.TCPConn, error) {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
		if err == nil {
			return c.(*net.TCPConn), nil
		}
		if time.Now().After(deadline) || !(errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
			errors.Is(err, syscall.ENETUNREACH) || os.IsTimeout(err)) {
			return nil, fmt.Errorf("connect to %s: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// peerSize is a write or read size from 1 B to 256 KiB.
func peerSize(r *rand.Rand) int {
	return 1 + r.IntN(1<<r.IntN(19))
}

func peerSend(c *net.TCPConn, id uint32, key, n uint64) error {
	r := rand.New(rand.NewPCG(key, 1))
	buf := make([]byte, maxChunk)
	for off := uint64(0); off < n; {
		k := uint64(peerSize(r))
		if k > n-off {
			k = n - off
		}
		streamGen(key, off, buf[:k])
		w, err := c.Write(buf[:k])
		off += uint64(w)
		if err != nil {
			return &peerError{4, fmt.Sprintf("conn %d: write: %v after %d bytes", id, err, off)}
		}
	}
	if err := c.CloseWrite(); err != nil {
		return &peerError{4, fmt.Sprintf("conn %d: shutdown: %v after %d bytes", id, err, n)}
	}
	return nil
}

func peerRecv(c *net.TCPConn, id uint32, dir int, key, n uint64) (uint64, error) {
	r := rand.New(rand.NewPCG(key, 2))
	buf, want := make([]byte, maxChunk), make([]byte, maxChunk)
	h := fnv.New64a()
	var off uint64
	for {
		k, err := c.Read(buf[:peerSize(r)])
		if k > 0 {
			got := buf[:k]
			streamGen(key, off, want[:k])
			for i := range got {
				if off+uint64(i) >= n {
					return 0, &peerError{3, fmt.Sprintf("MISMATCH conn %d dir %d at offset %d: got 0x%02x want end-of-file", id, dir, n, got[i])}
				}
				if got[i] != want[i] {
					return 0, &peerError{3, fmt.Sprintf("MISMATCH conn %d dir %d at offset %d: got 0x%02x want 0x%02x", id, dir, off+uint64(i), got[i], want[i])}
				}
			}
			h.Write(got)
			off += uint64(k)
		}
		if err == io.EOF {
			if off < n {
				return 0, &peerError{4, fmt.Sprintf("conn %d: unexpected end-of-file after %d bytes (want %d)", id, off, n)}
			}
			return h.Sum64(), nil
		}
		if err != nil {
			return 0, &peerError{4, fmt.Sprintf("conn %d: read: %v after %d bytes", id, err, off)}
		}
	}
}
