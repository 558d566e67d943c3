package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/driver"
)

// LabelRaw labels the containers the raw `docker run` baseline creates, with the run's tenant as value, so that
// Cleanup finds them even when a run is interrupted before the engine auto-removes them.
const LabelRaw = "io.sandkeep.bench"

// Transports as ExecResult.Transport reports them.
const (
	transportAgent = "agent"
	transportExec  = "exec"
)

// Env is what every scenario runs against: two Managers over the same state home (M with Transport "agent",
// which owns the channel listeners, and MExec with Transport "exec"), a client for the raw baselines on the same
// daemon, the image both use, and a tenant unique to this run (so sandboxes never collide with real ones).
type Env struct {
	M      *sandkeep.Manager
	MExec  *sandkeep.Manager
	Docker *client.Client
	Image  string
	Tenant string
	// Config is what M was opened with, for scenarios that open another Manager on the same home.
	Config sandkeep.Config
}

// withStore is e.Config with the agent transport and st recording runs.
func (e *Env) withStore(st sandkeep.Store) sandkeep.Config {
	c := e.Config
	c.Transport, c.Store = transportAgent, st
	return c
}

func (e *Env) key(user string) (sandkeep.Key, error) { return sandkeep.NewKey(e.Tenant, user) }

// run runs req through m for user and checks that it exited 0 over the transport wanted: a series labelled
// "agent" that silently went through Docker exec would measure the wrong thing.
func (e *Env) run(ctx context.Context, m *sandkeep.Manager, user, transport string, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
	return e.runNet(ctx, m, user, transport, nil, req)
}

// runNet is run in a run with the network block net (nil: the run's own).
func (e *Env) runNet(ctx context.Context, m *sandkeep.Manager, user, transport string, net *sandkeep.Network, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
	key, err := e.key(user)
	if err != nil {
		return nil, err
	}
	return e.runIn(ctx, m, sandkeep.RunRequest{Key: key, Network: net}, transport, req)
}

// runIn runs req in the run rr asks for and checks it exited 0 over transport.
func (e *Env) runIn(ctx context.Context, m *sandkeep.Manager, rr sandkeep.RunRequest, transport string, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
	user := rr.Key.User
	if req.Timeout == 0 {
		req.Timeout = time.Minute
	}
	res, err := m.ExecWith(ctx, rr, req)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%v for %s: %w", req.Argv, user, err)
	case res.ExitCode != 0:
		return nil, fmt.Errorf("%v for %s exited %d: %s", req.Argv, user, res.ExitCode, res.Stderr)
	case res.Transport != transport:
		return nil, fmt.Errorf("%v for %s went over transport %q, want %q", req.Argv, user, res.Transport, transport)
	}
	return res, nil
}

// skTrue runs `true` for user through the agent transport.
func (e *Env) skTrue(ctx context.Context, user string) (*sandkeep.ExecResult, error) {
	return e.run(ctx, e.M, user, transportAgent, sandkeep.ExecRequest{Argv: []string{"true"}})
}

// rawExec is what `docker exec` does through the Engine API: create, attach (which starts), drain, inspect.
// stdout receives the command's stdout (nil discards it).
func (e *Env) rawExec(ctx context.Context, containerID string, stdout io.Writer, argv ...string) error {
	if stdout == nil {
		stdout = io.Discard
	}
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
	_, err = stdcopy.StdCopy(stdout, io.Discard, att.Reader)
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
		Config:     &container.Config{Image: e.Image, Cmd: []string{"true"}, Labels: map[string]string{LabelRaw: e.Tenant}},
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

// removeUsers removes the sandboxes (and workspaces) of users through M, eight at a time, under its own timeout
// even when ctx is cancelled: a scenario leaves nothing running behind it.
func (e *Env) removeUsers(ctx context.Context, users []string) error {
	return removeAll(ctx, e, e.M, users)
}

// forEach calls f for 0..n-1 with at most limit calls at once, and returns the first error; after an error
// (or when ctx ends) no new call starts. Every call has returned when forEach returns.
func forEach(ctx context.Context, n, limit int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, max(1, limit))
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := f(ctx, i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
				cancel()
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// rotate takes n samples of each series, rotating which goes first every round so that every series runs in
// every position equally often and machine noise falls on all alike. It stops at the first error or when ctx ends.
func rotate(ctx context.Context, n int, series ...func(context.Context) error) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(series))
	for i := range out {
		out[i] = make([]time.Duration, 0, n)
	}
	// Series take turns in short blocks, the order rotating every round: side by side in one run, so drift and
	// noise hit all alike, but a sample never pays for the previous series' teardown (a Docker exec leaves runc
	// and shim work on a core for a few milliseconds after it returns).
	block := min(rotateBlock, max(1, n/4))
	for round := 0; round*block < n; round++ {
		for j := range series {
			s := (round + j) % len(series)
			for range min(block, n-round*block) {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				start := time.Now()
				if err := series[s](ctx); err != nil {
					return nil, err
				}
				out[s] = append(out[s], time.Since(start))
			}
		}
	}
	return out, nil
}

// rotateBlock is how many consecutive samples a series takes per turn.
const rotateBlock = 10

// WarmExec: `true` in a running sandbox through sandkeep's agent channel, through sandkeep's Docker-exec
// transport, and as a raw Engine-API exec in the same container, rotating the three in one loop. It returns
// two rows: agent vs raw (the fast path's bar) and exec vs raw (the exec transport's overhead over the engine).
func WarmExec(ctx context.Context, e *Env, n int) (_ []Result, err error) {
	if e.MExec == nil {
		return nil, errors.New("warm exec: Env.MExec (the exec-transport Manager) is nil")
	}
	const user = "warm"
	defer func() { err = errors.Join(err, e.removeUsers(ctx, []string{user})) }()
	res, err := e.skTrue(ctx, user) // create the sandbox and connect its channel: not measured
	if err != nil {
		return nil, err
	}
	id := res.Sandbox.ID
	if _, err := e.run(ctx, e.MExec, user, transportExec, sandkeep.ExecRequest{Argv: []string{"true"}}); err != nil {
		return nil, err
	}
	s, err := rotate(ctx, n,
		func(ctx context.Context) error { _, err := e.skTrue(ctx, user); return err },
		func(ctx context.Context) error {
			_, err := e.run(ctx, e.MExec, user, transportExec, sandkeep.ExecRequest{Argv: []string{"true"}})
			return err
		},
		func(ctx context.Context) error { return e.rawExec(ctx, id, nil, "true") })
	if err != nil {
		return nil, fmt.Errorf("warm exec: %w", err)
	}
	agent := newResult("warm exec `true` (agent transport)", "raw Engine-API exec", s[0], s[2])
	agent.Extra = map[string]string{"transport": transportAgent}
	exec := newResult("warm exec `true` (exec transport)", "raw Engine-API exec", s[1], s[2])
	exec.Extra = map[string]string{"transport": transportExec}
	return []Result{agent, exec}, nil
}

// OutputBytes is how much WarmOutput's command writes to stdout.
const OutputBytes = 1 << 20

// countWriter counts what is written to it and drops it.
type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// WarmOutput: a warm command writing 1 MiB to stdout, through the agent transport (output limit 2 MiB) vs a raw
// Engine-API exec draining the stream with stdcopy. Both sides stream into a counting writer (neither keeps the
// bytes) and each sample checks that exactly 1 MiB arrived.
func WarmOutput(ctx context.Context, e *Env, n int) (_ Result, err error) {
	const user = "output"
	defer func() { err = errors.Join(err, e.removeUsers(ctx, []string{user})) }()
	argv := []string{"head", "-c", strconv.Itoa(OutputBytes), "/dev/zero"}
	res, err := e.skTrue(ctx, user)
	if err != nil {
		return Result{}, err
	}
	id := res.Sandbox.ID
	s, err := rotate(ctx, n,
		func(ctx context.Context) error {
			var w countWriter
			res, err := e.run(ctx, e.M, user, transportAgent, sandkeep.ExecRequest{Argv: argv, OutputLimit: 2 * OutputBytes, Stdout: &w})
			if err == nil && (w.n != OutputBytes || res.StdoutTruncated) {
				err = fmt.Errorf("sandkeep delivered %d bytes (truncated %v), want %d", w.n, res.StdoutTruncated, OutputBytes)
			}
			return err
		},
		func(ctx context.Context) error {
			var w countWriter
			err := e.rawExec(ctx, id, &w, argv...)
			if err == nil && w.n != OutputBytes {
				err = fmt.Errorf("raw exec delivered %d bytes, want %d", w.n, OutputBytes)
			}
			return err
		})
	if err != nil {
		return Result{}, fmt.Errorf("warm output: %w", err)
	}
	r := newResult("warm exec, 1 MiB stdout (agent transport)", "raw Engine-API exec + stdcopy", s[0], s[1])
	r.Extra = map[string]string{"transport": transportAgent}
	return r, nil
}

// FirstCommand: the first command for a new key (create + start + channel + exec) vs `docker run --rm` of the
// same image. Every sandbox it creates is removed before it returns.
func FirstCommand(ctx context.Context, e *Env, n int) (_ Result, err error) {
	var users []string
	defer func() { err = errors.Join(err, e.removeUsers(ctx, users)) }()
	s, err := rotate(ctx, n,
		func(ctx context.Context) error {
			user := "first-" + strconv.Itoa(len(users))
			users = append(users, user)
			_, err := e.skTrue(ctx, user)
			return err
		},
		e.rawRun)
	if err != nil {
		return Result{}, fmt.Errorf("first command: %w", err)
	}
	r := newResult("first command, new key", "docker run --rm", s[0], s[1])
	r.Extra = map[string]string{"transport": transportAgent}
	return r, nil
}

// ConcurrentFirst: c concurrent first calls for one new key, time until all are done, against one raw
// `docker run --rm`; three rounds, a new key each. Extra says how many containers the engine created for the
// key (counted from its create events) and how many exist afterwards: both should be 1.
func ConcurrentFirst(ctx context.Context, e *Env, c int) (_ Result, err error) {
	const rounds = 3
	var users []string
	defer func() { err = errors.Join(err, e.removeUsers(ctx, users)) }()
	var sk, raw []time.Duration
	created, present := 0, 0
	for round := range rounds {
		user := "burst-" + strconv.Itoa(round)
		users = append(users, user)
		key, err := e.key(user)
		if err != nil {
			return Result{}, err
		}
		since := time.Now()
		err = forEach(ctx, c, c, func(ctx context.Context, _ int) error { _, err := e.skTrue(ctx, user); return err })
		sk = append(sk, time.Since(since))
		if err != nil {
			return Result{}, fmt.Errorf("concurrent first calls: %w", err)
		}
		nc, err := e.createEvents(ctx, key, since)
		if err != nil {
			return Result{}, err
		}
		np, err := e.countContainers(ctx, driver.LabelKey+"="+key.Hex())
		if err != nil {
			return Result{}, err
		}
		created, present = max(created, nc), max(present, np)
		start := time.Now()
		if err := e.rawRun(ctx); err != nil {
			return Result{}, err
		}
		raw = append(raw, time.Since(start))
	}
	r := newResult(fmt.Sprintf("%d concurrent first calls, one key (all done)", c), "one docker run --rm", sk, raw)
	r.Extra = map[string]string{
		"containers_created_per_key": strconv.Itoa(created),
		"containers_per_key":         strconv.Itoa(present),
	}
	return r, nil
}

// createEvents counts the engine's container create events for key since since (until now).
func (e *Env) createEvents(ctx context.Context, key sandkeep.Key, since time.Time) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stamp := func(t time.Time) string { return fmt.Sprintf("%d.%09d", t.Unix(), t.Nanosecond()) }
	res := e.Docker.Events(ctx, client.EventsListOptions{
		Since: stamp(since.Add(-time.Second)), Until: stamp(time.Now().Add(time.Second)),
		Filters: client.Filters{}.
			Add("type", "container").
			Add("event", "create").
			Add("label", driver.LabelKey+"="+key.Hex()),
	})
	n := 0
	for {
		select {
		case <-res.Messages:
			n++
		case err := <-res.Err:
			if errors.Is(err, io.EOF) || err == nil {
				return n, nil
			}
			return 0, fmt.Errorf("count create events: %w", err)
		}
	}
}

// countContainers counts the containers (running or not) carrying label ("k=v").
func (e *Env) countContainers(ctx context.Context, label string) (int, error) {
	list, err := e.Docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: client.Filters{}.Add("label", label)})
	if err != nil {
		return 0, fmt.Errorf("list containers %s: %w", label, err)
	}
	return len(list.Items), nil
}

// Throughput: keys sandboxes each running m warm `true` commands one after another, all keys at once, through
// the agent transport vs raw Engine-API exec streams into the same containers; two rounds, alternating which
// goes first. Samples are per-command latencies; aggregate execs/s and p99 go into Extra.
func Throughput(ctx context.Context, e *Env, keys, m int) (_ Result, err error) {
	users := make([]string, keys)
	for i := range users {
		users[i] = "tp-" + strconv.Itoa(i)
	}
	defer func() { err = errors.Join(err, e.removeUsers(ctx, users)) }()
	ids := make([]string, keys)
	err = forEach(ctx, keys, 8, func(ctx context.Context, i int) error {
		res, err := e.skTrue(ctx, users[i])
		if err == nil {
			ids[i] = res.Sandbox.ID
		}
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("throughput setup: %w", err)
	}
	phase := func(ctx context.Context, run func(ctx context.Context, i int) error) ([]time.Duration, time.Duration, error) {
		var mu sync.Mutex
		lat := make([]time.Duration, 0, keys*m)
		start := time.Now()
		err := forEach(ctx, keys, keys, func(ctx context.Context, i int) error {
			for range m {
				t0 := time.Now()
				if err := run(ctx, i); err != nil {
					return err
				}
				d := time.Since(t0)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
			return nil
		})
		return lat, time.Since(start), err
	}
	var sk, raw []time.Duration
	var skWall, rawWall time.Duration
	phases := []func() error{
		func() error {
			l, w, err := phase(ctx, func(ctx context.Context, i int) error { _, err := e.skTrue(ctx, users[i]); return err })
			sk, skWall = append(sk, l...), skWall+w
			return err
		},
		func() error {
			l, w, err := phase(ctx, func(ctx context.Context, i int) error { return e.rawExec(ctx, ids[i], nil, "true") })
			raw, rawWall = append(raw, l...), rawWall+w
			return err
		},
	}
	for round := range 2 {
		for j := range phases {
			if err := phases[(round+j)%2](); err != nil {
				return Result{}, fmt.Errorf("throughput: %w", err)
			}
		}
	}
	r := newResult(fmt.Sprintf("throughput: %d keys x %d warm execs in parallel (per exec)", keys, m), "raw Engine-API exec", sk, raw)
	skRate, rawRate := float64(len(sk))/skWall.Seconds(), float64(len(raw))/rawWall.Seconds()
	ms := func(d time.Duration) string {
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
	}
	r.Extra = map[string]string{
		"transport":            transportAgent,
		"sandkeep_execs_per_s": strconv.FormatFloat(skRate, 'f', 1, 64),
		"raw_execs_per_s":      strconv.FormatFloat(rawRate, 'f', 1, 64),
		"throughput_x":         strconv.FormatFloat(skRate/rawRate, 'f', 1, 64),
		"sandkeep_p99_ms":      ms(r.Sandkeep.P99),
		"raw_p99_ms":           ms(r.Base.P99),
	}
	return r, nil
}
