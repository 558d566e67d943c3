package lifecycle

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"go.uber.org/goleak"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/fake"
	"github.com/sandkeep/sandkeep/internal/identity"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The kubernetes suites' clients (client-go, shared by the test cluster) keep their HTTP/2 connections to
		// the API server for the whole test process.
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*http2ClientConn).readLoop"),
	)
}

const (
	testImage    = "sandkeep-test:lifecycle"
	testImageID  = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	otherImageID = "sha256:2222222222222222222222222222222222222222222222222222222222222222"

	// bound is how long a test waits for something that should happen at once. Generous: it only matters
	// when the code is broken, never for speed.
	bound = 20 * time.Second
)

// clock is a controllable Config.Now. It starts at the wall clock (whole seconds, so file mtimes and RFC 3339
// labels round-trip exactly) because the fake stamps FinishedAt with the real time.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Now().Truncate(time.Second)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// env is one test's world: a home, a fake driver and a clock. Managers made from it share all three, as
// several processes on one host share a home and an engine.
type env struct {
	t     *testing.T
	home  *Home
	drv   *fake.Driver
	clock *clock
	agent string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	home, err := OpenHome(filepath.Join(t.TempDir(), "home"))
	if err != nil {
		t.Fatal(err)
	}
	agent := filepath.Join(t.TempDir(), "sandkeep-agent")
	if err := os.WriteFile(agent, []byte("#!/bin/sh\n# stand-in agent: copied, never run\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return &env{
		t:     t,
		home:  home,
		drv:   fake.New(fake.WithTempDir(t.TempDir()), fake.WithImage(testImage, testImageID)),
		clock: newClock(),
		agent: agent,
	}
}

func (e *env) config() Config {
	return Config{Image: testImage, AgentPath: e.agent, Now: e.clock.Now}
}

// manager returns a new Manager over e's home and driver (a new one stands for another process).
func (e *env) manager(mutate ...func(*Config)) *Manager {
	e.t.Helper()
	return e.managerOn(e.drv, mutate...)
}

func (e *env) managerOn(drv driver.Driver, mutate ...func(*Config)) *Manager {
	e.t.Helper()
	cfg := e.config()
	for _, f := range mutate {
		f(&cfg)
	}
	m, err := New(e.home, drv, cfg)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	e.t.Cleanup(func() { _ = m.Close() })
	return m
}

func (e *env) inspect(key identity.Key) *driver.Sandbox {
	e.t.Helper()
	sb, err := e.drv.Inspect(context.Background(), key.ContainerName())
	if err != nil {
		e.t.Fatalf("Inspect(%s): %v", key.ContainerName(), err)
	}
	return sb
}

func (e *env) absent(key identity.Key) {
	e.t.Helper()
	if sb, err := e.drv.Inspect(context.Background(), key.ContainerName()); !cerrdefs.IsNotFound(err) {
		e.t.Fatalf("Inspect(%s) = %+v, %v; want not found", key.ContainerName(), sb, err)
	}
}

func (e *env) count() int {
	e.t.Helper()
	sbs, err := e.drv.List(context.Background(), e.home.Installation)
	if err != nil {
		e.t.Fatal(err)
	}
	return len(sbs)
}

func key(t *testing.T, tenant, user string) identity.Key {
	t.Helper()
	k, err := identity.New(tenant, user)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// sh is a request running script with sh -c; its stdout is collected in the returned buffer, which may be
// read once Exec has returned (the driver waits for its copiers).
func sh(script string, env ...string) (ExecRequest, *bytes.Buffer) {
	var out bytes.Buffer
	return ExecRequest{Argv: []string{"sh", "-c", script}, Env: env, Stdout: &out, Stderr: &out}, &out
}

// run executes script for k and fails the test unless it exits 0.
func run(t *testing.T, m *Manager, k identity.Key, script string, env ...string) (*ExecResult, string) {
	t.Helper()
	req, out := sh(script, env...)
	res, err := m.Exec(t.Context(), k, req)
	if err != nil {
		t.Fatalf("Exec(%q): %v", script, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("Exec(%q): exit %d, output %q", script, res.ExitCode, out.String())
	}
	return res, out.String()
}

// waitFor polls cond until it holds, failing the test after bound.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitForWithin(t, what, bound, cond)
}

// waitForWithin is waitFor with its own bound, for what waits on a slower engine (a pod on a loaded node).
func waitForWithin(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// holder runs a command for k that holds the key's gate until released. It returns once the command is
// running; release lets it end and waits for its Exec, which must succeed.
func holder(t *testing.T, m *Manager, k identity.Key) (release func()) {
	t.Helper()
	dir := t.TempDir()
	req, out := sh(`touch "$D/started"; i=0; while [ ! -e "$D/release" ]; do sleep 0.02; i=$((i+1)); [ $i -lt 3000 ] || exit 7; done`, "D="+dir)
	type result struct {
		res *ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := m.Exec(context.Background(), k, req)
		done <- result{res, err}
	}()
	started := func() bool { return exists(filepath.Join(dir, "started")) }
	deadline := time.Now().Add(bound)
	for !started() {
		select {
		case r := <-done:
			t.Fatalf("holder ended before it started: %+v, %v, %q", r.res, r.err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("holder did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o600); err != nil {
				t.Error(err)
			}
			r := <-done
			if r.err != nil || r.res.ExitCode != 0 {
				t.Errorf("holder: %+v, %v", r.res, r.err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

// waiters is how many callers hold or queue for k's gate in m.
func waiters(m *Manager, k identity.Key) int32 { return m.gates.waiting(k) }
