package msglog

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// The marks file records, for every stream, its low mark: the offset below
// which its bytes were truncated (or where it started). It is two slots,
// marks.0 and marks.1, written alternately in place, each
//
//	0      4     8     16      20         24
//	+------+-----+-----+-------+----------+------------------------------+
//	|"RDMK"| crc | gen | count | reserved | count × {owner, stream, low} |
//	+------+-----+-----+-------+----------+------------------------------+
//
// with crc = CRC32C of bytes [8, 24+24·count), padded with zeros to a
// multiple of marksBlock. Recovery takes the valid slot with the highest gen;
// a torn write spoils only the slot being written.
//
// Space: a slot only grows when a stream is created (inside Append, where a
// failure is ErrFull like any other). Both slots are then padded with real
// zero bytes to the new capacity, so that a Truncate rewrites already
// allocated blocks and succeeds on a full disk (true of ext4, xfs and tmpfs,
// not of copy-on-write filesystems).
const (
	marksHeader = 24
	marksEntry  = 24
	marksBlock  = 4096
)

var marksMagic = [4]byte{'R', 'D', 'M', 'K'}

type markEntry struct {
	key Key
	low uint64
}

type marks struct {
	files [2]*os.File
	paths [2]string
	sizes [2]int64 // bytes allocated (file sizes)
	gen   uint64   // generation of the newest valid slot
	cur   int      // slot holding gen
	buf   []byte
}

func marksPath(dir string, i int) string { return filepath.Join(dir, fmt.Sprintf("marks.%d", i)) }

// openMarks opens (creating) both slots and returns the newest valid
// content. No valid slot means a fresh store.
func openMarks(dir string) (*marks, []markEntry, error) {
	m := &marks{cur: 1}
	var best []markEntry
	found := false
	for i := range 2 {
		p := marksPath(dir, i)
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			m.close()
			return nil, nil, fmt.Errorf("open marks: %w", err)
		}
		m.files[i], m.paths[i] = f, p
		b, err := io.ReadAll(f)
		if err != nil {
			m.close()
			return nil, nil, fmt.Errorf("read marks: %w", err)
		}
		m.sizes[i] = int64(len(b))
		gen, ents, ok := parseMarks(b)
		if ok && (!found || gen > m.gen) {
			found, m.gen, m.cur, best = true, gen, i, ents
		}
	}
	return m, best, nil
}

func parseMarks(b []byte) (gen uint64, ents []markEntry, ok bool) {
	if len(b) < marksHeader || [4]byte(b[:4]) != marksMagic {
		return 0, nil, false
	}
	le := binary.LittleEndian
	count := uint64(le.Uint32(b[16:]))
	end := marksHeader + count*marksEntry
	if end > uint64(len(b)) {
		return 0, nil, false
	}
	if crc32.Checksum(b[8:end], castagnoli) != le.Uint32(b[4:]) {
		return 0, nil, false
	}
	ents = make([]markEntry, count)
	for i := range ents {
		e := b[marksHeader+i*marksEntry:]
		ents[i] = markEntry{Key{le.Uint64(e), le.Uint64(e[8:])}, le.Uint64(e[16:])}
	}
	return le.Uint64(b[8:]), ents, true
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// write stores ents (any order) as the next generation.
func (m *marks) write(ents []markEntry) error {
	slices.SortFunc(ents, func(a, b markEntry) int {
		return cmp.Or(cmp.Compare(a.key.Owner, b.key.Owner), cmp.Compare(a.key.Stream, b.key.Stream))
	})
	n := marksHeader + len(ents)*marksEntry
	capacity := int64((n + marksBlock - 1) / marksBlock * marksBlock)
	b := slices.Grow(m.buf[:0], int(capacity))[:n]
	le := binary.LittleEndian
	copy(b, marksMagic[:])
	le.PutUint64(b[8:], m.gen+1)
	le.PutUint32(b[16:], uint32(len(ents)))
	le.PutUint32(b[20:], 0)
	for i, e := range ents {
		p := b[marksHeader+i*marksEntry:]
		le.PutUint64(p, e.key.Owner)
		le.PutUint64(p[8:], e.key.Stream)
		le.PutUint64(p[16:], e.low)
	}
	le.PutUint32(b[4:], crc32.Checksum(b[8:n], castagnoli))
	m.buf = b

	slot := 1 - m.cur
	// Grow both slots to capacity first, with real zeros, so that later
	// in-place rewrites never need new blocks.
	for i := range 2 {
		if m.sizes[i] >= capacity {
			continue
		}
		if _, err := m.files[i].WriteAt(make([]byte, capacity-m.sizes[i]), m.sizes[i]); err != nil {
			return fmt.Errorf("grow %s: %w", m.paths[i], err)
		}
		if err := m.files[i].Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", m.paths[i], err)
		}
		m.sizes[i] = capacity
	}
	if _, err := m.files[slot].WriteAt(b, 0); err != nil {
		return fmt.Errorf("write %s: %w", m.paths[slot], err)
	}
	if err := m.files[slot].Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", m.paths[slot], err)
	}
	m.gen++
	m.cur = slot
	return nil
}

// growth is how many bytes the files grow by to hold n entries.
func (m *marks) growth(n int) int64 {
	need := marksHeader + n*marksEntry
	capacity := int64((need + marksBlock - 1) / marksBlock * marksBlock)
	return max(capacity-m.sizes[0], 0) + max(capacity-m.sizes[1], 0)
}

func (m *marks) bytes() int64 { return m.sizes[0] + m.sizes[1] }

func (m *marks) close() error {
	var errs []error
	for i, f := range m.files {
		if f != nil {
			if err := f.Close(); err != nil && !errors.Is(err, fs.ErrClosed) {
				errs = append(errs, err)
			}
			m.files[i] = nil
		}
	}
	return errors.Join(errs...)
}
