package heartbeat_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/radic-project/radic/heartbeat"
	"github.com/radic-project/radic/heartbeat/hbtest"
)

type cluster struct {
	t       *testing.T
	net     *hbtest.Network
	members []heartbeat.NodeID
	mu      sync.Mutex
	events  map[heartbeat.NodeID][]heartbeat.Event
	cancel  map[heartbeat.NodeID]context.CancelFunc
	done    map[heartbeat.NodeID]chan error
	runners map[heartbeat.NodeID]*heartbeat.Runner
	inc     uint64
}

func newCluster(t *testing.T, n int) *cluster {
	c := &cluster{t: t, net: hbtest.NewNetwork(1), events: map[heartbeat.NodeID][]heartbeat.Event{},
		cancel: map[heartbeat.NodeID]context.CancelFunc{}, done: map[heartbeat.NodeID]chan error{},
		runners: map[heartbeat.NodeID]*heartbeat.Runner{}}
	for i := range n {
		c.members = append(c.members, heartbeat.NodeID(i))
	}
	for _, id := range c.members {
		c.start(id)
	}
	return c
}

func (c *cluster) start(id heartbeat.NodeID) {
	c.inc++
	r, err := heartbeat.NewRunner(heartbeat.RunnerConfig{
		Core:      heartbeat.Config{Self: id, Members: c.members, Incarnation: c.inc},
		Transport: c.net.Endpoint(id),
		OnEvent: func(e heartbeat.Event) {
			c.mu.Lock()
			c.events[id] = append(c.events[id], e)
			c.mu.Unlock()
		},
	})
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	c.cancel[id], c.done[id], c.runners[id] = cancel, done, r
}

func (c *cluster) stop(id heartbeat.NodeID) {
	if c.done[id] == nil {
		return
	}
	c.cancel[id]()
	if err := <-c.done[id]; err != nil {
		c.t.Errorf("node %d: Run() = %v", id, err)
	}
	c.done[id] = nil
}

func (c *cluster) stopAll() {
	for _, id := range c.members {
		c.stop(id)
	}
}

func (c *cluster) count(on heartbeat.NodeID, kind heartbeat.EventKind, about heartbeat.NodeID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, e := range c.events[on] {
		if e.Kind == kind && e.Node == about {
			n++
		}
	}
	return n
}

func TestRunnerDetectsCrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 3)
		defer c.stopAll()
		time.Sleep(time.Second)
		st, ok := c.runners[0].Status(t.Context())
		if !ok || len(st.Ring) != 3 {
			t.Fatalf("ring of 0 = %+v", st.Ring)
		}
		c.stop(1)
		start := time.Now()
		for c.count(2, heartbeat.EventDeclared, 1) == 0 {
			time.Sleep(10 * time.Millisecond)
			if time.Since(start) > 2*time.Second {
				t.Fatal("crash of 1 not declared by 2 within 2s")
			}
		}
		if took := time.Since(start); took >= time.Second {
			t.Errorf("detection took %v, want < 1s", took)
		}
		time.Sleep(200 * time.Millisecond)
		if c.count(0, heartbeat.EventDeclared, 1) != 1 {
			t.Errorf("node 0 did not learn of the death")
		}
	})
}

func TestRunnerIsolatedNodeFencesAndRejoins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 4)
		defer c.stopAll()
		time.Sleep(time.Second)
		c.net.Isolate(2, c.members)
		time.Sleep(2 * time.Second)
		if c.count(2, heartbeat.EventFence, 2) != 1 || c.count(3, heartbeat.EventDeclared, 2) != 1 {
			t.Fatalf("events: %+v", c.events)
		}
		c.net.Heal()
		time.Sleep(time.Second)
		if c.count(2, heartbeat.EventRejoin, 2) != 1 {
			t.Fatalf("node 2 did not rejoin: %+v", c.events[2])
		}
		st, _ := c.runners[0].Status(t.Context())
		if len(st.Ring) != 4 {
			t.Errorf("ring after heal = %v", st.Ring)
		}
	})
}

func TestRunnerLossyNetworkNoFalsePositive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 5)
		defer c.stopAll()
		c.net.SetLoss(0.2)
		time.Sleep(20 * time.Second)
		for _, id := range c.members {
			for _, o := range c.members {
				if n := c.count(id, heartbeat.EventDeclared, o); n > 0 {
					t.Errorf("node %d declared %d dead on a 20%% lossy network", id, o)
				}
			}
		}
	})
}
