package lifecycle

import "sync"

// keyCache remembers a value per key that can always be computed again (a key's uid, read back from the home;
// its posture, built from its shape): at most max entries, and when it is full it forgets them all rather than
// grow, so a process that sees millions of keys holds at most max of them. The zero value is not usable.
type keyCache[V any] struct {
	mu  sync.Mutex   // guards m
	m   map[string]V // key hex -> value; at most max
	max int
}

func newKeyCache[V any](max int) *keyCache[V] {
	if max <= 0 {
		max = DefaultMaxKeys
	}
	return &keyCache[V]{m: map[string]V{}, max: max}
}

func (c *keyCache[V]) load(k string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[k]
	return v, ok
}

func (c *keyCache[V]) store(k string, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		clear(c.m)
	}
	c.m[k] = v
}

func (c *keyCache[V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

func (c *keyCache[V]) delete(k string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, k)
}
