package msglog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/radic-project/radic/msglog/record"
)

// A segment is one append-only file of records, named by a 16-hex-digit id
// that grows by one at each rotation: 0000000000000001.seg, ...
type segment struct {
	id      uint64
	path    string
	f       *os.File
	size    int64 // bytes of whole, valid records; the file ends here
	records int64
	extents int // live extents pointing here; 0 = dead (droppable unless active)
}

const segSuffix = ".seg"

func segName(id uint64) string { return fmt.Sprintf("%016x%s", id, segSuffix) }

// listSegments returns the ids of the segment files in dir, ascending.
func listSegments(dir string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var ids []uint64
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, segSuffix) || len(name) != 16+len(segSuffix) {
			continue
		}
		id, err := strconv.ParseUint(strings.TrimSuffix(name, segSuffix), 16, 64)
		if err != nil {
			continue
		}
		ids = append(ids, id)
	}
	// ReadDir sorts by name, and fixed-width hex sorts like the number.
	return ids, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// scanner reads records of one segment through a buffer, by file position.
// Positions must stay below limit (the valid size of the segment).
type scanner struct {
	seg   *segment
	limit int64
	buf   []byte
	start int64 // file position of buf[0]
}

const scanChunk = 64 << 10

func (sc *scanner) reset(seg *segment, limit int64) {
	if sc.seg != seg {
		sc.buf = sc.buf[:0]
	}
	sc.seg, sc.limit = seg, limit
}

// peek returns up to n bytes at pos (fewer only at limit).
func (sc *scanner) peek(pos int64, n int) ([]byte, error) {
	if pos >= sc.start && pos+int64(n) <= sc.start+int64(len(sc.buf)) {
		return sc.buf[pos-sc.start:][:n], nil
	}
	want := max(n, scanChunk)
	if rem := sc.limit - pos; int64(want) > rem {
		want = int(max(rem, 0))
	}
	if cap(sc.buf) < want {
		sc.buf = make([]byte, want)
	}
	sc.buf = sc.buf[:want]
	m, err := sc.seg.f.ReadAt(sc.buf, pos)
	sc.buf, sc.start = sc.buf[:m], pos
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return sc.buf[:min(n, m)], nil
}

// record decodes the record at pos. The payload aliases the buffer.
func (sc *scanner) record(pos int64) (record.Record, int, error) {
	b, err := sc.peek(pos, record.HeaderLen)
	if err != nil {
		return record.Record{}, 0, err
	}
	length, err := record.CheckHeader(b)
	if err != nil {
		return record.Record{}, 0, err
	}
	b, err = sc.peek(pos, record.HeaderLen+length)
	if err != nil {
		return record.Record{}, 0, err
	}
	return record.Decode(b)
}

// validRecordAfter reports whether a decodable record starts anywhere in
// [from, size) of f: if so, damage before it is not a torn tail.
func validRecordAfter(f *os.File, from, size int64) (bool, error) {
	if from >= size {
		return false, nil
	}
	b := make([]byte, size-from)
	if _, err := f.ReadAt(b, from); err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	for i := 0; ; {
		j := bytes.Index(b[i:], record.Magic[:])
		if j < 0 {
			return false, nil
		}
		if _, _, err := record.Decode(b[i+j:]); err == nil {
			return true, nil
		}
		i += j + 1
	}
}

func createSegment(dir string, id uint64) (*segment, error) {
	p := filepath.Join(dir, segName(id))
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	return &segment{id: id, path: p, f: f}, nil
}
