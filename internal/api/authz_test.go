package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/api/apitest"
	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/processes"
)

// world is a server whose backend may hold the victim tenant's objects.
type world struct {
	be *apitest.Backend
	ts *httptest.Server
}

func newWorld(t *testing.T, tokens *apitest.Tokens) *world {
	be := apitest.NewBackend(t.TempDir())
	srv, err := New(Config{Backend: be, Tokens: tokens, MetricsToken: "metrics-secret",
		MCP: func(b service.Backend, hooks MCPHooks) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				key, err := hooks.KeyFor(r)
				if err != nil {
					http.Error(w, string(fault.CodeOf(err)), http.StatusBadRequest)
					return
				}
				fmt.Fprintf(w, "tenant=%s user=%s", key.Tenant, key.User)
			})
		}})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{be: be, ts: httptest.NewServer(srv.Handler())}
	t.Cleanup(w.ts.Close)
	return w
}

func (w *world) do(t *testing.T, method, path, token, body string, hdr ...string) (int, http.Header, string) {
	t.Helper()
	r, _ := http.NewRequest(method, w.ts.URL+path, strings.NewReader(body))
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := w.ts.Client().Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestAuthorizationMatrix sends every route every kind of refused token, and another tenant's valid token
// against the victim's objects. The first are refused without effect; the second answer, status and body,
// exactly as the same request to a server where the victim's objects never existed.
func TestAuthorizationMatrix(t *testing.T) {
	tokens := apitest.NewTokens()
	full, empty := newWorld(t, tokens), newWorld(t, tokens)
	ctx := context.Background()

	// The victim: tenant globex, user bob, with a sandbox, a workspace file and a run with events.
	victim, _ := sandkeep.NewKey("globex", "bob")
	res, err := full.be.Exec(ctx, victim, service.AdmitRequest{}, sandkeep.ExecRequest{Argv: []string{"echo", "secret"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatal(res, err)
	}
	ws, err := full.be.Workspace(ctx, victim, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Write(ctx, "f.txt", strings.NewReader("globex data"), 0o644); err != nil {
		t.Fatal(err)
	}
	ws.Close()
	if _, err := full.be.StartProcess(ctx, victim, processes.StartRequest{Argv: []string{"dev-server"}, Tag: "dev", Stdin: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := full.be.CreateSnapshot(ctx, victim, "s1", ""); err != nil { // named as the routes below name theirs
		t.Fatal(err)
	}
	runs, _ := full.be.Runs(ctx, store.RunFilter{Tenant: "globex"})
	runID := runs[0].ID
	before := snapshot(t, full.be, victim)

	// Every route with token auth, as a concrete request against the victim's objects.
	type req struct {
		method, path, body string
		hdr                []string
	}
	// Those that act on the caller's own objects come last, so that the read-only ones compare two worlds in
	// which the caller has nothing.
	cases := []struct {
		name string
		req
	}{
		{"GET /v1/sandboxes", req{"GET", "/v1/sandboxes", "", nil}},
		{"GET /v1/sandboxes/{user}", req{"GET", "/v1/sandboxes/bob", "", nil}},
		{"POST /v1/sandboxes/{user}/stop", req{"POST", "/v1/sandboxes/bob/stop", "", nil}},
		{"DELETE /v1/sandboxes/{user}", req{"DELETE", "/v1/sandboxes/bob", "", nil}},
		{"POST /v1/sandboxes/{user}/fork", req{"POST", "/v1/sandboxes/bob/fork", `{"to":"carol"}`, nil}},
		{"POST /v1/sandboxes/{user}/snapshots", req{"POST", "/v1/sandboxes/bob/snapshots", `{"name":"s1"}`, nil}},
		{"GET /v1/snapshots", req{"GET", "/v1/snapshots", "", nil}},
		{"DELETE /v1/snapshots/{name}", req{"DELETE", "/v1/snapshots/s1", "", nil}},
		{"POST /v1/snapshots/{name}/restore", req{"POST", "/v1/snapshots/s1/restore", `{"user":"carol"}`, nil}},
		{"GET /v1/sandboxes/{user}/files/{path...}", req{"GET", "/v1/sandboxes/bob/files/f.txt", "", nil}},
		{"GET /v1/sandboxes/{user}/files/{path...}#list", req{"GET", "/v1/sandboxes/bob/files/?list=1", "", nil}},
		{"GET /v1/sandboxes/{user}/files/{path...}#tar", req{"GET", "/v1/sandboxes/bob/files/", "", nil}},
		{"GET /v1/sandboxes/{user}/exec/tty", req{"GET", "/v1/sandboxes/bob/exec/tty", "", nil}},
		{"GET /v1/sandboxes/{user}/ports/{port}", req{"GET", "/v1/sandboxes/bob/ports/8080", "", nil}},
		{"GET /v1/sandboxes/{user}/ports", req{"GET", "/v1/sandboxes/bob/ports", "", nil}},
		{"GET /v1/sandboxes/{user}/processes", req{"GET", "/v1/sandboxes/bob/processes", "", nil}},
		{"GET /v1/sandboxes/{user}/processes/{ref}/output", req{"GET", "/v1/sandboxes/bob/processes/dev/output?follow=0", "", nil}},
		{"GET /v1/sandboxes/{user}/processes/{ref}/output#pid", req{"GET", "/v1/sandboxes/bob/processes/101/output?follow=0", "", nil}},
		{"POST /v1/sandboxes/{user}/processes/{ref}/input", req{"POST", "/v1/sandboxes/bob/processes/dev/input", `{"data":"x"}`, nil}},
		{"POST /v1/sandboxes/{user}/processes/{ref}/signal", req{"POST", "/v1/sandboxes/bob/processes/dev/signal", `{"signal":"HUP"}`, nil}},
		{"POST /v1/sandboxes/{user}/processes/{ref}/kill", req{"POST", "/v1/sandboxes/bob/processes/101/kill", "", nil}},
		{"POST /v1/sandboxes/{user}/processes/{ref}/resize", req{"POST", "/v1/sandboxes/bob/processes/dev/resize", `{"rows":24,"cols":80}`, nil}},
		{"GET /v1/runs", req{"GET", "/v1/runs", "", nil}},
		{"GET /v1/runs/{id}", req{"GET", "/v1/runs/" + runID, "", nil}},
		{"GET /v1/runs/{id}/events", req{"GET", "/v1/runs/" + runID + "/events", "", nil}},
		{"GET /v1/runs/{id}/logs", req{"GET", "/v1/runs/" + runID + "/logs", "", nil}},
		{"GET /v1/runs/{id}/events#follow", req{"GET", "/v1/runs/" + runID + "/events?follow=1", "", nil}},
		{"GET /v1/openapi.json", req{"GET", "/v1/openapi.json", "", nil}},
		{"GET /v1/templates", req{"GET", "/v1/templates", "", nil}},
		{"POST /v1/runs/{id}/finish", req{"POST", "/v1/runs/" + runID + "/finish", `{}`, nil}},
		{"POST /v1/sandboxes/{user}/exec", req{"POST", "/v1/sandboxes/bob/exec", `{"argv":["echo","x"]}`, nil}},
		{"POST /v1/sandboxes/{user}/runs", req{"POST", "/v1/sandboxes/bob/runs", `{}`, nil}},
		{"POST /v1/sandboxes/{user}/processes", req{"POST", "/v1/sandboxes/bob/processes", `{"argv":["dev-server"],"tag":"dev"}`, nil}},
		{"PUT /v1/sandboxes/{user}/files/{path...}", req{"PUT", "/v1/sandboxes/bob/files/f.txt", "overwritten", nil}},
		{"/mcp", req{"POST", "/mcp", `{}`, []string{UserHeader, "bob"}}},
	}
	covered := map[string]bool{}
	for _, c := range cases {
		p, _, _ := strings.Cut(c.name, "#")
		covered[p] = true
	}
	srv, _ := New(Config{Backend: full.be, Tokens: tokens, MCP: func(service.Backend, MCPHooks) http.Handler {
		return http.NotFoundHandler()
	}})
	var scopesOf = map[string][]string{}
	for _, r := range srv.routes {
		if r.auth != authToken {
			continue
		}
		scopesOf[r.pattern] = r.scopes
		if !covered[r.pattern] {
			t.Errorf("route %s has no case in the authorization matrix", r.pattern)
		}
	}

	now := time.Now().UTC()
	revoked, revokedTok := tokens.Add("globex", auth.ScopeAdmin)
	revokedTok.RevokedAt = now.Add(-time.Minute)
	tokens.Put(revokedTok)
	expired, expiredTok := tokens.Add("globex", auth.ScopeAdmin)
	expiredTok.ExpiresAt = now.Add(-time.Second)
	tokens.Put(expiredTok)
	other, _ := tokens.Add("acme", auth.ScopeAdmin)
	refused := []struct{ name, token string }{
		{"no token", ""},
		{"malformed token", "not-a-token"},
		{"unknown token", auth.Generate()},
		{"revoked token", revoked},
		{"expired token", expired},
	}

	for _, c := range cases {
		pattern, _, _ := strings.Cut(c.name, "#")
		t.Run(c.name, func(t *testing.T) {
			for _, tk := range refused {
				status, h, body := full.do(t, c.method, c.path, tk.token, c.body, c.hdr...)
				if status != http.StatusUnauthorized || !strings.Contains(body, `"code":"UNAUTHENTICATED"`) ||
					!strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("%s: %d %s", tk.name, status, body)
				}
				if strings.Contains(body, "secret") || strings.Contains(body, "globex") {
					t.Errorf("%s: the refusal tells something: %s", tk.name, body)
				}
			}
			if need := scopesOf[pattern]; len(need) > 0 {
				var have []string
				for _, sc := range []string{auth.ScopeExec, auth.ScopeFiles, auth.ScopeRead} {
					if !slices.Contains(need, sc) {
						have = append(have, sc)
					}
				}
				wrong, _ := tokens.Add("globex", have...)
				status, _, body := full.do(t, c.method, c.path, wrong, c.body, c.hdr...)
				if status != http.StatusForbidden || !strings.Contains(body, `"code":"FORBIDDEN"`) {
					t.Errorf("scopes %v for %v: %d %s", have, need, status, body)
				}
			}

			// Another tenant's valid token: the same answer as where the victim never existed.
			status, _, body := full.do(t, c.method, c.path, other, c.body, c.hdr...)
			estatus, _, ebody := empty.do(t, c.method, c.path, other, c.body, c.hdr...)
			if strings.Contains(body, "globex") || strings.Contains(body, "secret") {
				t.Errorf("another tenant sees the victim: %d %s", status, body)
			}
			switch pattern {
			case "POST /v1/sandboxes/{user}/exec", "POST /v1/sandboxes/{user}/runs", "POST /v1/sandboxes/{user}/processes", "PUT /v1/sandboxes/{user}/files/{path...}", "/mcp":
				// These act on the caller's own (acme, bob): they succeed there, and touch nothing of globex.
				if status != estatus || status/100 != 2 {
					t.Errorf("status %d (empty world %d): %s", status, estatus, body)
				}
				if pattern == "/mcp" && body != "tenant=acme user=bob" {
					t.Errorf("/mcp key: %s", body)
				}
			default:
				if status != estatus || body != ebody {
					t.Errorf("answers differ:\n with the victim: %d %s\n without:         %d %s", status, body, estatus, ebody)
				}
			}
		})
	}
	if sns, _ := full.be.Snapshots(ctx, "globex"); len(sns) != 1 || sns[0].Name != "s1" {
		t.Errorf("the victim's snapshots changed: %+v", sns)
	}
	if after := snapshot(t, full.be, victim); after != before {
		t.Errorf("the victim changed:\n before %s\n after  %s", before, after)
	}

	// /metrics with a metrics token: none, or a tenant's token, is refused.
	for _, tok := range []string{"", other} {
		if status, _, body := full.do(t, "GET", "/metrics", tok, ""); status != http.StatusUnauthorized {
			t.Errorf("/metrics with %q: %d %s", tok, status, body)
		}
	}
	if status, _, _ := full.do(t, "GET", "/metrics", "metrics-secret", ""); status != http.StatusOK {
		t.Errorf("/metrics with its token: %d", status)
	}
}

// snapshot describes what a victim has: its sandbox, its file, its runs and their events.
func snapshot(t *testing.T, be *apitest.Backend, key sandkeep.Key) string {
	t.Helper()
	ctx := context.Background()
	sb, err := be.Sandbox(ctx, key)
	if err != nil {
		return "no sandbox: " + err.Error()
	}
	ws, err := be.Workspace(ctx, key, false)
	if err != nil {
		return "no workspace: " + err.Error()
	}
	defer ws.Close()
	rc, _, err := ws.OpenFile("f.txt")
	if err != nil {
		return "no file: " + err.Error()
	}
	data, _ := io.ReadAll(rc)
	rc.Close()
	runs, _ := be.Runs(ctx, store.RunFilter{Tenant: key.Tenant})
	nev := 0
	for _, r := range runs {
		evs, _ := be.Events(ctx, store.EventFilter{RunID: r.ID})
		nev += len(evs)
	}
	ps, _ := be.Processes(ctx, key)
	var out strings.Builder
	for _, p := range ps {
		_, _ = be.AttachProcess(ctx, key, processes.Ref{PID: p.PID}, processes.AttachOptions{Stdout: &out, Snapshot: true})
	}
	return fmt.Sprintf("sandbox %s %s used %s; file %q; %d runs; %d events; processes %+v output %q", sb.Name, sb.State,
		sb.LastUsed, data, len(runs), nev, ps, out.String())
}
