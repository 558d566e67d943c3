package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable Config.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestRequestRateLimit(t *testing.T) {
	clk := &clock{t: time.Now()}
	e := newEnv(t, func(c *Config) {
		c.Now = clk.now
		c.Limits = Limits{RequestsPerSecond: 2, Burst: 3}
		c.TenantLimits = map[string]Limits{"slow": {RequestsPerSecond: 0.1}}
	})
	get := func(tok string) *http.Response { return e.req("GET", "/v1/sandboxes", tok, nil) }
	for i := range 3 {
		if resp := get(e.tok); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d of the burst: %d", i, resp.StatusCode)
		}
	}
	resp := get(e.tok)
	wantError(t, resp, http.StatusTooManyRequests, "RATE_LIMITED")
	if ra := resp.Header.Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After %q, want 1", ra)
	}
	other, _ := e.tokens.Add("globex", ScopeRead)
	if resp := get(other); resp.StatusCode != http.StatusOK {
		t.Errorf("another tenant is limited too: %d", resp.StatusCode)
	}
	clk.add(500 * time.Millisecond) // one token back
	if resp := get(e.tok); resp.StatusCode != http.StatusOK {
		t.Errorf("after refill: %d", resp.StatusCode)
	}
	wantError(t, get(e.tok), http.StatusTooManyRequests, "RATE_LIMITED")

	slow, _ := e.tokens.Add("slow", ScopeRead)
	if resp := get(slow); resp.StatusCode != http.StatusOK {
		t.Fatalf("first request of slow: %d", resp.StatusCode)
	}
	resp = get(slow)
	wantError(t, resp, http.StatusTooManyRequests, "RATE_LIMITED")
	if ra := resp.Header.Get("Retry-After"); ra != "10" {
		t.Errorf("Retry-After %q at 0.1/s, want 10", ra)
	}
}

// execAsync starts an exec and returns a channel with its status and body.
func execAsync(e *env, user, body string) <-chan [2]string {
	ch := make(chan [2]string, 1)
	go func() {
		r, _ := http.NewRequest("POST", e.ts.URL+"/v1/sandboxes/"+user+"/exec", strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+e.tok)
		resp, err := e.ts.Client().Do(r)
		if err != nil {
			ch <- [2]string{"error", err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		ch <- [2]string{resp.Status, string(b)}
	}()
	return ch
}

func (e *env) waitExecs(t *testing.T, n int) {
	t.Helper()
	waitUntil(t, func() bool { got, _ := e.be.Execs(); return got >= n }, "the backend to run the command")
}

func recv(t *testing.T, ch <-chan [2]string) [2]string {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for an answer")
	}
	return [2]string{}
}

func TestConcurrentExecLimit(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Limits = Limits{MaxConcurrentExecs: 1} })
	first := execAsync(e, "alice", `{"argv":["fake","wait=a"]}`)
	e.waitExecs(t, 1)
	start := time.Now()
	resp := e.exec("bob", `{"argv":["true"]}`)
	wantError(t, resp, http.StatusTooManyRequests, "RATE_LIMITED")
	if time.Since(start) > 2*time.Second || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("the refusal took %v, Retry-After %q", time.Since(start), resp.Header.Get("Retry-After"))
	}
	other, _ := e.tokens.Add("globex", ScopeExec)
	if resp := e.req("POST", "/v1/sandboxes/bob/exec", other, strings.NewReader(`{"argv":["true"]}`)); resp.StatusCode != 200 {
		t.Errorf("another tenant: %d", resp.StatusCode)
	}
	e.be.Release("a")
	if got := recv(t, first); got[0] != "200 OK" {
		t.Fatalf("the running command: %v", got)
	}
	if resp := e.exec("bob", `{"argv":["true"]}`); resp.StatusCode != 200 {
		t.Errorf("after the first ended: %d", resp.StatusCode)
	}
}

func TestSandboxLimit(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TenantLimits = map[string]Limits{"acme": {MaxSandboxes: 2}} })
	for _, u := range []string{"alice", "bob", "alice"} {
		if resp := e.exec(u, `{"argv":["true"]}`); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", u, resp.StatusCode, readAll(t, resp))
		}
	}
	resp := e.exec("carol", `{"argv":["true"]}`)
	eb := wantError(t, resp, http.StatusTooManyRequests, "RATE_LIMITED")
	if resp.Header.Get("Retry-After") != "30" || !strings.Contains(eb.Message, "2 sandboxes") {
		t.Errorf("refusal %+v, Retry-After %q", eb, resp.Header.Get("Retry-After"))
	}
	if resp := e.req("DELETE", "/v1/sandboxes/bob", e.tok, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: %d", resp.StatusCode)
	}
	if resp := e.exec("carol", `{"argv":["true"]}`); resp.StatusCode != 200 {
		t.Errorf("carol after bob was removed: %d", resp.StatusCode)
	}
}

// Two new users at once cannot both take the last place.
func TestSandboxLimitCountsPendingCommands(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Limits = Limits{MaxSandboxes: 1} })
	first := execAsync(e, "x", `{"argv":["fake","wait=x"]}`)
	e.waitExecs(t, 1)
	wantError(t, e.exec("y", `{"argv":["true"]}`), http.StatusTooManyRequests, "RATE_LIMITED")
	e.be.Release("x")
	if got := recv(t, first); got[0] != "200 OK" {
		t.Fatal(got)
	}
	if resp := e.exec("x", `{"argv":["true"]}`); resp.StatusCode != 200 {
		t.Errorf("x again: %d", resp.StatusCode)
	}
}

func TestDrainLosesNoResult(t *testing.T) {
	e := newEnv(t, nil)
	running := execAsync(e, "alice", `{"argv":["fake","out=done","wait=d"]}`)
	e.waitExecs(t, 1)
	drained := make(chan error, 1)
	go func() { drained <- e.srv.Drain(context.Background()) }()
	waitUntil(t, e.srv.drain.isDraining, "draining")

	resp := e.exec("bob", `{"argv":["true"]}`)
	wantError(t, resp, http.StatusServiceUnavailable, "SHUTTING_DOWN")
	wantError(t, e.req("GET", "/readyz", "", nil), http.StatusServiceUnavailable, "SHUTTING_DOWN")
	select {
	case err := <-drained:
		t.Fatalf("Drain returned %v with a command running", err)
	case <-time.After(50 * time.Millisecond):
	}
	e.be.Release("d")
	got := recv(t, running)
	if got[0] != "200 OK" || !strings.Contains(got[1], `"stdout":"done"`) {
		t.Fatalf("the running command's answer: %v", got)
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Drain did not return")
	}
}

func TestDrainBoundedByCtx(t *testing.T) {
	e := newEnv(t, nil)
	running := execAsync(e, "alice", `{"argv":["fake","wait=d"]}`)
	e.waitExecs(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := e.srv.Drain(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "1 commands still running") {
		t.Fatalf("Drain: %v", err)
	}
	e.be.Release("d")
	recv(t, running)
	if err := e.srv.Drain(context.Background()); err != nil { // again, now idle
		t.Fatal(err)
	}
}
