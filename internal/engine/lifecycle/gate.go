package lifecycle

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/flock"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// gates hands out the per-key gate. A gate is two locks taken in order: an in-process shared/exclusive lock (so
// goroutines queue without touching the file system) and a flock on the key's lock file (so processes that
// share the home queue too). Lifecycle operations (ensure, recycle, stop, remove) and the commands of the native
// exec take it exclusively, one at a time; commands whose caller asked to run concurrently take it shared, beside
// each other but never beside an exclusive holder. Different keys never wait for each other.
//
// A key's entry lives only while someone waits for or holds its gate: the last one out removes it, so a
// long-lived process that has seen millions of keys keeps only the busy ones. At most max entries live at once;
// past that a new key is refused with KEY_LIMIT (the existing keys go on).
type gates struct {
	home *Home
	max  int
	mu   sync.Mutex       // guards keys and every gate's waiters transitions to and from 0
	keys map[string]*gate // the keys with a waiter or a holder; at most max
}

type gate struct {
	mu       sync.Mutex
	excl     bool          // an exclusive holder has it (or is taking the file lock)
	shared   int           // shared holders (and the one taking the file lock for them)
	fileSh   bool          // the file lock is held shared, for the shared holders as a group
	taking   bool          // a shared holder is taking the file lock: the others wait for it
	pendingX int           // exclusive callers waiting: new shared callers let them go first
	changed  chan struct{} // closed and replaced at every release
	waiters  atomic.Int32  // callers queued or holding; the sweeper leaves a key with waiters alone
	file     *flock.Flock
}

// DefaultMaxKeys bounds the keys one process holds or waits for at once (gates, and the build gates).
const DefaultMaxKeys = 1 << 16

func newGates(h *Home, max int) *gates {
	if max <= 0 {
		max = DefaultMaxKeys
	}
	return &gates{home: h, max: max, keys: map[string]*gate{}}
}

// join counts a caller in at k's gate, making the entry when it is the first; it refuses a new key past the cap.
func (g *gates) join(k identity.Key) (*gate, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	gt, ok := g.keys[k.Hex()]
	if !ok {
		if len(g.keys) >= g.max {
			return nil, fault.New(fault.KeyLimit, "retry when fewer users' commands are running, or raise the limit (MaxKeys)",
				"this sandkeep already runs or queues commands for %d users, its limit; sandbox %s was not started", g.max, k.Short())
		}
		gt = &gate{file: flock.New(g.home.lockPath(k)), changed: make(chan struct{})}
		g.keys[k.Hex()] = gt
	}
	gt.waiters.Add(1)
	return gt, nil
}

// leave counts a caller out of k's gate; the last one out removes the entry.
func (g *gates) leave(k identity.Key, gt *gate) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gt.waiters.Add(-1) == 0 && g.keys[k.Hex()] == gt {
		delete(g.keys, k.Hex())
	}
}

// waiting is the number of callers waiting for or holding k's gate in this process.
func (g *gates) waiting(k identity.Key) int32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gt, ok := g.keys[k.Hex()]; ok {
		return gt.waiters.Load()
	}
	return 0
}

// size is the number of keys with an entry.
func (g *gates) size() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.keys)
}

func (gt *gate) broadcast() {
	close(gt.changed)
	gt.changed = make(chan struct{})
}

// waitNoticeAfter is how long a caller waits at a gate before the hook WhenWaiting put in its context is called.
const waitNoticeAfter = time.Second

type waitNoticeKey struct{}

// WhenWaiting returns ctx carrying notice: a gate wait under the returned context that has not ended after
// waitNoticeAfter calls it once, with the wait's bound, from another goroutine; the wait does not return before
// notice has. The CLI's stop and rm use it to say what they wait for instead of hanging without a word.
func WhenWaiting(ctx context.Context, notice func(bound time.Duration)) context.Context {
	return context.WithValue(ctx, waitNoticeKey{}, notice)
}

// noticeAfter arms ctx's WhenWaiting hook, if any, for a wait bounded by bound; stop disarms it, or waits for
// the hook when it already fired (so its output never interleaves with the caller's next).
func noticeAfter(ctx context.Context, bound time.Duration) (stop func()) {
	notice, _ := ctx.Value(waitNoticeKey{}).(func(time.Duration))
	if notice == nil {
		return func() {}
	}
	done := make(chan struct{})
	t := time.AfterFunc(waitNoticeAfter, func() {
		defer close(done)
		notice(bound)
	})
	return func() {
		if !t.Stop() {
			<-done
		}
	}
}

// acquire takes k's gate exclusively, waiting at most wait. It returns SANDBOX_BUSY when the wait runs out and
// the ctx error when the caller gives up first.
func (g *gates) acquire(ctx context.Context, k identity.Key, wait time.Duration) (release func(), err error) {
	return g.acquireMode(ctx, k, wait, false)
}

// acquireMode takes k's gate shared (beside other shared holders) or exclusively.
func (g *gates) acquireMode(ctx context.Context, k identity.Key, wait time.Duration, shared bool) (release func(), err error) {
	defer noticeAfter(ctx, wait)()
	gt, err := g.join(k)
	if err != nil {
		return nil, err
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	fail := func(err error) (func(), error) {
		g.leave(k, gt)
		if err == errWaitExpired {
			return nil, busy(k, wait)
		}
		return nil, fmt.Errorf("wait for sandbox %s: %w", k.Short(), err)
	}
	if !shared {
		gt.mu.Lock()
		gt.pendingX++
		gt.mu.Unlock()
	}
	for {
		gt.mu.Lock()
		var ok, takeFile bool
		switch {
		case !shared && !gt.excl && gt.shared == 0:
			gt.pendingX--
			gt.excl, ok, takeFile = true, true, true
		case shared && !gt.excl && gt.pendingX == 0 && !gt.taking:
			gt.shared++
			ok, takeFile = true, !gt.fileSh
			gt.taking = takeFile
		}
		changed := gt.changed
		gt.mu.Unlock()
		if ok && !takeFile {
			return g.releaser(k, gt, true), nil
		}
		if ok {
			err := lockFile(ctx, gt.file, timer.C, shared)
			gt.mu.Lock()
			if shared {
				gt.taking = false
				gt.fileSh = err == nil
				if err != nil {
					gt.shared--
				}
			} else if err != nil {
				gt.excl = false
			}
			gt.broadcast()
			gt.mu.Unlock()
			if err != nil {
				return fail(err)
			}
			return g.releaser(k, gt, shared), nil
		}
		select {
		case <-changed:
		case <-timer.C:
			if !shared {
				gt.mu.Lock()
				gt.pendingX--
				gt.broadcast()
				gt.mu.Unlock()
			}
			return fail(errWaitExpired)
		case <-ctx.Done():
			if !shared {
				gt.mu.Lock()
				gt.pendingX--
				gt.broadcast()
				gt.mu.Unlock()
			}
			return fail(context.Cause(ctx))
		}
	}
}

// tryAcquire takes k's gate exclusively only when nobody holds or waits for it (the sweeper's way in).
func (g *gates) tryAcquire(k identity.Key) (release func(), ok bool) {
	if g.waiting(k) > 0 {
		return nil, false
	}
	gt, err := g.join(k)
	if err != nil {
		return nil, false
	}
	gt.mu.Lock()
	if gt.excl || gt.shared > 0 || gt.pendingX > 0 {
		gt.mu.Unlock()
		g.leave(k, gt)
		return nil, false
	}
	gt.excl = true
	gt.mu.Unlock()
	locked, err := gt.file.TryLock()
	if err != nil || !locked {
		gt.mu.Lock()
		gt.excl = false
		gt.broadcast()
		gt.mu.Unlock()
		g.leave(k, gt)
		return nil, false
	}
	return g.releaser(k, gt, false), true
}

func (g *gates) releaser(k identity.Key, gt *gate, shared bool) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			gt.mu.Lock()
			if shared {
				gt.shared--
				if gt.shared == 0 && gt.fileSh {
					_ = gt.file.Unlock()
					gt.fileSh = false
				}
			} else {
				_ = gt.file.Unlock()
				gt.excl = false
			}
			gt.broadcast()
			gt.mu.Unlock()
			g.leave(k, gt)
		})
	}
}

var errWaitExpired = fmt.Errorf("gate wait expired")

// lockFile polls the flock: flock(2) has no timeout, and only one goroutine per process polls a given key
// (the others wait in process), so a short backoff costs little.
func lockFile(ctx context.Context, f *flock.Flock, expired <-chan time.Time, shared bool) error {
	delay := time.Millisecond
	try := f.TryLock
	if shared {
		try = f.TryRLock
	}
	for {
		ok, err := try()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-time.After(delay):
		case <-expired:
			return errWaitExpired
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		delay = min(delay*2, 25*time.Millisecond)
	}
}

func busy(k identity.Key, wait time.Duration) error {
	return fault.New(fault.SandboxBusy,
		"wait for the running command to finish, or raise the gate wait (--gate-wait / SANDKEEP_GATE_WAIT)",
		"sandbox for %s is busy: another command held it for longer than %s", k, wait)
}
