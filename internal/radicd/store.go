package radicd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/msglog"
	"github.com/radic-project/radic/msglog/record"
)

// stores holds one msglog.Store per protected node, under
// STATE-DIR/store/node-ID: the critical data of node ID's processes, which
// this node keeps as one of ID's k protectors.
type stores struct {
	dir  string
	opts msglog.Options
	log  *slog.Logger

	mu sync.Mutex
	// +checklocks:mu
	byNode map[heartbeat.NodeID]*msglog.Store
}

func openStores(dir string, opts msglog.Options, log *slog.Logger) (*stores, error) {
	s := &stores{dir: dir, opts: opts, log: log, byNode: map[heartbeat.NodeID]*msglog.Store{}}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store dir: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("store dir: %w", err)
	}
	for _, e := range ents {
		id, ok := strings.CutPrefix(e.Name(), "node-")
		n, err := strconv.ParseUint(id, 10, 32)
		if !ok || err != nil || !e.IsDir() {
			continue
		}
		if _, err := s.get(heartbeat.NodeID(n)); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// get opens (creating) the store of node id.
func (s *stores) get(id heartbeat.NodeID) (*msglog.Store, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.byNode[id]; st != nil {
		return st, nil
	}
	o := s.opts
	o.Logf = func(format string, args ...any) {
		s.log.Info(fmt.Sprintf(format, args...), "store_node", id)
	}
	st, err := msglog.Open(filepath.Join(s.dir, fmt.Sprintf("node-%d", id)), o)
	if err != nil {
		return nil, fmt.Errorf("open store of node %d: %w", id, err)
	}
	s.byNode[id] = st
	return st, nil
}

func (s *stores) lookup(id heartbeat.NodeID) *msglog.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byNode[id]
}

func (s *stores) nodes() []heartbeat.NodeID {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []heartbeat.NodeID
	for id := range s.byNode {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// totals sums the stores' stats: bytes on disk, records stored.
func (s *stores) totals() (bytes int64, records uint64, full uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.byNode {
		x := st.Stats()
		bytes += x.Bytes.Load()
		records += x.Appends.Load() - x.Duplicates.Load()
		full += x.FullErrors.Load()
	}
	return
}

func (s *stores) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for id, st := range s.byNode {
		if err := st.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close store of node %d: %w", id, err))
		}
	}
	s.byNode = map[heartbeat.NodeID]*msglog.Store{}
	return errors.Join(errs...)
}

// decodeRecords splits a body of concatenated records.
func decodeRecords(b []byte) ([]msglog.Record, error) {
	var out []msglog.Record
	for len(b) > 0 {
		r, n, err := record.Decode(b)
		if err != nil {
			return nil, err
		}
		r.Payload = bytes.Clone(r.Payload)
		out = append(out, r)
		b = b[n:]
	}
	return out, nil
}

// statusFor maps store errors to HTTP: a full store is back-pressure
// (507, retry after truncation), a conflict or gap is the client's (409).
func statusFor(err error) int {
	switch {
	case errors.Is(err, msglog.ErrFull):
		return http.StatusInsufficientStorage
	case errors.Is(err, msglog.ErrConflict), errors.Is(err, msglog.ErrGap), errors.Is(err, msglog.ErrTruncated):
		return http.StatusConflict
	case errors.Is(err, msglog.ErrInvalid):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

const maxBody = 64 << 20

func nodeParam(r *http.Request) (heartbeat.NodeID, error) {
	n, err := strconv.ParseUint(r.URL.Query().Get("node"), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("bad or missing node=: %v", err)
	}
	return heartbeat.NodeID(n), nil
}

// handleReplicaAppend stores records of node=ID sent by ID (or by another
// replica catching this one up).
func (d *Daemon) handleReplicaAppend(w http.ResponseWriter, r *http.Request) {
	id, err := nodeParam(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	body, err := readBody(w, r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	recs, err := decodeRecords(body)
	if err != nil {
		http.Error(w, "records: "+err.Error(), http.StatusBadRequest)
		return
	}
	st, err := d.stores.get(id)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if _, err := st.AppendBatch(recs); err != nil {
		if errors.Is(err, msglog.ErrFull) {
			w.Header().Set("Retry-After", "1")
		}
		http.Error(w, err.Error(), statusFor(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// readBody reads a request body of at most maxBody bytes, into one buffer
// of its announced length: growing one (io.ReadAll) touched fresh pages
// several times over, which this VM pays for per page (a restarted rank's
// log, tens of MB, went to its new protectors at ~70 MB/s).
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, maxBody)
	if n := r.ContentLength; n > 0 && n <= maxBody {
		b := make([]byte, n)
		if _, err := io.ReadFull(body, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	return io.ReadAll(body)
}

// handleReplicaStreams lists node=ID's streams held here.
func (d *Daemon) handleReplicaStreams(w http.ResponseWriter, r *http.Request) {
	id, err := nodeParam(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// The listing covers every batch acknowledged: its readers (a replay,
	// a re-protection) read the streams it names up to their ends.
	if err := d.settleLog(r.Context(), id); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	var out []msglog.StreamInfo
	if st := d.stores.lookup(id); st != nil {
		for _, o := range st.Owners() {
			out = append(out, st.Streams(o)...)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// handleReplicaRead streams records of node=ID, owner, stream from offset
// from, concatenated.
func (d *Daemon) handleReplicaRead(w http.ResponseWriter, r *http.Request) {
	id, err := nodeParam(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	q := r.URL.Query()
	owner, err1 := strconv.ParseUint(q.Get("owner"), 10, 64)
	stream, err2 := strconv.ParseUint(q.Get("stream"), 10, 64)
	from, err3 := strconv.ParseUint(q.Get("from"), 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		http.Error(w, "owner, stream, from: "+err.Error(), http.StatusBadRequest)
		return
	}
	st := d.stores.lookup(id)
	if st == nil {
		http.Error(w, "no store for that node", http.StatusNotFound)
		return
	}
	c := st.Read(owner, stream, from)
	// Records go out in writes of about replicaReadChunk, encoded
	// straight from the store into one reused buffer.
	buf := make([]byte, 0, replicaReadChunk+64<<10)
	w.Header().Set("Content-Type", "application/octet-stream")
	for {
		var err error
		buf, err = c.AppendNext(buf)
		end := errors.Is(err, io.EOF)
		if err != nil && !end {
			// Headers may be out already; a short body fails the
			// client's record decoding, never silently.
			http.Error(w, err.Error(), statusFor(err))
			return
		}
		if end || len(buf) >= replicaReadChunk {
			if _, werr := w.Write(buf); werr != nil || end {
				return
			}
			buf = buf[:0]
		}
	}
}

// replicaReadChunk is how much handleReplicaRead writes at once.
const replicaReadChunk = 1 << 20

// handleLog takes records of this node's own processes and returns once
// every current protector (the next k active ring members) has stored
// them: the pessimistic log's acknowledgement.
func (d *Daemon) handleLog(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if _, err := decodeRecords(body); err != nil {
		http.Error(w, "records: "+err.Error(), http.StatusBadRequest)
		return
	}
	prots, err := d.replicate(r.Context(), body)
	w.Header().Set("X-Radic-Protectors", joinIDs(prots))
	if err != nil {
		var he *httpError
		code := http.StatusServiceUnavailable
		if errors.As(err, &he) && he.code != 0 {
			code = he.code
		}
		http.Error(w, err.Error(), code)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

// ringProtectors is this node's protectors as its ring names them now:
// an error when the daemon stops, the node is fenced or none is alive.
func (d *Daemon) ringProtectors(ctx context.Context) ([]heartbeat.NodeID, error) {
	st, ok := d.runner.Status(ctx)
	if !ok {
		return nil, errors.New("daemon stopping")
	}
	if st.Fenced {
		return nil, &httpError{http.StatusServiceUnavailable, "this node is fenced"}
	}
	var prots []heartbeat.NodeID
	for _, m := range st.Members {
		if m.ID == st.Self {
			prots = m.Protectors
		}
	}
	if len(prots) == 0 {
		return nil, &httpError{http.StatusServiceUnavailable, "no protector alive"}
	}
	return prots, nil
}

// replicate sends encoded records of this node to all its protectors.
func (d *Daemon) replicate(ctx context.Context, body []byte) ([]heartbeat.NodeID, error) {
	prots, err := d.ringProtectors(ctx)
	if err != nil {
		return nil, err
	}
	errs := make([]error, len(prots))
	var wg sync.WaitGroup
	for i, p := range prots {
		wg.Go(func() { errs[i] = d.pushTo(ctx, p, d.self, body) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		d.replErrors.Add(1)
		return prots, err
	}
	if len(prots) < d.cfg.Protectors {
		d.replErrors.Add(1)
		return prots, &httpError{http.StatusServiceUnavailable,
			fmt.Sprintf("only %d of %d protectors alive: stored on %s", len(prots), d.cfg.Protectors, joinIDs(prots))}
	}
	return prots, nil
}

// pushTo stores encoded records of node `of` on peer p.
func (d *Daemon) pushTo(ctx context.Context, p, of heartbeat.NodeID, body []byte) error {
	addr, ok := d.loc.peerAddr(int(p))
	if !ok {
		return fmt.Errorf("protector %d: no address", p)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	url := fmt.Sprintf("http://%s/v1/replica/append?node=%d", addr, of)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return fmt.Errorf("protector %d: %w", p, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return &httpError{resp.StatusCode, fmt.Sprintf("protector %d: %s: %s", p, resp.Status, strings.TrimSpace(string(msg)))}
	}
	return nil
}

func joinIDs(ids []heartbeat.NodeID) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.Itoa(int(id))
	}
	return strings.Join(s, ",")
}
