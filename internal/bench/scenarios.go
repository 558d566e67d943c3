package bench

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep"
)

// Env is what every scenario runs against: a Manager, a client for the raw baseline on the same daemon, the
// image both use, and a tenant unique to this run (so sandboxes never collide with real ones).
type Env struct {
	M      *sandkeep.Manager
	Docker *client.Client
	Image  string
	Tenant string
}

func (e *Env) key(user string) (sandkeep.Key, error) { return sandkeep.NewKey(e.Tenant, user) }

// skTrue runs `true` through sandkeep for user.
func (e *Env) skTrue(ctx context.Context, user string) (*sandkeep.ExecResult, error) {
	key, err := e.key(user)
	if err != nil {
		return nil, err
	}
	res, err := e.M.Exec(ctx, key, sandkeep.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("true exited %d: %s", res.ExitCode, res.Stderr)
	}
	return res, err
}

// rawExec is what `docker exec` does through the Engine API: create, attach (which starts), drain, inspect.
func (e *Env) rawExec(ctx context.Context, containerID string, argv ...string) error {
	created, err := e.Docker.ExecCreate(ctx, containerID, client.ExecCreateOptions{
		AttachStdout: true, AttachStderr: true, Cmd: argv,
	})
	if err != nil {
		return err
	}
	att, err := e.Docker.ExecAttach(ctx, created.ID, client.ExecAttachOptions{})
	if err != nil {
		return err
	}
	_, err = stdcopy.StdCopy(io.Discard, io.Discard, att.Reader)
	att.Close()
	if err != nil {
		return err
	}
	ins, err := e.Docker.ExecInspect(ctx, created.ID, client.ExecInspectOptions{})
	if err != nil {
		return err
	}
	if ins.ExitCode != 0 {
		return fmt.Errorf("raw exec %v exited %d", argv, ins.ExitCode)
	}
	return nil
}

// rawRun is `docker run --rm --network none IMAGE true`: create, wait, start, wait for exit, auto-remove.
func (e *Env) rawRun(ctx context.Context) error {
	c, err := e.Docker.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     &container.Config{Image: e.Image, Cmd: []string{"true"}, Labels: map[string]string{"io.sandkeep.bench": e.Tenant}},
		HostConfig: &container.HostConfig{AutoRemove: true, NetworkMode: "none"},
	})
	if err != nil {
		return err
	}
	wait := e.Docker.ContainerWait(ctx, c.ID, client.ContainerWaitOptions{Condition: container.WaitConditionRemoved})
	if _, err := e.Docker.ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
		return err
	}
	select {
	case r := <-wait.Result:
		if r.StatusCode != 0 {
			return fmt.Errorf("raw run exited %d", r.StatusCode)
		}
		return nil
	case err := <-wait.Error:
		return err
	}
}

// alternate takes n samples of a and b, swapping which goes first every round.
func alternate(ctx context.Context, n int, a, b func(context.Context) error) (sa, sb []time.Duration, err error) {
	timed := func(f func(context.Context) error, into *[]time.Duration) error {
		start := time.Now()
		if err := f(ctx); err != nil {
			return err
		}
		*into = append(*into, time.Since(start))
		return nil
	}
	for i := range n {
		first, second := timed, timed
		fa, fb, da, db := a, b, &sa, &sb
		if i%2 == 1 {
			fa, fb, da, db = b, a, &sb, &sa
		}
		if err := first(fa, da); err != nil {
			return nil, nil, err
		}
		if err := second(fb, db); err != nil {
			return nil, nil, err
		}
	}
	return sa, sb, nil
}

// WarmExec: `true` in a running sandbox through sandkeep vs a raw Engine-API exec of `true` in the same container.
func WarmExec(ctx context.Context, e *Env, n int) (Result, error) {
	res, err := e.skTrue(ctx, "warm") // create the sandbox: not measured
	if err != nil {
		return Result{}, err
	}
	id := res.Sandbox.ID
	sk, raw, err := alternate(ctx, n,
		func(ctx context.Context) error { _, err := e.skTrue(ctx, "warm"); return err },
		func(ctx context.Context) error { return e.rawExec(ctx, id, "true") })
	if err != nil {
		return Result{}, err
	}
	return newResult("warm exec `true`, one key", "raw Engine-API exec", sk, raw), nil
}

// FirstCommand: the first command for a new key (create + start + exec) vs `docker run --rm` of the same image.
func FirstCommand(ctx context.Context, e *Env, n int) (Result, error) {
	i := 0
	sk, raw, err := alternate(ctx, n,
		func(ctx context.Context) error {
			i++
			_, err := e.skTrue(ctx, "first-"+strconv.Itoa(i))
			return err
		},
		e.rawRun)
	if err != nil {
		return Result{}, err
	}
	return newResult("first command, new key", "docker run --rm", sk, raw), nil
}

// ConcurrentFirst: c concurrent first calls for one new key, time until all are done, against one raw run.
func ConcurrentFirst(ctx context.Context, e *Env, c int) (Result, error) {
	var sk, raw []time.Duration
	for round := range 3 {
		user := "burst-" + strconv.Itoa(round)
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, c)
		for range c {
			wg.Go(func() {
				if _, err := e.skTrue(ctx, user); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		sk = append(sk, time.Since(start))
		close(errs)
		if err := <-errs; err != nil {
			return Result{}, err
		}
		start = time.Now()
		if err := e.rawRun(ctx); err != nil {
			return Result{}, err
		}
		raw = append(raw, time.Since(start))
	}
	r := newResult(fmt.Sprintf("%d concurrent first calls, one key (all done)", c), "one docker run --rm", sk, raw)
	r.Extra = map[string]string{"containers_per_key": "1"}
	return r, nil
}

// ParallelKeys: k keys each running m warm `true` commands at once, vs k raw exec streams into the same
// containers. Samples are per-command latencies; throughput goes into Extra.
func ParallelKeys(ctx context.Context, e *Env, k, m int) (Result, error) {
	ids := make([]string, k)
	for i := range k {
		res, err := e.skTrue(ctx, "par-"+strconv.Itoa(i))
		if err != nil {
			return Result{}, err
		}
		ids[i] = res.Sandbox.ID
	}
	phase := func(run func(ctx context.Context, i int) error) ([]time.Duration, time.Duration, error) {
		var mu sync.Mutex
		var lat []time.Duration
		var first error
		var wg sync.WaitGroup
		start := time.Now()
		for i := range k {
			wg.Go(func() {
				for range m {
					t0 := time.Now()
					err := run(ctx, i)
					mu.Lock()
					lat = append(lat, time.Since(t0))
					if err != nil && first == nil {
						first = err
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return lat, time.Since(start), first
	}
	var sk, raw []time.Duration
	var skWall, rawWall time.Duration
	for round := range 2 { // alternate the phases
		phases := []func() error{
			func() error {
				l, w, err := phase(func(ctx context.Context, i int) error { _, err := e.skTrue(ctx, "par-"+strconv.Itoa(i)); return err })
				sk, skWall = append(sk, l...), skWall+w
				return err
			},
			func() error {
				l, w, err := phase(func(ctx context.Context, i int) error { return e.rawExec(ctx, ids[i], "true") })
				raw, rawWall = append(raw, l...), rawWall+w
				return err
			},
		}
		if round == 1 {
			phases[0], phases[1] = phases[1], phases[0]
		}
		for _, p := range phases {
			if err := p(); err != nil {
				return Result{}, err
			}
		}
	}
	r := newResult(fmt.Sprintf("%d keys x %d warm execs in parallel (per exec)", k, m), "raw Engine-API exec", sk, raw)
	r.Extra = map[string]string{
		"sandkeep_execs_per_s": fmt.Sprintf("%.1f", float64(len(sk))/skWall.Seconds()),
		"raw_execs_per_s":      fmt.Sprintf("%.1f", float64(len(raw))/rawWall.Seconds()),
	}
	return r, nil
}
