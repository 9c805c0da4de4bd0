package msglog

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

var (
	templateOnce sync.Once
	templateDir  string
	templateErr  error
)

// template builds, once, a small store of 3 streams over a few segments,
// with a truncation, to be damaged by FuzzRecover.
func template(tb testing.TB) string {
	templateOnce.Do(func() {
		templateDir, templateErr = os.MkdirTemp("", "msglog-fuzz-template")
		if templateErr != nil {
			return
		}
		s, err := Open(templateDir, Options{Sync: SyncNever, SegmentSize: MinSegmentSize})
		if err != nil {
			templateErr = err
			return
		}
		ends := map[Key]uint64{}
		for i := range 60 {
			k := Key{1, uint64(i % 3)}
			n := 1 + (i*97)%400
			if err := s.Append(rec(k, ends[k], n)); err != nil {
				templateErr = err
			}
			ends[k] += uint64(n)
		}
		templateErr = errors.Join(templateErr, s.Truncate(1, 1, 500), s.Close())
	})
	if templateErr != nil {
		tb.Fatal(templateErr)
	}
	return templateDir
}

// FuzzRecover damages one file of a store (flip a byte, cut the file) and
// checks that Open either refuses with an error or serves only bytes that
// were written, contiguously, from Low to End of every stream.
func FuzzRecover(f *testing.F) {
	f.Add(uint8(0), uint32(100), uint8(1), uint32(0))
	f.Add(uint8(0), uint32(0), uint8(0), uint32(4000))
	f.Add(uint8(1), uint32(4000), uint8(0x80), uint32(0))
	f.Add(uint8(2), uint32(8), uint8(0xff), uint32(0))
	f.Add(uint8(3), uint32(30), uint8(4), uint32(0))
	f.Add(uint8(0), uint32(45), uint8(4), uint32(200))
	f.Fuzz(func(t *testing.T, file uint8, pos uint32, xor uint8, cut uint32) {
		src := template(t)
		dir := t.TempDir()
		ents, err := os.ReadDir(src)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			if e.Name() == "LOCK" {
				continue
			}
			names = append(names, e.Name())
		}
		victim := names[int(file)%len(names)]
		for _, name := range names {
			b, err := os.ReadFile(filepath.Join(src, name))
			if err != nil {
				t.Fatal(err)
			}
			if name == victim && len(b) > 0 {
				b[int(pos)%len(b)] ^= xor
				if cut > 0 {
					b = b[:len(b)-int(cut)%len(b)]
				}
			}
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		s, err := Open(dir, Options{Sync: SyncNever, SegmentSize: MinSegmentSize})
		if err != nil {
			return // refused: fine, as long as it said so
		}
		defer s.Close()
		for _, owner := range s.Owners() {
			for _, info := range s.Streams(owner) {
				c := s.Read(owner, info.Stream, info.Low)
				pos := info.Low
				for {
					r, err := c.Next()
					if err == io.EOF {
						break
					}
					if err != nil {
						t.Fatalf("%s damaged at %d (xor %#x, cut %d): Open succeeded but Next: %v", victim, pos, xor, cut, err)
					}
					if r.Offset != pos || string(r.Payload) != string(pattern(info.Key, r.Offset, len(r.Payload))) {
						t.Fatalf("%s damaged at %d (xor %#x, cut %d): served bytes never written at %v offset %d",
							victim, pos, xor, cut, info.Key, r.Offset)
					}
					pos = r.End()
				}
				if pos != info.End {
					t.Fatalf("%v read to %d, End %d", info.Key, pos, info.End)
				}
			}
		}
	})
}

func TestMain(m *testing.M) {
	code := m.Run()
	if templateDir != "" {
		os.RemoveAll(templateDir)
	}
	os.Exit(code)
}
