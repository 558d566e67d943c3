package api

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandkeep/sandkeep/internal/api/apitest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

// env is one API server over a fake backend, served by httptest.
type env struct {
	t      testing.TB
	srv    *Server
	ts     *httptest.Server
	be     *apitest.Backend
	tokens *apitest.Tokens
	logs   *syncBuffer
	tok    string // tenant acme, every scope
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newEnv(t testing.TB, mut func(*Config)) *env {
	t.Helper()
	e := &env{t: t, be: apitest.NewBackend(t.TempDir()), tokens: apitest.NewTokens(), logs: &syncBuffer{}}
	cfg := Config{Backend: e.be, Tokens: e.tokens, Logger: jsonLogger(e.logs), PollInterval: 10 * time.Millisecond, MetricsOpen: true}
	if mut != nil {
		mut(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	e.ts = httptest.NewServer(srv.Handler())
	t.Cleanup(e.ts.Close)
	e.tok, _ = e.tokens.Add("acme", ScopeAdmin)
	return e
}

// req is one request: method, path, token ("" for none), body, and header pairs.
func (e *env) req(method, path, token string, body io.Reader, hdr ...string) *http.Response {
	e.t.Helper()
	r, err := http.NewRequest(method, e.ts.URL+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.ts.Client().Do(r)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// exec posts body to user's exec route with the env's token.
func (e *env) exec(user, body string, hdr ...string) *http.Response {
	return e.req("POST", "/v1/sandboxes/"+user+"/exec", e.tok, strings.NewReader(body), hdr...)
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// wantError checks that resp is an error answer with status and code, and returns it.
func wantError(t *testing.T, resp *http.Response, status int, code string) errorBody {
	t.Helper()
	body := readAll(t, resp)
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
	var eb errorBody
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&eb); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	if string(eb.Code) != code || eb.Message == "" {
		t.Fatalf("error %+v, want code %s and a message", eb, code)
	}
	return eb
}

func decodeJSON[T any](t *testing.T, resp *http.Response) T {
	t.Helper()
	var v T
	body := readAll(t, resp)
	if resp.StatusCode/100 != 2 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("decode %q: %v", body, err)
	}
	return v
}

func jsonLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewJSONHandler(w, nil)) }
