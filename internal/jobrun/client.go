package jobrun

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/radic-project/radic/internal/launch"
)

// Daemons says where node's radicd listens (HOST:PORT). It is asked again
// on every connection, so a node that moved is found where it is now. The
// virtual cluster answers from its state; a launcher on real hosts (issue
// 15: --daemon HOST:PORT) can answer from the ring.
type Daemons func(node int) (string, error)

// Client speaks radicd's launch API (package internal/launch) to one
// node's daemon.
type Client struct {
	Node    int
	Daemons Daemons
	HTTP    *http.Client
	// Moved, if set, returns a channel closed once Node's daemon is no
	// longer at addr: a request in flight there is then ended (its
	// connection may hang on an address that is gone).
	Moved func(node int, addr string) <-chan struct{}
}

// Error is a failed call to a node's radicd.
type Error struct {
	Node   int
	Addr   string // "" when the address itself was unknown
	Op     string // "launch rank 2", "start rank 2", ...
	Status int    // the HTTP status; 0 when radicd was not reached
	Msg    string // radicd's explanation
	Err    error  // the transport's error, when Status is 0
}

func (e *Error) Error() string {
	where := fmt.Sprintf("node %d's radicd", e.Node)
	if e.Addr != "" {
		where += " (" + e.Addr + ")"
	}
	if e.Status == 0 {
		return fmt.Sprintf("%s: %s: unreachable: %v", where, e.Op, e.Err)
	}
	return fmt.Sprintf("%s: %s: %s", where, e.Op, e.Msg)
}

func (e *Error) Unwrap() error { return e.Err }

// Unreachable reports whether err is a failure to reach a radicd (down,
// cut off, moved) rather than its answer.
func Unreachable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == 0
}

// NewHTTPClient is the client a launcher shares between its daemons: a
// connection per long poll (three per rank), and a dead address noticed
// within seconds.
func NewHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     30 * time.Second,
	}}
}

// do sends one request; a non-2xx answer becomes an *Error with radicd's
// message. The caller closes the returned body.
func (c *Client) do(ctx context.Context, op, method, path string, body io.Reader) (*http.Response, error) {
	addr, err := c.Daemons(c.Node)
	if err != nil {
		return nil, &Error{Node: c.Node, Op: op, Err: err}
	}
	ctx, cancel := context.WithCancel(ctx)
	if c.Moved != nil {
		moved := c.Moved(c.Node, addr)
		go func() {
			select {
			case <-moved:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, body)
	if err != nil {
		cancel()
		return nil, &Error{Node: c.Node, Addr: addr, Op: op, Err: err}
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		cancel()
		return nil, &Error{Node: c.Node, Addr: addr, Op: op, Err: err}
	}
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		cancel()
		return nil, &Error{Node: c.Node, Addr: addr, Op: op, Status: resp.StatusCode, Msg: strings.TrimSpace(string(msg))}
	}
	resp.Body = cancelOnClose{resp.Body, cancel}
	return resp, nil
}

// cancelOnClose ends a request's context with its body.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

func rankPath(job string, rank int) string {
	return "/v1/jobs/" + url.PathEscape(job) + "/ranks/" + strconv.Itoa(rank)
}

// Launch creates rec's rank, held at its gate, after radicd stored rec
// with its protectors.
func (c *Client) Launch(ctx context.Context, rec *launch.Record) (launch.Started, error) {
	return c.launch(ctx, rec, "")
}

// LaunchInsteadOf creates the rank on this node in place of node lost,
// which could not: radicd does so only once its ring has declared lost
// dead (503 before), and not if lost had created it (409: its recovery
// restarts it).
func (c *Client) LaunchInsteadOf(ctx context.Context, rec *launch.Record, lost int) (launch.Started, error) {
	return c.launch(ctx, rec, "?instead-of="+strconv.Itoa(lost))
}

func (c *Client) launch(ctx context.Context, rec *launch.Record, query string) (launch.Started, error) {
	var st launch.Started
	b, err := json.Marshal(rec)
	if err != nil {
		return st, err
	}
	resp, err := c.do(ctx, fmt.Sprintf("launch rank %d", rec.Rank), http.MethodPost, "/v1/jobs/"+url.PathEscape(rec.Job)+"/ranks"+query, bytes.NewReader(b))
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&st)
	return st, err
}

// Start lets a created rank run its program.
func (c *Client) Start(ctx context.Context, job string, rank int) error {
	resp, err := c.do(ctx, fmt.Sprintf("start rank %d", rank), http.MethodPost, rankPath(job, rank)+"/start", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Status is the rank's state; with wait > 0 radicd answers once the rank
// has exited or wait has passed.
func (c *Client) Status(ctx context.Context, job string, rank int, wait time.Duration) (launch.RankStatus, error) {
	var st launch.RankStatus
	p := rankPath(job, rank)
	if wait > 0 {
		p += "?wait=" + wait.String()
	}
	resp, err := c.do(ctx, fmt.Sprintf("status of rank %d", rank), http.MethodGet, p, nil)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&st)
	return st, err
}

// Output asks for stream's bytes from offset from (everything before it
// is released on radicd). The body holds the bytes; eof says whether they
// end the stream. The caller closes body.
func (c *Client) Output(ctx context.Context, job string, rank int, stream string, from uint64, wait time.Duration) (body io.ReadCloser, eof bool, err error) {
	p := fmt.Sprintf("%s/output?stream=%s&from=%d&wait=%s", rankPath(job, rank), stream, from, wait)
	resp, err := c.do(ctx, fmt.Sprintf("%s of rank %d", stream, rank), http.MethodGet, p, nil)
	if err != nil {
		return nil, false, err
	}
	if got := resp.Header.Get(launch.HeaderOffset); got != strconv.FormatUint(from, 10) {
		resp.Body.Close()
		return nil, false, fmt.Errorf("%s of rank %d: asked from %d, got offset %q", stream, rank, from, got)
	}
	return resp.Body, resp.Header.Get(launch.HeaderEOF) == "1", nil
}

// Signal signals the rank's process group.
func (c *Client) Signal(ctx context.Context, job string, rank int, sig syscall.Signal) error {
	name := launch.SignalName(sig)
	if name == "" {
		return fmt.Errorf("signal %v cannot be sent through radicd", sig)
	}
	resp, err := c.do(ctx, fmt.Sprintf("SIG%s to rank %d", name, rank), http.MethodPost, rankPath(job, rank)+"/signal?sig="+name, nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Stdin feeds r to the rank's stdin until r ends, then closes it.
func (c *Client) Stdin(ctx context.Context, job string, rank int, r io.Reader) error {
	resp, err := c.do(ctx, fmt.Sprintf("stdin of rank %d", rank), http.MethodPost, rankPath(job, rank)+"/stdin", r)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Forget tells radicd the launcher is done with job: ranks still there
// are killed and forgotten.
func (c *Client) Forget(ctx context.Context, job string) error {
	resp, err := c.do(ctx, "forget job "+job, http.MethodDelete, "/v1/jobs/"+url.PathEscape(job), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// OutputEpoch is Output from the instance at epoch only: any other
// instance of the rank answers 409 (a restarted rank's offsets start
// again at 0).
func (c *Client) OutputEpoch(ctx context.Context, job string, rank int, stream string, from uint64, wait time.Duration, epoch uint64) (body io.ReadCloser, eof bool, err error) {
	p := fmt.Sprintf("%s/output?stream=%s&from=%d&wait=%s&epoch=%d", rankPath(job, rank), stream, from, wait, epoch)
	resp, err := c.do(ctx, fmt.Sprintf("%s of rank %d", stream, rank), http.MethodGet, p, nil)
	if err != nil {
		return nil, false, err
	}
	if got := resp.Header.Get(launch.HeaderOffset); got != strconv.FormatUint(from, 10) {
		resp.Body.Close()
		return nil, false, fmt.Errorf("%s of rank %d: asked from %d, got offset %q", stream, rank, from, got)
	}
	return resp.Body, resp.Header.Get(launch.HeaderEOF) == "1", nil
}

// Recovery is where the ranks of a job launched with recovery run now,
// and the recoveries so far, as node's radicd knows them.
func (c *Client) Recovery(ctx context.Context, job string) (launch.JobRecovery, error) {
	var jr launch.JobRecovery
	resp, err := c.do(ctx, "recovery of job "+job, http.MethodGet, "/v1/recovery/jobs/"+url.PathEscape(job), nil)
	if err != nil {
		return jr, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&jr)
	return jr, err
}

// Divergence reports a restarted rank's divergence to node's radicd
// (radic_divergences_total).
func (c *Client) Divergence(ctx context.Context, dv launch.Divergence) error {
	b, err := json.Marshal(dv)
	if err != nil {
		return err
	}
	resp, err := c.do(ctx, fmt.Sprintf("divergence of rank %d", dv.Rank), http.MethodPost, "/v1/recovery/divergence", bytes.NewReader(b))
	if err != nil {
		return err
	}
	return resp.Body.Close()
}
