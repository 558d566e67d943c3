// Package ui is the operator dashboard `sandkeep serve` mounts under /ui/: server-rendered HTML pages (overview,
// sandboxes, runs, one run, egress, latency) with inline SVG charts, a little JavaScript for live updates over
// server-sent events, and a sign-in with an API token. Templates, CSS and JS are embedded: nothing is fetched
// from anywhere else, and the pages work without JavaScript for everything but the live parts.
//
// Who sees what: a session is opened by posting a token (never in a URL); it is a random id in an HttpOnly,
// SameSite=Strict cookie, kept server-side with the token's hash, and the token is looked up again on every
// request, so a revoked or expired token ends its sessions. A tenant's token sees its tenant only, and another
// tenant's run or sandbox answers exactly like a missing one (404). An admin-scoped token administers its own
// tenant: it may stop or remove that tenant's sandboxes; those POSTs carry the session's CSRF token and pass
// Go's cross-origin checks (Sec-Fetch-Site, Origin). Installation-wide views (every tenant's sandboxes and runs,
// the server's own histograms) need the operator's credential (Config.OperatorToken), which is no tenant's
// token.
package ui

import (
	"context"
	"embed"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Prefix is where the dashboard is mounted.
const Prefix = "/ui/"

// Defaults of Config.
const (
	DefaultSessionTTL   = 8 * time.Hour
	DefaultPollInterval = 500 * time.Millisecond
	DefaultMaxSessions  = 10_000
	DefaultStreamMax    = 15 * time.Minute
	pageTimeout         = 10 * time.Second
)

// Store is the part of the run store the dashboard reads. store.Store satisfies it.
type Store interface {
	GetRun(ctx context.Context, id string) (store.Run, error)
	ListEvents(ctx context.Context, f store.EventFilter) ([]store.Event, error)
	ListRunLogs(ctx context.Context, f store.RunLogFilter) ([]store.RunLog, error)
	store.Dashboard
}

// AllLister is the optional Backend capability of listing every tenant's sandboxes (service.Service has it);
// without it the operator sees the sandboxes of its own listing only.
type AllLister interface {
	ListAll(ctx context.Context) ([]sandkeep.Sandbox, error)
}

// Config is what New needs. Backend, Store and Tokens are required.
type Config struct {
	Backend service.Backend // sandboxes: list, stop, remove
	Store   Store           // runs and events
	Tokens  auth.Lookup     // finds a presented token by its hash (store.TokenStore)
	// Gatherer, when set, is the server's Prometheus registry: the latency page shows the server's own exec and
	// gate-wait histograms from it (to the operator's sessions: they are installation-wide).
	Gatherer prometheus.Gatherer
	// OperatorToken, when set, is the installation operator's dashboard credential (sandkeep-server.yaml's
	// operator_token_env): signed in with it, a session sees every tenant and may stop or remove any sandbox.
	// It is not a store token, so no tenant's token, admin or not, can stand for it. "": no operator sign-in.
	OperatorToken string
	Logger        *slog.Logger

	SessionTTL   time.Duration // how long a session lives after sign-in; default 8h
	MaxSessions  int           // sessions kept at once (the oldest is dropped past it); default 10,000
	PollInterval time.Duration // how often live streams look for news; default 500ms
	StreamMax    time.Duration // how long one live stream lasts before the browser reconnects; default 15m
	Now          func() time.Time
}

// UI is the dashboard's handler. Make one with New, mount it at Prefix, and Close it before the server shuts
// down so that live streams end.
type UI struct {
	cfg      Config
	log      *slog.Logger
	now      func() time.Time
	pages    map[string]*template.Template
	rows     *template.Template // the sandboxes table body, for the live stream
	sessions *sessions
	mux      *http.ServeMux
	handler  http.Handler

	ctx    context.Context // cancelled by Close: every live stream watches it
	cancel context.CancelFunc
	mu     sync.Mutex // guards closed, so that no stream joins wg once Close waits for it
	closed bool
	wg     sync.WaitGroup // the live streams
}

// New checks cfg and builds the dashboard. It starts no goroutine.
func New(cfg Config) (*UI, error) {
	if cfg.Backend == nil || cfg.Store == nil || cfg.Tokens == nil {
		return nil, errors.New("ui: Config.Backend, Config.Store and Config.Tokens are required")
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.StreamMax <= 0 {
		cfg.StreamMax = DefaultStreamMax
	}
	u := &UI{cfg: cfg, log: cfg.Logger, now: cfg.Now, mux: http.NewServeMux()}
	if u.log == nil {
		u.log = slog.New(slog.DiscardHandler)
	}
	if u.now == nil {
		u.now = time.Now
	}
	var err error
	if u.pages, u.rows, err = parseTemplates(); err != nil {
		return nil, err
	}
	u.sessions = newSessions(cfg.SessionTTL, cfg.MaxSessions, u.now)
	u.ctx, u.cancel = context.WithCancel(context.Background())
	u.routes()
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.fail(w, r, nil, http.StatusForbidden, "This request came from another site, so it was refused.",
			"Use the dashboard's own buttons; a form on another site cannot act here.")
	}))
	u.handler = headers(cop.Handler(u.mux))
	return u, nil
}

// ServeHTTP serves the dashboard under Prefix.
func (u *UI) ServeHTTP(w http.ResponseWriter, r *http.Request) { u.handler.ServeHTTP(w, r) }

// Close ends every live stream and waits for them. The dashboard keeps answering pages.
func (u *UI) Close() {
	u.mu.Lock()
	u.closed = true
	u.mu.Unlock()
	u.cancel()
	u.wg.Wait()
}

// join adds a live stream to wg, unless the UI is closed.
func (u *UI) join() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return false
	}
	u.wg.Add(1)
	return true
}

func (u *UI) routes() {
	static, _ := fs.Sub(staticFS, "static")
	fileServer := http.StripPrefix(Prefix+"static/", http.FileServerFS(static))
	u.mux.Handle("GET "+Prefix+"static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		fileServer.ServeHTTP(w, r)
	}))
	u.mux.HandleFunc("GET "+Prefix+"signin", u.handleSignInPage)
	u.mux.HandleFunc("POST "+Prefix+"signin", u.handleSignIn)
	u.mux.HandleFunc("POST "+Prefix+"signout", u.authed(u.handleSignOut))
	u.mux.HandleFunc("GET "+Prefix+"{$}", u.authed(u.handleOverview))
	u.mux.HandleFunc("GET "+Prefix+"sandboxes", u.authed(u.handleSandboxes))
	u.mux.HandleFunc("GET "+Prefix+"sandboxes/live", u.authed(u.handleSandboxesLive))
	u.mux.HandleFunc("POST "+Prefix+"sandboxes/stop", u.authed(u.handleSandboxAction))
	u.mux.HandleFunc("POST "+Prefix+"sandboxes/remove", u.authed(u.handleSandboxAction))
	u.mux.HandleFunc("GET "+Prefix+"runs", u.authed(u.handleRuns))
	u.mux.HandleFunc("GET "+Prefix+"runs/{id}", u.authed(u.handleRun))
	u.mux.HandleFunc("GET "+Prefix+"runs/{id}/live", u.authed(u.handleRunLive))
	u.mux.HandleFunc("GET "+Prefix+"egress", u.authed(u.handleEgress))
	u.mux.HandleFunc("GET "+Prefix+"latency", u.authed(u.handleLatency))
	u.mux.HandleFunc(Prefix, u.authed(func(w http.ResponseWriter, r *http.Request, v *viewer) {
		u.notFound(w, r, v)
	}))
}

// headers sets what every answer of the dashboard carries: no caching of pages, no framing, no sniffing, no
// referrer, and a content security policy that allows this origin's scripts and styles only.
func headers(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
			"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}
