// Package replayfile is how radicd hands a restarted process its log: one
// file (on tmpfs), which the process's shim maps before main(). Each
// connection's received bytes lie, contiguous, in a page-aligned region
// of their own, so the shim's C half serves receives from the mapping as
// it is and unmaps each region once its connection's log is used up: no
// copy in the process, and no buffer of the log's size to fault in (a VM
// that pays per fresh page took seconds for the copies of a few hundred
// MB; pages a kernel write put in a tmpfs file map at ~2 GB/s here).
//
// Layout (little endian; every offset a multiple of PageSize):
//
//	header   magic "RADICRPL" | u32 version | u32 conns | u64 file size
//	         | u64 determinants' offset | u64 their length
//	         | conns x (u64 connection id | u64 offset | u64 length)
//	         | u32 CRC32C of all the above
//	the determinant stream's bytes, from the header's page boundary on
//	each connection's bytes, in its region
//
// radicd plans the layout from the streams' lengths ([Plan]), writes the
// header, and puts each record's new bytes where [Placer] says. This
// package has no I/O.
package replayfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"

	"github.com/radic-project/radic/msglog/record"
	"github.com/radic-project/radic/observer"
)

// PageSize aligns every region: the shim unmaps regions one by one. It is
// the largest base page Linux runs with (arm64 and ppc64 kernels are often
// built with 64 KiB pages), not x86's 4 KiB: a region that began inside a
// page could not be unmapped alone there. The gaps between regions are
// holes in the file (radicd sizes it with ftruncate and writes only the
// regions), so they cost address space, not memory.
const PageSize = 64 << 10

const (
	magic   = "RADICRPL"
	version = 2                     // 2: regions aligned to 64 KiB
	fixed   = 8 + 4 + 4 + 8 + 8 + 8 // up to the regions
	perConn = 24
	// MaxConns bounds a header: a process's connections to other nodes.
	MaxConns = 1 << 20
)

// ErrFile is wrapped by every error of Decode and Placer: the file is not
// a replay file or not the one planned.
var ErrFile = errors.New("replayfile: bad replay file")

// Region is where a stream's bytes lie in the file.
type Region struct {
	Conn uint64 // the connection (unused for the determinants)
	Off  uint64
	Len  uint64
}

// End is the offset past the region.
func (r Region) End() uint64 { return r.Off + r.Len }

// Header says where everything is.
type Header struct {
	Size  uint64   // the file's length
	Dets  Region   // the determinant stream
	Conns []Region // by connection id, ascending
}

func align(n uint64) uint64 { return (n + PageSize - 1) &^ (PageSize - 1) }

// Plan lays out a file for a determinant stream of detLen bytes and
// connections of the given lengths (connection id -> bytes).
func Plan(detLen uint64, conns map[uint64]uint64) *Header {
	h := &Header{}
	ids := make([]uint64, 0, len(conns))
	for id := range conns {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	off := align(uint64(fixed + perConn*len(ids) + 4))
	h.Dets = Region{Conn: observer.DeterminantStream, Off: off, Len: detLen}
	off = align(off + detLen)
	for _, id := range ids {
		h.Conns = append(h.Conns, Region{Conn: id, Off: off, Len: conns[id]})
		off = align(off + conns[id])
	}
	h.Size = off
	return h
}

// Encode returns the header's bytes (written at offset 0).
func (h *Header) Encode() []byte {
	b := make([]byte, 0, fixed+perConn*len(h.Conns)+4)
	b = append(b, magic...)
	b = binary.LittleEndian.AppendUint32(b, version)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(h.Conns)))
	b = binary.LittleEndian.AppendUint64(b, h.Size)
	b = binary.LittleEndian.AppendUint64(b, h.Dets.Off)
	b = binary.LittleEndian.AppendUint64(b, h.Dets.Len)
	for _, c := range h.Conns {
		b = binary.LittleEndian.AppendUint64(b, c.Conn)
		b = binary.LittleEndian.AppendUint64(b, c.Off)
		b = binary.LittleEndian.AppendUint64(b, c.Len)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Decode reads the header of file (the whole mapping) and checks that
// every region is aligned, inside the file and apart from the others.
func Decode(file []byte) (*Header, error) {
	fail := func(format string, args ...any) (*Header, error) {
		return nil, fmt.Errorf("%w: "+format, append([]any{ErrFile}, args...)...)
	}
	if len(file) < fixed+4 {
		return fail("%d bytes, shorter than a header", len(file))
	}
	if string(file[:8]) != magic {
		return fail("magic %q", file[:8])
	}
	if v := binary.LittleEndian.Uint32(file[8:]); v != version {
		return fail("version %d, want %d", v, version)
	}
	n := binary.LittleEndian.Uint32(file[12:])
	if n > MaxConns {
		return fail("%d connections (at most %d)", n, MaxConns)
	}
	end := fixed + perConn*int(n)
	if len(file) < end+4 {
		return fail("%d bytes, shorter than a header of %d connections", len(file), n)
	}
	if got, want := crc32.Checksum(file[:end], castagnoli), binary.LittleEndian.Uint32(file[end:]); got != want {
		return fail("header checksum %08x, want %08x", got, want)
	}
	h := &Header{
		Size: binary.LittleEndian.Uint64(file[16:]),
		Dets: Region{Conn: observer.DeterminantStream, Off: binary.LittleEndian.Uint64(file[24:]), Len: binary.LittleEndian.Uint64(file[32:])},
	}
	if h.Size != uint64(len(file)) {
		return fail("the header says %d bytes, the file has %d", h.Size, len(file))
	}
	prev := Region{Off: 0, Len: uint64(end + 4)}
	check := func(what string, r Region) error {
		switch {
		case r.Off%PageSize != 0:
			return fmt.Errorf("%w: %s at %d, not page-aligned", ErrFile, what, r.Off)
		case r.Off < prev.End() || r.Len > h.Size || r.Off > h.Size-r.Len:
			return fmt.Errorf("%w: %s [%d, +%d) overlaps what precedes it or passes the end %d", ErrFile, what, r.Off, r.Len, h.Size)
		}
		prev = r
		return nil
	}
	if err := check("the determinants", h.Dets); err != nil {
		return nil, err
	}
	for i := range int(n) {
		p := file[fixed+perConn*i:]
		r := Region{Conn: binary.LittleEndian.Uint64(p), Off: binary.LittleEndian.Uint64(p[8:]), Len: binary.LittleEndian.Uint64(p[16:])}
		if i > 0 && r.Conn <= h.Conns[i-1].Conn {
			return fail("connection %s after %s: not in ascending order", observer.ConnString(r.Conn), observer.ConnString(h.Conns[i-1].Conn))
		}
		if err := check("connection "+observer.ConnString(r.Conn), r); err != nil {
			return nil, err
		}
		h.Conns = append(h.Conns, r)
	}
	return h, nil
}

// Bytes returns region r of file.
func (r Region) Bytes(file []byte) []byte { return file[r.Off:r.End():r.End()] }

// Placer puts the records of a planned file's streams in place: it checks
// what replay relies on (each stream starts at 0, is contiguous, and ends
// where the plan says) and trims the bytes records repeat (a msglog
// cursor's records may overlap).
type Placer struct {
	h    *Header
	ends map[uint64]uint64 // per stream: the bytes placed so far
}

// NewPlacer starts placing records for h.
func (h *Header) NewPlacer() *Placer {
	return &Placer{h: h, ends: map[uint64]uint64{}}
}

func (p *Placer) region(stream uint64) (Region, bool) {
	if stream == observer.DeterminantStream {
		return p.h.Dets, true
	}
	i, ok := slices.BinarySearchFunc(p.h.Conns, stream, func(r Region, id uint64) int {
		switch {
		case r.Conn < id:
			return -1
		case r.Conn > id:
			return 1
		}
		return 0
	})
	if !ok {
		return Region{}, false
	}
	return p.h.Conns[i], true
}

// Place returns where in the file r's bytes that are new go, and those
// bytes (empty: r repeats what was placed). Bytes past the plan's length
// of their stream are left out: the plan is a listing of the streams,
// and what a store took after it is what came later (a store lists and
// appends a batch of records under one lock, so the listing is a cut at
// record boundaries).
func (p *Placer) Place(r record.Record) (uint64, []byte, error) {
	fail := func(format string, args ...any) (uint64, []byte, error) {
		return 0, nil, fmt.Errorf("%w: stream %d: "+format, append([]any{ErrFile, r.Stream}, args...)...)
	}
	det := r.Stream == observer.DeterminantStream
	if det != (r.Kind == record.KindDeterminant) || (!det && r.Kind != record.KindData) {
		return fail("a %v record", r.Kind)
	}
	reg, ok := p.region(r.Stream)
	if !ok {
		return fail("not in the plan")
	}
	end := p.ends[r.Stream]
	if r.Offset > end {
		return fail("a gap at offset %d (record at %d)", end, r.Offset)
	}
	last := min(r.End(), reg.Len)
	if last <= end {
		return 0, nil, nil
	}
	p.ends[r.Stream] = last
	return reg.Off + end, r.Payload[end-r.Offset : last-r.Offset], nil
}

// Done checks that every stream was placed whole.
func (p *Placer) Done() error {
	for _, reg := range append([]Region{p.h.Dets}, p.h.Conns...) {
		if got := p.ends[reg.Conn]; got != reg.Len {
			return fmt.Errorf("%w: stream %d: %d bytes placed, the plan has %d", ErrFile, reg.Conn, got, reg.Len)
		}
	}
	return nil
}
