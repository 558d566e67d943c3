package api

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// presentTTL is how long a sandbox seen to exist counts as existing without asking the backend again. The
// sweeper may remove one meanwhile; the sandbox bound is then briefly over-generous, never stuck.
const presentTTL = time.Minute

// Retry-After of the limits that have no refill time: a running command or a sandbox must go away first.
const (
	retryExecs     = 1
	retrySandboxes = 30
)

func checkLimits(what string, l Limits) error {
	if l.MaxSandboxes < Unlimited || l.MaxConcurrentExecs < Unlimited || l.Burst < Unlimited || l.MaxConcurrentFileOps < Unlimited ||
		(l.RequestsPerSecond < 0 && l.RequestsPerSecond != Unlimited) || math.IsNaN(l.RequestsPerSecond) || math.IsInf(l.RequestsPerSecond, 0) {
		return fmt.Errorf("api: Config.%s: limits must be zero (the default), positive, or Unlimited (-1): %+v", what, l)
	}
	return nil
}

// resolveLimits fills l's zero fields from def and turns Unlimited into the limiter's zero (no bound).
func resolveLimits(l, def Limits) Limits {
	pick := func(v, d int) int {
		switch {
		case v == 0:
			return d
		case v < 0:
			return 0
		}
		return v
	}
	out := Limits{
		MaxSandboxes:         pick(l.MaxSandboxes, def.MaxSandboxes),
		MaxConcurrentExecs:   pick(l.MaxConcurrentExecs, def.MaxConcurrentExecs),
		MaxConcurrentFileOps: pick(l.MaxConcurrentFileOps, def.MaxConcurrentFileOps),
		RequestsPerSecond:    l.RequestsPerSecond,
		Burst:                l.Burst,
	}
	switch {
	case l.RequestsPerSecond == 0: // the default rate, and its burst unless one is given
		out.RequestsPerSecond = def.RequestsPerSecond
		out.Burst = pick(l.Burst, def.Burst)
	case l.RequestsPerSecond < 0:
		out.RequestsPerSecond, out.Burst = 0, 0
	default:
		out.Burst = pick(l.Burst, 0) // zero: max(1, RequestsPerSecond) in request
	}
	return out
}

// limiter enforces Limits per tenant. Nothing in it waits: a limit reached is an error at once.
type limiter struct {
	def    Limits
	per    map[string]Limits // read-only after newLimiter
	now    func() time.Time
	mu     sync.Mutex         // guards tenants
	tenant map[string]*tenant // one per tenant seen since start; bounded by the tenants that have tokens
}

// tenant is one tenant's state.
type tenant struct {
	mu      sync.Mutex
	tokens  float64   // the request bucket's content
	last    time.Time // when tokens was computed; zero: the bucket is full
	execs   int       // commands running now
	fileOps int       // workspaces open for file operations now
	// uploaded: users whose workspace this server opened for an upload, counted as sandboxes until removed
	// (a workspace without a container is not in List). Forgotten on restart.
	uploaded map[string]bool
	present  map[string]time.Time // users whose sandbox was seen to exist, and when
	pending  map[string]int       // users with an admitted command whose sandbox may be new, and how many
	// admit serializes the sandbox-bound check of users not known to exist, so two new users cannot both
	// take the last place. It is held across one List call, never across a command.
	admit sync.Mutex
}

func newLimiter(def Limits, per map[string]Limits, now func() time.Time) *limiter {
	cp := make(map[string]Limits, len(per))
	for k, v := range per {
		cp[k] = v
	}
	return &limiter{def: def, per: cp, now: now, tenant: map[string]*tenant{}}
}

func (l *limiter) limitsOf(t string) Limits {
	if v, ok := l.per[t]; ok {
		return v
	}
	return l.def
}

func (l *limiter) get(t string) *tenant {
	l.mu.Lock()
	defer l.mu.Unlock()
	st, ok := l.tenant[t]
	if !ok {
		st = &tenant{present: map[string]time.Time{}, pending: map[string]int{}, uploaded: map[string]bool{}}
		l.tenant[t] = st
	}
	return st
}

// tenants returns the tenants seen since start.
func (l *limiter) tenants() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.tenant))
	for t := range l.tenant {
		out = append(out, t)
	}
	return out
}

func limited(seconds int, format string, args ...any) error {
	return &limitError{fe: fault.New(fault.RateLimited, fmt.Sprintf("retry after %d s, or ask the operator to raise the limit", seconds),
		format, args...), seconds: seconds}
}

// request takes one token of t's request bucket: a token bucket of RequestsPerSecond, Burst deep.
func (l *limiter) request(t string) error {
	st := l.get(t) // also records t as seen, for the sandboxes metric
	lim := l.limitsOf(t)
	if lim.RequestsPerSecond <= 0 {
		return nil
	}
	burst := float64(lim.Burst)
	if burst <= 0 {
		burst = math.Max(1, lim.RequestsPerSecond)
	}
	now := l.now()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.last.IsZero() {
		st.tokens = burst
	} else if el := now.Sub(st.last).Seconds(); el > 0 {
		st.tokens = math.Min(burst, st.tokens+el*lim.RequestsPerSecond)
	}
	st.last = now
	if st.tokens >= 1 {
		st.tokens--
		return nil
	}
	wait := math.Ceil((1 - st.tokens) / lim.RequestsPerSecond)
	return limited(int(math.Max(1, wait)), "tenant %s passed its limit of %g requests per second", t, lim.RequestsPerSecond)
}

// lister is the part of the backend the sandbox bound needs.
type lister interface {
	List(ctx context.Context, tenant string) ([]sandkeep.Sandbox, error)
}

// admitExec checks key's tenant against its command and sandbox bounds and returns the function that
// releases what it took; which limit refused is the second result.
func (l *limiter) admitExec(ctx context.Context, b lister, key sandkeep.Key) (release func(ok bool), refused string, err error) {
	st := l.get(key.Tenant)
	lim := l.limitsOf(key.Tenant)
	st.mu.Lock()
	if lim.MaxConcurrentExecs > 0 && st.execs >= lim.MaxConcurrentExecs {
		st.mu.Unlock()
		return nil, "execs", limited(retryExecs, "tenant %s already runs %d commands, its limit", key.Tenant, st.execs)
	}
	st.execs++
	st.mu.Unlock()
	undoExec := func() {
		st.mu.Lock()
		st.execs--
		st.mu.Unlock()
	}
	pending, err := l.admitSandbox(ctx, b, st, lim, key)
	if err != nil {
		undoExec()
		if fault.CodeOf(err) == fault.RateLimited {
			return nil, "sandboxes", err
		}
		return nil, "", err
	}
	return func(ok bool) {
		st.mu.Lock()
		defer st.mu.Unlock()
		st.execs--
		if pending {
			if st.pending[key.User]--; st.pending[key.User] <= 0 {
				delete(st.pending, key.User)
			}
		}
		if ok && lim.MaxSandboxes > 0 {
			st.present[key.User] = l.now()
		}
	}, "", nil
}

// admitSandbox refuses a command that would make the tenant's sandbox count pass MaxSandboxes. pending says
// the command was counted as a possible new sandbox (release undoes it).
func (l *limiter) admitSandbox(ctx context.Context, b lister, st *tenant, lim Limits, key sandkeep.Key) (pending bool, err error) {
	if lim.MaxSandboxes <= 0 {
		return false, nil
	}
	now := l.now()
	st.mu.Lock()
	seen, ok := st.present[key.User]
	up := st.uploaded[key.User]
	st.mu.Unlock()
	if up || ok && now.Sub(seen) < presentTTL {
		return false, nil
	}
	st.admit.Lock()
	defer st.admit.Unlock()
	boxes, listErr := b.List(ctx, key.Tenant)
	users := make(map[string]bool, len(boxes))
	for _, sb := range boxes {
		users[sb.User] = true
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if listErr != nil {
		// The backend cannot list (no engine, say): count the sandboxes this server knows of, and let the
		// command go on only while they leave room, so that the backend answers (and records) its own refusal.
		for u := range st.present {
			users[u] = true
		}
	} else if users[key.User] {
		st.present[key.User] = now
		return false, nil
	}
	for u := range st.pending {
		users[u] = true
	}
	for u := range st.uploaded {
		users[u] = true
	}
	if !users[key.User] && len(users) >= lim.MaxSandboxes {
		if listErr != nil {
			return false, listErr
		}
		return false, limited(retrySandboxes, "tenant %s has %d sandboxes, its limit; this command would create one more",
			key.Tenant, len(users))
	}
	st.pending[key.User]++
	return true, nil
}

// forget drops what the limiter knows of key's sandbox (it was removed).
func (l *limiter) forget(key sandkeep.Key) {
	st := l.get(key.Tenant)
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.present, key.User)
	delete(st.uploaded, key.User)
}

// admitFiles takes one of t's file-operation places; release gives it back.
func (l *limiter) admitFiles(t string) (release func(), err error) {
	st := l.get(t)
	lim := l.limitsOf(t)
	st.mu.Lock()
	defer st.mu.Unlock()
	if lim.MaxConcurrentFileOps > 0 && st.fileOps >= lim.MaxConcurrentFileOps {
		return nil, limited(retryExecs, "tenant %s already has %d file operations open, its limit", t, st.fileOps)
	}
	st.fileOps++
	var once sync.Once
	return func() {
		once.Do(func() {
			st.mu.Lock()
			st.fileOps--
			st.mu.Unlock()
		})
	}, nil
}

// admitWorkspace checks that creating key's workspace keeps its tenant within MaxSandboxes, and returns the
// function to call with whether it was created: a created one counts as a sandbox from then on.
func (l *limiter) admitWorkspace(ctx context.Context, b lister, key sandkeep.Key) (done func(created bool), err error) {
	st := l.get(key.Tenant)
	lim := l.limitsOf(key.Tenant)
	pending, err := l.admitSandbox(ctx, b, st, lim, key)
	if err != nil {
		return nil, err
	}
	return func(created bool) {
		st.mu.Lock()
		defer st.mu.Unlock()
		if pending {
			if st.pending[key.User]--; st.pending[key.User] <= 0 {
				delete(st.pending, key.User)
			}
		}
		if created && lim.MaxSandboxes > 0 {
			st.uploaded[key.User] = true
		}
	}, nil
}
