package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/pools"
)

// ScenarioPool is the warm pools' scenario (issue 23).
const ScenarioPool = "pool"

// Defaults of the pool scenario.
const (
	DefaultPoolN     = 20 // samples per series of the first two rows
	DefaultPoolBurst = 50 // concurrent new keys, and the pool's size
)

// Template names the pool scenario's Manager offers: one pooled, one not.
const (
	poolTemplate   = "bench-pool"
	noPoolTemplate = "bench-nopool"
)

// poolFillWait bounds how long the scenario waits for its pool to be full again before a sample.
const poolFillWait = 5 * time.Minute

// Pool: what a warm pool buys a new key, side by side in one run, on a Manager of its own over the bench's home
// that keeps a pool of burst members of template bench-pool (the bench image, the default shape).
//
//   - A new key's first command (`true`, template bench-pool) with the pool full vs `docker run --rm` of the same
//     image, n samples each in alternating order; before every sample of either series the pool is full again and
//     idle (untimed), so neither pays for the other's refill. Each claim starts its refill at once, on its own
//     clock, as it does in service. Every sample must have been claimed (sandbox_claimed), else the run fails.
//   - burst new keys at once with a pool of burst: each call's time; p99 against the median of one `docker run
//     --rm` (the previous row's). Every call must have been claimed, each from a member of its own.
//   - The on-demand fallback: a new key's first command of template bench-nopool (no pool: what a claim falls
//     back to when the pool is empty, a create on the command's path) vs `docker run --rm`, n samples each.
func Pool(ctx context.Context, e *Env, n, burst int) (_ []Result, err error) {
	cfg := e.Config
	cfg.Transport = transportAgent
	cfg.Templates = map[string]sandkeep.Template{
		poolTemplate:   {Pool: burst},
		noPoolTemplate: {},
	}
	cfg.PoolCap = burst
	m, err := sandkeep.Open(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	var users []string
	defer func() {
		err = errors.Join(err, removeAll(ctx, e, m, users), m.Close())
	}()
	ok, err := pools.Warm(ctx, m)
	if err != nil || !ok {
		return nil, fmt.Errorf("pool: warm pools not started (another process keeps this home's pools?): %v", err)
	}
	full := func(ctx context.Context) error {
		deadline := time.Now().Add(poolFillWait)
		for {
			for _, p := range pools.List(m) {
				if p.Template == poolTemplate && p.Ready == burst && p.Making == 0 {
					return nil
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("pool: not full within %s: %+v", poolFillWait, pools.List(m))
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	var mu sync.Mutex
	first := func(ctx context.Context, template string, wantClaim bool) (time.Duration, string, error) {
		mu.Lock()
		user := "pool-" + strconv.Itoa(len(users))
		users = append(users, user)
		mu.Unlock()
		var claimed atomic.Bool
		key, err := e.key(user)
		if err != nil {
			return 0, "", err
		}
		rr := sandkeep.RunRequest{Key: key, Template: template, Observer: sandkeep.Observer{Event: func(name string, _ any) {
			if name == events.NameSandboxClaimed {
				claimed.Store(true)
			}
		}}}
		start := time.Now()
		res, err := e.runIn(ctx, m, rr, transportAgent, sandkeep.ExecRequest{Argv: []string{"true"}})
		took := time.Since(start)
		if err == nil && claimed.Load() != wantClaim {
			err = fmt.Errorf("pool: %s's first command claimed a member: %v, want %v", user, claimed.Load(), wantClaim)
		}
		id := ""
		if res != nil {
			id = res.Sandbox.ID
		}
		return took, id, err
	}
	raw := func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		err := e.rawRun(ctx)
		return time.Since(start), err
	}

	// Row 1: warm pool vs docker run --rm, alternating which goes first.
	var claimS, rawS []time.Duration
	for i := range n {
		for j := range 2 {
			if err := full(ctx); err != nil {
				return nil, err
			}
			if (i+j)%2 == 0 {
				d, _, err := first(ctx, poolTemplate, true)
				if err != nil {
					return nil, err
				}
				claimS = append(claimS, d)
			} else {
				d, err := raw(ctx)
				if err != nil {
					return nil, err
				}
				rawS = append(rawS, d)
			}
		}
	}
	warm := newResult("first command, new key, template's pool warm", "docker run --rm", claimS, rawS)
	warm.Extra = map[string]string{"pool": strconv.Itoa(burst), "claimed": fmt.Sprintf("%d/%d", len(claimS), len(claimS))}

	// Row 2: burst concurrent new keys against a full pool of burst.
	if err := full(ctx); err != nil {
		return nil, err
	}
	times := make([]time.Duration, burst)
	ids := make([]string, burst)
	err = forEach(ctx, burst, burst, func(ctx context.Context, i int) error {
		d, id, err := first(ctx, poolTemplate, true)
		times[i], ids[i] = d, id
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pool burst: %w", err)
	}
	if uniq := len(slices.Compact(slices.Sorted(slices.Values(ids)))); uniq != burst {
		return nil, fmt.Errorf("pool burst: %d keys got %d sandboxes", burst, uniq)
	}
	// The baseline is one docker run --rm: the first row's series, so the ratio of this row's p99 to it is
	// sandkeep's p99 over the raw median.
	conc := newResult(fmt.Sprintf("%d concurrent new keys, pool of %d (per call)", burst, burst), "one docker run --rm", times, rawS)
	conc.Extra = map[string]string{"claimed": fmt.Sprintf("%d/%d", burst, burst), "distinct_sandboxes": strconv.Itoa(burst)}
	if med := conc.Base.Median; med > 0 {
		conc.Extra["p99_over_run_median"] = fmt.Sprintf("%.3fx", float64(conc.Sandkeep.P99)/float64(med))
	}

	// Row 3: the on-demand fallback (no pool) vs docker run --rm, with the pool full and idle throughout.
	var fbS, fbRaw []time.Duration
	for i := range n {
		for j := range 2 {
			if err := full(ctx); err != nil {
				return nil, err
			}
			if (i+j)%2 == 0 {
				d, _, err := first(ctx, noPoolTemplate, false)
				if err != nil {
					return nil, err
				}
				fbS = append(fbS, d)
			} else {
				d, err := raw(ctx)
				if err != nil {
					return nil, err
				}
				fbRaw = append(fbRaw, d)
			}
		}
	}
	fb := newResult("first command, new key, pool empty (on-demand create)", "docker run --rm", fbS, fbRaw)
	return []Result{warm, conc, fb}, nil
}
