package criu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/radic-project/radic/checkpoint"
	"github.com/radic-project/radic/checkpoint/hwbp"
	"github.com/radic-project/radic/checkpoint/image"
	"github.com/radic-project/radic/checkpoint/reexec"
	"github.com/radic-project/radic/internal/testenv"
)

// TestMain makes the test binary a child subreaper, as radicd is meant to
// be: `criu restore -d` leaves the restored process to its nearest
// subreaper, so the tests reap what they restored.
func TestMain(m *testing.M) {
	unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	os.Exit(m.Run())
}

// backend returns a usable criu backend or skips the test, saying why.
func backend(t *testing.T, cfg Config) *Backend {
	t.Helper()
	cfg.Logf = t.Logf
	cfg.WorkDir = t.TempDir()
	b := New(cfg)
	if err := b.Usable(); err != nil {
		t.Skipf("criu backend not usable here: %v", err)
	}
	return b
}

// Model: the state program stateful.c computes, in Go.
const (
	words  = 1 << 20
	stride = 512
	touch  = 64
)

type model struct {
	a       []uint64
	digests []uint64 // digests[n] after step n
}

func newModel() *model {
	m := &model{a: make([]uint64, words), digests: []uint64{14695981039346656037}}
	for i := range m.a {
		m.a[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	return m
}

func (m *model) digest(n uint64) uint64 {
	for uint64(len(m.digests)) <= n {
		s := uint64(len(m.digests))
		d := m.digests[s-1]
		base := uint32((s * touch) % (words / stride))
		for p := uint32(0); p < touch; p++ {
			w := ((base+p)%(words/stride))*stride + uint32(s%stride)
			m.a[w] = m.a[w]*6364136223846793005 + s
			d = (d ^ m.a[w]) * 1099511628211
		}
		m.digests = append(m.digests, d)
	}
	return m.digests[n]
}

// line is one report of the program.
type line struct {
	conn   int
	step   uint64
	digest uint64
}

// rig is one stateful program under test: its binary, cgroup, listener.
type rig struct {
	t      *testing.T
	b      *Backend
	bin    string
	cgroup string
	ln     net.Listener
	lines  chan line
	model  *model
	store  string
	waits  map[int]chan struct{} // closed when a process start() made is reaped
	mu     sync.Mutex
	eof    map[int]chan struct{} // by connection: closed once all its reports are in lines
}

// eofOf is closed once every report of connection conn has been queued.
func (r *rig) eofOf(conn int) chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.eof[conn] == nil {
		r.eof[conn] = make(chan struct{})
	}
	return r.eof[conn]
}

// cgroupRoot is the cgroup v2 mount, or "".
func cgroupRoot() string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		for i, x := range f {
			if x == "-" && i+1 < len(f) && f[i+1] == "cgroup2" {
				return f[4]
			}
		}
	}
	return ""
}

func newRig(t *testing.T, b *Backend) *rig {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc to build testdata/stateful.c")
	}
	r := &rig{t: t, b: b, lines: make(chan line, 100000), model: newModel(), store: t.TempDir(), waits: map[int]chan struct{}{}, eof: map[int]chan struct{}{}}
	r.bin = filepath.Join(t.TempDir(), "stateful")
	if out, err := exec.Command(gcc, "-O2", "-Wall", "-Werror", "-o", r.bin, "testdata/stateful.c").CombinedOutput(); err != nil {
		t.Fatalf("build stateful: %v\n%s", err, out)
	}
	if root := cgroupRoot(); root != "" {
		dir, err := os.MkdirTemp(root, "radic-ckpt-test-")
		if err == nil {
			r.cgroup = dir
			t.Cleanup(func() {
				os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
				for i := 0; i < 200 && os.Remove(dir) != nil; i++ {
					time.Sleep(10 * time.Millisecond)
				}
			})
		}
	}
	if r.cgroup == "" {
		t.Log("no cgroup v2 here: the restore's cgroup is not checked")
	}
	r.ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.ln.Close() })
	go func() {
		for conn := 0; ; conn++ {
			c, err := r.ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			go func(conn int, c net.Conn) {
				defer close(r.eofOf(conn))
				s := bufio.NewScanner(c)
				for s.Scan() {
					var l line
					if _, err := fmt.Sscanf(s.Text(), "step %d %x", &l.step, &l.digest); err != nil {
						continue
					}
					l.conn = conn
					r.lines <- l
				}
			}(conn, c)
		}
	}()
	return r
}

// start runs the program, stepping every ms milliseconds, with env added
// to the test's environment.
func (r *rig) start(ms int, env ...string) *exec.Cmd {
	r.t.Helper()
	port := r.ln.Addr().(*net.TCPAddr).Port
	cmd := exec.Command(r.bin, strconv.Itoa(port), strconv.Itoa(ms))
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if r.cgroup != "" {
		cg, err := os.Open(r.cgroup)
		if err != nil {
			r.t.Fatal(err)
		}
		defer cg.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(cg.Fd())
	}
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { cmd.Wait(); close(waited) }()
	r.t.Cleanup(func() {
		cmd.Process.Kill()
		<-waited
	})
	r.waits[cmd.Process.Pid] = waited
	return cmd
}

// next is the program's next report, checked against the model.
func (r *rig) next() line {
	r.t.Helper()
	select {
	case l := <-r.lines:
		if want := r.model.digest(l.step); l.digest != want {
			r.t.Fatalf("step %d on connection %d: digest %016x, want %016x: the program's state was not carried intact", l.step, l.conn, l.digest, want)
		}
		return l
	case <-time.After(10 * time.Second):
		r.t.Fatal("no report from the program for 10s")
	}
	return line{}
}

// until reads reports until step n, returning the last.
func (r *rig) until(n uint64) line {
	r.t.Helper()
	for {
		if l := r.next(); l.step >= n {
			return l
		}
	}
}

// drain reads the reports of last's connection up to its end (the
// program has exited and its socket is closed), returning the highest
// step. (A quiet period is no proof: under load a report can still be on
// its way.)
func (r *rig) drain(last line) line {
	r.t.Helper()
	eof := r.eofOf(last.conn)
	for {
		select {
		case l := <-r.lines:
			if l.step > last.step {
				last = l
			}
		case <-eof:
			if l := r.latest(last); l.step > last.step {
				last = l
			}
			return last
		case <-time.After(10 * time.Second):
			r.t.Fatalf("connection %d of the killed program still open after 10s", last.conn)
		}
	}
}

// latest reads what is queued now, without waiting for more, returning
// the last report (or last, if none).
func (r *rig) latest(last line) line {
	for {
		select {
		case l := <-r.lines:
			last = l
		default:
			return last
		}
	}
}

// exited waits for a process the rig started to be reaped.
func (r *rig) exited(pid int) {
	r.t.Helper()
	select {
	case <-r.waits[pid]:
	case <-time.After(10 * time.Second):
		r.t.Fatalf("process %d still there 10s after its checkpoint", pid)
	}
}

// restored takes care of a restored process: killed and reaped at the end.
func (r *rig) restored(pid int) {
	r.t.Cleanup(func() {
		syscall.Kill(pid, syscall.SIGKILL)
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, 0, nil) // ours: the test binary is a subreaper
	})
}

// resumed checks that a restored program carries on from its checkpoint:
// on a new connection, from a step no earlier than `from` (what it had
// reported before the checkpoint began), with the right state, and on.
func (r *rig) resumed(origConn int, from, lastSeen uint64) line {
	r.t.Helper()
	var l line
	for {
		l = r.next()
		if l.conn > origConn {
			break
		}
	}
	if l.step < from || l.step > lastSeen+1 {
		r.t.Fatalf("restored program reported step %d first; want %d..%d (it stopped there)", l.step, from, lastSeen+1)
	}
	for i := uint64(1); i <= 3; i++ {
		if n := r.next(); n.step != l.step+i {
			r.t.Fatalf("after step %d the restored program reported step %d, want %d", l.step, n.step, l.step+i)
		}
	}
	return l
}

func (r *rig) checkCgroup(pid int) {
	r.t.Helper()
	if r.cgroup == "" {
		return
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		r.t.Fatal(err)
	}
	if want := "::/" + filepath.Base(r.cgroup); !strings.Contains(string(b), want) {
		r.t.Errorf("restored process %d is in cgroup %q, want %s", pid, strings.TrimSpace(string(b)), want)
	}
}

func TestCheckpointRestoreKeepsState(t *testing.T) {
	for _, tc := range []struct {
		name  string
		probe func() (hwbp.Result, error)
	}{
		{"probed", nil},
		// The knob forced on: what a machine whose breakpoints do not trap
		// runs (CRIU steps with PTRACE_SYSCALL).
		{"no-breakpoints", func() (hwbp.Result, error) { return hwbp.Result{Trap: false, Detail: "forced by the test"}, nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := backend(t, Config{Probe: tc.probe})
			fault, probe := b.Fault()
			t.Logf("%s; knob %q", probe, fault)
			if tc.probe != nil && fault != faultNoBreakpoints {
				t.Fatalf("probe said no trap, but CRIU_FAULT=%q", fault)
			}
			r := newRig(t, b)
			cmd := r.start(10)
			before := r.until(30)
			pid := cmd.Process.Pid
			img, err := b.Checkpoint(context.Background(), checkpoint.Request{
				Group: checkpoint.Group{Node: 1, Roots: []int{pid}}, Dir: filepath.Join(r.store, "1")})
			if err != nil {
				t.Fatal(err)
			}
			r.exited(pid)
			last := r.drain(before)
			t.Logf("checkpoint at step %d..%d: dump %v, pack %v, %d bytes raw, %d stored (%d chunks)",
				before.step, last.step, img.Stats.Dump, img.Stats.Pack, img.Stats.Bytes, img.Stats.PackBytes, img.Manifest.Chunks)
			start := time.Now()
			pids, err := b.Restore(context.Background(), img, checkpoint.Target{Cgroup: r.cgroup})
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			r.restored(pids[0])
			if len(pids) != 1 || pids[0] != pid {
				t.Fatalf("Restore = %v, want [%d]", pids, pid)
			}
			r.checkCgroup(pid)
			got := r.resumed(before.conn, before.step, last.step)
			t.Logf("restore %v; resumed at step %d with its state", took, got.step)
		})
	}
}

func TestIncrementalCheckpoint(t *testing.T) {
	b := backend(t, Config{})
	r := newRig(t, b)
	// Slow steps, so that little memory changes between the two
	// checkpoints: 64 of the array's 2048 pages per step, a few steps.
	cmd := r.start(500)
	pid := cmd.Process.Pid
	first := r.until(3)
	ctx := context.Background()
	group := checkpoint.Group{Node: 1, Roots: []int{pid}}
	img1, err := b.Checkpoint(ctx, checkpoint.Request{Group: group, Dir: filepath.Join(r.store, "1"), LeaveRunning: true})
	if err != nil {
		t.Fatal(err)
	}
	mid := r.until(r.latest(line{}).step + 2)
	img2, err := b.Checkpoint(ctx, checkpoint.Request{Group: group, Dir: filepath.Join(r.store, "2"), Parent: img1, LeaveRunning: true})
	if err != nil {
		t.Fatal(err)
	}
	m1, m2 := img1.Manifest, img2.Manifest
	t.Logf("full: %d chunks, %d bytes raw, %d stored, dump %v pack %v", m1.Chunks, m1.Bytes, m1.PackBytes, img1.Stats.Dump, img1.Stats.Pack)
	t.Logf("incremental: %d chunks, %d new, %d bytes raw, %d stored, dump %v pack %v", m2.Chunks, m2.NewChunks, m2.Bytes, m2.PackBytes, img2.Stats.Dump, img2.Stats.Pack)
	if m2.Parent != "1" {
		t.Errorf("second image's parent = %q, want 1", m2.Parent)
	}
	// Between the two dumps the program wrote 64 pages per step it
	// made; anything else it dirties (stack, stdio) fits in another 64.
	// How many steps that is depends on how long the first image took
	// to pack, so the bound is counted, not assumed.
	steps := r.latest(mid).step + 1 - first.step
	bound := 64*int(steps) + 64
	t.Logf("%d steps between the dumps: at most %d chunks may be new", steps, bound)
	if m2.NewChunks > bound {
		t.Errorf("incremental image stores %d new chunks of %d; the program changed at most %d", m2.NewChunks, m2.Chunks, bound)
	}
	if bound < m2.Chunks && m2.NewChunks >= m2.Chunks {
		t.Errorf("incremental image reuses none of its parent's %d chunks", m1.Chunks)
	}
	// Still running (LeaveRunning) and still right.
	r.until(mid.step + 2)
	cmd.Process.Kill()
	r.exited(pid)
	last := r.drain(mid)
	pids, err := b.Restore(ctx, img2, checkpoint.Target{Cgroup: r.cgroup})
	if err != nil {
		t.Fatal(err)
	}
	r.restored(pids[0])
	// From the second image, not the first: at or after `mid`.
	got := r.resumed(mid.conn, mid.step, last.step)
	t.Logf("restored from the incremental image at step %d", got.step)
}

func TestRestoreRefusesDamagedImage(t *testing.T) {
	b := backend(t, Config{})
	r := newRig(t, b)
	cmd := r.start(10)
	pid := cmd.Process.Pid
	r.until(5)
	dir := filepath.Join(r.store, "1")
	img, err := b.Checkpoint(context.Background(), checkpoint.Request{Group: checkpoint.Group{Roots: []int{pid}}, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	r.exited(pid)
	pack := filepath.Join(dir, image.PackName)
	st, err := os.Stat(pack)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(pack, st.Size()-100); err != nil {
		t.Fatal(err)
	}
	_, err = b.Restore(context.Background(), img, checkpoint.Target{})
	if !errors.Is(err, image.ErrCorrupt) {
		t.Fatalf("Restore(truncated pack) = %v, want ErrCorrupt", err)
	}
	t.Logf("truncated: %v", err)
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		t.Fatalf("process %d exists after a refused restore", pid)
	}
	os.Remove(filepath.Join(dir, image.ManifestName))
	_, err = b.Restore(context.Background(), img, checkpoint.Target{})
	if !errors.Is(err, image.ErrIncomplete) {
		t.Fatalf("Restore(no manifest) = %v, want ErrIncomplete", err)
	}
	t.Logf("incomplete: %v", err)
}

func TestRestoreSaysPidsInUse(t *testing.T) {
	b := backend(t, Config{})
	r := newRig(t, b)
	cmd := r.start(10)
	pid := cmd.Process.Pid
	r.until(5)
	img, err := b.Checkpoint(context.Background(), checkpoint.Request{Group: checkpoint.Group{Roots: []int{pid}}, Dir: filepath.Join(r.store, "1"), LeaveRunning: true})
	if err != nil {
		t.Fatal(err)
	}
	// The original still runs: its pid is taken.
	_, err = b.Restore(context.Background(), img, checkpoint.Target{})
	var inUse *checkpoint.PidsInUseError
	if !errors.As(err, &inUse) {
		t.Fatalf("Restore while the original runs = %v, want a PidsInUseError", err)
	}
	if len(inUse.InUse) != 1 || inUse.InUse[0].Pid != pid || inUse.InUse[0].Comm != "stateful" {
		t.Errorf("PidsInUseError.InUse = %+v, want pid %d held by stateful", inUse.InUse, pid)
	}
	if msg := err.Error(); !strings.Contains(msg, strconv.Itoa(pid)) || !strings.Contains(msg, "in use") {
		t.Errorf("message %q does not name pid %d in use", msg, pid)
	}
	t.Logf("%v", err)
	// Nothing was done to the original.
	l := r.latest(line{})
	r.until(l.step + 3)
}

// TestProbeAgreesWithCRIU cross-checks the breakpoint probe against CRIU
// itself: with the knob off, a dump finishes where the probe saw a trap,
// and hangs waiting for one where it did not.
func TestProbeAgreesWithCRIU(t *testing.T) {
	res, err := hwbp.Probe()
	if err != nil {
		t.Skipf("probe cannot tell here: %v", err)
	}
	t.Logf("probe: %v in %v", res, res.Took)
	b := backend(t, Config{Probe: func() (hwbp.Result, error) { return hwbp.Result{Trap: true, Detail: "knob off for the test"}, nil }})
	if f, _ := b.Fault(); f != "" {
		t.Fatalf("probe said trap, but CRIU_FAULT=%q", f)
	}
	r := newRig(t, b)
	cmd := r.start(10)
	r.until(5)
	wait := 20 * time.Second
	if !res.Trap {
		wait = 3 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err = b.Checkpoint(ctx, checkpoint.Request{Group: checkpoint.Group{Roots: []int{cmd.Process.Pid}}, Dir: filepath.Join(r.store, "1"), LeaveRunning: true})
	switch {
	case res.Trap && err != nil:
		t.Errorf("probe saw breakpoints trap, but a dump without CRIU_FAULT failed: %v", err)
	case !res.Trap && err == nil:
		t.Errorf("probe saw no trap, but a dump without CRIU_FAULT finished: the knob would be set for nothing")
	case !res.Trap:
		t.Logf("dump without the knob did not finish in %v, as the probe said: %v", wait, err)
	}
}

// TestGroupOfTwoTrees: a node's group of two process trees (two ranks) is
// checkpointed as one cut and restored together; both carry on.
func TestGroupOfTwoTrees(t *testing.T) {
	b := backend(t, Config{})
	r := newRig(t, b)
	c1, c2 := r.start(10), r.start(10)
	pids := []int{c1.Process.Pid, c2.Process.Pid}
	// Both connected and reporting.
	seen := map[int]bool{}
	var last line
	for len(seen) < 2 || last.step < 20 {
		last = r.next()
		seen[last.conn] = true
	}
	img, err := b.Checkpoint(context.Background(), checkpoint.Request{
		Group: checkpoint.Group{Node: 2, Roots: pids}, Dir: filepath.Join(r.store, "1")})
	if err != nil {
		t.Fatal(err)
	}
	r.exited(pids[0])
	r.exited(pids[1])
	r.drain(last)
	if got := img.Manifest.Meta[metaStopped]; got != "1" {
		t.Errorf("manifest stopped = %q: a group of two trees must be stopped for its cut", got)
	}
	t.Logf("group of 2: dump %v, pack %v, %d bytes raw, %d stored", img.Stats.Dump, img.Stats.Pack, img.Stats.Bytes, img.Stats.PackBytes)
	start := time.Now()
	got, err := b.Restore(context.Background(), img, checkpoint.Target{Cgroup: r.cgroup})
	for _, pid := range got {
		r.restored(pid)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore of 2 trees: %v", time.Since(start))
	if len(got) != 2 || got[0] != pids[0] || got[1] != pids[1] {
		t.Fatalf("Restore = %v, want %v", got, pids)
	}
	// Each restored program reports on a new connection, three steps in a
	// row (stopped for the cut, they must have been continued).
	steps := map[int][]uint64{}
	for done := 0; done < 2; {
		l := r.next()
		if seen[l.conn] {
			continue
		}
		s := steps[l.conn]
		if len(s) > 0 && l.step != s[len(s)-1]+1 {
			t.Fatalf("connection %d: step %d after %d", l.conn, l.step, s[len(s)-1])
		}
		steps[l.conn] = append(s, l.step)
		if len(steps[l.conn]) == 3 {
			done++
		}
	}
	for _, pid := range pids {
		r.checkCgroup(pid)
	}
}

// TestUnusableSaysWhy: without a working criu the backend says why, and
// Choose falls back to exec.
func TestUnusableSaysWhy(t *testing.T) {
	b := New(Config{Criu: "/nonexistent/criu", Probe: func() (hwbp.Result, error) { return hwbp.Result{Trap: true}, nil }})
	err := b.Usable()
	if !errors.Is(err, checkpoint.ErrUnusable) {
		t.Fatalf("Usable() with no criu = %v, want ErrUnusable", err)
	}
	if os.Geteuid() == 0 && !strings.Contains(err.Error(), "/nonexistent/criu") {
		t.Errorf("Usable() = %q: does not name the criu it tried", err)
	}
	got, why := checkpoint.Choose(b, reexec.Backend{})
	if got == nil || got.Name() != reexec.Name || len(why) != 1 {
		t.Errorf("Choose(criu, exec) = %v, %v; want exec, and why criu was passed over", got, why)
	}
	t.Logf("fell back: %v", why)
}

// TestCheckpointUnderTheShim: a process with radic's preload library and
// its Go runtime loaded (threads, epoll, eventfd, a pipe; every TCP socket
// marked managed in test mode) is checkpointed and restored like any
// other, and carries on with its state.
func TestCheckpointUnderTheShim(t *testing.T) {
	b := backend(t, Config{})
	lib := filepath.Join(testenv.Root(t), "lib", "libradic.so")
	for _, p := range []string{lib, filepath.Join(filepath.Dir(lib), "libradic-go.so")} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("%s is not built (make builds it): %v", p, err)
		}
	}
	r := newRig(t, b)
	cmd := r.start(10, "LD_PRELOAD="+lib, "RADIC_TEST_MANAGE=1")
	pid := cmd.Process.Pid
	before := r.until(30)
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if len(tasks) < 2 {
		t.Fatalf("process %d has %d thread(s): the shim's Go runtime is not loaded", pid, len(tasks))
	}
	img, err := b.Checkpoint(context.Background(), checkpoint.Request{Group: checkpoint.Group{Roots: []int{pid}}, Dir: filepath.Join(r.store, "1")})
	if err != nil {
		t.Fatal(err)
	}
	r.exited(pid)
	last := r.drain(before)
	if got := len(img.Manifest.Procs[0].Tids); got != len(tasks) {
		t.Errorf("manifest lists %d threads, the process had %d", got, len(tasks))
	}
	pids, err := b.Restore(context.Background(), img, checkpoint.Target{Cgroup: r.cgroup})
	if err != nil {
		t.Fatal(err)
	}
	r.restored(pids[0])
	got := r.resumed(before.conn, before.step, last.step)
	t.Logf("%d threads; dump %v, %d bytes raw; resumed at step %d", len(tasks), img.Stats.Dump, img.Stats.Bytes, got.step)
}

// TestPstreeIDs: the ids restore will need are read from CRIU's own
// pstree.img (the bytes of a real one: a shell and its child, one thread
// each), and a damaged file is an error, not a shorter list.
func TestPstreeIDs(t *testing.T) {
	img := []byte{0x19, 0x43, 0x56, 0x54, 0x30, 0x30, 0x27, 0x50,
		0x12, 0, 0, 0, 0x08, 0x9c, 0xa2, 0x01, 0x10, 0x00, 0x18, 0x9c, 0xa2, 0x01, 0x20, 0x9c, 0xa2, 0x01, 0x28, 0x9c, 0xa2, 0x01,
		0x14, 0, 0, 0, 0x08, 0x87, 0xb5, 0x01, 0x10, 0x85, 0xb3, 0x01, 0x18, 0x85, 0xb3, 0x01, 0x20, 0x85, 0xb3, 0x01, 0x28, 0x87, 0xb5, 0x01}
	dir := t.TempDir()
	write := func(b []byte) {
		if err := os.WriteFile(filepath.Join(dir, "pstree.img"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(img)
	got, err := pstreeIDs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{20764, 20764, 23175, 23175}; !slices.Equal(got, want) {
		t.Errorf("pstreeIDs = %v, want %v", got, want)
	}
	for n := 9; n < len(img); n++ {
		if n == 8+4+18 {
			continue // a whole first entry is a valid image of one process
		}
		write(img[:n])
		if ids, err := pstreeIDs(dir); err == nil {
			t.Errorf("pstree.img cut to %d bytes: %v, no error", n, ids)
		}
	}
}
