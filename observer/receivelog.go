package observer

import (
	"errors"
	"fmt"

	msgrec "github.com/radic-project/radic/msglog/record"
)

// ConnReceives is what one connection delivered to its process in an
// earlier run, as the exec backend replays it: the bytes, and the result
// of each receive in call order (a count, 0 for end of stream, or -errno).
type ConnReceives struct {
	Data    []byte
	Results []int64
}

// ReceiveLog is a process's logged receives, by connection, as rebuilt
// from its msglog records ([SplitReceives]).
type ReceiveLog struct {
	Conns map[uint64]*ConnReceives
	// Accepts are the connections the process accepted, by the logical
	// port it accepted them on, in the order its accepts returned them: a
	// restarted process must be given them in that order (its accepts
	// return whichever connection its peers resume first otherwise).
	Accepts map[uint16][]uint64
	// Ready are the process's polls and selects over managed fds, in
	// call order (KindReady determinants): a restarted process's polls
	// report what these did, until they are used up.
	Ready []Determinant
	// Connects are the process's connects to nodes of the job, made and
	// failed, in call order (KindConnect determinants): a restarted
	// process's connects fail where these did, so that a program that
	// retries until its peer listens tries as often as it did.
	Connects []Determinant
	// DetLen is the determinant stream's length: where the restarted
	// process's own determinants continue.
	DetLen uint64
	// Identity is what getpid and gethostname answered the process in
	// its first run (KindValue determinants): a restarted process is
	// given the same answers, so that what it prints or computes from
	// them does not differ from what its first run did.
	Identity map[ValueCall][]byte
}

// ErrReceiveLog is wrapped by every error of SplitReceives and ReceivesFrom.
var ErrReceiveLog = errors.New("observer: inconsistent receive log")

func logErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrReceiveLog}, args...)...)
}

// SplitReceives rebuilds a process's receives from the records of its
// streams (any order of streams; each stream's records in offset order,
// overlaps allowed, as msglog cursors give them): the determinant stream's
// receive determinants, each connection's data. It checks what replay
// relies on: every stream starts at 0 and is contiguous, every
// determinant decodes, and the counts of each connection's receives sum to
// no more than its logged bytes (bytes beyond them arrived in a receive
// that had not returned). A connect or accept determinant names a
// connection of the earlier run even when nothing was received on it (the
// peer holds it: the restarted process resumes it rather than open another).
// Determinants of other kinds are refused: this replay knows receives,
// connections, polls and the process's identity (getpid, gethostname)
// only.
func SplitReceives(recs []msgrec.Record) (*ReceiveLog, error) {
	var dets []byte
	data := map[uint64][]byte{}
	ends := map[uint64]uint64{}
	for i := range recs {
		r := &recs[i]
		var buf *[]byte
		switch {
		case r.Kind == msgrec.KindDeterminant && r.Stream == DeterminantStream:
			buf = &dets
		case r.Kind == msgrec.KindData && r.Stream != DeterminantStream:
			b := data[r.Stream]
			buf = &b
		default:
			return nil, logErr("record %d: a %v record on stream %d", i, r.Kind, r.Stream)
		}
		end := ends[r.Stream]
		if r.Offset > end {
			return nil, logErr("stream %d has a gap at offset %d (record at %d)", r.Stream, end, r.Offset)
		}
		if r.End() > end {
			*buf = append(*buf, r.Payload[end-r.Offset:]...)
			ends[r.Stream] = r.End()
		}
		if r.Kind == msgrec.KindData {
			data[r.Stream] = *buf
		}
	}
	return ReceivesFrom(dets, data)
}

// ReceivesFrom is SplitReceives for streams already put together: the
// determinant stream's bytes and each connection's received bytes (the
// log's Conns take data's slices as they are). A restarted process's
// shim gets them so, in a file radicd laid out (observer/replayfile).
func ReceivesFrom(dets []byte, data map[uint64][]byte) (*ReceiveLog, error) {
	log := &ReceiveLog{Conns: map[uint64]*ConnReceives{}, DetLen: uint64(len(dets))}
	get := func(conn uint64) *ConnReceives {
		c := log.Conns[conn]
		if c == nil {
			c = &ConnReceives{Data: data[conn]}
			log.Conns[conn] = c
		}
		return c
	}
	counted := map[uint64]uint64{}
	for off := 0; off < len(dets); {
		d, n, err := DecodeDeterminant(dets[off:])
		if err != nil {
			return nil, logErr("determinant at offset %d: %v", off, err)
		}
		if d.Kind == KindConnect {
			log.Connects = append(log.Connects, d)
		}
		if d.Kind == KindConnect || d.Kind == KindAccept {
			if d.Errno == 0 {
				get(d.Conn)
				if d.Kind == KindAccept {
					if log.Accepts == nil {
						log.Accepts = map[uint16][]uint64{}
					}
					log.Accepts[d.Port] = append(log.Accepts[d.Port], d.Conn)
				}
			}
			off += n
			continue
		}
		if d.Kind == KindReady {
			log.Ready = append(log.Ready, d)
			off += n
			continue
		}
		if d.Kind == KindValue && (d.ValueCall == ValueGetpid || d.ValueCall == ValueGethostname) {
			// The first run's identity: a process restarted twice
			// logs none of its own (it keeps this one).
			if log.Identity == nil {
				log.Identity = map[ValueCall][]byte{}
			}
			if _, ok := log.Identity[d.ValueCall]; !ok {
				log.Identity[d.ValueCall] = d.Value
			}
			off += n
			continue
		}
		if d.Kind != KindRecv {
			return nil, logErr("determinant at offset %d: %v (only receives, connections, polls and the identity are replayed)", off, &d)
		}
		c := get(d.Conn)
		switch {
		case d.Errno != 0:
			c.Results = append(c.Results, -int64(d.Errno))
		default:
			c.Results = append(c.Results, int64(d.N))
			counted[d.Conn] += d.N
			if counted[d.Conn] > uint64(len(c.Data)) {
				return nil, logErr("connection %s: receives returned %d bytes, %d are logged", ConnString(d.Conn), counted[d.Conn], len(c.Data))
			}
		}
		off += n
	}
	for conn := range data {
		get(conn)
	}
	return log, nil
}
