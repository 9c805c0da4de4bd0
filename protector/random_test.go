package protector

import (
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// testSeed is TEST_SEED from the environment, or a fresh one; it is
// printed so that a failure can be replayed.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv("TEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("TEST_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("TEST_SEED=%d", seed)
	return seed
}

// TestRandomFaults runs seeded random fault sequences on rings of 4-6
// nodes with 0-2 spares and k of 1 or 2: crashes, kill-rank, short and long
// freezes, minority partitions, at random moments (some during an earlier
// recovery), with random latencies. The step invariants hold throughout;
// at the end every group not reported lost runs exactly once, live and
// protected (world.settled).
func TestRandomFaults(t *testing.T) {
	seed := testSeed(t)
	runs := 40
	if testing.Short() {
		runs = 10
	}
	for i := range runs {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		n := 4 + rng.IntN(3)
		var spares []NodeID
		for s := range rng.IntN(3) {
			spares = append(spares, NodeID(n+s))
		}
		k := 1 + rng.IntN(2)
		w := newWorld(t, n, spares, func(c *Config) { c.Protectors = k; c.RestartTimeout = 400 * time.Millisecond })
		w.rng = rng
		w.jitter = 3 * time.Millisecond
		w.startDelay = time.Duration(10+rng.IntN(100)) * time.Millisecond
		w.replayDelay = time.Duration(10+rng.IntN(300)) * time.Millisecond
		w.viewLag = time.Duration(80+rng.IntN(40)) * time.Millisecond
		if rng.IntN(4) == 0 {
			w.silent[w.ids[len(w.ids)-1]] = true
		}
		faults := 1 + rng.IntN(3)
		var log []string
		w.run(time.Duration(50+rng.IntN(300)) * time.Millisecond)
		for range faults {
			var cand []NodeID
			for _, id := range w.ids {
				if w.up(id) && !w.fenced[id] {
					cand = append(cand, id)
				}
			}
			// Keep a strict majority of the ring as launched alive,
			// so that recovery is possible at all.
			if 2*(len(cand)-1) <= len(w.ids) {
				break
			}
			x := cand[rng.IntN(len(cand))]
			switch f := rng.IntN(5); f {
			case 0, 1:
				w.crash(x)
				log = append(log, "crash "+strconv.Itoa(int(x)))
			case 2:
				var hosted []GroupID
				for g, is := range w.running {
					if len(is) == 1 && is[0].node == x && w.ms[x].groups[g].rec == nil && w.ms[x].groups[g].Stage == StageLive {
						hosted = append(hosted, g)
					}
				}
				if len(hosted) > 0 {
					slices.Sort(hosted)
					g := hosted[rng.IntN(len(hosted))]
					w.exitProc(g)
					log = append(log, "exit group "+strconv.Itoa(int(g)))
				}
			case 3:
				d := time.Duration(100+rng.IntN(1500)) * time.Millisecond
				w.freeze(x)
				w.after(d, None, func() { w.thaw(x) })
				log = append(log, "freeze "+strconv.Itoa(int(x))+" for "+d.String())
			case 4:
				w.partition(x)
				w.after(time.Duration(200+rng.IntN(1500))*time.Millisecond, None, w.heal)
				log = append(log, "isolate "+strconv.Itoa(int(x)))
			}
			w.run(time.Duration(rng.IntN(1500)) * time.Millisecond)
		}
		w.run(3 * time.Second)
		w.heal()
		for id := range w.frozen {
			w.thaw(id)
		}
		w.run(3 * time.Second)
		if testing.Verbose() || t.Failed() {
			t.Logf("run %d: n=%d spares=%v k=%d faults=%v failures=%d", i, n, spares, k, log, len(w.failed))
		}
		w.settled()
		if t.Failed() {
			t.Fatalf("run %d failed: TEST_SEED=%d; %v", i, seed, w)
		}
	}
}
