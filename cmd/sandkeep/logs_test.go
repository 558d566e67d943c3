package main

import (
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestLogsRun: `sandkeep logs --run ID` shows what a run's setup did: a failed image build's engine output (the
// RUN step's own line and the daemon's error) and a post-create's output, with the driver's actions, each line
// labelled with its source; --json gives the entries; an unknown run is NOT_FOUND, a missing --run refused. The same
// logs are read through the API (GET /v1/runs/{id}/logs, and ?follow=1, with the SDK) and on the dashboard's run page.
func TestLogsRun(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	ten := c.ten("acme")
	repo := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(repo, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("Dockerfile", "FROM "+testutil.TestImage(t)+"\nRUN echo build-output-marker-"+c.suffix+" && exit 3\n")
	broken := write("broken.yaml", "sandbox:\n  mode: inline\n  build: {dockerfile: Dockerfile}\n")
	c.run(t, "exec", "--spec", broken, "--tenant", ten, "--user", "b", "--", "true").wantFailure(t, "BUILD_FAILED")
	run, _ := c.lastRun(t)
	buildRun := run.ID
	out := c.run(t, "logs", "--run", run.ID).want(t, 0).stdout
	for _, want := range []string{"[build]", "build-output-marker-" + c.suffix, "build failed:"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs of the failed build lack %q:\n%s", want, out)
		}
	}

	post := write("post.yaml", "sandbox:\n  mode: inline\n  post_create: echo post-create-marker-"+c.suffix+"\n")
	c.run(t, "exec", "--spec", post, "--tenant", ten, "--user", "p", "--", "true").want(t, 0)
	run, _ = c.lastRun(t)
	out = c.run(t, "logs", "--run", run.ID, "--follow").want(t, 0).stdout // the run is over: --follow ends
	for _, want := range []string{"[driver]", "create sandbox", "[post_create] post-create-marker-" + c.suffix, "post_create in sandbox", "exited 0"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs of the post-create run lack %q:\n%s", want, out)
		}
	}
	var entry struct{ RunID, Source, Text string }
	first, _, _ := strings.Cut(c.run(t, "logs", "--run", run.ID, "--json").want(t, 0).stdout, "\n")
	if err := json.Unmarshal([]byte(first), &entry); err != nil || entry.Source != "driver" {
		t.Errorf("--json first entry %q: %+v, %v", first, entry, err)
	}
	c.run(t, "logs", "--run", "0190c4f0-0000-7000-8000-000000000000").wantFailure(t, "RUN_NOT_FOUND")
	c.run(t, "logs").wantFailure(t, "INVALID_ARGUMENT")
	t.Logf("sandkeep logs --run %s:\n%s", run.ID, out)

	// The same logs through the API (the SDK's RunLogs, and FollowRunLogs, which ends: the run is over) and on the
	// dashboard's run page, served from the same store.
	s := c.startServer(t)
	tok := c.createToken(t, ten, "logs", "read").Token
	cl := s.client(t, tok)
	logs, err := cl.RunLogs(bounded(t), buildRun, 0, 0)
	var api strings.Builder
	for _, l := range logs {
		api.WriteString(l.Source + ": " + l.Text + "\n")
	}
	if err != nil || !strings.Contains(api.String(), "build: ") || !strings.Contains(api.String(), "build-output-marker-"+c.suffix) {
		t.Errorf("GET /v1/runs/%s/logs: %v\n%s", buildRun, err, api.String())
	}
	api.Reset()
	err = cl.FollowRunLogs(bounded(t), run.ID, 0, func(l client.RunLog) error {
		api.WriteString(l.Source + ": " + l.Text + "\n")
		return nil
	})
	if err != nil || !strings.Contains(api.String(), "post_create: post-create-marker-"+c.suffix) {
		t.Errorf("GET /v1/runs/%s/logs?follow=1: %v\n%s", run.ID, err, api.String())
	}
	cookie := uiSignIn(t, s, tok)
	for id, marker := range map[string]string{buildRun: "build-output-marker-" + c.suffix, run.ID: "post-create-marker-" + c.suffix} {
		if r := s.raw(t, "GET", "/ui/runs/"+id, "", nil, "Cookie", cookie); r.status != http.StatusOK || !strings.Contains(r.body, marker) {
			t.Errorf("GET /ui/runs/%s: %d, without %q", id, r.status, marker)
		}
	}
}

// uiSignIn signs in to s's dashboard with tok and returns the session cookie ("name=value").
func uiSignIn(t *testing.T, s *server, tok string) string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{}, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer hc.CloseIdleConnections()
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
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("POST /ui/signin: %d", resp.StatusCode)
	}
	return strings.SplitN(resp.Header.Get("Set-Cookie"), ";", 2)[0]
}
