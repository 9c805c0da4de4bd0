// Package image is the on-disk format of a checkpoint image: the files a
// checkpointer wrote (CRIU's *.img), cut into 4 KiB chunks, each
// compressed (DEFLATE) and named by its SHA-256, stored in the image's
// pack, and a manifest written last that lists every file as its chunks.
//
//	DIR/pack       chunks new in this image, back to back
//	DIR/manifest   "RADIC-CKPT 1 LEN SHA256\n" + LEN bytes of JSON (Manifest)
//
// An image is complete only once its manifest exists: it is written to a
// temporary name, synced and renamed after the pack is synced, so a crash
// or a cut connection while an image is being written leaves no manifest,
// and [Open] says [ErrIncomplete]. The manifest's header carries the
// length and checksum of its body, every chunk its checksum and every file
// its own: a truncated or altered image is refused ([ErrCorrupt]) before
// anything is restored from it.
//
// Incremental: an image may have a parent (the group's previous image, a
// sibling directory). A chunk whose checksum the parent lists is not
// written again; the manifest points into the pack that holds it. CRIU's
// pages-*.img are page arrays, so pages that did not change between two
// checkpoints are the same chunks even when mappings grew or shrank (a
// shift is a whole number of pages). An image therefore needs its
// ancestors' packs: keep a chain whole, and start a new one (an image
// with no parent) to let older packs go.
//
// The package reads and writes files only; it runs no processes.
package image

import (
	"bytes"
	"compress/flate"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Format constants.
const (
	// ChunkSize is the unit of dedup and checksums: a page, so that CRIU's
	// page arrays dedup across checkpoints whatever moved.
	ChunkSize = 4096
	// Version is the manifest format.
	Version = 1
	// PackName and ManifestName are the image's two files.
	PackName     = "pack"
	ManifestName = "manifest"
	magic        = "RADIC-CKPT"
)

// Sentinel errors; errors from this package wrap one of them.
var (
	// ErrIncomplete: the image has no manifest (it is being written, or its
	// writer died): it must not be used.
	ErrIncomplete = errors.New("checkpoint image incomplete")
	// ErrCorrupt: the image is complete but does not check out (truncated
	// pack, altered bytes, missing parent).
	ErrCorrupt = errors.New("checkpoint image corrupt")
)

// Manifest describes an image.
type Manifest struct {
	Version int       `json:"version"`
	Backend string    `json:"backend"`        // "criu"
	Tool    string    `json:"tool,omitempty"` // e.g. "criu 4.1.1"
	Node    int       `json:"node"`
	Created time.Time `json:"created"`
	// Parent is the parent image's directory name (a sibling), or "".
	Parent string `json:"parent,omitempty"`
	// Procs are the group's processes, roots first in group order.
	Procs []Proc `json:"procs"`
	// Meta is the backend's own (how the image was taken: options that a
	// restore must repeat).
	Meta  map[string]string `json:"meta,omitempty"`
	Files []File            `json:"files"`
	// Bytes is the files' total size; PackBytes what this image's own pack
	// holds (compressed new chunks); Chunks and NewChunks count them.
	Bytes     int64 `json:"bytes"`
	PackBytes int64 `json:"pack_bytes"`
	Chunks    int   `json:"chunks"`
	NewChunks int   `json:"new_chunks"`
}

// Proc is one process of the image.
type Proc struct {
	Pid  int    `json:"pid"`
	Root int    `json:"root"` // index of its tree in the group (Group.Roots)
	Comm string `json:"comm"`
	// Start is its start time (clock ticks since boot), so that a pid
	// reused by another process is never signalled.
	Start uint64 `json:"start"`
	// Tids are its threads (the pid included): all are restored with the
	// same ids, so all must be free.
	Tids []int `json:"tids"`
	// Fds are what its fds 0-2 were (readlink of /proc/PID/fd/N): a pipe
	// to outside the group must be handed in at restore (Target.Inherit).
	Fds map[int]string `json:"fds,omitempty"`
}

// File is one file of the image, as a list of chunks.
type File struct {
	Name   string  `json:"name"` // slash-separated, relative
	Size   int64   `json:"size"`
	Mode   uint32  `json:"mode"`
	Sum    string  `json:"sum"` // SHA-256 of the whole file
	Chunks []Chunk `json:"chunks"`
}

// Chunk is a stretch of a file, stored in a pack.
type Chunk struct {
	Sum  string `json:"s"`           // SHA-256 of the raw bytes (hex, first 16 bytes)
	Pack string `json:"p,omitempty"` // image directory holding it; "" = this one
	Off  int64  `json:"o"`           // in that pack
	Len  int    `json:"n"`           // stored bytes
	Raw  int    `json:"r"`           // raw bytes
	Flat bool   `json:"z,omitempty"` // stored DEFLATEd (else as is)
}

func chunkSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:16])
}

// Pids is every thread id the image's processes need free.
func (m *Manifest) Pids() []int {
	var ids []int
	for _, p := range m.Procs {
		ids = append(ids, p.Tids...)
	}
	sort.Ints(ids)
	return ids
}

// Write packs every regular file under src into the new image dir (which
// must not exist) with manifest m (its Files, sizes and counts are filled
// in here), referencing the chunks of parent (a complete image beside dir,
// or nil). The manifest is written last: until Write returns nil, dir is
// not a usable image, and on error Write removes what it made of it.
func Write(src, dir string, m *Manifest, parent *Manifest) (err error) {
	if parent != nil && m.Parent == "" {
		return errors.New("image: a parent manifest needs m.Parent (its directory name)")
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	known := map[string]Chunk{}
	if parent != nil {
		for _, f := range parent.Files {
			for _, c := range f.Chunks {
				if c.Pack == "" {
					c.Pack = m.Parent
				}
				known[c.Sum] = c
			}
		}
	}
	pack, err := os.OpenFile(filepath.Join(dir, PackName), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer pack.Close()
	var names []string
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(src, p)
			names = append(names, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	sort.Strings(names)
	m.Version, m.Files, m.Bytes, m.PackBytes, m.Chunks, m.NewChunks = Version, nil, 0, 0, 0, 0
	var off int64
	var zbuf bytes.Buffer
	zw, _ := flate.NewWriter(&zbuf, flate.BestSpeed)
	buf := make([]byte, ChunkSize)
	for _, name := range names {
		f, err := os.Open(filepath.Join(src, filepath.FromSlash(name)))
		if err != nil {
			return fmt.Errorf("image: %w", err)
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return fmt.Errorf("image: %w", err)
		}
		file := File{Name: name, Mode: uint32(st.Mode().Perm())}
		whole := sha256.New()
		for {
			n, rerr := io.ReadFull(f, buf)
			if n > 0 {
				b := buf[:n]
				whole.Write(b)
				file.Size += int64(n)
				sum := chunkSum(b)
				c, ok := known[sum]
				if !ok {
					zbuf.Reset()
					zw.Reset(&zbuf)
					zw.Write(b)
					zw.Close()
					stored, flat := zbuf.Bytes(), true
					if len(stored) >= n {
						stored, flat = b, false
					}
					if _, err := pack.Write(stored); err != nil {
						f.Close()
						return fmt.Errorf("image: write pack: %w", err)
					}
					c = Chunk{Sum: sum, Off: off, Len: len(stored), Raw: n, Flat: flat}
					off += int64(len(stored))
					known[sum] = c
					m.NewChunks++
				}
				file.Chunks = append(file.Chunks, c)
				m.Chunks++
			}
			if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
				break
			}
			if rerr != nil {
				f.Close()
				return fmt.Errorf("image: read %s: %w", name, rerr)
			}
		}
		f.Close()
		file.Sum = hex.EncodeToString(whole.Sum(nil))
		m.Files = append(m.Files, file)
		m.Bytes += file.Size
	}
	m.PackBytes = off
	if err := pack.Sync(); err != nil {
		return fmt.Errorf("image: sync pack: %w", err)
	}
	if err := pack.Close(); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	body, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	sum := sha256.Sum256(body)
	out := fmt.Appendf(nil, "%s %d %d %x\n", magic, Version, len(body), sum)
	out = append(out, body...)
	tmp := filepath.Join(dir, ManifestName+".tmp")
	if err := writeSync(tmp, out); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, ManifestName)); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync() // the rename itself
		d.Close()
	}
	return nil
}

func writeSync(name string, b []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Open reads dir's manifest and checks its own checksum. It does not read
// the packs: see Verify.
func Open(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s has no manifest (still being written, or its writer died)", ErrIncomplete, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", dir, err)
	}
	return parseManifest(dir, b)
}

func parseManifest(dir string, b []byte) (*Manifest, error) {
	nl := bytes.IndexByte(b, '\n')
	if nl < 0 {
		return nil, fmt.Errorf("%w: %s: manifest header cut short", ErrCorrupt, dir)
	}
	f := strings.Fields(string(b[:nl]))
	if len(f) != 4 || f[0] != magic {
		return nil, fmt.Errorf("%w: %s: not a radic checkpoint manifest", ErrCorrupt, dir)
	}
	if f[1] != strconv.Itoa(Version) {
		return nil, fmt.Errorf("%w: %s: manifest version %s, this radic reads %d", ErrCorrupt, dir, f[1], Version)
	}
	n, err := strconv.Atoi(f[2])
	body := b[nl+1:]
	if err != nil || n != len(body) {
		return nil, fmt.Errorf("%w: %s: manifest body is %d bytes, its header says %s", ErrCorrupt, dir, len(body), f[2])
	}
	sum := sha256.Sum256(body)
	if hex.EncodeToString(sum[:]) != f[3] {
		return nil, fmt.Errorf("%w: %s: manifest checksum mismatch", ErrCorrupt, dir)
	}
	var m Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("%w: %s: manifest: %v", ErrCorrupt, dir, err)
	}
	return &m, nil
}

// reader reads chunks of an image and its ancestors.
type reader struct {
	dir   string
	packs map[string]*os.File
	buf   []byte
}

func newReader(dir string) *reader { return &reader{dir: dir, packs: map[string]*os.File{}} }

func (r *reader) close() {
	for _, f := range r.packs {
		f.Close()
	}
}

// chunk returns c's raw bytes, checked (valid until the next call).
func (r *reader) chunk(c Chunk) ([]byte, error) {
	f, ok := r.packs[c.Pack]
	if !ok {
		p := filepath.Join(r.dir, PackName)
		if c.Pack != "" {
			if strings.ContainsAny(c.Pack, `/\`) || c.Pack == ".." {
				return nil, fmt.Errorf("%w: %s: bad pack name %q", ErrCorrupt, r.dir, c.Pack)
			}
			p = filepath.Join(filepath.Dir(r.dir), c.Pack, PackName)
		}
		var err error
		if f, err = os.Open(p); err != nil {
			return nil, fmt.Errorf("%w: %s: pack of image %q: %v", ErrCorrupt, r.dir, c.Pack, err)
		}
		r.packs[c.Pack] = f
	}
	if c.Len < 0 || c.Raw < 0 || c.Raw > ChunkSize || c.Len > 2*ChunkSize {
		return nil, fmt.Errorf("%w: %s: chunk %s has bad sizes", ErrCorrupt, r.dir, c.Sum)
	}
	stored := make([]byte, c.Len)
	if _, err := f.ReadAt(stored, c.Off); err != nil {
		return nil, fmt.Errorf("%w: %s: chunk %s at %d of pack %q: %v (truncated pack?)", ErrCorrupt, r.dir, c.Sum, c.Off, c.Pack, err)
	}
	raw := stored
	if c.Flat {
		zr := flate.NewReader(bytes.NewReader(stored))
		r.buf = r.buf[:0]
		var err error
		b := bytes.NewBuffer(r.buf)
		_, err = io.Copy(b, io.LimitReader(zr, ChunkSize+1))
		zr.Close()
		if err != nil {
			return nil, fmt.Errorf("%w: %s: chunk %s: %v", ErrCorrupt, r.dir, c.Sum, err)
		}
		raw = b.Bytes()
		r.buf = raw
	}
	if len(raw) != c.Raw || chunkSum(raw) != c.Sum {
		return nil, fmt.Errorf("%w: %s: chunk %s at %d of pack %q does not match its checksum", ErrCorrupt, r.dir, c.Sum, c.Off, c.Pack)
	}
	return raw, nil
}

// walk reads every file of m in dir, checked chunk by chunk and whole,
// handing each file's bytes to fn (nil: read and check only).
func walk(dir string, m *Manifest, fn func(File, io.Reader) error) error {
	r := newReader(dir)
	defer r.close()
	for _, f := range m.Files {
		if !fs.ValidPath(f.Name) {
			return fmt.Errorf("%w: %s: bad file name %q", ErrCorrupt, dir, f.Name)
		}
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			if fn == nil {
				_, err := io.Copy(io.Discard, pr)
				done <- err
				return
			}
			err := fn(f, pr)
			pr.CloseWithError(err)
			done <- err
		}()
		whole := sha256.New()
		var size int64
		var err error
		for _, c := range f.Chunks {
			var b []byte
			if b, err = r.chunk(c); err != nil {
				break
			}
			whole.Write(b)
			size += int64(len(b))
			if _, err = pw.Write(b); err != nil {
				break
			}
		}
		if err == nil && (size != f.Size || hex.EncodeToString(whole.Sum(nil)) != f.Sum) {
			err = fmt.Errorf("%w: %s: file %s does not match its checksum", ErrCorrupt, dir, f.Name)
		}
		pw.CloseWithError(err)
		if ferr := <-done; err == nil && ferr != nil {
			err = ferr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Verify reads every chunk of the image (and of the ancestors it uses) and
// checks every checksum: nil means the image can be restored from.
func Verify(dir string, m *Manifest) error {
	return walk(dir, m, nil)
}

// Extract writes the image's files under dst (created), checking every
// checksum on the way; on error dst may hold part of them.
func Extract(dir string, m *Manifest, dst string) error {
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	return walk(dir, m, func(f File, r io.Reader) error {
		p := filepath.Join(dst, filepath.FromSlash(f.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fs.FileMode(f.Mode&0o777|0o600))
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, r); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}
