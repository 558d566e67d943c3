package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkeep/sandkeep/internal/mcpserver"
	"github.com/sandkeep/sandkeep/internal/service"
)

// mcpHeaders adds the caller's headers to every MCP request.
type mcpHeaders map[string]string

func (h mcpHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// The real MCP server behind the API: token auth, tenant from the token, per-tool scopes, the request id on
// the command, and the API's metrics and limits on its execs.
func TestMCPEndToEnd(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.MCP = func(b service.Backend, h MCPHooks) http.Handler {
			return mcpserver.Handler(b, h.KeyFor, mcpserver.Options{
				Authorize: func(r *http.Request, tool string) error { return h.Authorize(r, mcpserver.Scope(tool)) },
				RequestID: h.RequestID,
			})
		}
	})
	connect := func(token, user, id string) *mcp.ClientSession {
		t.Helper()
		tr := &mcp.StreamableClientTransport{Endpoint: e.ts.URL + "/mcp", MaxRetries: -1, HTTPClient: &http.Client{
			Transport: mcpHeaders{"Authorization": "Bearer " + token, UserHeader: user, RequestIDHeader: id}}}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(context.Background(), tr, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		return cs
	}
	call := func(cs *mcp.ClientSession, tool string, args map[string]any) (*mcp.CallToolResult, string) {
		t.Helper()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(res)
		return res, string(b)
	}

	alice := connect(e.tok, "alice", "mcp-req-1")
	res, text := call(alice, mcpserver.ToolExec, map[string]any{"argv": []string{"echo", "via", "mcp"}})
	if res.IsError || !strings.Contains(text, `via mcp\n`) {
		t.Fatalf("exec: %s", text)
	}
	if ar := e.be.LastAdmit(); ar.RequestID != "mcp-req-1" {
		t.Errorf("request id on the command: %q", ar.RequestID)
	}
	wantMetric(t, scrape(t, e), `sandkeep_execs_total{outcome="ok"} 1`)

	readOnly, _ := e.tokens.Add("acme", ScopeRead)
	ro := connect(readOnly, "alice", "mcp-req-2")
	if res, text := call(ro, mcpserver.ToolExec, map[string]any{"command": "id"}); !res.IsError || !strings.Contains(text, "FORBIDDEN") {
		t.Errorf("read-only exec: %s", text)
	}
	if res, text := call(ro, mcpserver.ToolSandboxStatus, nil); res.IsError {
		t.Errorf("read-only sandbox_status: %s", text)
	}
	if n, _ := e.be.Execs(); n != 1 {
		t.Errorf("%d commands ran, want 1", n)
	}

	// No token: refused before the MCP server sees the request.
	wantError(t, e.req("POST", "/mcp", "", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`),
		UserHeader, "alice", "Content-Type", "application/json", "Accept", "application/json, text/event-stream"),
		http.StatusUnauthorized, "UNAUTHENTICATED")
}
