package build

import "sync"

// Gates lets one build of a given context run at a time; later ones wait and then reuse the engine's cache. A
// context's entry lives only while a build of it runs or waits, so a long-lived process keeps none for the
// contexts it built before. The zero value is ready to use.
type Gates struct {
	mu   sync.Mutex            // guards keys and every entry's refs
	keys map[string]*buildGate // contexts with a build running or waiting
}

type buildGate struct {
	mu   sync.Mutex
	refs int // builds holding or waiting for mu; guarded by Gates.mu
}

// Lock waits until no other build of key runs and returns the unlock.
func (g *Gates) Lock(key string) (unlock func()) {
	g.mu.Lock()
	if g.keys == nil {
		g.keys = map[string]*buildGate{}
	}
	bg, ok := g.keys[key]
	if !ok {
		bg = &buildGate{}
		g.keys[key] = bg
	}
	bg.refs++
	g.mu.Unlock()

	bg.mu.Lock()
	return func() {
		bg.mu.Unlock()
		g.mu.Lock()
		defer g.mu.Unlock()
		if bg.refs--; bg.refs == 0 {
			delete(g.keys, key)
		}
	}
}

// Len is the number of contexts with a build running or waiting.
func (g *Gates) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.keys)
}
