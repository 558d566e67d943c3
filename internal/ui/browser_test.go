package ui_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/drivers"
	"github.com/sandkeep/sandkeep/internal/api"
	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/testutil"
	"github.com/sandkeep/sandkeep/internal/ui"
	"github.com/sandkeep/sandkeep/stores"
)

// The browser tests drive Debian's chromium (headless, through the DevTools protocol with chromedp) against the
// dashboard and the HTTP API of one server over a real Manager and the real Docker engine. Chromium may resolve
// nothing but loopback (--host-resolver-rules), and every background service it has is off.

// EnvRequireChromium makes a missing chromium fail the browser tests instead of skipping them (scripts/test.sh
// sets it).
const EnvRequireChromium = "SANDKEEP_REQUIRE_CHROMIUM"

func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv(EnvRequireChromium) == "1" {
		t.Fatalf("%s=1 but no chromium on PATH: run scripts/chromium-up.sh", EnvRequireChromium)
	}
	t.Skipf("no chromium on PATH (scripts/chromium-up.sh installs it; %s=1 fails instead)", EnvRequireChromium)
	return ""
}

// artifacts returns the directory screenshots go to: $SANDKEEP_ARTIFACTS/ui, else a directory under the
// system's temp dir that outlives the test, so a person can look at them.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("SANDKEEP_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "sandkeep-artifacts")
	}
	dir = filepath.Join(dir, "ui")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// stack is one server: the API under /v1 and the dashboard under /ui/, over a Manager of the probe image whose
// sandboxes may reach allowed.test only.
type stack struct {
	t   *testing.T
	url string
	st  store.Store
	svc *service.Service
	id  string
}

func newStack(t *testing.T) *stack {
	t.Helper()
	testutil.Docker(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	dsn := filepath.Join(t.TempDir(), "runs.db")
	st, err := stores.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	cfg := sandkeep.Config{
		Home: t.TempDir(), Image: testutil.ProbeImage(t), AgentPath: testutil.AgentBinary(t), Store: st, Grace: time.Second,
		Network: &sandkeep.Network{Mode: "allowlist", Rules: []string{"allowed.test"}},
		Drivers: []sandkeep.DriverOption{drivers.Docker()},
	}
	m, err := sandkeep.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Cleanup(t, m.Installation())
	t.Cleanup(func() { _ = m.Close() })
	svc := service.New(m, st, files.Limits{}, service.Admission{})
	reg := prometheus.NewRegistry()
	apiSrv, err := api.New(api.Config{Backend: svc, Tokens: st, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	u, err := ui.New(ui.Config{Backend: svc, Store: st, Tokens: st, Gatherer: reg, PollInterval: 200 * time.Millisecond,
		OperatorToken: browserOperatorToken})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(ui.Prefix, u)
	mux.Handle("/", apiSrv.Handler())
	ts := httptest.NewServer(mux)
	t.Cleanup(func() { u.Close(); ts.Close() })
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return &stack{t: t, url: ts.URL, st: st, svc: svc, id: hex.EncodeToString(b)}
}

func (s *stack) token(tenant string, scopes ...string) string {
	s.t.Helper()
	_, secret, err := auth.Create(s.t.Context(), s.st, auth.Spec{Tenant: tenant, Name: "ui-test", Scopes: scopes}, time.Now())
	if err != nil {
		s.t.Fatal(err)
	}
	return secret
}

func (s *stack) client(token string) *client.Client {
	s.t.Helper()
	tr := &http.Transport{}
	s.t.Cleanup(tr.CloseIdleConnections)
	c, err := client.New(s.url, token, client.WithHTTPClient(&http.Client{Transport: tr}))
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// browser starts chromium with an empty profile and returns a tab's context.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-domain-reliability", true),
		chromedp.Flag("disable-client-side-phishing-detection", true),
		chromedp.Flag("no-pings", true),
		chromedp.Flag("dns-prefetch-disable", true),
		chromedp.Flag("metrics-recording-only", true),
		chromedp.Flag("disable-features", "OptimizationHints,MediaRouter,Translate,AutofillServerCommunication,CertificateTransparencyComponentUpdater"),
		// Only loopback resolves: the browser cannot reach anything else, whatever a page asks for.
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancel2)
	ctx, cancel3 := context.WithTimeout(ctx, 10*time.Minute)
	t.Cleanup(cancel3)
	if err := chromedp.Do(ctx); err != nil { // start the browser now, so a failure names it
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// do runs actions, failing the test with what.
func do(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

func html(t *testing.T, ctx context.Context) string {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(tctx, chromedp.OuterHTML(chromedp.CSS("html")))
	if err != nil {
		t.Fatalf("page html: %v", err)
	}
	return s
}

// shoot writes the page at desktop width and at 320 px (a small phone) to the artifacts directory.
func shoot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := artifacts(t)
	for _, vp := range []struct {
		suffix string
		w, h   int64
		mobile bool
	}{{"desktop", 1280, 900, false}, {"phone", 320, 680, true}} {
		var opts []chromedp.EmulateViewportOption
		if vp.mobile {
			opts = append(opts, chromedp.EmulateMobile, chromedp.EmulatePortrait)
		}
		do(t, ctx, "viewport", chromedp.EmulateViewport(vp.w, vp.h, opts...))
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		png, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
		cancel()
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+"-"+vp.suffix+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	do(t, ctx, "viewport", chromedp.EmulateViewport(1280, 900))
}

// dark turns the emulated prefers-color-scheme to dark (or back to the default).
func dark(t *testing.T, ctx context.Context, on bool) {
	t.Helper()
	var features []*emulation.MediaFeature
	if on {
		features = []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}
	}
	if _, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{Features: features}); err != nil {
		t.Fatalf("emulate the dark scheme: %v", err)
	}
}

func signIn(t *testing.T, ctx context.Context, base, token string) {
	t.Helper()
	do(t, ctx, "sign in",
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Submit(chromedp.CSS("#token")),
		chromedp.WaitVisible(chromedp.CSS("form.who")),
	)
}

// browserOperatorToken is the installation operator's dashboard credential in the browser test's UI.
const browserOperatorToken = "sk-operator-browser-0123456789abcdef"

// TestBrowser is the dashboard as an operator uses it, in Chromium: sign in, watch a sandbox appear while its
// first command runs, open the run and watch its events arrive, find a refused host on the egress page after a
// blocked request, stop the sandbox from the page; then a second tenant's token sees none of it, not even by
// guessing URLs. Screenshots of every page at two widths go to the artifacts directory.
func TestBrowser(t *testing.T) {
	s := newStack(t)
	ctx := browser(t)
	acme, globex := "acme-"+s.id, "globex-"+s.id
	// The installation's operator signs in with its own credential: a tenant's admin token sees only its tenant.
	admin := browserOperatorToken
	acmeExec := s.client(s.token(acme, auth.ScopeExec, auth.ScopeRead, auth.ScopeFiles))

	// Sign in; the token never shows in the URL.
	signIn(t, ctx, s.url, admin)
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil || strings.Contains(loc, "skt_") || !strings.HasSuffix(loc, "/ui/") {
		t.Fatalf("after sign-in the browser is at %q (%v)", loc, err)
	}
	stored, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify(localStorage) + JSON.stringify(sessionStorage) + document.cookie`))
	if err != nil || strings.Contains(stored, "skt_") || strings.Contains(stored, ui.CookieName) {
		t.Errorf("storage visible to scripts: %q (%v): want no token and an HttpOnly cookie", stored, err)
	}

	// A sandbox appears on the open sandboxes page while its first command runs: no reload.
	do(t, ctx, "sandboxes page", chromedp.Navigate(s.url+"/ui/sandboxes"), chromedp.WaitVisible(chromedp.CSS("[data-live-indicator]:not([hidden])")))
	type result struct {
		res *client.ExecResult
		err error
	}
	first := make(chan result, 1)
	go func() {
		// It runs until the test uploads /workspace/release (or two minutes pass), so the page is open before
		// it ends, however slow the machine.
		res, err := acmeExec.Exec(context.Background(), "alice", client.ExecRequest{
			Command: "echo started; i=0; while [ ! -e /workspace/release ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; echo done",
			Timeout: 3 * time.Minute})
		first <- result{res, err}
	}()
	row := fmt.Sprintf(`tr[data-sandbox="%s/alice"]`, acme)
	do(t, ctx, "the sandbox appears", chromedp.WaitVisible(chromedp.CSS(row)))
	do(t, ctx, "the sandbox runs", chromedp.WaitVisible(chromedp.CSS(row+" .pill.ok")))
	if st := text(t, ctx, row+" .pill"); st != "running" {
		t.Errorf("the new sandbox's state = %q, want running", st)
	}
	shoot(t, ctx, "sandboxes")

	// Its run, opened while the command runs, gets its events live.
	var runID string
	deadline := time.Now().Add(time.Minute)
	for runID == "" && time.Now().Before(deadline) {
		page, err := s.st.QueryRuns(t.Context(), store.RunQuery{Tenant: acme, Status: store.StatusRunning})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Runs) > 0 {
			runID = page.Runs[0].ID
		}
		time.Sleep(100 * time.Millisecond)
	}
	if runID == "" {
		t.Fatal("no running run of acme")
	}
	do(t, ctx, "runs page", chromedp.Navigate(s.url+"/ui/runs?status=running"), chromedp.WaitVisible(chromedp.CSS(`a[href="/ui/runs/`+runID+`"]`)))
	shoot(t, ctx, "runs")
	do(t, ctx, "open the run", chromedp.Click(chromedp.CSS(`a[href="/ui/runs/`+runID+`"]`)), chromedp.WaitVisible(chromedp.CSS("ol.timeline")))
	if strings.Contains(html(t, ctx), "exec_finished") {
		t.Fatal("the command finished before its run page was open: the live part is not tested")
	}
	// The run's log: what the docker driver did to provide the sandbox, as the engine answered; the same entries
	// through the HTTP API (GET /v1/runs/{id}/logs, the SDK's RunLogs) over the real service and store.
	if got := text(t, ctx, "[data-run-log]"); !strings.Contains(got, "[driver] docker: create sandbox") || !strings.Contains(got, "created and started") {
		t.Errorf("the run page's log reads %q, want the driver's create and start", got)
	}
	if logs, err := acmeExec.RunLogs(t.Context(), runID, 0, 0); err != nil || len(logs) < 2 || logs[0].Source != "driver" || !strings.Contains(logs[0].Text, "create sandbox") {
		t.Errorf("GET /v1/runs/%s/logs: %+v, %v", runID, logs, err)
	}
	if _, err := acmeExec.Upload(t.Context(), "alice", "release", strings.NewReader("go"), 0o644); err != nil {
		t.Fatalf("release the command: %v", err)
	}
	do(t, ctx, "exec_finished arrives live",
		chromedp.WaitVisible(chromedp.CSS(`ol.timeline li.new.ok`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-run-status].ok`)))
	if got := text(t, ctx, "ol.timeline li.new.ok"); !strings.Contains(got, "exec_finished") || !strings.Contains(got, "exit 0") {
		t.Errorf("the live event reads %q", got)
	}
	for _, want := range []string{"admitted", "Mode", "Source", "Trust", "Driver", "docker", "exec_started"} {
		if !strings.Contains(html(t, ctx), want) {
			t.Errorf("the run page lacks %q", want)
		}
	}
	shoot(t, ctx, "run")
	if r := <-first; r.err != nil || r.res.ExitCode != 0 {
		t.Fatalf("the first command: %+v, %v", r.res, r.err)
	}

	// A blocked request shows on the egress page: the proxy refuses denied.test before any lookup or dial.
	res, err := acmeExec.Exec(t.Context(), "alice", client.ExecRequest{Argv: []string{testutil.ProbePath, "http", "http://denied.test:8080/x"}, Timeout: time.Minute})
	if err != nil || !strings.Contains(res.Stdout, "status 403") {
		t.Fatalf("the blocked request: %+v, %v", res, err)
	}
	do(t, ctx, "egress page", chromedp.Navigate(s.url+"/ui/egress?window=1h"), chromedp.WaitVisible(chromedp.CSS("table")))
	if page := html(t, ctx); !strings.Contains(page, "denied.test:8080") || !strings.Contains(page, "not-allowlisted") {
		t.Errorf("the egress page does not show the refused host:\n%s", page)
	}
	shoot(t, ctx, "egress")
	do(t, ctx, "overview", chromedp.Navigate(s.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS(".cards")))
	if !strings.Contains(html(t, ctx), "denied.test") {
		t.Error("the overview's last refusals lack denied.test")
	}
	shoot(t, ctx, "overview")
	dark(t, ctx, true)
	shoot(t, ctx, "overview-dark")
	dark(t, ctx, false)
	do(t, ctx, "latency", chromedp.Navigate(s.url+"/ui/latency?window=1h"), chromedp.WaitVisible(chromedp.CSS("figure.chart svg")))
	shoot(t, ctx, "latency")

	// Stop the sandbox from the page.
	do(t, ctx, "stop",
		chromedp.Navigate(s.url+"/ui/sandboxes"),
		chromedp.WaitVisible(chromedp.CSS(row+` form[action="/ui/sandboxes/stop"] button`)),
		chromedp.Click(chromedp.CSS(row+` form[action="/ui/sandboxes/stop"] button`)),
		chromedp.WaitVisible(chromedp.CSS(".notice")),
	)
	if got := text(t, ctx, ".notice"); !strings.Contains(got, "Stopped "+acme+"/alice") {
		t.Errorf("notice after stop: %q", got)
	}
	key, _ := sandkeep.NewKey(acme, "alice")
	if sb, err := s.svc.Sandbox(t.Context(), key); err != nil || sb.State == "running" {
		t.Errorf("after Stop on the page the sandbox is %+v (%v)", sb, err)
	}
	do(t, ctx, "stopped state", chromedp.WaitVisible(chromedp.CSS(row+` .pill.warn`)))

	// A second tenant's token sees none of it, by the pages or by guessed URLs.
	do(t, ctx, "sign out", chromedp.Click(chromedp.CSS("form.who button")), chromedp.WaitVisible(chromedp.CSS("#token")))
	globexTok := s.token(globex, auth.ScopeRead, auth.ScopeExec)
	if _, err := s.client(globexTok).Exec(t.Context(), "bob", client.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	signIn(t, ctx, s.url, globexTok)
	for _, page := range []string{"/ui/", "/ui/sandboxes", "/ui/runs", "/ui/runs?tenant=" + acme, "/ui/egress?window=30d", "/ui/latency"} {
		do(t, ctx, page, chromedp.Navigate(s.url+page), chromedp.WaitVisible(chromedp.CSS("main")))
		body := html(t, ctx)
		for _, leak := range []string{acme, runID, "denied.test", "alice"} {
			if strings.Contains(body, leak) {
				t.Errorf("globex sees %q on %s", leak, page)
			}
		}
	}
	if !strings.Contains(html(t, ctx), "globex") {
		t.Error("globex does not see its own tenant")
	}
	do(t, ctx, "guessed run URL", chromedp.Navigate(s.url+"/ui/runs/"+runID), chromedp.WaitVisible(chromedp.CSS("main")))
	guessed := html(t, ctx)
	do(t, ctx, "missing run URL", chromedp.Navigate(s.url+"/ui/runs/01900000-0000-7000-8000-000000000000"), chromedp.WaitVisible(chromedp.CSS("main")))
	missing := html(t, ctx)
	if !strings.Contains(guessed, "Nothing here") || guessed != missing {
		t.Errorf("another tenant's run by its URL does not answer like a missing one")
	}
	shoot(t, ctx, "not-found")
	do(t, ctx, "guessed live URL", chromedp.Navigate(s.url+"/ui/runs/"+runID+"/live"), chromedp.WaitVisible(chromedp.CSS("main")))
	if !strings.Contains(html(t, ctx), "Nothing here") {
		t.Error("another tenant's live stream by its URL is not a 404")
	}
	do(t, ctx, "sign out", chromedp.Navigate(s.url+"/ui/"), chromedp.Click(chromedp.CSS("form.who button")), chromedp.WaitVisible(chromedp.CSS("#token")))
	shoot(t, ctx, "signin")
	t.Logf("screenshots in %s", artifacts(t))
}
