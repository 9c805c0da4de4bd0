package image

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// writeFiles makes a source dir like a CRIU dump: a page array and small
// metadata files.
func writeFiles(t *testing.T, pages []byte) string {
	t.Helper()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "pages-1.img"), pages, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(src, "r0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "r0", "core-1.img"), []byte("core of 1"), 0o600); err != nil {
		t.Fatal(err)
	}
	return src
}

// somePages is n pages, half random (incompressible) and half text.
func somePages(rng *rand.Rand, n int) []byte {
	b := make([]byte, n*ChunkSize)
	for i := range n {
		p := b[i*ChunkSize : (i+1)*ChunkSize]
		if i%2 == 0 {
			for j := range p {
				p[j] = byte(rng.Uint32())
			}
		} else {
			copy(p, bytes.Repeat([]byte{byte(i)}, ChunkSize))
		}
	}
	return b
}

func readAll(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			rel, _ := filepath.Rel(dir, p)
			out[rel], _ = os.ReadFile(p)
		}
		return nil
	})
	return out
}

func TestRoundTripAndIncremental(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pages := somePages(rng, 64)
	store := t.TempDir()
	src1 := writeFiles(t, pages)
	m1 := &Manifest{Backend: "test"}
	d1 := filepath.Join(store, "1")
	if err := Write(src1, d1, m1, nil); err != nil {
		t.Fatal(err)
	}
	if m1.NewChunks != m1.Chunks || m1.Chunks != 65 { // every page differs, plus core-1.img
		t.Errorf("first image: %d new chunks of %d, want 65 of 65", m1.NewChunks, m1.Chunks)
	}
	if m1.PackBytes >= m1.Bytes {
		t.Errorf("pack %d bytes for %d bytes of files: text pages should compress", m1.PackBytes, m1.Bytes)
	}
	// The child: three pages changed, one page inserted at the front
	// (everything after it shifts by a page, as when a mapping grows).
	pages2 := append(somePages(rng, 1), pages...)
	for _, i := range []int{5, 20, 40} {
		pages2[i*ChunkSize+7] ^= 0xff
	}
	src2 := writeFiles(t, pages2)
	m2 := &Manifest{Backend: "test", Parent: "1"}
	d2 := filepath.Join(store, "2")
	if err := Write(src2, d2, m2, m1); err != nil {
		t.Fatal(err)
	}
	if m2.NewChunks != 4 {
		t.Errorf("child image: %d new chunks, want 4 (1 inserted + 3 changed pages)", m2.NewChunks)
	}
	for _, c := range []struct {
		dir string
		src string
	}{{d1, src1}, {d2, src2}} {
		m, err := Open(c.dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := Verify(c.dir, m); err != nil {
			t.Fatalf("Verify(%s) = %v", c.dir, err)
		}
		out := t.TempDir()
		if err := Extract(c.dir, m, out); err != nil {
			t.Fatal(err)
		}
		got, want := readAll(t, out), readAll(t, c.src)
		if len(got) != len(want) {
			t.Fatalf("extracted %d files, want %d", len(got), len(want))
		}
		for k, v := range want {
			if !bytes.Equal(got[k], v) {
				t.Errorf("%s: extracted %s differs", c.dir, k)
			}
		}
	}
	// The child needs its parent's pack.
	if err := os.Rename(filepath.Join(d1, PackName), filepath.Join(d1, "gone")); err != nil {
		t.Fatal(err)
	}
	if err := Verify(d2, m2); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Verify(child without its parent's pack) = %v, want ErrCorrupt", err)
	}
}

func writeOne(t *testing.T) (string, *Manifest) {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 4))
	src := writeFiles(t, somePages(rng, 16))
	dir := filepath.Join(t.TempDir(), "img")
	m := &Manifest{Backend: "test", Procs: []Proc{{Pid: 42, Tids: []int{42, 43}}}}
	if err := Write(src, dir, m, nil); err != nil {
		t.Fatal(err)
	}
	return dir, m
}

func TestNoManifestIsIncomplete(t *testing.T) {
	dir, _ := writeOne(t)
	os.Remove(filepath.Join(dir, ManifestName))
	if _, err := Open(dir); !errors.Is(err, ErrIncomplete) {
		t.Errorf("Open(no manifest) = %v, want ErrIncomplete", err)
	}
}

func TestEveryManifestTruncationRefused(t *testing.T) {
	dir, _ := writeOne(t)
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	for n := range len(b) {
		if _, err := parseManifest(dir, b[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("manifest cut to %d of %d bytes: err = %v, want ErrCorrupt", n, len(b), err)
		}
	}
	for i := range len(b) {
		c := bytes.Clone(b)
		c[i] ^= 0x01
		if _, err := parseManifest(dir, c); err == nil {
			t.Fatalf("manifest with byte %d flipped was accepted", i)
		}
	}
}

func TestPackDamageRefused(t *testing.T) {
	dir, m := writeOne(t)
	pack := filepath.Join(dir, PackName)
	orig, err := os.ReadFile(pack)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"truncated by one byte", orig[:len(orig)-1]},
		{"truncated to half", orig[:len(orig)/2]},
		{"empty", nil},
		{"a byte flipped at the start", flip(orig, 0)},
		{"a byte flipped in the middle", flip(orig, len(orig)/2)},
		{"a byte flipped at the end", flip(orig, len(orig)-1)},
	} {
		if err := os.WriteFile(pack, tc.b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := Verify(dir, m); !errors.Is(err, ErrCorrupt) {
			t.Errorf("pack %s: Verify = %v, want ErrCorrupt", tc.name, err)
		}
		if err := Extract(dir, m, t.TempDir()); !errors.Is(err, ErrCorrupt) {
			t.Errorf("pack %s: Extract = %v, want ErrCorrupt", tc.name, err)
		}
	}
	if err := os.WriteFile(pack, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Verify(dir, m); err != nil {
		t.Errorf("pack restored: Verify = %v", err)
	}
}

func flip(b []byte, i int) []byte {
	c := bytes.Clone(b)
	c[i] ^= 0x40
	return c
}

func TestPids(t *testing.T) {
	m := &Manifest{Procs: []Proc{{Pid: 9, Tids: []int{9, 12}}, {Pid: 3, Tids: []int{3}}}}
	if got, want := m.Pids(), []int{3, 9, 12}; !slices.Equal(got, want) {
		t.Errorf("Pids() = %v, want %v", got, want)
	}
}

func TestWriteNeverOverwrites(t *testing.T) {
	dir, m := writeOne(t)
	src := writeFiles(t, somePages(rand.New(rand.NewPCG(5, 6)), 2))
	if err := Write(src, dir, &Manifest{}, nil); err == nil {
		t.Fatal("Write into an existing image succeeded")
	}
	if err := Verify(dir, m); err != nil {
		t.Errorf("the existing image was damaged by a refused Write: %v", err)
	}
}
