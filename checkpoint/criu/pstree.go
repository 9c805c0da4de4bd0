package criu

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/encoding/protowire"
)

// CRIU's image header: the common magic, then the image's own.
const (
	imgCommonMagic = 0x54564319
	pstreeMagic    = 0x50273030
)

// pstreeIDs reads the pids and thread ids that CRIU will restore from the
// pstree.img of a dump directory: what restore needs free, exactly (the
// manifest's list was read from /proc before the dump; a child forked
// meanwhile is only here).
//
// pstree.img: two magics (u32 LE), then entries, each a u32 LE length and
// a PstreeEntry message (1 pid, 2 ppid, 3 pgid, 4 sid, 5 repeated threads).
func pstreeIDs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "pstree.img"))
	if err != nil {
		return nil, err
	}
	if len(b) < 8 || binary.LittleEndian.Uint32(b) != imgCommonMagic || binary.LittleEndian.Uint32(b[4:]) != pstreeMagic {
		return nil, fmt.Errorf("%s/pstree.img: not a CRIU pstree image", dir)
	}
	var ids []int
	for b = b[8:]; len(b) > 0; {
		if len(b) < 4 {
			return nil, fmt.Errorf("%s/pstree.img: entry cut short", dir)
		}
		n := int(binary.LittleEndian.Uint32(b))
		if n > len(b)-4 {
			return nil, fmt.Errorf("%s/pstree.img: entry of %d bytes, %d left", dir, n, len(b)-4)
		}
		msg := b[4 : 4+n]
		b = b[4+n:]
		for len(msg) > 0 {
			num, typ, l := protowire.ConsumeTag(msg)
			if l < 0 {
				return nil, fmt.Errorf("%s/pstree.img: %w", dir, protowire.ParseError(l))
			}
			msg = msg[l:]
			switch {
			case (num == 1 || num == 5) && typ == protowire.VarintType:
				v, l := protowire.ConsumeVarint(msg)
				if l < 0 {
					return nil, fmt.Errorf("%s/pstree.img: %w", dir, protowire.ParseError(l))
				}
				ids = append(ids, int(v))
				msg = msg[l:]
			case num == 5 && typ == protowire.BytesType: // packed threads
				p, l := protowire.ConsumeBytes(msg)
				if l < 0 {
					return nil, fmt.Errorf("%s/pstree.img: %w", dir, protowire.ParseError(l))
				}
				for len(p) > 0 {
					v, k := protowire.ConsumeVarint(p)
					if k < 0 {
						return nil, fmt.Errorf("%s/pstree.img: %w", dir, protowire.ParseError(k))
					}
					ids = append(ids, int(v))
					p = p[k:]
				}
				msg = msg[l:]
			default:
				l := protowire.ConsumeFieldValue(num, typ, msg)
				if l < 0 {
					return nil, fmt.Errorf("%s/pstree.img: %w", dir, protowire.ParseError(l))
				}
				msg = msg[l:]
			}
		}
	}
	return ids, nil
}
