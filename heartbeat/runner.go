package heartbeat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Transport carries heartbeat datagrams between ring members. UDP
// (hbudp), an in-memory network (hbtest) and, later, the emulated Blue Gene
// fabric implement it.
type Transport interface {
	// Send transmits b, one encoded Message of at most MaxDatagram bytes,
	// to member to. It must not block for longer than a socket write and
	// must not keep b. Losing a datagram is not an error: the protocol
	// tolerates loss; Send returns an error only when the transport cannot
	// work at all (closed, unknown member).
	Send(to NodeID, b []byte) error
	// Recv blocks until a datagram arrives, copies it into b (len(b) >=
	// MaxDatagram) and returns its length. After Close it returns an error
	// wrapping net.ErrClosed.
	Recv(b []byte) (int, error)
	// Close ends Recv and releases the transport.
	Close() error
}

// ErrSuperseded is returned by Runner.Run when a newer incarnation of this
// node exists: this process is stale and must not run.
var ErrSuperseded = errors.New("heartbeat: superseded by a newer incarnation of this node")

// RunnerConfig configures a Runner.
type RunnerConfig struct {
	Core      Config
	Transport Transport
	Stats     *Stats       // may be nil
	Logger    *slog.Logger // may be nil
	// OnEvent is called from the runner's goroutine for every event, in
	// order; an EventFence handler must have stopped the node's managed
	// processes when it returns.
	OnEvent func(Event)
}

// Runner drives one Node with real (or synctest) time over a Transport.
// One goroutine, RoutineRun, owns the Node.
type Runner struct {
	cfg    RunnerConfig
	log    *slog.Logger
	node   *Node
	in     chan Message
	status chan chan Status
	susp   chan NodeID
}

// NewRunner validates cfg and builds the core.
func NewRunner(cfg RunnerConfig) (*Runner, error) {
	if cfg.Transport == nil {
		return nil, fmt.Errorf("%w: no transport", ErrConfig)
	}
	if cfg.Stats == nil {
		cfg.Stats = new(Stats)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n, err := New(cfg.Core, cfg.Stats, time.Now())
	if err != nil {
		return nil, err
	}
	return &Runner{
		cfg: cfg, log: log, node: n,
		in:     make(chan Message, 256),
		status: make(chan chan Status),
		susp:   make(chan NodeID, 16),
	}, nil
}

// Config returns the defaulted core configuration.
func (r *Runner) Config() Config { return r.node.Config() }

// Status asks the run loop for a snapshot; it returns false when the
// runner is not running.
func (r *Runner) Status(ctx context.Context) (Status, bool) {
	c := make(chan Status, 1)
	select {
	case r.status <- c:
		return <-c, true
	case <-ctx.Done():
		return Status{}, false
	}
}

// Suspect escalates a suspicion of id (an observer's socket error).
func (r *Runner) Suspect(id NodeID) {
	select {
	case r.susp <- id:
	default:
	}
}

// Run runs the protocol until ctx ends (nil) or the node is superseded
// (ErrSuperseded). It closes the transport on return.
func (r *Runner) Run(ctx context.Context) error {
	_, inc := r.node.Self()
	log := r.log.With("routine", "RoutineRun")
	log.Info("heartbeat ring member starting", "incarnation", inc,
		"period", r.node.cfg.Period, "timeout", r.node.cfg.Timeout,
		"probe_timeout", r.node.cfg.ProbeTimeout, "fence_timeout", r.node.cfg.FenceTimeout)
	defer log.Info("heartbeat ring member stopped")

	var wg sync.WaitGroup
	defer wg.Wait()
	defer r.cfg.Transport.Close()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { r.routineRecv(rctx) })

	timer := time.NewTimer(0)
	defer timer.Stop()
	var err error
	apply := func() {
		rd := r.node.Ready()
		buf := make([]byte, 0, MaxDatagram)
		for i := range rd.Messages {
			buf = rd.Messages[i].Append(buf[:0])
			if e := r.cfg.Transport.Send(rd.Messages[i].To, buf); e != nil {
				log.Debug("send failed", "to", rd.Messages[i].To, "err", e)
			}
		}
		for _, e := range rd.Events {
			r.logEvent(log, e)
			if r.cfg.OnEvent != nil {
				r.cfg.OnEvent(e)
			}
			if e.Kind == EventSuperseded {
				err = ErrSuperseded
			}
		}
		d := time.Until(rd.NextTick)
		timer.Reset(max(d, 0))
	}
	for err == nil {
		select {
		case <-ctx.Done():
			return nil
		case m := <-r.in:
			r.node.Step(m, time.Now())
		case <-timer.C:
			// Read what arrived first: a node that was not scheduled
			// must not blame its peers for datagrams it has not read.
		drain:
			for {
				select {
				case m := <-r.in:
					r.node.Step(m, time.Now())
				default:
					break drain
				}
			}
			r.node.Tick(time.Now())
		case id := <-r.susp:
			r.node.Suspect(id, time.Now())
		case c := <-r.status:
			c <- r.node.Status(time.Now())
		}
		apply()
	}
	return err
}

func (r *Runner) logEvent(log *slog.Logger, e Event) {
	attrs := []any{"event", e.Kind.String(), "peer", e.Node, "peer_incarnation", e.Inc}
	if e.Cause != "" {
		attrs = append(attrs, "cause", e.Cause)
	}
	switch e.Kind {
	case EventDeclared:
		attrs = append(attrs, "by_me", e.ByMe)
		if e.Detection > 0 {
			attrs = append(attrs, "detection", e.Detection)
		}
		log.Warn("node declared dead", attrs...)
	case EventFence:
		log.Error("cut off from the ring: fencing this node", attrs...)
	case EventSuperseded:
		log.Error("a newer incarnation of this node exists: stopping", attrs...)
	case EventSuspect, EventRefuted:
		log.Info("watchdog "+e.Kind.String(), attrs...)
	default:
		log.Info("ring "+e.Kind.String(), attrs...)
	}
}

func (r *Runner) routineRecv(ctx context.Context) {
	buf := make([]byte, MaxDatagram+1)
	for {
		n, err := r.cfg.Transport.Recv(buf)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Error("heartbeat transport failed", "err", err)
			}
			return
		}
		m, err := Decode(buf[:n])
		if err != nil {
			r.log.Debug("bad datagram", "err", err)
			continue
		}
		select {
		case r.in <- m:
		case <-ctx.Done():
			return
		}
	}
}
