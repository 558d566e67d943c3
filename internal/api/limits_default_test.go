package api

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestResolveLimits(t *testing.T) {
	def := Limits{MaxSandboxes: 5, MaxConcurrentExecs: 4, RequestsPerSecond: 10, Burst: 20, MaxConcurrentFileOps: 3}
	for _, tc := range []struct {
		name    string
		in, out Limits
	}{
		{"zero takes every default", Limits{}, def},
		{"given values stay", Limits{MaxSandboxes: 1, MaxConcurrentExecs: 2, RequestsPerSecond: 3, Burst: 4, MaxConcurrentFileOps: 5},
			Limits{MaxSandboxes: 1, MaxConcurrentExecs: 2, RequestsPerSecond: 3, Burst: 4, MaxConcurrentFileOps: 5}},
		{"unlimited lifts each bound", Limits{MaxSandboxes: Unlimited, MaxConcurrentExecs: Unlimited, RequestsPerSecond: Unlimited, MaxConcurrentFileOps: Unlimited},
			Limits{}},
		{"a rate without a burst keeps the rate's own burst", Limits{RequestsPerSecond: 2},
			Limits{MaxSandboxes: 5, MaxConcurrentExecs: 4, RequestsPerSecond: 2, MaxConcurrentFileOps: 3}},
		{"a burst on the default rate", Limits{Burst: 7}, Limits{MaxSandboxes: 5, MaxConcurrentExecs: 4, RequestsPerSecond: 10, Burst: 7, MaxConcurrentFileOps: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := resolveLimits(tc.in, def); got != tc.out {
				t.Errorf("resolveLimits(%+v) = %+v, want %+v", tc.in, got, tc.out)
			}
		})
	}
	if err := checkLimits("Limits", Limits{MaxSandboxes: -2}); err == nil {
		t.Error("-2 sandboxes accepted")
	}
	if err := checkLimits("Limits", Limits{RequestsPerSecond: -0.5}); err == nil {
		t.Error("-0.5 requests per second accepted")
	}
}

// A server configured with no limits at all still bounds a tenant: a flood of requests is refused with the
// code, the sentence and the hint the docs give, and another tenant is not affected.
func TestDefaultLimitsBoundATenant(t *testing.T) {
	clk := &clock{t: time.Now()} // no refill while the test runs
	e := newEnv(t, func(c *Config) { c.Now = clk.now })
	refused := 0
	for range DefaultLimits.Burst + 10 {
		resp := e.req("GET", "/v1/sandboxes", e.tok, nil)
		if resp.StatusCode == http.StatusTooManyRequests {
			eb := wantError(t, resp, http.StatusTooManyRequests, "RATE_LIMITED")
			if !strings.Contains(eb.Message, "requests per second") || !strings.Contains(eb.Hint, "raise the limit") {
				t.Fatalf("refusal %+v", eb)
			}
			refused++
			continue
		}
		readAll(t, resp)
	}
	if refused != 10 {
		t.Errorf("%d of %d requests refused, want 10 (the default burst is %d)", refused, DefaultLimits.Burst+10, DefaultLimits.Burst)
	}
	other, _ := e.tokens.Add("globex", ScopeRead)
	if resp := e.req("GET", "/v1/sandboxes", other, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("another tenant: %d", resp.StatusCode)
	}

	open := newEnv(t, func(c *Config) { c.Now = clk.now; c.Limits = Limits{RequestsPerSecond: Unlimited} })
	for i := range DefaultLimits.Burst + 10 {
		if resp := open.req("GET", "/v1/sandboxes", open.tok, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d with the rate lifted: %d", i, resp.StatusCode)
		}
	}
}

func (e *env) putAs(user, path, body string) *http.Response {
	return e.req("PUT", "/v1/sandboxes/"+user+"/files/"+path, e.tok, strings.NewReader(body))
}

// An upload that creates a workspace is one more sandbox of the tenant: past the limit it is refused before
// anything is created, and it counts against a later exec too.
func TestUploadsCountAgainstSandboxLimit(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Limits = Limits{MaxSandboxes: 2} })
	if resp := e.exec("alice", `{"argv":["true"]}`); resp.StatusCode != 200 {
		t.Fatalf("alice: %d %s", resp.StatusCode, readAll(t, resp))
	}
	if resp := e.putAs("bob", "a.txt", "hi"); resp.StatusCode != 200 {
		t.Fatalf("bob's upload: %d %s", resp.StatusCode, readAll(t, resp))
	}
	resp := e.putAs("carol", "a.txt", "hi")
	eb := wantError(t, resp, http.StatusTooManyRequests, "RATE_LIMITED")
	if resp.Header.Get("Retry-After") != "30" || !strings.Contains(eb.Message, "2 sandboxes") {
		t.Errorf("refusal %+v, Retry-After %q", eb, resp.Header.Get("Retry-After"))
	}
	wantError(t, e.req("GET", "/v1/sandboxes/carol/files/a.txt", e.tok, nil), http.StatusNotFound, "FILE_NOT_FOUND")
	wantError(t, e.exec("carol", `{"argv":["true"]}`), http.StatusTooManyRequests, "RATE_LIMITED")
	for _, u := range []string{"alice", "bob"} { // their workspaces exist: no new sandbox
		if resp := e.putAs(u, "b.txt", "again"); resp.StatusCode != 200 {
			t.Errorf("%s's second upload: %d %s", u, resp.StatusCode, readAll(t, resp))
		}
	}
	if resp := e.req("DELETE", "/v1/sandboxes/bob", e.tok, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete bob: %d", resp.StatusCode)
	}
	if resp := e.putAs("carol", "a.txt", "hi"); resp.StatusCode != 200 {
		t.Errorf("carol after bob was removed: %d %s", resp.StatusCode, readAll(t, resp))
	}
}

// A tenant's open file operations are bounded; a slow one holds its place until it ends, and gives it back.
func TestConcurrentFileOpsLimit(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Limits = Limits{MaxConcurrentFileOps: 1} })
	pr, pw := io.Pipe()
	first := make(chan int, 1)
	go func() {
		resp := e.req("PUT", "/v1/sandboxes/alice/files/slow.txt", e.tok, pr)
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	if _, err := pw.Write([]byte("part")); err != nil { // the handler is reading: it holds the place
		t.Fatal(err)
	}
	resp := e.putAs("bob", "x.txt", "x")
	eb := wantError(t, resp, http.StatusTooManyRequests, "RATE_LIMITED")
	if !strings.Contains(eb.Message, "file operations") || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("refusal %+v, Retry-After %q", eb, resp.Header.Get("Retry-After"))
	}
	other, _ := e.tokens.Add("globex", ScopeFiles)
	if resp := e.req("PUT", "/v1/sandboxes/bob/files/x.txt", other, strings.NewReader("x")); resp.StatusCode != 200 {
		t.Errorf("another tenant: %d", resp.StatusCode)
	}
	pw.Close()
	if got := <-first; got != 200 {
		t.Fatalf("the slow upload: %d", got)
	}
	if resp := e.putAs("bob", "x.txt", "x"); resp.StatusCode != 200 {
		t.Errorf("after the slow upload ended: %d", resp.StatusCode)
	}
}
