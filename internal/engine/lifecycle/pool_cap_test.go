package lifecycle

import (
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/driver/fake"
)

// poolTotal is the members ready or being made over every pool of m.
func poolTotal(m *Manager) (ready, making int) {
	for _, st := range m.Pools() {
		ready += st.Ready
		making += st.Making
	}
	return ready, making
}

// TestPoolCap: two pools of 3 under a cap of 4 hold 4 members in all, first come first served by template
// name; a claim's refill brings them back to 4, never past it.
func TestPoolCap(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	a, b := poolShape(t, m, "a"), poolShape(t, m, "b")
	ok, err := m.StartPools(t.Context(), []PoolSpec{{Shape: a, Size: 3}, {Shape: b, Size: 3}}, 4)
	if err != nil || !ok {
		t.Fatalf("StartPools = %v, %v", ok, err)
	}
	waitReady(t, m, "a", 3)
	waitReady(t, m, "b", 1)
	settled := func(what string, keys int) {
		t.Helper()
		time.Sleep(300 * time.Millisecond) // a refill past the cap would have started by now
		if ready, making := poolTotal(m); ready != 4 || making != 0 || len(e.list()) != 4+keys {
			t.Fatalf("%s: %d ready, %d being made, %d sandboxes; want 4 members in all and %d keys'", what, ready, making, len(e.list()), keys)
		}
	}
	settled("after the first fill", 0)
	if _, claimed := claimedBy(t, m, key(t, "acme", "alice"), a, "true"); !claimed {
		t.Fatal("the first command of a new key did not claim")
	}
	waitReady(t, m, "a", 3) // the refill takes the place the claim freed
	settled("after a claim and its refill", 1)
}

// TestPoolBackoffMissingImage: a pool whose image is missing does not try again at every wake-up: after a failed
// round it waits refillRetry, then twice that, ...; once the image is there, the next try fills the pool and the
// backoff is over.
func TestPoolBackoffMissingImage(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	sh, err := m.NewShape("late", func(c *Config) { c.Image = "late:1" })
	if err != nil {
		t.Fatal(err)
	}
	ok, err := m.StartPools(t.Context(), []PoolSpec{{Shape: sh, Size: 2}}, 0)
	if err != nil || !ok {
		t.Fatalf("StartPools = %v, %v", ok, err)
	}
	idle := func() int { // waits for the round in flight to end; returns the resolves so far
		t.Helper()
		waitFor(t, "the round to end", func() bool { _, making := poolTotal(m); return making == 0 })
		return e.drv.Calls(fake.OpResolve)
	}
	poke := func() int {
		t.Helper()
		for range 3 {
			m.poolSet().poke()
			time.Sleep(50 * time.Millisecond)
		}
		return idle()
	}
	waitFor(t, "a first try", func() bool { return e.drv.Calls(fake.OpResolve) > 0 })
	first := idle()
	if n := poke(); n != first {
		t.Fatalf("tried again at once: %d resolves, then %d", first, n)
	}
	e.clock.Advance(refillRetry)
	second := poke()
	if second == first {
		t.Fatalf("did not try again after %s", refillRetry)
	}
	e.clock.Advance(refillRetry) // the second failure in a row waits twice as long
	if n := poke(); n != second {
		t.Fatalf("tried again %s after the second failure: %d resolves, then %d", refillRetry, second, n)
	}
	e.drv.AddImage("late:1", testImageID)
	e.clock.Advance(refillRetry)
	poke()
	waitReady(t, m, "late", 2)
	if backoff(1) != refillRetry || backoff(2) != 2*refillRetry || backoff(100) != refillBackoffMax {
		t.Errorf("backoff: %s %s %s", backoff(1), backoff(2), backoff(100))
	}
}
