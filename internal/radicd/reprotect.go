package radicd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/msglog"
	"github.com/radic-project/radic/msglog/record"
)

// reprotectEvery is how often a protector checks that the other protectors
// of the nodes it protects hold everything it holds.
const reprotectEvery = 500 * time.Millisecond

// routineReprotect re-protects after ring changes: when a protector of
// node X dies (or a spare is promoted), X's next k members change, and every
// current protector of X that holds X's data copies to the other current
// protectors what they lack. Appends are idempotent, so two holders racing
// to fill the same replica are harmless.
func (d *Daemon) routineReprotect(ctx context.Context) {
	d.log.Info("RoutineReprotect starting")
	defer d.log.Info("RoutineReprotect stopped")
	t := time.NewTicker(reprotectEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, ok := d.runner.Status(ctx)
		if !ok || st.Fenced {
			continue
		}
		for _, x := range d.stores.nodes() {
			var m *heartbeat.MemberStatus
			for i := range st.Members {
				if st.Members[i].ID == x {
					m = &st.Members[i]
				}
			}
			if m == nil || m.State != "alive" || !slices.Contains(m.Protectors, d.self) {
				continue
			}
			for _, q := range m.Protectors {
				if q == d.self {
					continue
				}
				n, err := d.catchUp(ctx, x, q)
				if err != nil {
					d.log.Warn("re-protection failed", "protected", x, "replica", q, "err", err)
				} else if n > 0 {
					d.reprotected.Add(uint64(n))
					d.log.Info("re-protected", "protected", x, "replica", q, "records", n)
				}
			}
		}
	}
}

// catchUp sends to q the records of node x that q lacks; it returns how
// many it sent.
func (d *Daemon) catchUp(ctx context.Context, x, q heartbeat.NodeID) (int, error) {
	local := d.stores.lookup(x)
	if local == nil {
		return 0, nil
	}
	remote, err := d.remoteStreams(ctx, q, x)
	if err != nil {
		return 0, err
	}
	sent := 0
	for _, owner := range local.Owners() {
		for _, si := range local.Streams(owner) {
			from := si.Low
			if r, ok := remote[si.Key]; ok {
				if r.End >= si.End {
					continue
				}
				from = max(from, r.End)
				if r.End < si.Low {
					return sent, fmt.Errorf("replica %d of node %d ends stream %v at %d, below what is kept here (%d): cannot fill the gap", q, x, si.Key, r.End, si.Low)
				}
			}
			n, err := d.pushStream(ctx, local, q, x, si.Key, from)
			sent += n
			if err != nil {
				return sent, err
			}
		}
	}
	return sent, nil
}

func (d *Daemon) remoteStreams(ctx context.Context, q, x heartbeat.NodeID) (map[msglog.Key]msglog.StreamInfo, error) {
	addr, ok := d.loc.peerAddr(int(q))
	if !ok {
		return nil, fmt.Errorf("no address for node %d", q)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/v1/replica/streams?node=%d", addr, x), nil)
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("streams of node %d on %d: %s: %s", x, q, resp.Status, b)
	}
	var list []msglog.StreamInfo
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, err
	}
	out := make(map[msglog.Key]msglog.StreamInfo, len(list))
	for _, s := range list {
		out[s.Key] = s
	}
	return out, nil
}

// pushStream copies one stream from offset `from` in batches of about 1 MiB.
func (d *Daemon) pushStream(ctx context.Context, local *msglog.Store, q, x heartbeat.NodeID, k msglog.Key, from uint64) (int, error) {
	c := local.Read(k.Owner, k.Stream, from)
	var buf []byte
	n, batch := 0, 0
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		err := d.pushTo(ctx, q, x, buf)
		if err == nil {
			n += batch
		}
		buf, batch = buf[:0], 0
		return err
	}
	for {
		rec, err := c.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return n, err
		}
		buf = record.AppendRecord(buf, &rec)
		batch++
		if len(buf) >= 1<<20 {
			if err := flush(); err != nil {
				return n, err
			}
		}
	}
	return n, flush()
}
