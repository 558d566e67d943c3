package build

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestGates: builds of one context run one at a time, others in parallel, and no entry outlives its builds.
func TestGates(t *testing.T) {
	var g Gates
	var running, peak atomic.Int32
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			key := "ctx-a"
			if i%2 == 1 {
				key = "ctx-b" + string(rune('0'+i%10))
			}
			unlock := g.Lock(key)
			defer unlock()
			if key == "ctx-a" {
				if n := running.Add(1); n > peak.Load() {
					peak.Store(n)
				}
				defer running.Add(-1)
			}
		})
	}
	wg.Wait()
	if peak.Load() != 1 {
		t.Errorf("%d builds of one context at once, want 1", peak.Load())
	}
	if n := g.Len(); n != 0 {
		t.Errorf("%d build gates kept after every build ended, want 0", n)
	}
}
