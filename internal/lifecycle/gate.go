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

// gates hands out the per-key gate. A gate is two locks taken in order: an in-process semaphore (so
// goroutines queue without touching the file system) and a flock on the key's lock file (so processes that
// share the home queue too). Different keys never wait for each other.
type gates struct {
	home *Home
	mu   sync.Mutex       // guards keys
	keys map[string]*gate // one per key seen since start; a gate is a few bytes and an fd while held
}

type gate struct {
	sem     chan struct{} // capacity 1: holding the slot means this process may try the flock
	waiters atomic.Int32  // callers queued or holding; the sweeper leaves a key with waiters alone
	file    *flock.Flock
}

func newGates(h *Home) *gates { return &gates{home: h, keys: map[string]*gate{}} }

func (g *gates) get(k identity.Key) *gate {
	g.mu.Lock()
	defer g.mu.Unlock()
	gt, ok := g.keys[k.Hex()]
	if !ok {
		gt = &gate{sem: make(chan struct{}, 1), file: flock.New(g.home.lockPath(k))}
		g.keys[k.Hex()] = gt
	}
	return gt
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

// acquire takes k's gate, waiting at most wait. It returns SANDBOX_BUSY when the wait runs out and the ctx
// error when the caller gives up first.
func (g *gates) acquire(ctx context.Context, k identity.Key, wait time.Duration) (release func(), err error) {
	defer noticeAfter(ctx, wait)()
	gt := g.get(k)
	gt.waiters.Add(1)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case gt.sem <- struct{}{}:
	case <-timer.C:
		gt.waiters.Add(-1)
		return nil, busy(k, wait)
	case <-ctx.Done():
		gt.waiters.Add(-1)
		return nil, fmt.Errorf("wait for sandbox %s: %w", k.Short(), context.Cause(ctx))
	}
	if err := lockFile(ctx, gt.file, timer.C); err != nil {
		<-gt.sem
		gt.waiters.Add(-1)
		if err == errWaitExpired {
			return nil, busy(k, wait)
		}
		return nil, fmt.Errorf("wait for sandbox %s: %w", k.Short(), err)
	}
	return gt.releaser(), nil
}

// tryAcquire takes k's gate only when nobody holds or waits for it (the sweeper's way in).
func (g *gates) tryAcquire(k identity.Key) (release func(), ok bool) {
	gt := g.get(k)
	if gt.waiters.Load() > 0 {
		return nil, false
	}
	select {
	case gt.sem <- struct{}{}:
	default:
		return nil, false
	}
	gt.waiters.Add(1)
	locked, err := gt.file.TryLock()
	if err != nil || !locked {
		gt.waiters.Add(-1)
		<-gt.sem
		return nil, false
	}
	return gt.releaser(), true
}

func (gt *gate) releaser() func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			_ = gt.file.Unlock()
			gt.waiters.Add(-1)
			<-gt.sem
		})
	}
}

var errWaitExpired = fmt.Errorf("gate wait expired")

// lockFile polls the flock: flock(2) has no timeout, and only one goroutine per process polls a given key
// (the others wait on the semaphore), so a short backoff costs little.
func lockFile(ctx context.Context, f *flock.Flock, expired <-chan time.Time) error {
	delay := time.Millisecond
	for {
		ok, err := f.TryLock()
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
