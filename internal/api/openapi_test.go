package api

import (
	"context"
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
)

func TestOpenAPICoversRoutes(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.MCP = func(service.Backend, MCPHooks) http.Handler { return http.NotFoundHandler() }
	})
	resp := e.req("GET", "/v1/openapi.json", e.tok, nil)
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal([]byte(readAll(t, resp)), &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1.") {
		t.Errorf("openapi %q, want 3.1.x", doc.OpenAPI)
	}
	rest := regexp.MustCompile(`\{(\w+)\.\.\.\}`)
	registered := map[string]bool{}
	for _, r := range e.srv.routes {
		method, path, ok := strings.Cut(r.pattern, " ")
		if !ok { // no method in the pattern: /mcp, which MCP clients POST to
			method, path = "POST", r.pattern
		}
		path = rest.ReplaceAllString(path, "{$1}")
		registered[strings.ToLower(method)+" "+path] = true
		if _, ok := doc.Paths[path][strings.ToLower(method)]; !ok {
			t.Errorf("route %s is not in openapi.json", r.pattern)
		}
	}
	for path, ops := range doc.Paths {
		for method := range ops {
			if !registered[method+" "+path] {
				t.Errorf("openapi.json describes %s %s, which is not registered", method, path)
			}
		}
	}
}

// TestEveryCodeHasAStatus reads internal/fault's constants, so that a new code cannot be left without a status.
func TestEveryCodeHasAStatus(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "fault", "fault.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for i, name := range vs.Names {
				lit := vs.Values[i].(*ast.BasicLit)
				code, _ := strconv.Unquote(lit.Value)
				n++
				if _, ok := statusOf[fault.Code(code)]; !ok {
					t.Errorf("fault.%s (%s) has no HTTP status in statusOf", name.Name, code)
				}
			}
		}
	}
	if n < 40 {
		t.Fatalf("found only %d codes in fault.go", n)
	}
}

func TestErrorStatuses(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct {
		code   fault.Code
		status int
	}{
		{fault.SandboxBusy, 409},
		{fault.SpecInvalid, 422},
		{fault.PostureRefused, 422},
		{fault.InvalidWorkdir, 400},
		{fault.DriverUnavailable, 503},
		{fault.SandboxDriverUnavailable, 503},
		{fault.ImageUnavailable, 500},
		{fault.FileTooLarge, 413},
	} {
		t.Run(string(tc.code), func(t *testing.T) {
			e.be.ExecHook = func(ctx context.Context, key sandkeep.Key, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
				return nil, fault.New(tc.code, "the hint", "the message")
			}
			eb := wantError(t, e.exec("alice", `{"argv":["x"]}`), tc.status, string(tc.code))
			if eb.Message != "the message" || eb.Hint != "the hint" {
				t.Errorf("body %+v", eb)
			}
		})
	}
	// An error that is not a fault: INTERNAL, and its text stays in the log.
	e.be.ExecHook = func(ctx context.Context, key sandkeep.Key, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
		return nil, errors.New("open /var/lib/secret/path: permission denied")
	}
	eb := wantError(t, e.exec("alice", `{"argv":["x"]}`), 500, "INTERNAL")
	if strings.Contains(eb.Message, "/var/lib") {
		t.Errorf("the cause reached the client: %+v", eb)
	}
	if !strings.Contains(e.logs.String(), "/var/lib/secret/path") {
		t.Error("the cause is not in the log")
	}
	// Unknown routes and methods answer JSON too.
	wantError(t, e.req("GET", "/v2/whatever", e.tok, nil), 404, "REQUEST_INVALID")
	wantError(t, e.req("PATCH", "/v1/sandboxes/alice", e.tok, nil), 404, "REQUEST_INVALID")
}

func TestMCPMount(t *testing.T) {
	var got []string
	e := newEnv(t, func(c *Config) {
		c.MCP = func(b service.Backend, hooks MCPHooks) http.Handler {
			if _, ok := b.(*guarded); !ok {
				t.Errorf("the MCP handler gets %T, not the guarded backend", b)
			}
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				key, err := hooks.KeyFor(r)
				if err != nil {
					got = append(got, string(fault.CodeOf(err)))
					return
				}
				got = append(got, key.Tenant+"/"+key.User+" "+hooks.RequestID(r)+" exec:"+
					string(fault.CodeOf(hooks.Authorize(r, ScopeExec)))+" read:"+string(fault.CodeOf(hooks.Authorize(r, ScopeRead))))
			})
		}
	})
	readOnly, _ := e.tokens.Add("acme", ScopeRead)
	readAll(t, e.req("POST", "/mcp", e.tok, strings.NewReader("{}"), UserHeader, "alice", RequestIDHeader, "m-1"))
	readAll(t, e.req("POST", "/mcp", readOnly, strings.NewReader("{}"), UserHeader, "bob", RequestIDHeader, "m-2"))
	readAll(t, e.req("POST", "/mcp", e.tok, strings.NewReader("{}")))
	wantError(t, e.req("POST", "/mcp", "", strings.NewReader("{}"), UserHeader, "alice"), 401, "UNAUTHENTICATED")
	want := []string{"acme/alice m-1 exec: read:", "acme/bob m-2 exec:FORBIDDEN read:", "REQUEST_INVALID"}
	if !slices.Equal(got, want) {
		t.Errorf("hooks gave %q, want %q", got, want)
	}
	// Outside the API's auth the hooks refuse.
	r := httptest.NewRequest("POST", "/mcp", nil)
	r.Header.Set(UserHeader, "alice")
	if _, err := mcpHooks.KeyFor(r); fault.CodeOf(err) != fault.Unauthenticated {
		t.Errorf("KeyFor without auth: %v", err)
	}
	if err := mcpHooks.Authorize(r, ScopeRead); fault.CodeOf(err) != fault.Unauthenticated {
		t.Errorf("Authorize without auth: %v", err)
	}
}
