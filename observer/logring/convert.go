package logring

import (
	"fmt"
	"syscall"

	"github.com/radic-project/radic/msglog"
	"github.com/radic-project/radic/msglog/record"
	"github.com/radic-project/radic/observer"
)

// maxCoalesce bounds one msglog data record built from ring records.
const maxCoalesce = 4 << 20

// Converter turns one process's ring records, in ring order, into msglog
// records: each connection's received bytes (Stream = the connection id)
// and the process's determinant stream (observer.DeterminantStream). It
// checks what the ring promises: each connection's bytes are contiguous,
// and a receive's count equals the bytes logged for it. The zero value is
// not usable; use NewConverter.
type Converter struct {
	owner  uint64
	detOff uint64
	conns  map[uint64]*connLog
}

type connLog struct {
	next    uint64 // stream offset the next bytes must start at
	known   bool   // next is known: the connection began here, or bytes came
	pending uint64 // bytes of DATA records since the last receive determinant
}

// NewConverter converts the records of process owner, whose determinant
// stream continues at detOff (0 for a process's first run).
func NewConverter(owner, detOff uint64) *Converter {
	return &Converter{owner: owner, detOff: detOff, conns: map[uint64]*connLog{}}
}

// DetOffset is where the next determinant goes in the determinant stream.
func (c *Converter) DetOffset() uint64 { return c.detOff }

// ConvertError says which ring record broke the ring's promises.
type ConvertError struct {
	Index int // the record's index in the batch
	Rec   Record
	Why   string
}

func (e *ConvertError) Error() string {
	return fmt.Sprintf("logring: record %d (%v on connection %s at offset %d, result %d): %s",
		e.Index, e.Rec.Type, observer.ConnString(e.Rec.Conn), e.Rec.Offset, e.Rec.Result, e.Why)
}

// Convert appends to out the msglog records for recs: data records first
// (contiguous bytes of one connection merged), then one determinant record
// holding the batch's determinants in order. Payloads are copied. On error
// the converter's state is unchanged and out is returned as it came.
func (c *Converter) Convert(out []msglog.Record, recs []Record) ([]msglog.Record, error) {
	plan, state, err := c.plan(recs)
	if err != nil {
		return out, err
	}
	for i := range plan {
		pr := &plan[i]
		if pr.pieces != nil {
			p := make([]byte, 0, pr.n)
			for _, x := range pr.pieces {
				p = append(p, x...)
			}
			pr.rec.Payload = p
		}
		out = append(out, pr.rec)
	}
	c.commit(state, plan)
	return out, nil
}

// AppendEncoded is Convert followed by record.AppendRecord of each record
// onto body, with each ring payload copied once, straight into body (the
// drain's path: a copy fewer per logged byte). It returns the records'
// count and payload bytes. On error body is returned as it came and the
// converter's state is unchanged.
func (c *Converter) AppendEncoded(body []byte, recs []Record) ([]byte, int, uint64, error) {
	plan, state, err := c.plan(recs)
	if err != nil {
		return body, 0, 0, err
	}
	var payload uint64
	for i := range plan {
		pr := &plan[i]
		start := len(body)
		body = append(body, make([]byte, record.HeaderLen)...)
		if pr.pieces != nil {
			for _, x := range pr.pieces {
				body = append(body, x...)
			}
		} else {
			body = append(body, pr.rec.Payload...)
		}
		record.Seal(body[start:], &record.Fields{Kind: pr.rec.Kind, Length: uint32(pr.n),
			Owner: pr.rec.Owner, Stream: pr.rec.Stream, Offset: pr.rec.Offset})
		payload += uint64(pr.n)
	}
	c.commit(state, plan)
	return body, len(plan), payload, nil
}

// planRec is one output record of a batch before its payload is built:
// a data record's payload is pieces of the ring records (n bytes in all),
// a determinant record's its own.
type planRec struct {
	rec    msglog.Record
	pieces [][]byte
	n      int
}

// commit makes a converted batch's view the converter's state.
func (c *Converter) commit(state map[uint64]*connLog, plan []planRec) {
	for conn, cl := range state {
		c.conns[conn] = cl
	}
	for i := range plan {
		if plan[i].rec.Kind == msglog.KindDeterminant {
			c.detOff += uint64(plan[i].n)
		}
	}
}

// plan converts recs without copying: see Convert.
func (c *Converter) plan(recs []Record) ([]planRec, map[uint64]*connLog, error) {
	var out []planRec
	state := map[uint64]*connLog{} // the batch's view, committed at the end
	get := func(conn uint64) (*connLog, bool) {
		if cl := state[conn]; cl != nil {
			return cl, true
		}
		cl, ok := c.conns[conn]
		n := &connLog{}
		if ok {
			*n = *cl
		}
		state[conn] = n
		return n, ok
	}
	open := map[uint64]int{} // conn -> index in out of its growing data record
	var dets []byte
	fail := func(i int, r Record, why string) ([]planRec, map[uint64]*connLog, error) {
		return nil, nil, &ConvertError{Index: i, Rec: r, Why: why}
	}
	for i, r := range recs {
		if r.Conn == observer.DeterminantStream {
			return fail(i, r, observer.ErrReservedConn.Error())
		}
		if r.Type == TypeReady || r.Type == TypeValue || (r.Type == TypeConnect && r.Result < 0) {
			// A determinant alone: a wait's or a value's payload is
			// not a connection's bytes, a failed connect made none.
			d := observer.Determinant{Kind: observer.KindConnect, Peer: UnpackPeer(r.Offset), Errno: syscall.Errno(-r.Result)}
			switch r.Type {
			case TypeReady:
				call := observer.ReadyCall(r.Conn)
				if call == 0 {
					call = observer.ReadyPoll
				}
				d = observer.Determinant{Kind: observer.KindReady, ReadyCall: call,
					Errno: syscall.Errno(-r.Result), Ready: ReadyFds(r)}
			case TypeValue:
				d = observer.Determinant{Kind: observer.KindValue, ValueCall: observer.ValueCall(r.Conn), Value: r.Payload}
			}
			var err error
			if dets, err = observer.AppendDeterminant(dets, &d); err != nil {
				return fail(i, r, err.Error())
			}
			continue
		}
		cl, _ := get(r.Conn)
		if (r.Type == TypeConnect || r.Type == TypeAccept) && !cl.known {
			cl.next, cl.known = 0, true // a new connection's stream starts at 0
		}
		if len(r.Payload) > 0 {
			if cl.known && r.Offset != cl.next {
				return fail(i, r, fmt.Sprintf("bytes not contiguous: want offset %d", cl.next))
			}
			// A connection a restarted process replayed continues where
			// its log ends: its first bytes here say where. (A receive
			// that returned nothing, EAGAIN after the log ran out, may
			// come first and says nothing of it.)
			cl.next, cl.known = r.Offset, true
			if j, ok := open[r.Conn]; ok && out[j].n+len(r.Payload) <= maxCoalesce {
				out[j].pieces = append(out[j].pieces, r.Payload)
				out[j].n += len(r.Payload)
			} else {
				open[r.Conn] = len(out)
				out = append(out, planRec{rec: msglog.Record{Kind: msglog.KindData, Owner: c.owner, Stream: r.Conn,
					Offset: r.Offset}, pieces: [][]byte{r.Payload}, n: len(r.Payload)})
			}
			cl.next += uint64(len(r.Payload))
		}
		var d observer.Determinant
		switch r.Type {
		case TypeConnect:
			d = observer.Determinant{Kind: observer.KindConnect, Conn: r.Conn, Peer: UnpackPeer(r.Offset)}
		case TypeAccept:
			d = observer.Determinant{Kind: observer.KindAccept, Conn: r.Conn, Port: uint16(r.Offset)}
		case TypeData:
			cl.pending += uint64(len(r.Payload))
			continue
		case TypeRecvData:
			if cl.pending != 0 {
				return fail(i, r, fmt.Sprintf("%d bytes of an earlier receive have no determinant", cl.pending))
			}
			d = observer.Determinant{Kind: observer.KindRecv, Conn: r.Conn, N: uint64(r.Result)}
		case TypeRecv:
			switch {
			case r.Result > 0 && uint64(r.Result) != cl.pending:
				return fail(i, r, fmt.Sprintf("the receive returned %d but %d bytes were logged for it", r.Result, cl.pending))
			case r.Result <= 0 && cl.pending != 0:
				return fail(i, r, fmt.Sprintf("the receive failed but %d bytes were logged for it", cl.pending))
			case r.Result > 0:
				d = observer.Determinant{Kind: observer.KindRecv, Conn: r.Conn, N: uint64(r.Result)}
			case r.Result == 0:
				d = observer.Determinant{Kind: observer.KindRecv, Conn: r.Conn}
			default:
				d = observer.Determinant{Kind: observer.KindRecv, Conn: r.Conn, Errno: syscall.Errno(-r.Result)}
			}
			cl.pending = 0
		default:
			return fail(i, r, "unknown type")
		}
		var err error
		if dets, err = observer.AppendDeterminant(dets, &d); err != nil {
			return fail(i, r, err.Error())
		}
	}
	if len(dets) > 0 {
		out = append(out, planRec{rec: msglog.Record{Kind: msglog.KindDeterminant, Owner: c.owner,
			Stream: observer.DeterminantStream, Offset: c.detOff, Payload: dets}, n: len(dets)})
	}
	return out, state, nil
}

// DecodeAll decodes every record of b (a drained, unwrapped stretch of
// the ring that ends at a record boundary).
func DecodeAll(b []byte) ([]Record, error) {
	var out []Record
	for off := 0; off < len(b); {
		r, n, err := Decode(b[off:])
		if err != nil {
			return nil, fmt.Errorf("at ring offset +%d: %w", off, err)
		}
		if n > len(b)-off {
			n = len(b) - off // the last record's padding may be the end
		}
		out = append(out, r)
		off += n
	}
	return out, nil
}
