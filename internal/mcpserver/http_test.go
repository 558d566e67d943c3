package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
)

// httpFixture is a Handler behind httptest with a toy token check: the token names the tenant, and the token
// "readonly" may only use read-scoped tools.
type httpFixture struct {
	b   *fakeBackend
	srv *httptest.Server
	tr  *http.Transport
}

var testTokens = map[string]string{"tok-acme": "acme", "tok-globex": "globex", "readonly": "acme"}

func newHTTPFixture(t *testing.T) *httpFixture {
	t.Helper()
	b := newFakeBackend(t)
	keyFor := func(r *http.Request) (sandkeep.Key, error) {
		tenant, ok := testTokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		switch {
		case r.Header.Get("Authorization") == "Bearer explode":
			return sandkeep.Key{}, errors.New("token store: dial /var/lib/secret.sock")
		case !ok:
			return sandkeep.Key{}, fault.New(fault.Unauthenticated, "pass Authorization: Bearer <token>", "no valid token")
		}
		return sandkeep.NewKey(tenant, r.Header.Get("Sandkeep-User"))
	}
	h := Handler(b, keyFor, Options{
		RequestID: func(r *http.Request) string { return r.Header.Get("X-Request-Id") },
		Authorize: func(r *http.Request, tool string) error {
			if r.Header.Get("Authorization") == "Bearer readonly" && Scope(tool) != store.ScopeRead {
				return fault.New(fault.Forbidden, "ask for a token with the "+Scope(tool)+" scope", "this token is read-only")
			}
			return nil
		},
	})
	f := &httpFixture{b: b, srv: httptest.NewServer(h), tr: &http.Transport{}}
	t.Cleanup(func() {
		f.tr.CloseIdleConnections()
		f.srv.Close()
	})
	return f
}

// headers adds fixed headers to every request, as an MCP client configured with headers does.
type headers struct {
	h    map[string]string
	base http.RoundTripper
}

func (rt headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range rt.h {
		if k == "Host" {
			r.Host = v
			continue
		}
		r.Header.Set(k, v)
	}
	return rt.base.RoundTrip(r)
}

func (f *httpFixture) client(t *testing.T, h map[string]string) *mcp.ClientSession {
	t.Helper()
	tr := &mcp.StreamableClientTransport{Endpoint: f.srv.URL, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: headers{h: h, base: f.tr}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(context.Background(), tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func TestHTTPRefused(t *testing.T) {
	f := newHTTPFixture(t)
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}`
	tests := []struct {
		name   string
		header map[string]string
		status int
		code   fault.Code
	}{
		{"no token", map[string]string{"Sandkeep-User": "alice"}, 401, fault.Unauthenticated},
		{"bad token", map[string]string{"Authorization": "Bearer nope", "Sandkeep-User": "alice"}, 401, fault.Unauthenticated},
		{"no user", map[string]string{"Authorization": "Bearer tok-acme"}, 400, fault.InvalidIdentity},
		{"user with a control character", map[string]string{"Authorization": "Bearer tok-acme", "Sandkeep-User": "a\tb"}, 400, fault.InvalidIdentity},
		{"keyFor fails without a code", map[string]string{"Authorization": "Bearer explode", "Sandkeep-User": "alice"}, 500, fault.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, f.srv.URL, strings.NewReader(init))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			resp, err := (&http.Client{Transport: f.tr}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.status || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d %s, want %d JSON: %s", resp.StatusCode, resp.Header.Get("Content-Type"), tt.status, body)
			}
			var te ToolError
			dec := json.NewDecoder(strings.NewReader(string(body)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&te); err != nil || te.Code != tt.code || te.Message == "" {
				t.Fatalf("body %s (%v), want {code: %s, message, hint}", body, err, tt.code)
			}
			if tt.status == 401 && resp.Header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
			if strings.Contains(string(body), "secret.sock") {
				t.Errorf("an internal cause reached the client: %s", body)
			}
			if n := len(f.b.calls()); n != 0 {
				t.Errorf("a refused request reached the backend (%d execs)", n)
			}
		})
	}
}

func TestHTTP(t *testing.T) {
	f := newHTTPFixture(t)
	alice := f.client(t, map[string]string{"Authorization": "Bearer tok-acme", "Sandkeep-User": "alice", "X-Request-Id": "req-1"})
	bob := f.client(t, map[string]string{"Authorization": "Bearer tok-globex", "Sandkeep-User": "bob"})

	tools, err := alice.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) != 15 {
		t.Fatalf("tools over HTTP: %v, %v", tools, err)
	}
	f.b.execFn = func(_ context.Context, key sandkeep.Key, _ sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
		return &sandkeep.ExecResult{ExitCode: 1, Stdout: key.Tenant + "/" + key.User}, nil
	}
	out := output[ExecOutput](t, call(t, alice, ToolExec, map[string]any{"command": "whoami"}))
	if out.Stdout != "acme/alice" || out.ExitCode != 1 {
		t.Errorf("alice's exec %+v", out)
	}
	out = output[ExecOutput](t, call(t, bob, ToolExec, map[string]any{"argv": []string{"id"}}))
	if out.Stdout != "globex/bob" {
		t.Errorf("bob's exec ran as %q", out.Stdout)
	}
	calls := f.b.calls()
	if len(calls) != 2 || calls[0].ar.RequestID != "req-1" || calls[1].ar.RequestID != "" {
		t.Errorf("request ids %+v, want req-1 then none", calls)
	}

	// Files written by one key are not visible to another.
	output[WriteFileOutput](t, call(t, alice, ToolWriteFile, map[string]any{"path": "secret", "content": "alice's"}))
	r := output[ReadFileOutput](t, call(t, alice, ToolReadFile, map[string]any{"path": "secret"}))
	if r.Content != "alice's" {
		t.Errorf("alice read %q", r.Content)
	}
	wantCode(t, call(t, bob, ToolReadFile, map[string]any{"path": "secret"}), fault.NotFound)

	// Tool errors travel as results over HTTP too.
	wantCode(t, call(t, alice, ToolExec, map[string]any{"command": "ls", "timeout_seconds": 0}), fault.InvalidArgument)
}

func TestHTTPAuthorize(t *testing.T) {
	f := newHTTPFixture(t)
	ro := f.client(t, map[string]string{"Authorization": "Bearer readonly", "Sandkeep-User": "alice"})
	for tool, args := range map[string]map[string]any{
		ToolExec:      {"command": "ls"},
		ToolWriteFile: {"path": "x", "content": ""},
		ToolReadFile:  {"path": "x"},
		ToolListFiles: {},
	} {
		te := wantCode(t, call(t, ro, tool, args), fault.Forbidden)
		if !strings.Contains(te.Hint, Scope(tool)) {
			t.Errorf("%s: hint %q does not name the scope %s", tool, te.Hint, Scope(tool))
		}
	}
	output[StatusOutput](t, call(t, ro, ToolSandboxStatus, nil))
	if n := len(f.b.calls()); n != 0 {
		t.Errorf("a refused tool reached the backend (%d execs)", n)
	}
}

// TestHTTPDisconnect: a client that goes away while its command runs cancels the command, whichever protocol
// version it speaks: the SDK's client (the newest) or a plain POST of an older one.
func TestHTTPDisconnect(t *testing.T) {
	tests := []struct {
		name string
		call func(ctx context.Context, t *testing.T, f *httpFixture) error
	}{
		{"sdk client", func(ctx context.Context, t *testing.T, f *httpFixture) error {
			cs := f.client(t, map[string]string{"Authorization": "Bearer tok-acme", "Sandkeep-User": "alice"})
			_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: ToolExec, Arguments: map[string]any{"command": "sleep 100"}})
			return err
		}},
		{"2025-06-18 POST", func(ctx context.Context, t *testing.T, f *httpFixture) error {
			body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"exec","arguments":{"command":"sleep 100"}}}`
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.srv.URL, strings.NewReader(body))
			if err != nil {
				return err
			}
			for k, v := range map[string]string{"Authorization": "Bearer tok-acme", "Sandkeep-User": "alice",
				"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
				"MCP-Protocol-Version": "2025-06-18"} {
				req.Header.Set(k, v)
			}
			resp, err := (&http.Client{Transport: f.tr}).Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			_, err = io.ReadAll(resp.Body)
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newHTTPFixture(t)
			started := make(chan struct{})
			cancelled := make(chan struct{})
			var once sync.Once
			f.b.execFn = func(ctx context.Context, _ sandkeep.Key, _ sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
				once.Do(func() { close(started) })
				select {
				case <-ctx.Done():
					close(cancelled)
					return nil, ctx.Err()
				case <-time.After(30 * time.Second):
					return &sandkeep.ExecResult{}, nil
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- tt.call(ctx, t, f) }()
			select {
			case <-started:
			case err := <-done:
				t.Fatalf("the call ended before the command started: %v", err)
			}
			cancel()
			if err := <-done; err == nil {
				t.Error("a cancelled call reported success")
			}
			select {
			case <-cancelled:
			case <-time.After(10 * time.Second):
				t.Fatal("the client went away but its command kept running")
			}
		})
	}
}

// TestHTTPLargestWrite: the largest write fits in a request body even when its JSON escapes every byte (6 MiB
// of JSON for 1 MiB of control characters, past the SDK's default body bound of 4 MiB).
func TestHTTPLargestWrite(t *testing.T) {
	f := newHTTPFixture(t)
	cs := f.client(t, map[string]string{"Authorization": "Bearer tok-acme", "Sandkeep-User": "alice"})
	control := strings.Repeat("\x01", DefaultMaxWriteBytes)
	w := output[WriteFileOutput](t, call(t, cs, ToolWriteFile, map[string]any{"path": "ctl", "content": control}))
	if w.Bytes != DefaultMaxWriteBytes {
		t.Errorf("wrote %d bytes, want %d", w.Bytes, DefaultMaxWriteBytes)
	}
}

// TestHTTPBehindProxy: a reverse proxy on the same machine reaches the loopback listener with its own Host.
func TestHTTPBehindProxy(t *testing.T) {
	f := newHTTPFixture(t)
	cs := f.client(t, map[string]string{"Authorization": "Bearer tok-acme", "Sandkeep-User": "alice",
		"Host": "sandkeep.example.com"})
	output[StatusOutput](t, call(t, cs, ToolSandboxStatus, nil))
}

func TestHTTPStatus(t *testing.T) {
	for code, want := range map[fault.Code]int{
		fault.Unauthenticated: 401, fault.Forbidden: 403, fault.InvalidIdentity: 400, fault.RequestInvalid: 400,
		fault.RateLimited: 429, fault.ShuttingDown: 503, fault.Internal: 500, fault.NotFound: 404,
	} {
		if got := httpStatus(code); got != want {
			t.Errorf("%s: status %d, want %d", code, got, want)
		}
	}
}
