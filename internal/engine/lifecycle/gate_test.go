package lifecycle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/fake"
	"github.com/sandkeep/sandkeep/internal/fault"
)

func TestGateBusy(t *testing.T) {
	const wait = 200 * time.Millisecond
	short := func(c *Config) { c.GateWait = wait }
	for _, tt := range []struct {
		name        string
		sameManager bool // the waiter queues on the in-process semaphore; otherwise on the home's flock
	}{{"same manager", true}, {"other manager", false}} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			m := e.manager(short)
			k, other := key(t, "acme", "alice"), key(t, "acme", "bob")
			release := holder(t, m, k)
			waiter := m
			if !tt.sameManager {
				waiter = e.manager(short)
			}

			start := time.Now()
			res, err := waiter.Exec(t.Context(), k, ExecRequest{Argv: []string{"true"}})
			if !fault.Is(err, fault.SandboxBusy) {
				t.Fatalf("Exec on a held key = %+v, %v; want SANDBOX_BUSY", res, err)
			}
			if waited := time.Since(start); waited < wait {
				t.Errorf("gave up after %s, before the gate wait of %s", waited, wait)
			}
			if n, want := waiters(waiter, k), map[bool]int32{true: 1, false: 0}[tt.sameManager]; n != want {
				t.Errorf("after a busy wait %d waiters are counted, want %d (the holder only)", n, want)
			}
			run(t, waiter, other, "true") // another key is not busy

			release()
			run(t, waiter, k, "true") // the key is free again
			if n := waiters(waiter, k); n != 0 {
				t.Errorf("%d waiters counted on an idle key", n)
			}
		})
	}
}

func TestGateWaitCancelled(t *testing.T) {
	for _, tt := range []struct {
		name        string
		sameManager bool
	}{{"same manager", true}, {"other manager", false}} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			m := e.manager() // default gate wait: minutes, so only the ctx can end the wait
			k := key(t, "acme", "alice")
			release := holder(t, m, k)
			waiter, want := m, int32(2)
			if !tt.sameManager {
				waiter, want = e.manager(), 1
			}

			ctx, cancel := context.WithCancelCause(t.Context())
			defer cancel(nil)
			errc := make(chan error, 1)
			go func() {
				_, err := waiter.Exec(ctx, k, ExecRequest{Argv: []string{"true"}})
				errc <- err
			}()
			waitFor(t, "the second exec to queue", func() bool { return waiters(waiter, k) == want })
			cause := errors.New("caller went away")
			cancel(cause)

			select {
			case err := <-errc:
				if !errors.Is(err, cause) || fault.Is(err, fault.SandboxBusy) {
					t.Errorf("cancelled wait = %v; want the ctx cause, not SANDBOX_BUSY", err)
				}
			case <-time.After(bound):
				t.Fatal("a cancelled waiter kept waiting")
			}
			if n := waiters(waiter, k); n != want-1 {
				t.Errorf("after the cancelled wait %d waiters are counted, want %d", n, want-1)
			}
			release()
			if n := e.drv.Calls(fake.OpExec); n != 1 {
				t.Errorf("driver Exec called %d times, want 1 (the cancelled waiter must not run)", n)
			}
		})
	}
}

// execRecorder records when the driver finished each command, by the ROLE in its env.
type execRecorder struct {
	*fake.Driver
	mu       sync.Mutex
	returned map[string]time.Time
}

func (r *execRecorder) Exec(ctx context.Context, sb *driver.Sandbox, req agentproto.Request, out driver.Output) (agentproto.Result, error) {
	res, err := r.Driver.Exec(ctx, sb, req, out)
	r.mu.Lock()
	r.returned[role(req)] = time.Now()
	r.mu.Unlock()
	return res, err
}

func role(req agentproto.Request) string {
	for _, kv := range req.Env {
		if v, ok := strings.CutPrefix(kv, "ROLE="); ok {
			return v
		}
	}
	return ""
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		t.Fatalf("pid file %s: %q", path, b)
	}
	return pid
}

// gone: the process no longer exists (reaped), is a zombie waiting for a reaper that is not ours, or has a
// SIGKILL pending (it is being torn down and can run no more user code).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return true
	}
	for line := range strings.Lines(string(b)) {
		name, value, _ := strings.Cut(strings.TrimSpace(line), ":")
		value = strings.TrimSpace(value)
		switch name {
		case "State":
			if strings.HasPrefix(value, "Z") || strings.HasPrefix(value, "X") {
				return true
			}
		case "SigPnd", "ShdPnd":
			if mask, err := strconv.ParseUint(value, 16, 64); err == nil && mask&(1<<(syscall.SIGKILL-1)) != 0 {
				return true
			}
		}
	}
	return false
}

// TestCancelledCallerHoldsGateUntilCommandEnds: a caller that gives up gets its answer only once its command is
// dead, and the next command of the key starts only after that.
func TestCancelledCallerHoldsGateUntilCommandEnds(t *testing.T) {
	e := newEnv(t)
	rec := &execRecorder{Driver: e.drv, returned: map[string]time.Time{}}
	m := e.managerOn(rec)
	k := key(t, "acme", "alice")
	dir := t.TempDir()

	var (
		mu      sync.Mutex
		bStart  time.Time
		aGoneAt = -1 // 1: A's leader was gone when B started; 0: it was alive
	)
	e.drv.SetHooks(fake.Hooks{BeforeExec: func(sb *driver.Sandbox, req agentproto.Request) {
		if role(req) != "B" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		bStart = time.Now()
		aGoneAt = 0
		if b, err := os.ReadFile(filepath.Join(dir, "a.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
				aGoneAt = 1
			}
		}
	}})

	ctxA, cancelA := context.WithCancel(t.Context())
	defer cancelA()
	reqA, _ := sh(`echo $$ > "$D/a.pid"; sleep 60 & echo $! > "$D/child.pid"; touch "$D/started"; wait`, "D="+dir, "ROLE=A")
	type outcome struct {
		res *ExecResult
		err error
		at  time.Time
	}
	aDone, bDone := make(chan outcome, 1), make(chan outcome, 1)
	go func() {
		res, err := m.Exec(ctxA, k, reqA)
		aDone <- outcome{res, err, time.Now()}
	}()
	waitFor(t, "A to start", func() bool { return exists(filepath.Join(dir, "started")) })
	aPid, childPid := readPid(t, filepath.Join(dir, "a.pid")), readPid(t, filepath.Join(dir, "child.pid"))

	go func() {
		res, err := m.Exec(context.Background(), k, ExecRequest{Argv: []string{"true"}, Env: []string{"ROLE=B"}})
		bDone <- outcome{res, err, time.Now()}
	}()
	waitFor(t, "B to queue behind A", func() bool { return waiters(m, k) == 2 })
	cancelA()

	var a, b outcome
	select {
	case a = <-aDone:
	case <-time.After(bound):
		t.Fatal("A did not return after its ctx was cancelled")
	}
	if !errors.Is(a.err, context.Canceled) {
		t.Errorf("A = %v; want context.Canceled", a.err)
	}
	if a.res == nil || !a.res.Cancelled {
		t.Errorf("A's result = %+v; want Cancelled", a.res)
	}
	if err := syscall.Kill(aPid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("A's process %d still exists after A returned: kill(0) = %v", aPid, err)
	}
	if !gone(childPid) {
		t.Errorf("A's background child %d is still running after A returned", childPid)
	}
	select {
	case b = <-bDone:
	case <-time.After(bound):
		t.Fatal("B did not run after A")
	}
	if b.err != nil || b.res.ExitCode != 0 {
		t.Fatalf("B = %+v, %v", b.res, b.err)
	}

	mu.Lock()
	defer mu.Unlock()
	rec.mu.Lock()
	aReturned := rec.returned["A"]
	rec.mu.Unlock()
	if bStart.IsZero() || aReturned.IsZero() {
		t.Fatalf("missing timestamps: B started %v, A's command returned %v", bStart, aReturned)
	}
	if bStart.Before(aReturned) {
		t.Errorf("B started %s before A's command was over", aReturned.Sub(bStart))
	}
	if aGoneAt != 1 {
		t.Errorf("A's process was still alive when B started")
	}
	if a.res != nil && b.res.Sandbox.ID != a.res.Sandbox.ID {
		t.Errorf("a cancelled command recycled the sandbox: %s then %s", a.res.Sandbox.ID, b.res.Sandbox.ID)
	}
	if n := e.drv.Calls(fake.OpRemove); n != 0 {
		t.Errorf("Remove called %d times after a cancellation, want 0", n)
	}
}

// TestGateWaitNotice: a Stop that waits at a held gate calls the WhenWaiting hook once, with the wait's bound,
// before it returns; a Stop at a free gate never calls it.
func TestGateWaitNotice(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	k := key(t, "acme", "alice")
	run(t, m, k, "true") // the sandbox exists

	var mu sync.Mutex
	var calls []time.Duration
	ctx := WhenWaiting(t.Context(), func(bound time.Duration) {
		mu.Lock()
		calls = append(calls, bound)
		mu.Unlock()
	})
	noticed := func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls)
	}

	release := holder(t, m, k)
	errc := make(chan error, 1)
	go func() { errc <- m.Stop(ctx, k) }()
	waitFor(t, "the waiting stop's notice", func() bool { return len(noticed()) > 0 })
	select {
	case err := <-errc:
		t.Fatalf("stop returned while the gate was held: %v", err)
	default:
	}
	release()
	if err := <-errc; err != nil {
		t.Fatalf("stop after the holder ended: %v", err)
	}
	if got := noticed(); len(got) != 1 || got[0] != m.cfg.GateWait {
		t.Errorf("notices %v, want one with the gate wait %s", got, m.cfg.GateWait)
	}

	run(t, m, k, "true")
	mu.Lock()
	calls = nil
	mu.Unlock()
	if err := m.Stop(ctx, k); err != nil {
		t.Fatal(err)
	}
	time.Sleep(waitNoticeAfter + 200*time.Millisecond) // a notice armed and not disarmed would fire by now
	if got := noticed(); len(got) != 0 {
		t.Errorf("a stop at a free gate noticed %v", got)
	}
}

// TestGatesEvictedAndCapped: a key's gate lives only while a command runs or waits for it, so a process that has
// served many keys holds none of them when idle; past MaxKeys keys at once a new key is KEY_LIMIT while the keys
// already in go on; the cached uids stay bounded too.
func TestGatesEvictedAndCapped(t *testing.T) {
	e := newEnv(t)
	m := e.manager(func(c *Config) { c.MaxKeys = 2; c.GateWait = 200 * time.Millisecond })
	for i := range 5 {
		run(t, m, key(t, "acme", "u"+strconv.Itoa(i)), "true")
	}
	if n := m.gates.size(); n != 0 {
		t.Errorf("%d gates kept after their commands ended, want 0", n)
	}
	if n := m.def.postures.len(); n > 2 {
		t.Errorf("%d postures cached, want at most MaxKeys (2)", n)
	}

	a, b, c := key(t, "acme", "a"), key(t, "acme", "b"), key(t, "acme", "c")
	releaseA, releaseB := holder(t, m, a), holder(t, m, b)
	_, err := m.Exec(t.Context(), c, ExecRequest{Argv: []string{"true"}})
	if !fault.Is(err, fault.KeyLimit) || !strings.Contains(err.Error(), "2 users") {
		t.Fatalf("a third key past MaxKeys=2: %v, want KEY_LIMIT naming the limit", err)
	}
	if _, err := m.Exec(t.Context(), a, ExecRequest{Argv: []string{"true"}}); !fault.Is(err, fault.SandboxBusy) {
		t.Errorf("a key already in waits as before: %v, want SANDBOX_BUSY", err)
	}
	releaseA()
	run(t, m, c, "true") // room again
	releaseB()
	if n := m.gates.size(); n != 0 {
		t.Errorf("%d gates kept when idle", n)
	}
}
