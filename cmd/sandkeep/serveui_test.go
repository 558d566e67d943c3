package main

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeUI: `sandkeep serve` serves the dashboard at /ui/ beside the API: the sign-in page, a session from a
// posted token, the overview of that token's tenant, and /v1 and /metrics as before. The pages themselves are
// tested in internal/ui, in Chromium too.
func TestServeUI(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	cfg := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	if err := os.WriteFile(cfg, []byte("metrics_open: true\n"), 0o644); err != nil { // the dashboard shares the registry /metrics serves
		t.Fatal(err)
	}
	s := c.startServer(t, "--config", cfg)
	tenant := c.ten("acme")
	tok := c.createToken(t, tenant, "ui", "read").Token

	if r := s.raw(t, "GET", "/ui/signin", "", nil); r.status != http.StatusOK || !strings.Contains(r.body, `name="token"`) {
		t.Fatalf("GET /ui/signin: %d %s", r.status, r.body)
	}
	if r := s.raw(t, "GET", "/ui/static/app.js", "", nil); r.status != http.StatusOK {
		t.Errorf("GET /ui/static/app.js: %d", r.status)
	}
	// The sign-in answers 303 with the session cookie; s.raw follows redirects, so this request does not.
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequestWithContext(bounded(t), "POST", s.url+"/ui/signin", strings.NewReader(url.Values{"token": {tok}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/" {
		t.Fatalf("POST /ui/signin: %d, Location %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	cookie := strings.SplitN(resp.Header.Get("Set-Cookie"), ";", 2)[0]
	if r := s.raw(t, "GET", "/ui/", "", nil, "Cookie", cookie); r.status != http.StatusOK || !strings.Contains(r.body, tenant) {
		t.Errorf("GET /ui/ signed in: %d", r.status)
	}
	if r := s.raw(t, "GET", "/v1/sandboxes", tok, nil); r.status != http.StatusOK {
		t.Errorf("GET /v1/sandboxes beside the dashboard: %d %s", r.status, r.body)
	}
	if r := s.raw(t, "GET", "/metrics", "", nil); r.status != http.StatusOK || !strings.Contains(r.body, "go_goroutines") || !strings.Contains(r.body, "sandkeep_api_requests_total") {
		t.Errorf("GET /metrics: %d", r.status)
	}
	if r := s.raw(t, "GET", "/nope", "", nil); r.status != http.StatusNotFound || !strings.Contains(r.body, "REQUEST_INVALID") {
		t.Errorf("GET /nope: %d %s", r.status, r.body)
	}
}
