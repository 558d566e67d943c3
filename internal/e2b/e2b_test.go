package e2b

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/api"
	"github.com/sandkeep/sandkeep/internal/e2b/proto/filesystem"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
)

func TestPaths(t *testing.T) {
	cases := []struct{ in, want, err string }{
		{"", "", ""},
		{"~", "", ""},
		{"a.txt", "a.txt", ""},
		{"~/a/b.txt", "a/b.txt", ""},
		{"/home/user", "", ""},
		{"/home/user/x", "x", ""},
		{"/workspace/x/y", "x/y", ""},
		{"/workspace", "", ""},
		{"a/../b", "b", ""},
		{"../../etc/passwd", "etc/passwd", ""}, // cleaned under the workspace root, never above it
		{"/etc/passwd", "", "outside the workspace"},
		{"/home/userx", "", "outside the workspace"},
		{"/workspacex", "", "outside the workspace"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := rel(c.in)
			if c.err != "" {
				if !fault.Is(err, fault.InvalidPath) || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("rel(%q) = %q, %v; want INVALID_PATH %q", c.in, got, err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("rel(%q) = %q, %v; want %q", c.in, got, err, c.want)
			}
		})
	}
	if got := displayPath("a/b"); got != "/home/user/a/b" {
		t.Errorf("displayPath = %q", got)
	}
}

func FuzzRel(f *testing.F) {
	for _, s := range []string{"", "~", "a/../../b", "/home/user/../../etc", "/workspace/./x", "~/../.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		r, err := rel(p)
		if err != nil {
			return
		}
		if strings.HasPrefix(r, "/") || r == ".." || strings.HasPrefix(r, "../") || strings.Contains(r, "/../") {
			t.Fatalf("rel(%q) = %q escapes the workspace", p, r)
		}
	})
}

func FuzzMetadataFilter(f *testing.F) {
	for _, s := range []string{"", "a=b", "a=b&c=d", "a%3Db=c", "=&&=", "%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := metadataFilter(s)
		if err != nil {
			return
		}
		for k, v := range m {
			if !matches(map[string]string{k: v}, map[string]string{k: v}) {
				t.Fatalf("filter %q does not match itself", s)
			}
		}
	})
}

func TestDiff(t *testing.T) {
	t0 := time.Unix(1000, 0)
	old := snapshot{
		"w/keep": {Name: "keep", Type: files.TypeFile, Size: 1, MTime: t0, Mode: "0644"},
		"w/gone": {Name: "gone", Type: files.TypeFile, Size: 1, MTime: t0, Mode: "0644"},
		"w/grow": {Name: "grow", Type: files.TypeFile, Size: 1, MTime: t0, Mode: "0644"},
		"w/mode": {Name: "mode", Type: files.TypeFile, Size: 1, MTime: t0, Mode: "0644"},
	}
	cur := snapshot{
		"w/keep": old["w/keep"],
		"w/grow": {Name: "grow", Type: files.TypeFile, Size: 2, MTime: t0.Add(time.Second), Mode: "0644"},
		"w/mode": {Name: "mode", Type: files.TypeFile, Size: 1, MTime: t0, Mode: "0600"},
		"w/new":  {Name: "new", Type: files.TypeFile, Size: 0, MTime: t0, Mode: "0644"},
	}
	var got []string
	for _, ev := range diff("w", old, cur) {
		got = append(got, ev.Type.String()+":"+ev.Name)
	}
	want := []string{"EVENT_TYPE_REMOVE:gone", "EVENT_TYPE_WRITE:grow", "EVENT_TYPE_CHMOD:mode", "EVENT_TYPE_CREATE:new"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("diff = %v, want %v", got, want)
	}
	if e := entryInfo("d", files.Entry{Name: "d", Type: files.TypeDir, Mode: "0755"}); e.Type != filesystem.FileType_FILE_TYPE_DIRECTORY || e.Path != "/home/user/d" {
		t.Errorf("entryInfo(dir) = %v", e)
	}
}

func TestRecordIDs(t *testing.T) {
	rs, err := openRecords(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"", "../x", "abc", "AAAAAAAAAAAAAAAAAAAA", "aaaaaaaaaaaaaaaaaaa/", strings.Repeat("a", 21)} {
		if _, err := rs.get(id); err != errNoRecord {
			t.Errorf("get(%q) = %v, want no record", id, err)
		}
	}
	id := newID()
	if !validID(id) {
		t.Fatalf("newID() = %q is not valid", id)
	}
}

// fakeBackend records the commands and removals the front asks for; every other Backend method is unused.
type fakeBackend struct {
	service.Backend
	mu      sync.Mutex
	execs   []string
	removed []string
	stopped []string
	failTpl string
	// nets are the network blocks the front admitted runs and commands with, in order ("" for none given).
	nets []string
}

// netString is a network block as the fake records it.
func netString(n *sandkeep.Network) string {
	if n == nil {
		return ""
	}
	return n.Mode + strings.Join(append([]string{""}, n.Rules...), " ")
}

// Admit refuses what the real admission would for the cases the tests use: an unknown template, and a block
// naming widen.example (a host the template's network does not allow: NETWORK_WIDENED).
func (b *fakeBackend) Admit(_ context.Context, key sandkeep.Key, ar service.AdmitRequest) (*sandkeep.Run, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ar.Template != "" && ar.Template == b.failTpl {
		return nil, fault.New(fault.TemplateNotFound, "list them: GET /v1/templates", "no template %q", ar.Template)
	}
	if ar.Network != nil && slices.Contains(ar.Network.Rules, "widen.example") {
		return nil, fault.New(fault.NetworkWidened, "ask for a subset of the template's hosts", "rule widen.example is not within the template's")
	}
	b.nets = append(b.nets, netString(ar.Network))
	return &sandkeep.Run{ID: "run-" + key.User}, nil
}

func (b *fakeBackend) EndRun(context.Context, string, bool) error { return nil }

func (b *fakeBackend) Exec(_ context.Context, key sandkeep.Key, ar service.AdmitRequest, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ar.Template != "" && ar.Template == b.failTpl {
		return nil, fault.New(fault.TemplateNotFound, "list them: GET /v1/templates", "no template %q", ar.Template)
	}
	b.execs = append(b.execs, key.Tenant+"/"+key.User+":"+strings.Join(req.Argv, " "))
	b.nets = append(b.nets, netString(ar.Network))
	return &sandkeep.ExecResult{}, nil
}

func (b *fakeBackend) Remove(_ context.Context, key sandkeep.Key) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.removed = append(b.removed, key.User)
	return nil
}

func (b *fakeBackend) Stop(_ context.Context, key sandkeep.Key) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = append(b.stopped, key.User)
	return nil
}

// fakeHooks accepts the keys "key-<tenant>".
func fakeHooks() api.E2BHooks {
	return api.E2BHooks{
		Authenticate: func(r *http.Request, key, scope string) (store.Token, error) {
			tenant, ok := strings.CutPrefix(key, "key-")
			if !ok {
				return store.Token{}, fault.New(fault.Unauthenticated, "send a token", "missing or invalid token")
			}
			return store.Token{ID: "tok_" + tenant, Tenant: tenant, Hash: "h-" + tenant}, nil
		},
		Reauthenticate: func(r *http.Request, hash, scope string) (store.Token, error) {
			return store.Token{Tenant: strings.TrimPrefix(hash, "h-")}, nil
		},
		Status: func(r *http.Request, err error) (*fault.Error, int) {
			fe, _ := err.(*fault.Error)
			if fe == nil {
				return fault.New(fault.Internal, "", "internal"), 500
			}
			return fe, map[fault.Code]int{fault.Unauthenticated: 401, fault.TemplateNotFound: 404, fault.SpecUnsupported: 422,
				fault.NetworkWidened: 403, fault.NetworkInvalid: 422}[fe.Code]
		},
		RequestID: func(*http.Request) string { return "" },
	}
}

type harness struct {
	t   *testing.T
	b   *fakeBackend
	f   *Front
	srv *httptest.Server
	now time.Time
}

func newHarness(t *testing.T, dir string, b *fakeBackend, now *time.Time) *harness {
	f, err := New(Config{Dir: dir, MaxTimeout: time.Hour, Now: func() time.Time { return *now }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(f.Handler(b, fakeHooks()))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { f.Close() })
	return &harness{t: t, b: b, f: f, srv: srv}
}

func (h *harness) do(method, path, key, body string) (int, map[string]any) {
	req, _ := http.NewRequest(method, h.srv.URL+"/e2b"+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// TestControlPlane: create admits a sandbox through the backend; bad input, a bad key and another tenant get
// E2B's error shape; nothing is left of a refused create; timeouts are enforced by the sweeper and survive a
// restart of the front (a new Front on the same records).
func TestControlPlane(t *testing.T) {
	dir := t.TempDir()
	now := time.Unix(1_800_000_000, 0).UTC()
	b := &fakeBackend{failTpl: "nope"}
	h := newHarness(t, dir, b, &now)

	st, body := h.do("POST", "/v2/sandboxes", "key-acme", `{"templateID":"base","timeout":60,"metadata":{"m":"1"}}`)
	if st != 201 || body["sandboxID"] == nil || body["envdAccessToken"] == nil || body["envdVersion"] != EnvdVersion {
		t.Fatalf("create: %d %v", st, body)
	}
	id := body["sandboxID"].(string)
	if len(b.execs) != 1 || b.execs[0] != "acme/e2b-"+id+":true" {
		t.Fatalf("create ran %v", b.execs)
	}

	for _, c := range []struct {
		name, method, path, key, body string
		status                        int
		msg                           string
	}{
		{"bad key", "POST", "/v2/sandboxes", "nope", `{}`, 401, "UNAUTHENTICATED"},
		{"no key", "GET", "/v2/sandboxes", "", ``, 401, "UNAUTHENTICATED"},
		{"unknown template", "POST", "/v2/sandboxes", "key-acme", `{"templateID":"nope"}`, 404, "TEMPLATE_NOT_FOUND"},
		{"timeout past the bound", "POST", "/v2/sandboxes", "key-acme", `{"timeout":3601}`, 400, "past this server's bound"},
		{"negative timeout", "POST", "/sandboxes/" + id + "/timeout", "key-acme", `{"timeout":-1}`, 400, "positive"},
		{"another tenant's get", "GET", "/sandboxes/" + id, "key-globex", ``, 404, "not found"},
		{"another tenant's kill", "DELETE", "/sandboxes/" + id, "key-globex", ``, 404, "not found"},
		{"another tenant's connect", "POST", "/v2/sandboxes/" + id + "/connect", "key-globex", `{}`, 404, "not found"},
		// Fork and snapshots are the backend's: one without them answers its code in E2B's shape.
		{"fork without a forker", "POST", "/sandboxes/" + id + "/fork", "key-acme", `{}`, 422, "SPEC_UNSUPPORTED: this server's backend cannot fork"},
		{"fork count past the bound", "POST", "/sandboxes/" + id + "/fork", "key-acme", `{"count":17}`, 400, "count must be 1..16"},
		{"fork timeout past the bound", "POST", "/sandboxes/" + id + "/fork", "key-acme", `{"timeout":3601}`, 400, "past this server's bound"},
		{"another tenant's fork", "POST", "/sandboxes/" + id + "/fork", "key-globex", `{}`, 404, "not found"},
		{"snapshot without a snapshotter", "POST", "/sandboxes/" + id + "/snapshots", "key-acme", `{}`, 422, "SPEC_UNSUPPORTED: this server's backend keeps no snapshots"},
		{"another tenant's snapshot", "POST", "/sandboxes/" + id + "/snapshots", "key-globex", `{}`, 404, "not found"},
		{"snapshot list without a snapshotter", "GET", "/snapshots", "key-acme", ``, 422, "SPEC_UNSUPPORTED"},
		{"another tenant's network update", "PUT", "/sandboxes/" + id + "/network", "key-globex", `{}`, 404, "not found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, body := h.do(c.method, c.path, c.key, c.body)
			msg, _ := body["message"].(string)
			if st != c.status || body["code"] != float64(c.status) || !strings.Contains(msg, c.msg) {
				t.Errorf("%s %s: %d %v, want %d with %q", c.method, c.path, st, body, c.status, c.msg)
			}
		})
	}
	if len(b.execs) != 1 {
		t.Errorf("refused creates ran commands: %v", b.execs)
	}
	recs, _ := h.f.recs.all("")
	if len(recs) != 1 {
		t.Errorf("refused creates left records: %d", len(recs))
	}

	// Another tenant's list does not show it; the owner's does, filtered by metadata.
	st, _ = h.do("GET", "/v2/sandboxes", "key-globex", "")
	if st != 200 {
		t.Fatalf("list: %d", st)
	}
	if n := h.list("key-globex", ""); n != 0 {
		t.Errorf("another tenant lists %d sandboxes", n)
	}
	if n := h.list("key-acme", "?metadata=m%3D1"); n != 1 {
		t.Errorf("owner lists %d with its metadata", n)
	}
	if n := h.list("key-acme", "?metadata=m%3D2"); n != 0 {
		t.Errorf("owner lists %d with other metadata", n)
	}

	// The front restarts: the sandbox and its timeout are still known, and the sweeper removes it once due.
	h.f.Close()
	h2 := newHarness(t, dir, b, &now)
	if len(b.removed) != 0 {
		t.Fatalf("removed %v: a create refused at admission makes nothing to remove", b.removed)
	}
	h2.f.SweepOnce(t.Context())
	if len(b.removed) != 0 {
		t.Fatalf("swept before its end: %v", b.removed)
	}
	now = now.Add(61 * time.Second)
	h2.f.SweepOnce(t.Context())
	if len(b.removed) != 1 || b.removed[0] != "e2b-"+id {
		t.Fatalf("sweeper removed %v, want e2b-%s", b.removed, id)
	}
	if st, _ := h2.do("GET", "/sandboxes/"+id, "key-acme", ""); st != 404 {
		t.Errorf("get after its timeout: %d", st)
	}

	// Under auto-pause the sweeper stops it instead, keeping its record (and workspace).
	st, body = h2.do("POST", "/v2/sandboxes", "key-acme", `{"timeout":10,"autoPause":true}`)
	if st != 201 {
		t.Fatalf("create: %d %v", st, body)
	}
	id2 := body["sandboxID"].(string)
	now = now.Add(11 * time.Second)
	h2.f.SweepOnce(t.Context())
	if len(b.stopped) != 1 || b.stopped[0] != "e2b-"+id2 {
		t.Fatalf("auto-pause stopped %v", b.stopped)
	}
	if st, body := h2.do("GET", "/sandboxes/"+id2, "key-acme", ""); st != 200 || body["state"] != "paused" {
		t.Errorf("after auto-pause: %d %v", st, body)
	}

	// Pagination: two more, listed two at a time; the state filter sees the paused one alone.
	for range 2 {
		now = now.Add(time.Second)
		if st, body := h2.do("POST", "/v2/sandboxes", "key-acme", `{}`); st != 201 {
			t.Fatalf("create: %d %v", st, body)
		}
	}
	req, _ := http.NewRequest("GET", h2.srv.URL+"/e2b/v2/sandboxes?limit=2", nil)
	req.Header.Set("X-API-KEY", "key-acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	next := resp.Header.Get("X-Next-Token")
	if next == "" {
		t.Fatal("a full first page has no X-Next-Token")
	}
	if n := h2.list("key-acme", "?limit=2&nextToken="+next); n != 1 {
		t.Errorf("second page: %d, want 1", n)
	}
	if n := h2.list("key-acme", "?state=paused"); n != 1 {
		t.Errorf("paused: %d, want 1", n)
	}
}

func (h *harness) list(key, query string) int {
	req, _ := http.NewRequest("GET", h.srv.URL+"/e2b/v2/sandboxes"+query, nil)
	req.Header.Set("X-API-KEY", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		h.t.Fatal(err)
	}
	return len(out)
}
