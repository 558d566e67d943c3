package ui

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/api/apitest"
	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/sqlite"
)

func TestMain(m *testing.M) {
	code := m.Run()
	for _, c := range cleanups { // the benchmarks' stores, closed before the leak check
		c()
	}
	if code == 0 {
		err := goleak.Find(
			// The shared Docker client (testutil.Docker) keeps idle HTTP connections for the whole test process.
			goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
			goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// world is a dashboard over a real SQLite store and the API's in-memory backend, served by httptest.
type world struct {
	t  *testing.T
	ui *UI
	ts *httptest.Server
	st *sqlite.Store
	be *apitest.Backend
}

// allLister is the fake backend with the AllLister capability service.Service has, over the tests' tenants.
type allLister struct{ *apitest.Backend }

func (a allLister) ListAll(ctx context.Context) ([]sandkeep.Sandbox, error) {
	var out []sandkeep.Sandbox
	for _, tenant := range []string{"acme", "globex", "ops"} {
		sbs, err := a.List(ctx, tenant)
		if err != nil {
			return nil, err
		}
		out = append(out, sbs...)
	}
	return out, nil
}

// testOperatorToken is the installation operator's dashboard credential in newWorld's UI.
const testOperatorToken = "sk-operator-0123456789abcdef"

func newWorld(t *testing.T) *world {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "runs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	w := &world{t: t, st: st, be: apitest.NewBackend(t.TempDir())}
	w.ui, err = New(Config{Backend: allLister{w.be}, Store: st, Tokens: st, PollInterval: 20 * time.Millisecond, OperatorToken: testOperatorToken})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(Prefix, w.ui)
	w.ts = httptest.NewServer(mux)
	t.Cleanup(func() { w.ui.Close(); w.ts.Close() })
	return w
}

// token creates a token of tenant with scopes and returns it.
func (w *world) token(tenant string, scopes ...string) (string, store.Token) {
	w.t.Helper()
	tok, secret, err := auth.Create(w.t.Context(), w.st, auth.Spec{Tenant: tenant, Name: "t" + randomID()[:8], Scopes: scopes}, time.Now())
	if err != nil {
		w.t.Fatal(err)
	}
	return secret, tok
}

// browser is a client with a cookie jar that does not follow redirects.
type browser struct {
	w  *world
	hc *http.Client
}

func (w *world) browser() *browser {
	jar, _ := cookiejar.New(nil)
	tr := &http.Transport{}
	w.t.Cleanup(tr.CloseIdleConnections)
	return &browser{w: w, hc: &http.Client{Transport: tr, Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

type answer struct {
	status int
	header http.Header
	body   string
}

func (b *browser) do(method, path string, form url.Values, hdr ...string) answer {
	b.w.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(b.w.t.Context(), method, b.w.ts.URL+path, body)
	if err != nil {
		b.w.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		b.w.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(raw)}
}

func (b *browser) get(path string) answer { return b.do("GET", path, nil) }

func (b *browser) signIn(token string) answer {
	b.w.t.Helper()
	a := b.do("POST", Prefix+"signin", url.Values{"token": {token}}, "Origin", b.w.ts.URL, "Sec-Fetch-Site", "same-origin")
	return a
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func (b *browser) csrf() string {
	b.w.t.Helper()
	m := csrfRe.FindStringSubmatch(b.get(Prefix).body)
	if m == nil {
		b.w.t.Fatal("no CSRF token on the overview")
	}
	return m[1]
}

// run records a run of tenant/user with events and returns it.
func (w *world) run(tenant, user, status string, evs ...events.Event) store.Run {
	w.t.Helper()
	id, _ := store.NewRunID()
	r := store.Run{ID: id, Tenant: tenant, User: user, Trust: store.TrustTrusted, ResolvedMode: "auto", Source: "default",
		Driver: "docker", Admission: store.AdmissionAdmitted}
	if err := w.st.CreateRun(w.t.Context(), r); err != nil {
		w.t.Fatal(err)
	}
	for _, e := range evs {
		e.RunID = id
		if _, err := w.st.AppendEvent(w.t.Context(), e); err != nil {
			w.t.Fatal(err)
		}
	}
	if status != store.StatusRunning {
		upd := store.RunUpdate{Status: status}
		if status != store.StatusSucceeded {
			upd.FailureCode, upd.Disposition = "EXEC_FAILED", store.DispositionDeterministic
		}
		if err := w.st.UpdateRun(w.t.Context(), id, upd); err != nil {
			w.t.Fatal(err)
		}
	}
	got, _ := w.st.GetRun(w.t.Context(), id)
	return got
}

func ev(t *testing.T, name string, payload any) events.Event {
	t.Helper()
	e, err := events.New("", name, payload)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestSignIn: the session cookie's attributes, a refused token's answer, no token anywhere but the form, and
// sign-out.
func TestSignIn(t *testing.T) {
	w := newWorld(t)
	secret, _ := w.token("acme", auth.ScopeRead)
	b := w.browser()

	if a := b.get(Prefix + "runs"); a.status != http.StatusSeeOther || a.header.Get("Location") != Prefix+"signin" {
		t.Fatalf("signed out: GET runs = %d %s, want a redirect to sign in", a.status, a.header.Get("Location"))
	}
	for _, bad := range []string{"", "skt_nope", secret + "x"} {
		if a := b.signIn(bad); a.status != http.StatusUnauthorized || !strings.Contains(a.body, "was not accepted") {
			t.Errorf("sign in with %q: %d", bad, a.status)
		}
	}
	exec, _ := w.token("acme", auth.ScopeExec)
	if a := b.signIn(exec); a.status != http.StatusUnauthorized {
		t.Errorf("a token without read: %d, want 401", a.status)
	}
	a := b.signIn(secret)
	if a.status != http.StatusSeeOther || a.header.Get("Location") != Prefix {
		t.Fatalf("sign in: %d %s", a.status, a.header.Get("Location"))
	}
	cookie := a.header.Get("Set-Cookie")
	for _, want := range []string{CookieName + "=", "Path=/ui/", "HttpOnly", "SameSite=Strict"} {
		if !strings.Contains(cookie, want) {
			t.Errorf("Set-Cookie %q lacks %q", cookie, want)
		}
	}
	if strings.Contains(cookie, secret) || strings.Contains(a.header.Get("Location"), secret) {
		t.Error("the token is in the cookie or the redirect")
	}
	for _, page := range []string{"", "sandboxes", "runs", "egress", "latency", "egress?window=7d", "latency?window=1h"} {
		a := b.get(Prefix + page)
		if a.status != http.StatusOK || !strings.Contains(a.body, "Sign out") || strings.Contains(a.body, secret) {
			t.Errorf("GET /ui/%s: %d", page, a.status)
		}
		if csp := a.header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || a.header.Get("Cache-Control") != "no-store" {
			t.Errorf("GET /ui/%s: CSP %q, Cache-Control %q", page, csp, a.header.Get("Cache-Control"))
		}
	}
	if a := b.get(Prefix + "static/app.css"); a.status != http.StatusOK || !strings.Contains(a.body, "prefers-color-scheme") {
		t.Errorf("app.css: %d", a.status)
	}
	// Sign-out needs the CSRF token; then the session is gone on the server too.
	if a := b.do("POST", Prefix+"signout", url.Values{}, "Sec-Fetch-Site", "same-origin"); a.status != http.StatusForbidden {
		t.Errorf("sign-out without the CSRF token: %d, want 403", a.status)
	}
	if a := b.do("POST", Prefix+"signout", url.Values{"csrf": {b.csrf()}}, "Sec-Fetch-Site", "same-origin"); a.status != http.StatusSeeOther {
		t.Errorf("sign-out: %d", a.status)
	}
	if a := b.get(Prefix); a.status != http.StatusSeeOther {
		t.Errorf("after sign-out: %d, want a redirect", a.status)
	}
}

// TestRevokedTokenEndsSession: revoking the token ends its sessions on the next request.
func TestRevokedTokenEndsSession(t *testing.T) {
	w := newWorld(t)
	secret, tok := w.token("acme", auth.ScopeRead)
	b := w.browser()
	b.signIn(secret)
	if a := b.get(Prefix); a.status != http.StatusOK {
		t.Fatalf("overview: %d", a.status)
	}
	if err := w.st.RevokeToken(t.Context(), tok.ID); err != nil {
		t.Fatal(err)
	}
	if a := b.get(Prefix); a.status != http.StatusSeeOther {
		t.Errorf("after revocation: %d, want a redirect to sign in", a.status)
	}
}

// TestTenantIsolation: a tenant sees only its runs, sandboxes and refusals; another tenant's run answers exactly
// like a missing one, to its admin token too; the operator's credential sees both.
func TestTenantIsolation(t *testing.T) {
	w := newWorld(t)
	blocked := ev(t, events.NameNetworkBlocked, events.NetworkBlocked{Host: "secret-host.test", Port: 443, Reason: "not-allowlisted"})
	ra := w.run("acme", "alice", store.StatusSucceeded, blocked, ev(t, events.NameExecStarted, events.ExecStarted{Command: "acme-cmd"}))
	rb := w.run("globex", "bob", store.StatusRunning)
	for _, k := range []sandkeep.Key{mustKey(t, "acme", "alice"), mustKey(t, "globex", "bob")} {
		if _, err := w.be.Exec(t.Context(), k, sandkeep.ExecRequest{Argv: []string{"echo", "hi"}}); err != nil {
			t.Fatal(err)
		}
	}
	secretB, _ := w.token("globex", auth.ScopeRead, auth.ScopeExec)
	b := w.browser()
	b.signIn(secretB)

	missing := b.get(Prefix + "runs/01900000-0000-7000-8000-000000000000")
	other := b.get(Prefix + "runs/" + ra.ID)
	bogus := b.get(Prefix + "runs/not-a-uuid")
	if missing.status != http.StatusNotFound || other.status != missing.status || bogus.status != missing.status ||
		other.body != missing.body || bogus.body != missing.body {
		t.Errorf("another tenant's run: %d vs missing %d vs malformed %d; bodies equal: %v", other.status, missing.status,
			bogus.status, other.body == missing.body)
	}
	if a := b.get(Prefix + "runs/" + ra.ID + "/live"); a.status != http.StatusNotFound {
		t.Errorf("another tenant's live stream: %d", a.status)
	}
	if a := b.get(Prefix + "runs/" + rb.ID); a.status != http.StatusOK {
		t.Errorf("own run: %d", a.status)
	}
	for _, page := range []string{"", "runs", "runs?tenant=acme", "sandboxes", "egress", "latency"} {
		a := b.get(Prefix + page)
		for _, leak := range []string{"acme", ra.ID, "secret-host", "alice"} {
			if strings.Contains(a.body, leak) {
				t.Errorf("GET /ui/%s shows %q to globex", page, leak)
			}
		}
	}
	// Actions need admin; a guessed action on another tenant is the same 404 as a missing sandbox.
	form := url.Values{"csrf": {b.csrf()}, "tenant": {"globex"}, "user": {"bob"}}
	if a := b.do("POST", Prefix+"sandboxes/stop", form, "Sec-Fetch-Site", "same-origin"); a.status != http.StatusForbidden {
		t.Errorf("stop without admin: %d", a.status)
	}

	// A tenant's admin token administers its tenant only (issue 22, Medium 9: an admin token of one tenant saw
	// and could stop every tenant's sandboxes): globex's admin sees none of acme's, and stopping acme's
	// sandbox answers like a missing one.
	adminB, _ := w.token("globex", auth.ScopeAdmin)
	gb := w.browser()
	gb.signIn(adminB)
	for _, page := range []string{"", "runs", "runs?tenant=acme", "sandboxes", "egress", "latency"} {
		a := gb.get(Prefix + page)
		for _, leak := range []string{"acme", ra.ID, "secret-host", "alice"} {
			if strings.Contains(a.body, leak) {
				t.Errorf("GET /ui/%s shows %q to globex's admin", page, leak)
			}
		}
	}
	if a := gb.get(Prefix + "sandboxes"); !strings.Contains(a.body, "bob") {
		t.Errorf("globex's admin does not see its own sandbox")
	}
	if a := gb.do("POST", Prefix+"sandboxes/stop", url.Values{"csrf": {gb.csrf()}, "tenant": {"acme"}, "user": {"alice"}},
		"Sec-Fetch-Site", "same-origin"); a.status != http.StatusNotFound {
		t.Errorf("globex's admin stopping acme's sandbox: %d, want 404", a.status)
	}
	if sb, err := w.be.Sandbox(t.Context(), mustKey(t, "acme", "alice")); err != nil || sb.State != "running" {
		t.Errorf("acme's sandbox after globex's admin tried to stop it: %+v, %v", sb, err)
	}

	// The installation's operator, with its own credential (no tenant's token), sees every tenant.
	ab := w.browser()
	if a := ab.signIn(testOperatorToken); a.status != http.StatusSeeOther {
		t.Fatalf("operator sign-in: %d %s", a.status, a.body)
	}
	for _, want := range []string{"acme", "globex"} {
		if a := ab.get(Prefix + "runs"); !strings.Contains(a.body, want) {
			t.Errorf("operator's runs lack %s", want)
		}
		if a := ab.get(Prefix + "sandboxes"); !strings.Contains(a.body, want) {
			t.Errorf("operator's sandboxes lack %s", want)
		}
	}
	if a := ab.get(Prefix + "runs/" + ra.ID); a.status != http.StatusOK || !strings.Contains(a.body, "acme-cmd") || !strings.Contains(a.body, "secret-host.test") {
		t.Errorf("operator's view of acme's run: %d", a.status)
	}
	if a := ab.get(Prefix + "egress"); !strings.Contains(a.body, "secret-host.test") {
		t.Error("operator's egress page lacks the refused host")
	}
}

func mustKey(t *testing.T, tenant, user string) sandkeep.Key {
	t.Helper()
	k, err := sandkeep.NewKey(tenant, user)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestActionsCSRF: stopping needs the session's CSRF token and a same-origin request; then it stops.
func TestActionsCSRF(t *testing.T) {
	w := newWorld(t)
	key := mustKey(t, "acme", "alice")
	if _, err := w.be.Exec(t.Context(), key, sandkeep.ExecRequest{Argv: []string{"echo"}}); err != nil {
		t.Fatal(err)
	}
	admin, _ := w.token("acme", auth.ScopeAdmin)
	b := w.browser()
	b.signIn(admin)
	csrf := b.csrf()
	form := func(tok, tenant, user string) url.Values {
		return url.Values{"csrf": {tok}, "tenant": {tenant}, "user": {user}}
	}
	tests := []struct {
		name   string
		form   url.Values
		hdr    []string
		status int
	}{
		{"no csrf token", form("", "acme", "alice"), []string{"Sec-Fetch-Site", "same-origin"}, http.StatusForbidden},
		{"wrong csrf token", form("x"+csrf, "acme", "alice"), []string{"Sec-Fetch-Site", "same-origin"}, http.StatusForbidden},
		{"cross-site", form(csrf, "acme", "alice"), []string{"Sec-Fetch-Site", "cross-site"}, http.StatusForbidden},
		{"other origin", form(csrf, "acme", "alice"), []string{"Origin", "https://evil.example"}, http.StatusForbidden},
		{"missing sandbox", form(csrf, "acme", "nobody"), []string{"Sec-Fetch-Site", "same-origin"}, http.StatusNotFound},
		{"stop", form(csrf, "acme", "alice"), []string{"Sec-Fetch-Site", "same-origin"}, http.StatusSeeOther},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := b.do("POST", Prefix+"sandboxes/stop", tt.form, tt.hdr...)
			if a.status != tt.status {
				t.Errorf("status %d, want %d: %s", a.status, tt.status, a.body)
			}
		})
	}
	sb, err := w.be.Sandbox(t.Context(), key)
	if err != nil || sb.State != "exited" {
		t.Errorf("after stop: %+v, %v", sb, err)
	}
	if a := b.get(Prefix + "sandboxes?done=stopped&who=acme/alice"); !strings.Contains(a.body, "Stopped acme/alice") {
		t.Error("no notice after the stop")
	}
}

// TestRunLive: the stream sends the events after the page's last one, then "done" once the run finishes.
func TestRunLive(t *testing.T) {
	w := newWorld(t)
	r := w.run("acme", "alice", store.StatusRunning, ev(t, events.NameExecStarted, events.ExecStarted{Command: "make"}))
	secret, _ := w.token("acme", auth.ScopeRead)
	b := w.browser()
	b.signIn(secret)
	page := b.get(Prefix + "runs/" + r.ID)
	m := regexp.MustCompile(`data-live-events="([^"]+)"`).FindStringSubmatch(page.body)
	if m == nil {
		t.Fatalf("a running run's page has no live stream:\n%s", page.body)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", w.ts.URL+strings.ReplaceAll(m[1], "&amp;", "&"), nil)
	resp, err := b.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		_, _ = w.st.AppendEvent(context.Background(), withRun(ev(t, events.NameExecFinished, events.ExecFinished{ExitCode: 3, DurationMS: 42}), r.ID))
		_ = w.st.UpdateRun(context.Background(), r.ID, store.RunUpdate{Status: store.StatusFailed, FailureCode: "EXEC_FAILED"})
	}()
	sc := bufio.NewScanner(resp.Body)
	var got []string
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "event: ") || strings.HasPrefix(line, "data: ") {
			got = append(got, line)
		}
		if line == "event: done" {
			sc.Scan()
			got = append(got, sc.Text())
			break
		}
	}
	text := strings.Join(got, "\n")
	if strings.Contains(text, `"make started`) {
		t.Errorf("the stream repeated an event the page showed:\n%s", text)
	}
	if !strings.Contains(text, "event: ev") || !strings.Contains(text, "exit 3 after 42ms") || !strings.Contains(text, `"status":"failed"`) {
		t.Errorf("stream:\n%s", text)
	}
}

func withRun(e events.Event, id string) events.Event { e.RunID = id; return e }

// TestSandboxesLive: the sandboxes stream sends the table's rows, escaped.
func TestSandboxesLive(t *testing.T) {
	w := newWorld(t)
	if _, err := w.be.Exec(t.Context(), mustKey(t, "acme", `<b>x</b>`), sandkeep.ExecRequest{Argv: []string{"echo"}}); err != nil {
		t.Fatal(err)
	}
	secret, _ := w.token("acme", auth.ScopeRead)
	b := w.browser()
	b.signIn(secret)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", w.ts.URL+Prefix+"sandboxes/live", nil)
	resp, err := b.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var rows strings.Builder
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			rows.WriteString(sc.Text())
		}
		if sc.Text() == "" && rows.Len() > 0 {
			break
		}
	}
	if !strings.Contains(rows.String(), "&lt;b&gt;x&lt;/b&gt;") || strings.Contains(rows.String(), "<b>x") {
		t.Errorf("rows: %s", rows.String())
	}
}

// TestLatencySamples: warm commands, first commands and gate waits are told apart from a run's events.
func TestLatencySamples(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mk := func(seq int64, run, name string, payload any) store.RunEvent {
		e, _ := events.New(run, name, payload)
		e.Seq, e.Time = seq, at.Add(time.Duration(seq)*time.Second)
		return store.RunEvent{Event: e}
	}
	asc := []store.RunEvent{
		mk(1, "r1", events.NameSandboxStarted, events.SandboxStarted{Created: true, DurationMS: 900}),
		mk(2, "r1", events.NameExecStarted, events.ExecStarted{GateWaitMS: 5}),
		mk(3, "r2", events.NameExecStarted, events.ExecStarted{GateWaitMS: 7}),
		mk(4, "r1", events.NameExecFinished, events.ExecFinished{DurationMS: 100}),
		mk(5, "r2", events.NameExecFinished, events.ExecFinished{DurationMS: 20}),
		mk(6, "r1", events.NameExecStarted, events.ExecStarted{}),
		mk(7, "r1", events.NameExecFinished, events.ExecFinished{DurationMS: 30}),
		mk(8, "r3", events.NameExecFinished, events.ExecFinished{DurationMS: 99}), // its start is outside the window
	}
	desc := make([]store.RunEvent, len(asc))
	for i := range asc {
		desc[len(asc)-1-i] = asc[i]
	}
	s := latencySamples(desc, nil)
	if len(s.first) != 1 || s.first[0].ms != 1000 {
		t.Errorf("first commands = %+v, want one of 1000ms", s.first)
	}
	// With the run's creation time known, a run's first command is timed from it (here 4s before its end).
	if s := latencySamples(desc, map[string]time.Time{"r1": at}); len(s.first) != 1 || s.first[0].ms != 4000 {
		t.Errorf("first commands from the run's creation = %+v, want 4000ms", s.first)
	}
	if len(s.warm) != 2 || s.warm[0].ms != 20 || s.warm[1].ms != 30 {
		t.Errorf("warm commands = %+v, want 20ms and 30ms", s.warm)
	}
	if len(s.gate) != 3 {
		t.Errorf("gate waits = %+v", s.gate)
	}
	qs := quantileSeries([]sample{{at, 1}, {at, 2}, {at, 3}, {at.Add(time.Hour), 10}}, at, at.Add(2*time.Hour), 2)
	if qs[0].Values[0] != 2 || qs[2].Values[0] != 3 || qs[0].Values[1] != 10 {
		t.Errorf("quantiles = %+v", qs)
	}
}
