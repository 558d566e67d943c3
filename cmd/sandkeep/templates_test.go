package main

import (
	"crypto/md5"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestServeTemplates: two tenants of one server run on two operator templates at once (different images and
// networks); a template a tenant may not use answers exactly like a missing one; asking for another template
// recycles the sandbox; GET /v1/templates lists what the tenant may use; a server whose engine is down starts and
// says why on /readyz.
func TestServeTemplates(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	small := testutil.ImageWithFiles(t, testutil.TestImage(t), map[string]testutil.ImageFile{"/etc/flavour": {Data: []byte("small\n")}})
	other := testutil.ImageWithFiles(t, testutil.TestImage(t), map[string]testutil.ImageFile{"/etc/flavour": {Data: []byte("other\n")}})
	acme, globex := c.ten("acme"), c.ten("globex")
	// Under gVisor (scripts/test.sh's runsc pass) no sandbox has a network (a networked command is refused with
	// EGRESS_UNAVAILABLE: TestExecRuntime), so small has none there and every network a caller asks for widens it.
	smallNet, proxy := `{mode: allowlist, rules: ["api.example.test"]}`, "set"
	if gvisor() {
		smallNet, proxy = `{mode: none}`, ""
	}
	cfg := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	conf := "secrets:\n  tok: {from_env: SK_TPL_SECRET}\n" +
		"templates:\n" +
		"  small:\n    image: " + small + "\n    env: {FLAVOUR_ENV: s}\n    network: " + smallNet + "\n    tenants: [" + acme + "]\n" +
		"    secrets: [{name: tok, path: /run/secrets/tok}]\n" +
		"  other:\n    image: " + other + "\n    tenants: [" + globex + ", " + acme + "]\n" +
		"tenant_templates:\n  " + acme + ": small\n  " + globex + ": other\n"
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	const secret = "sk-template-secret-5e1d"
	s := c.startServerEnv(t, []string{"SK_TPL_SECRET=" + secret}, "--config", cfg)
	acmeTok, globexTok := c.createToken(t, acme, "t", "").Token, c.createToken(t, globex, "t", "").Token

	const probe = `cat /etc/flavour; echo "tpl=$SANDKEEP_TEMPLATE env=$FLAVOUR_ENV proxy=${HTTPS_PROXY:+set}"`
	exec := func(tok, body string) httpAnswer {
		return s.raw(t, "POST", "/v1/sandboxes/u/exec", tok, strings.NewReader(body), "Content-Type", "application/json")
	}
	stdout := func(a httpAnswer) string {
		t.Helper()
		var v struct{ Stdout string }
		if a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &v) != nil {
			t.Fatalf("exec: %d %s", a.status, a.body)
		}
		return v.Stdout
	}
	body, _ := json.Marshal(map[string]any{"command": probe})
	var got [2]httpAnswer
	var wg sync.WaitGroup
	for i, tok := range []string{acmeTok, globexTok} {
		wg.Go(func() { got[i] = exec(tok, string(body)) })
	}
	wg.Wait()
	if out := stdout(got[0]); out != "small\ntpl=small env=s proxy="+proxy+"\n" {
		t.Errorf("acme on its default template: %q", out)
	}
	if out := stdout(got[1]); out != "other\ntpl=other env= proxy=\n" {
		t.Errorf("globex on its default template: %q", out)
	}

	// The template's secret file, the operator's value, reaches the command and nothing else.
	if out := stdout(exec(acmeTok, `{"command":"md5sum < /run/secrets/tok"}`)); !strings.HasPrefix(out, fmt.Sprintf("%x", md5.Sum([]byte(secret)))) {
		t.Errorf("the template's secret file: %q", out)
	}
	if strings.Contains(s.log.String(), secret) {
		t.Errorf("the secret's value reached the server's log")
	}

	// acme may pick other; globex may not pick small, and that looks exactly like a template that does not exist.
	body, _ = json.Marshal(map[string]any{"command": probe, "template": "other"})
	if out := stdout(exec(acmeTok, string(body))); out != "other\ntpl=other env= proxy=\n" {
		t.Errorf("acme asking for other: %q", out)
	}
	if out := c.run(t, "ps", "--json").want(t, 0).stdout; !strings.Contains(out, `"template": "other"`) && !strings.Contains(out, `"template":"other"`) {
		t.Errorf("ps does not say the sandbox's template: %s", out)
	}
	forbidden := exec(globexTok, `{"command":"true","template":"small"}`)
	missing := exec(globexTok, `{"command":"true","template":"nope"}`)
	if forbidden.status != http.StatusNotFound || !strings.Contains(forbidden.body, `"TEMPLATE_NOT_FOUND"`) ||
		stripRequestID(strings.Replace(forbidden.body, "small", "X", 1)) != stripRequestID(strings.Replace(missing.body, "nope", "X", 1)) {
		t.Errorf("a template the tenant may not use:\n %d %s\n a missing one:\n %d %s", forbidden.status, forbidden.body, missing.status, missing.body)
	}
	// A caller may narrow its template's network, never widen it.
	wider := []string{`{"mode":"allowlist","rules":["evil.test"]}`, `{"mode":"open"}`, `{"mode":"allowlist","preset":"default"}`}
	if narrow := `{"command":"echo ${HTTPS_PROXY:+set}","network":{"mode":"allowlist","rules":["api.example.test"]}}`; gvisor() {
		wider = append(wider, `{"mode":"allowlist","rules":["api.example.test"]}`)
	} else if out := stdout(exec(acmeTok, narrow)); out != "set\n" {
		t.Errorf("a narrower allowlist: %q", out)
	}
	if out := stdout(exec(acmeTok, `{"command":"echo [${HTTPS_PROXY:+set}]","network":{"mode":"none"}}`)); out != "[]\n" {
		t.Errorf("network none: %q", out)
	}
	for _, wide := range wider {
		a := exec(acmeTok, `{"command":"true","network":`+wide+`}`)
		if a.status != http.StatusForbidden || !strings.Contains(a.body, `"NETWORK_WIDENED"`) {
			t.Errorf("a wider network %s: %d %s", wide, a.status, a.body)
		}
	}
	a := s.raw(t, "GET", "/v1/templates", globexTok, nil)
	if a.status != http.StatusOK || strings.TrimSpace(a.body) != `{"templates":["other"]}` {
		t.Errorf("templates of globex: %d %s", a.status, a.body)
	}

	// The same through the Go SDK: the templates, a run admitted with a lower trust, attached to, and finished.
	sdk := s.client(t, globexTok)
	if names, err := sdk.Templates(bounded(t)); err != nil || !slices.Equal(names, []string{"other"}) {
		t.Errorf("SDK templates: %v, %v", names, err)
	}
	run, err := sdk.StartRun(bounded(t), "u", "", "untrusted")
	if err != nil || run.Trust != "untrusted" || run.Template != "other" || run.Driver != "docker" || run.Admission != "admitted" {
		t.Fatalf("SDK start run: %+v, %v", run, err)
	}
	if res, err := sdk.Exec(bounded(t), "u", client.ExecRequest{Command: "cat /etc/flavour", RunID: run.ID}); err != nil || res.Stdout != "other\n" {
		t.Errorf("SDK exec in the run: %+v, %v", res, err)
	}
	if fin, err := sdk.FinishRun(bounded(t), run.ID, false); err != nil || fin.Status != "succeeded" {
		t.Errorf("SDK finish: %+v, %v", fin, err)
	}

	// A server whose engine is down still starts, says why it is not ready, and admits each run by its mode, here
	// the operator's environment's (SANDKEEP_SANDBOX_DEFAULT), as exec does.
	down := c.startServerEnv(t, append([]string{"SANDKEEP_SANDBOX_DEFAULT=inline", "SK_TPL_SECRET=x"}, noDocker...), "--config", cfg)
	a = down.raw(t, "GET", "/readyz", "", nil)
	if a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, "SANDBOX_DRIVER_UNAVAILABLE") {
		t.Errorf("/readyz without an engine: %d %s", a.status, a.body)
	}
	if a := down.raw(t, "POST", "/v1/sandboxes/u/exec", acmeTok, strings.NewReader(`{"command":"true"}`)); a.status != http.StatusServiceUnavailable ||
		!strings.Contains(a.body, "SANDBOX_DRIVER_UNAVAILABLE") {
		t.Errorf("inline without an engine: %d %s", a.status, a.body)
	}
	var runs []store.Run
	decodeJSON(t, c.run(t, "runs", "--json", "--tenant", acme, "--limit", "1").want(t, 0).stdout, &runs)
	if len(runs) != 1 || runs[0].Source != "env" || runs[0].ResolvedMode != "inline" || runs[0].Admission != "refused" {
		t.Errorf("the refused run: %+v", runs)
	}
}
