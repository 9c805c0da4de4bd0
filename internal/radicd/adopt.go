package radicd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/msglog"
	"github.com/radic-project/radic/msglog/record"
)

// Adoption: a rank restarted on node N continues its streams there, so
// N's protectors must hold them under N before its new records arrive
// (an empty stream would refuse the gap). Each protector copies them
// itself, from the node that holds the dead group's store (a copy in
// place when that is the protector, the common case in a small ring),
// while N fetches the same log for the rank: the log crosses the network
// at most once per copy, and the two run at once instead of in turn.

// handleReplicaAdopt: POST /v1/replica/adopt?node=N&group=G&owner=O&from=H
// stores under node N every stream of owner O in node G's store held on
// node H (this node or a peer); {"records": n} once stored.
func (d *Daemon) handleReplicaAdopt(w http.ResponseWriter, r *http.Request) {
	id, err := nodeParam(r)
	q := r.URL.Query()
	group, err1 := strconv.ParseUint(q.Get("group"), 10, 32)
	owner, err2 := strconv.ParseUint(q.Get("owner"), 10, 64)
	from, err3 := strconv.ParseUint(q.Get("from"), 10, 32)
	if err := errors.Join(err, err1, err2, err3); err != nil {
		http.Error(w, "node, group, owner, from: "+err.Error(), http.StatusBadRequest)
		return
	}
	if id == heartbeat.NodeID(group) {
		http.Error(w, "node and group are the same: nothing to adopt", http.StatusBadRequest)
		return
	}
	st, err := d.stores.get(id)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	start := time.Now()
	n, err := d.adopt(r.Context(), st, heartbeat.NodeID(from), heartbeat.NodeID(group), owner)
	if err != nil {
		d.log.Warn("cannot adopt a restarted rank's log", "under_node", id, "group", group, "owner", fmt.Sprintf("%x", owner), "from", from, "err", err)
		http.Error(w, err.Error(), statusFor(err))
		return
	}
	d.log.Info("adopted a restarted rank's log", "under_node", id, "group", group, "owner", fmt.Sprintf("%x", owner), "from", from, "records", n, "took", time.Since(start))
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]int{"records": n})
}

// adopt appends to st owner's streams of group's store held on from.
func (d *Daemon) adopt(ctx context.Context, st *msglog.Store, from, group heartbeat.NodeID, owner uint64) (int, error) {
	if int(from) == d.cfg.Node {
		if err := d.settleLog(ctx, group); err != nil {
			return 0, err
		}
		src := d.stores.lookup(group)
		if src == nil {
			return 0, nil // nothing was ever logged for the group here
		}
		return st.CopyOwner(src, owner)
	}
	infos, err := d.ownerStreams(ctx, from, group, owner)
	if err != nil {
		return 0, err
	}
	b := newRecordBatch(st)
	for _, si := range infos {
		err := d.eachRecord(ctx, from, group, owner, si.Stream, si.Low, b.add)
		if err == nil {
			err = b.flush()
		}
		if err != nil {
			return b.stored, fmt.Errorf("stream %d of owner %x from node %d: %w", si.Stream, owner, from, err)
		}
	}
	return b.stored, st.Sync() // once, for every batch
}

// recordBatch appends records to a store in batches of about adoptBatch
// payload bytes, copied into one reused buffer, without an fsync each
// (the caller syncs once).
type recordBatch struct {
	st     *msglog.Store
	buf    []byte
	recs   []msglog.Record
	spans  [][2]int
	stored int
}

// adoptBatch is how many payload bytes a recordBatch stores at once.
const adoptBatch = 4 << 20

func newRecordBatch(st *msglog.Store) *recordBatch { return &recordBatch{st: st} }

func (b *recordBatch) add(r record.Record) error {
	// buf moves as it grows: the payloads are sliced at the flush.
	b.spans = append(b.spans, [2]int{len(b.buf), len(b.buf) + len(r.Payload)})
	b.buf = append(b.buf, r.Payload...)
	b.recs = append(b.recs, r)
	if len(b.buf) >= adoptBatch {
		return b.flush()
	}
	return nil
}

func (b *recordBatch) flush() error {
	for i, s := range b.spans {
		b.recs[i].Payload = b.buf[s[0]:s[1]:s[1]]
	}
	k, err := b.st.AppendBatchNoSync(b.recs)
	b.stored += k
	b.buf, b.recs, b.spans = b.buf[:0], b.recs[:0], b.spans[:0]
	return err
}

// ownerStreams lists owner's streams in group's store held on node from.
func (d *Daemon) ownerStreams(ctx context.Context, from, group heartbeat.NodeID, owner uint64) ([]msglog.StreamInfo, error) {
	if int(from) == d.cfg.Node {
		if err := d.settleLog(ctx, group); err != nil {
			return nil, err
		}
		st := d.stores.lookup(group)
		if st == nil {
			return nil, nil // nothing was ever logged for the group here
		}
		return st.Streams(owner), nil
	}
	all, err := d.remoteStreams(ctx, from, group)
	if err != nil {
		return nil, fmt.Errorf("streams of node %d's group on node %d: %w", group, from, err)
	}
	var infos []msglog.StreamInfo
	for k, si := range all {
		if k.Owner == owner {
			infos = append(infos, si)
		}
	}
	return infos, nil
}

// eachRecord calls fn with each record of owner's stream in group's store
// held on node from, from offset off, its CRC checked. The payload is
// fn's only during the call: records pass through one reused buffer.
func (d *Daemon) eachRecord(ctx context.Context, from, group heartbeat.NodeID, owner, stream, off uint64, fn func(record.Record) error) error {
	if int(from) != d.cfg.Node {
		body, err := d.openReplica(ctx, int(from), int(group), owner, stream, off)
		if err != nil {
			return err
		}
		defer body.Close()
		return readRecords(body, fn)
	}
	st := d.stores.lookup(group)
	if st == nil {
		return fmt.Errorf("no store of node %d here", group)
	}
	c := st.Read(owner, stream, off)
	var buf []byte
	for {
		var err error
		if buf, err = c.AppendNext(buf[:0]); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		r, _, err := record.Decode(buf)
		if err == nil {
			err = fn(r)
		}
		if err != nil {
			return err
		}
	}
}

// readRecords calls fn with each record whose encoding r yields, its CRC
// checked; the payload is fn's only during the call. A body that ends
// inside a record is an error, never a shorter stream.
func readRecords(r io.Reader, fn func(record.Record) error) error {
	br := bufio.NewReaderSize(r, 256<<10)
	buf := make([]byte, record.HeaderLen, 1<<20)
	for {
		buf = buf[:record.HeaderLen]
		if _, err := io.ReadFull(br, buf); err != nil {
			if err == io.EOF {
				return nil
			}
			return fmt.Errorf("record header cut short: %w", err)
		}
		length, err := record.CheckHeader(buf)
		if err != nil {
			return err
		}
		buf = slices.Grow(buf, length)[:record.HeaderLen+length]
		if _, err := io.ReadFull(br, buf[record.HeaderLen:]); err != nil {
			return fmt.Errorf("record cut short: %w", err)
		}
		rec, _, err := record.Decode(buf)
		if err == nil {
			err = fn(rec)
		}
		if err != nil {
			return err
		}
	}
}

// openReplica opens stream of owner in group's store on peer from, from
// offset off, as record encodings.
func (d *Daemon) openReplica(ctx context.Context, from, group int, owner, stream, off uint64) (io.ReadCloser, error) {
	addr, ok := d.loc.peerAddr(from)
	if !ok {
		return nil, fmt.Errorf("no address for node %d", from)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/v1/replica/read?node=%d&owner=%d&stream=%d&from=%d", addr, group, owner, stream, off), nil)
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		resp.Body.Close()
		return nil, fmt.Errorf("stream %d of owner %x on node %d: %s: %s", stream, owner, from, resp.Status, strings.TrimSpace(string(b)))
	}
	return resp.Body, nil
}

// adoptOn asks protector p to store under this node the log of owner
// that group's store on from holds.
func (d *Daemon) adoptOn(ctx context.Context, p heartbeat.NodeID, from, group int, owner uint64) error {
	addr, ok := d.loc.peerAddr(int(p))
	if !ok {
		return fmt.Errorf("protector %d: no address", p)
	}
	ctx, cancel := context.WithTimeout(ctx, replayFetchTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://%s/v1/replica/adopt?node=%d&group=%d&owner=%d&from=%d", addr, d.cfg.Node, group, owner, from), nil)
	resp, err := d.client.Do(req)
	if err != nil {
		return fmt.Errorf("protector %d: %w", p, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return &httpError{resp.StatusCode, fmt.Sprintf("protector %d: %s: %s", p, resp.Status, strings.TrimSpace(string(msg)))}
	}
	return nil
}
