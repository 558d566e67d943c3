// Package api is sandkeep's HTTP API: the versioned /v1 routes over a service.Backend, with bearer-token auth
// scoped to one tenant per token, per-tenant limits, request ids, structured access logs, Prometheus metrics
// and graceful draining. It serves; it does not listen: `sandkeep serve` owns the listener and the TLS.
//
// The tenant of every request comes only from its token. A route takes the user from its path and forms the
// Key (tenant, user) itself, so a token can neither name nor observe another tenant's sandboxes, runs, events
// or files: those answer exactly as objects that do not exist.
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
)

// Defaults of the Config bounds.
const (
	DefaultMaxBodyBytes   = 1 << 20  // JSON request bodies
	DefaultMaxUploadBytes = 1 << 30  // file and tar uploads
	DefaultMaxHeaderBytes = 64 << 10 // all request headers together
	DefaultPollInterval   = 500 * time.Millisecond

	DefaultUploadMinRate    = 16 << 10 // bytes per second
	DefaultUploadRateWindow = 30 * time.Second
)

// Config is what New needs. Backend and Tokens are required; zero values elsewhere take the defaults.
type Config struct {
	Backend service.Backend
	Tokens  Tokens // a store.TokenStore satisfies it

	// Limits bound every tenant: zero fields take DefaultLimits, Unlimited (-1) lifts a bound. TenantLimits
	// replaces them for the tenants it names; a zero field there takes the one of Limits.
	Limits       Limits
	TenantLimits map[string]Limits

	MaxBodyBytes   int64 // JSON request bodies (exec); default 1 MiB
	MaxUploadBytes int64 // one PUT .../files/ body, a file or a tar; default 1 GiB
	MaxHeaderBytes int   // used by HTTPServer; default 64 KiB

	// UploadMinRate is the slowest an upload's body may arrive, in bytes per second averaged over each
	// UploadRateWindow: a body that brings less in a window is cut with 408 UPLOAD_TOO_SLOW (nothing of the
	// file it was writing stays). Defaults 16 KiB/s and 30s; a negative UploadMinRate turns the check off.
	UploadMinRate    int64
	UploadRateWindow time.Duration

	// Logger receives one access log line per request (give it a slog.NewJSONHandler) and the causes of 5xx
	// answers. Nil discards.
	Logger *slog.Logger

	// Registry receives the API's metrics. Nil: a private registry (with Go and process collectors), served at
	// /metrics. A Registry that is also a prometheus.Gatherer (e.g. *prometheus.Registry) is served at /metrics;
	// otherwise set Gatherer.
	Registry prometheus.Registerer
	Gatherer prometheus.Gatherer
	// MetricsToken, when set, is the bearer token /metrics requires. Empty: /metrics is refused (401) unless
	// MetricsOpen, which serves it without auth (bind the server to a private address or protect it upstream).
	MetricsToken string
	MetricsOpen  bool

	// MCP, when set, makes the handler mounted at /mcp, behind token auth (any valid token: the handler checks
	// each tool's scope with hooks.Authorize). It receives the backend with this server's limits, metrics and
	// draining applied, and the hooks that name each request's key, scopes and id.
	MCP func(b service.Backend, hooks MCPHooks) http.Handler

	// E2B, when set, makes the handler mounted at /e2b/ (E2B's control plane and envd, internal/e2b). The route
	// has no bearer auth of its own: the handler authenticates each request with hooks.Authenticate (the SDK's
	// X-API-KEY) or a sandbox's access token. It receives the backend with this server's limits, metrics and
	// draining applied.
	E2B func(b service.Backend, hooks E2BHooks) http.Handler

	// Forward, when set, is asked first by the routes that hold a stream to one key's sandbox or its files (a
	// TTY, port forwarding, processes, files) and by /mcp (whose requests name one key), once the token is checked: when it serves the request itself it
	// returns true (a fleet replica hands the request to the key's owner); an error is answered as every error
	// is, before anything was written. false and nil: the route serves the request here.
	Forward func(w http.ResponseWriter, r *http.Request, key sandkeep.Key) (bool, error)

	// ForwardE2B, when set, is asked first by /e2b/ requests that name an E2B sandbox (in the path, or envd's
	// E2b-Sandbox-Id header): true when it served the request (a fleet replica hands it to the replica that made
	// the sandbox, where its record lives); an error is answered before anything was written.
	ForwardE2B func(w http.ResponseWriter, r *http.Request, sandboxID string) (bool, error)

	// PollInterval is how often GET /v1/runs/{id}/events?follow=1 asks the backend for new events; default 500ms.
	PollInterval time.Duration

	// Now is the clock for token expiry and rate limits; nil means time.Now.
	Now func() time.Time
}

// Limits bound one tenant. In a Config, a zero field takes its default and Unlimited lifts the bound.
// Exceeding one answers 429 RATE_LIMITED with Retry-After at once; nothing waits.
type Limits struct {
	MaxSandboxes         int     // sandboxes the tenant may have; an exec or upload that would create one more is refused
	MaxConcurrentExecs   int     // commands of the tenant running at once, over all its users
	RequestsPerSecond    float64 // sustained request rate of the tenant, over all its tokens
	Burst                int     // requests allowed at once above the rate; default max(1, RequestsPerSecond)
	MaxConcurrentFileOps int     // file uploads, downloads and listings of the tenant open at once
}

// Unlimited, as a Limits field, lifts that bound.
const Unlimited = -1

// DefaultLimits bound every tenant the operator did not configure otherwise: generous for one agent platform's
// tenant, small enough that one tenant cannot take a shared host from the others. The Burst default applies
// when RequestsPerSecond is the default too.
var DefaultLimits = Limits{MaxSandboxes: 50, MaxConcurrentExecs: 16, RequestsPerSecond: 50, Burst: 100, MaxConcurrentFileOps: 8}

// Server is the HTTP API. Make one with New; serve Handler (or HTTPServer); call Drain before shutting the
// listener down.
type Server struct {
	backend     service.Backend // the configured one, wrapped in guarded: limits, metrics, draining
	tokens      Tokens
	log         *slog.Logger
	now         func() time.Time
	maxBody     int64
	maxUp       int64
	maxHead     int
	upRate      int64         // bytes per second; 0: no minimum
	upWindow    time.Duration // over which upRate is averaged
	poll        time.Duration
	forward     func(http.ResponseWriter, *http.Request, sandkeep.Key) (bool, error) // Config.Forward
	forwardE2B  func(http.ResponseWriter, *http.Request, string) (bool, error)       // Config.ForwardE2B
	metricsT    string
	metricsOpen bool // Config.MetricsOpen

	limits   *limiter
	metrics  *metrics
	gatherer prometheus.Gatherer
	drain    drainer
	mux      *http.ServeMux
	routes   []route // as registered, for the OpenAPI test and the docs
}

// route is one registered pattern, how it authenticates, and the scopes its token needs.
type route struct {
	pattern string
	auth    authKind
	scopes  []string
}

type authKind int

const (
	authToken   authKind = iota // a tenant's token with scopes
	authNone                    // /healthz, /readyz
	authMetrics                 // Config.MetricsToken, when set
	authSelf                    // the handler authenticates each request itself (/e2b/: E2BHooks.Authenticate)
)

// New checks cfg and builds the server. It starts no goroutine.
func New(cfg Config) (*Server, error) {
	if cfg.Backend == nil || cfg.Tokens == nil {
		return nil, errors.New("api: Config.Backend and Config.Tokens are required")
	}
	s := &Server{
		tokens: cfg.Tokens, log: cfg.Logger, now: cfg.Now,
		maxBody: orDefault(cfg.MaxBodyBytes, DefaultMaxBodyBytes), maxUp: orDefault(cfg.MaxUploadBytes, DefaultMaxUploadBytes),
		maxHead: int(orDefault(int64(cfg.MaxHeaderBytes), DefaultMaxHeaderBytes)),
		poll:    time.Duration(orDefault(int64(cfg.PollInterval), int64(DefaultPollInterval))), metricsT: cfg.MetricsToken, metricsOpen: cfg.MetricsOpen,
		mux: http.NewServeMux(), forward: cfg.Forward, forwardE2B: cfg.ForwardE2B,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	switch {
	case cfg.UploadMinRate < 0:
	case cfg.UploadMinRate == 0:
		s.upRate = DefaultUploadMinRate
	default:
		s.upRate = cfg.UploadMinRate
	}
	s.upWindow = time.Duration(orDefault(int64(cfg.UploadRateWindow), int64(DefaultUploadRateWindow)))
	if s.now == nil {
		s.now = time.Now
	}
	if err := checkLimits("Limits", cfg.Limits); err != nil {
		return nil, err
	}
	for t, l := range cfg.TenantLimits {
		if err := checkLimits("TenantLimits["+t+"]", l); err != nil {
			return nil, err
		}
	}
	def := resolveLimits(cfg.Limits, DefaultLimits)
	per := make(map[string]Limits, len(cfg.TenantLimits))
	for t, l := range cfg.TenantLimits {
		per[t] = resolveLimits(l, def)
	}
	s.limits = newLimiter(def, per, s.now)
	reg, gat := cfg.Registry, cfg.Gatherer
	if reg == nil {
		r := prometheus.NewRegistry()
		r.MustRegister(prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
		reg, gat = r, r
	}
	if gat == nil {
		g, ok := reg.(prometheus.Gatherer)
		if !ok {
			return nil, errors.New("api: Config.Registry is not a prometheus.Gatherer: set Config.Gatherer for /metrics")
		}
		gat = g
	}
	s.gatherer = gat
	g := &guarded{Backend: cfg.Backend, s: s}
	s.backend = g
	m, err := newMetrics(reg, g)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.drain.stop = make(chan struct{})
	s.register(cfg.MCP, cfg.E2B)
	return s, nil
}

func orDefault(v, def int64) int64 {
	if v <= 0 {
		return def
	}
	return v
}

// register mounts every route. Patterns are Go 1.22 ServeMux patterns; {path...} takes the rest of the path.
func (s *Server) register(mcp func(service.Backend, MCPHooks) http.Handler, e2b func(service.Backend, E2BHooks) http.Handler) {
	s.handle("POST /v1/sandboxes/{user}/exec", authToken, s.handleExec, ScopeExec)
	s.handle("GET /v1/sandboxes/{user}/exec/tty", authToken, s.owned(s.handleExecTTY), ScopeExec)
	s.handle("GET /v1/sandboxes/{user}/ports/{port}", authToken, s.owned(s.handlePortForward), ScopeExec)
	s.handle("GET /v1/sandboxes/{user}/ports", authToken, s.handleForwardPorts, ScopeRead)
	s.handle("POST /v1/sandboxes/{user}/processes", authToken, s.owned(s.handleStartProcess), ScopeExec)
	s.handle("GET /v1/sandboxes/{user}/processes", authToken, s.owned(s.handleProcesses), ScopeRead)
	s.handle("GET /v1/sandboxes/{user}/processes/{ref}/output", authToken, s.owned(s.handleProcessOutput), ScopeExec)
	s.handle("POST /v1/sandboxes/{user}/processes/{ref}/input", authToken, s.owned(s.handleProcessInput), ScopeExec)
	s.handle("POST /v1/sandboxes/{user}/processes/{ref}/signal", authToken, s.owned(s.handleProcessSignal), ScopeExec)
	s.handle("POST /v1/sandboxes/{user}/processes/{ref}/kill", authToken, s.owned(s.handleProcessKill), ScopeExec)
	s.handle("POST /v1/sandboxes/{user}/processes/{ref}/resize", authToken, s.owned(s.handleProcessResize), ScopeExec)
	s.handle("GET /v1/sandboxes", authToken, s.handleSandboxes, ScopeRead)
	s.handle("GET /v1/sandboxes/{user}", authToken, s.handleSandbox, ScopeRead)
	s.handle("POST /v1/sandboxes/{user}/stop", authToken, s.handleStop, ScopeAdmin)
	s.handle("POST /v1/sandboxes/{user}/fork", authToken, s.handleFork, ScopeExec)
	s.handle("POST /v1/sandboxes/{user}/snapshots", authToken, s.handleCreateSnapshot, ScopeExec)
	s.handle("GET /v1/snapshots", authToken, s.handleSnapshots, ScopeRead)
	s.handle("DELETE /v1/snapshots/{name}", authToken, s.handleDeleteSnapshot, ScopeExec)
	s.handle("POST /v1/snapshots/{name}/restore", authToken, s.handleRestoreSnapshot, ScopeExec)
	s.handle("DELETE /v1/sandboxes/{user}", authToken, s.handleRemove, ScopeAdmin)
	s.handle("PUT /v1/sandboxes/{user}/files/{path...}", authToken, s.owned(s.handlePutFile), ScopeFiles)
	s.handle("GET /v1/sandboxes/{user}/files/{path...}", authToken, s.owned(s.handleGetFile), ScopeFiles)
	s.handle("POST /v1/sandboxes/{user}/runs", authToken, s.handleStartRun, ScopeExec)
	s.handle("POST /v1/runs/{id}/finish", authToken, s.handleFinishRun, ScopeExec)
	s.handle("GET /v1/templates", authToken, s.handleTemplates, ScopeRead)
	s.handle("GET /v1/runs", authToken, s.handleRuns, ScopeRead)
	s.handle("GET /v1/runs/{id}", authToken, s.handleRun, ScopeRead)
	s.handle("GET /v1/runs/{id}/events", authToken, s.handleEvents, ScopeRead)
	s.handle("GET /v1/runs/{id}/logs", authToken, s.handleRunLogs, ScopeRead)
	s.handle("GET /v1/openapi.json", authToken, s.handleOpenAPI)
	s.handle("GET /healthz", authNone, s.handleHealthz)
	s.handle("GET /readyz", authNone, s.handleReadyz)
	s.handle("GET /metrics", authMetrics, metricsHandler(s.gatherer).ServeHTTP)
	if mcp != nil {
		h := mcp(s.backend, mcpHooks)
		s.handle("/mcp", authToken, s.ownedMCP(h.ServeHTTP))
	}
	if e2b != nil {
		h := e2b(s.backend, s.e2bHooks())
		s.handle("/e2b/", authSelf, s.ownedE2B(h.ServeHTTP))
	}
	// Everything else: a JSON 404 rather than the mux's text one. It has no auth, and says nothing but "no
	// such route", so it reveals nothing a token would protect.
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, &httpError{status: http.StatusNotFound, fe: fault.New(fault.RequestInvalid,
			"see /v1/openapi.json for the routes", "no route %s %s", r.Method, r.URL.Path)})
	})
}

// owned wraps a route of one key's sandbox (a {user} in its path) that Config.Forward may serve elsewhere.
func (s *Server) owned(h http.HandlerFunc) http.HandlerFunc {
	if s.forward == nil {
		return h
	}
	return s.forwarded(h, func(w http.ResponseWriter, r *http.Request) (bool, error) {
		key, err := keyOf(r)
		if err != nil {
			return false, err
		}
		return s.forward(w, r, key)
	})
}

// forwarded serves a request through forward (which reports whether it served it, elsewhere) and otherwise
// through h here; forward's error is the request's answer.
func (s *Server) forwarded(h http.HandlerFunc, forward func(http.ResponseWriter, *http.Request) (bool, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		served, err := forward(w, r)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if !served {
			h(w, r)
		}
	}
}

// ownedE2B wraps /e2b/: a request that names an E2B sandbox may be served by the replica that made it
// (Config.ForwardE2B). The E2B front authenticates it there.
func (s *Server) ownedE2B(h http.HandlerFunc) http.HandlerFunc {
	if s.forwardE2B == nil {
		return h
	}
	return s.forwarded(h, func(w http.ResponseWriter, r *http.Request) (bool, error) {
		id := e2bSandboxID(r)
		if id == "" {
			return false, nil
		}
		return s.forwardE2B(w, r, id)
	})
}

// e2bSandboxID is the E2B sandbox a request names: envd's E2b-Sandbox-Id header, or the control plane's
// /e2b[/v2]/sandboxes/{id}[/...]; "" for none (a create, a list).
func e2bSandboxID(r *http.Request) string {
	p := strings.TrimPrefix(r.URL.Path, "/e2b")
	if strings.HasPrefix(p, "/envd/") {
		return r.Header.Get("E2b-Sandbox-Id")
	}
	rest, ok := strings.CutPrefix(strings.TrimPrefix(p, "/v2"), "/sandboxes/")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "/")
	return id
}

// ownedMCP wraps /mcp: an MCP request names one key (its token's tenant, its Sandkeep-User header's user), and
// Config.Forward may hand it whole to that key's owner, where the MCP session then lives (a session whose key
// moves to another replica is not found there: its client starts a new one). A request that names no key is
// served here, and the MCP handler answers it.
func (s *Server) ownedMCP(h http.HandlerFunc) http.HandlerFunc {
	if s.forward == nil {
		return h
	}
	return s.forwarded(h, func(w http.ResponseWriter, r *http.Request) (bool, error) {
		key, err := mcpHooks.KeyFor(r)
		if err != nil {
			return false, nil // no key named: the MCP handler answers it here
		}
		return s.forward(w, r, key)
	})
}

func (s *Server) handle(pattern string, auth authKind, h http.HandlerFunc, scopes ...string) {
	s.routes = append(s.routes, route{pattern: pattern, auth: auth, scopes: scopes})
	var inner http.HandlerFunc
	switch auth {
	case authToken:
		inner = s.authed(scopes, h)
	case authMetrics:
		inner = s.metricsAuth(h)
	default:
		inner = h
	}
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		infoOf(r).route = pattern
		inner(w, r)
	})
}

// Handler returns the API's handler: request ids, access log and metrics around every route.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serve) }

// HTTPServer returns an *http.Server for addr that serves Handler with the configured header bound and
// timeouts fit for streaming: a bound on reading headers, none on writing (a command may run for hours).
func (s *Server) HTTPServer(addr string) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           s.Handler(),
		MaxHeaderBytes:    s.maxHead,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
}

// Drain stops admitting commands (new execs answer 503 SHUTTING_DOWN, /readyz answers 503), ends event
// streams, and waits until every running command has returned its result or ctx ends. Call it before
// http.Server.Shutdown, which then finishes the in-flight responses. It may be called more than once.
func (s *Server) Drain(ctx context.Context) error {
	s.StopAdmitting()
	if err := s.drain.wait(ctx); err != nil {
		return fmt.Errorf("drain: %d commands still running: %w", s.drain.running(), err)
	}
	return nil
}

// StopAdmitting is Drain's first step alone: from its return on, new execs answer 503 SHUTTING_DOWN. A
// caller that announces the drain calls it first, so that nobody who saw the announcement is still admitted.
func (s *Server) StopAdmitting() { s.drain.begin() }

// drainer counts running commands and refuses new ones once draining. It is the only owner of that count.
type drainer struct {
	mu       sync.Mutex
	draining bool
	n        int           // commands admitted and not yet returned
	idle     chan struct{} // closed when n drops to 0 while draining; nil until a waiter needs it
	stop     chan struct{} // closed by begin: event followers end
}

func (d *drainer) enter() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.draining {
		return false
	}
	d.n++
	return true
}

func (d *drainer) leave() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.n--
	if d.n == 0 && d.idle != nil {
		close(d.idle)
		d.idle = nil
	}
}

func (d *drainer) begin() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.draining {
		d.draining = true
		close(d.stop)
	}
}

func (d *drainer) isDraining() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.draining
}

func (d *drainer) running() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

func (d *drainer) wait(ctx context.Context) error {
	d.mu.Lock()
	if d.n == 0 {
		d.mu.Unlock()
		return nil
	}
	if d.idle == nil {
		d.idle = make(chan struct{})
	}
	idle := d.idle
	d.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func errShuttingDown() error {
	return fault.New(fault.ShuttingDown, "retry on another instance, or after the restart",
		"the server is shutting down and admits no new commands")
}

func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	if s.drain.isDraining() {
		s.writeError(w, r, errShuttingDown())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := s.backend.Ready(ctx); err != nil {
		if fault.CodeOf(err) == "" {
			// The cause may name hosts or files, and /readyz has no auth: the log has it, the answer does not.
			err = fault.Wrap(err, fault.DriverUnavailable, "check the engine and the store", "the store or the driver does not answer")
		}
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}
