// Package e2b is the E2B front: E2B's control-plane API (under /e2b) and its in-sandbox envd API (under
// /e2b/envd, routed by the E2b-Sandbox-Id header), so agents written against the unmodified e2b SDK drive
// sandkeep sandboxes. It only translates: every command and file operation goes through the service Backend
// (the same admission, tenant isolation, limits, runs and events as /v1), and an E2B sandbox is the sandbox of
// key (tenant of the creating token, user "e2b-<sandbox id>").
package e2b

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/api"
	"github.com/sandkeep/sandkeep/internal/e2b/proto/filesystem/filesystemconnect"
	"github.com/sandkeep/sandkeep/internal/e2b/proto/process/processconnect"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
)

// EnvdVersion is the envd version the front reports. The SDK switches features on it (E2B-PROTOCOL.md): from
// 0.4.0 no default user is sent, 0.5.2 CloseStdin, 0.5.7 octet-stream uploads; 0.6.x's file metadata and
// watch options are not claimed.
const EnvdVersion = "0.5.7"

// Defaults of Config.
const (
	DefaultTimeout    = 300 * time.Second // E2B's default sandbox lifetime
	DefaultMaxTimeout = 24 * time.Hour
)

// Config is what New needs.
type Config struct {
	// Dir keeps the front's records (one file per sandbox); a directory of the server's state home.
	Dir string
	// MaxTimeout bounds a sandbox's timeout (create, set timeout, connect); default 24h.
	MaxTimeout time.Duration
	Logger     *slog.Logger
	Now        func() time.Time
}

// Front serves the E2B APIs. Make one with New, mount Handler through api.Config.E2B, and run Sweep.
type Front struct {
	cfg   Config
	recs  *records
	log   *slog.Logger
	now   func() time.Time
	procs *processes // the front's own commands, where the engine has no processes (engineproc.go)
	// noEngineProcs is set once the engine answered PROCESS_UNAVAILABLE: commands run on the exec path.
	noEngineProcs atomic.Bool

	mu      sync.Mutex
	b       service.Backend // set by Handler: the API's guarded backend
	hooks   api.E2BHooks
	mux     *http.ServeMux
	stopped chan struct{}

	// holder, when set, holds each sandbox's id for this process, so that other processes hand requests about
	// it over here, where its record lives (SetHolder: a fleet replica).
	holder atomic.Pointer[Holder]

	// networked tells whether an admitted run's commands get a network (service.Networked; tests stand in).
	networked func(*sandkeep.Run) bool
	// noteUpdate records network_updated in an update's run (service.NoteNetworkUpdate; tests stand in).
	noteUpdate func(run *sandkeep.Run, sandbox string)
	// netMu orders a network update against the start of a command (network.go); it guards starting.
	netMu    sync.Mutex
	starting map[string]int // per sandbox id, the engine process starts under way (startNetwork)

	cpuMu   sync.Mutex
	lastCPU map[string]cpuSample // the previous metrics sample of each sandbox (metrics.go)
}

// New opens the front's records.
func New(cfg Config) (*Front, error) {
	if cfg.MaxTimeout <= 0 {
		cfg.MaxTimeout = DefaultMaxTimeout
	}
	recs, err := openRecords(cfg.Dir)
	if err != nil {
		return nil, err
	}
	f := &Front{cfg: cfg, recs: recs, log: cfg.Logger, now: cfg.Now, procs: newProcesses(), lastCPU: map[string]cpuSample{}, starting: map[string]int{},
		networked: service.Networked, noteUpdate: service.NoteNetworkUpdate}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	if f.now == nil {
		f.now = time.Now
	}
	return f, nil
}

// Handler is the api.Config.E2B function: it binds the front to the API's backend and hooks and returns the
// handler of /e2b/.
func (f *Front) Handler(b service.Backend, hooks api.E2BHooks) http.Handler {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.b, f.hooks = b, hooks
	mux := http.NewServeMux()
	// Control plane (the SDK's ApiClient).
	mux.HandleFunc("POST /e2b/v2/sandboxes", f.handleCreate)
	mux.HandleFunc("GET /e2b/v2/sandboxes", f.handleList)
	mux.HandleFunc("GET /e2b/sandboxes", f.handleList)
	mux.HandleFunc("GET /e2b/sandboxes/{id}", f.handleGet)
	mux.HandleFunc("DELETE /e2b/sandboxes/{id}", f.handleKill)
	mux.HandleFunc("POST /e2b/sandboxes/{id}/timeout", f.handleTimeout)
	mux.HandleFunc("POST /e2b/sandboxes/{id}/pause", f.handlePause)
	mux.HandleFunc("POST /e2b/v2/sandboxes/{id}/connect", f.handleConnect)
	mux.HandleFunc("POST /e2b/sandboxes/{id}/resume", f.handleConnect)
	mux.HandleFunc("GET /e2b/sandboxes/{id}/metrics", f.handleMetrics)
	mux.HandleFunc("POST /e2b/sandboxes/{id}/fork", f.handleFork)
	mux.HandleFunc("POST /e2b/sandboxes/{id}/snapshots", f.handleCreateSnapshot)
	mux.HandleFunc("GET /e2b/snapshots", f.handleSnapshots)
	mux.HandleFunc("DELETE /e2b/templates/{id}", f.handleDeleteSnapshot)
	mux.HandleFunc("PUT /e2b/sandboxes/{id}/network", f.handleNetwork)
	// envd (the SDK's EnvdApiClient and its Connect transport).
	mux.HandleFunc("GET /e2b/envd/health", f.envd(f.handleHealth))
	mux.HandleFunc("GET /e2b/envd/files", f.envd(f.handleDownload))
	mux.HandleFunc("POST /e2b/envd/files", f.envd(f.handleUpload))
	path, h := processconnect.NewProcessHandler(&processService{f: f})
	mux.Handle("/e2b/envd"+path, http.StripPrefix("/e2b/envd", f.envdRPC(h)))
	path, h = filesystemconnect.NewFilesystemHandler(&filesystemService{f: f})
	mux.Handle("/e2b/envd"+path, http.StripPrefix("/e2b/envd", f.envdRPC(h)))
	mux.HandleFunc("/e2b/", func(w http.ResponseWriter, r *http.Request) {
		f.writeError(w, r, &statusError{status: http.StatusNotFound, msg: "the E2B front has no route " + r.Method + " " + strings.TrimPrefix(r.URL.Path, "/e2b")})
	})
	f.mux = mux
	return mux
}

func (f *Front) backend() (service.Backend, api.E2BHooks) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.b, f.hooks
}

// Holder tells the processes that share the front's clients (a fleet's replicas) which one keeps a sandbox's
// record: Hold when the sandbox is made (or found at start), Unhold when it is killed. A failed Hold only costs
// the sandbox its reach through the others.
type Holder struct {
	Hold   func(ctx context.Context, id string) error
	Unhold func(ctx context.Context, id string) error
}

// SetHolder makes h hold every sandbox the front makes from now on, and those it has records of already.
func (f *Front) SetHolder(ctx context.Context, h Holder) {
	f.holder.Store(&h)
	recs, err := f.recs.all("")
	if err != nil {
		f.log.Warn("e2b: hold the sandboxes of the records", "error", err)
		return
	}
	for _, r := range recs {
		f.hold(ctx, r.ID)
	}
}

func (f *Front) hold(ctx context.Context, id string) {
	if h := f.holder.Load(); h != nil {
		if err := h.Hold(ctx, id); err != nil {
			f.log.Warn("e2b: other replicas cannot reach this sandbox", "sandbox", id, "error", err)
		}
	}
}

func (f *Front) unhold(ctx context.Context, id string) {
	if h := f.holder.Load(); h != nil {
		if err := h.Unhold(ctx, id); err != nil {
			f.log.Warn("e2b: release the sandbox's hold", "sandbox", id, "error", err)
		}
	}
}

// keyOf is the sandkeep key of an E2B sandbox.
func keyOf(r *record) (sandkeep.Key, error) { return sandkeep.NewKey(r.Tenant, r.user()) }

// Sweep enforces sandbox timeouts until ctx ends: a sandbox past its end is killed (its sandbox and workspace
// removed), or paused under auto-pause. It reads the records each round, so timeouts survive a restart.
func (f *Front) Sweep(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f.SweepOnce(ctx)
	}
}

// SweepOnce does one round of Sweep.
func (f *Front) SweepOnce(ctx context.Context) {
	b, _ := f.backend()
	if b == nil {
		return
	}
	recs, err := f.recs.all("")
	if err != nil {
		f.log.Warn("e2b sweep", "error", err)
		return
	}
	now := f.now()
	for _, r := range recs {
		if r.Paused || now.Before(r.EndAt) {
			continue
		}
		var err error
		if r.AutoPause {
			err = f.pause(ctx, b, r)
		} else {
			err = f.kill(ctx, b, r)
		}
		if err != nil && !errors.Is(err, errNoRecord) {
			f.log.Warn("e2b sweep", "sandbox", r.ID, "error", err)
		}
	}
}

// kill ends the sandbox's processes, removes its sandbox and workspace, and forgets it.
func (f *Front) kill(ctx context.Context, b service.Backend, r *record) error {
	key, err := keyOf(r)
	if err != nil {
		return err
	}
	f.procs.endAll(r.ID)
	f.forgetCPU(r.ID)
	if err := b.Remove(ctx, key); err != nil && !fault.Is(err, fault.NotFound) {
		return err
	}
	if err := f.recs.remove(r.ID); err != nil {
		return err
	}
	f.unhold(ctx, r.ID)
	return nil
}

// pause ends the sandbox's processes and stops it; its workspace stays. A paused sandbox is resumed by connect.
func (f *Front) pause(ctx context.Context, b service.Backend, r *record) error {
	key, err := keyOf(r)
	if err != nil {
		return err
	}
	f.procs.endAll(r.ID)
	if err := b.Stop(ctx, key); err != nil && !fault.Is(err, fault.NotFound) {
		return err
	}
	_, err = f.recs.update(r.ID, func(r *record) error { r.Paused = true; return nil })
	return err
}

// Close ends every command the front runs and waits for them.
func (f *Front) Close() error {
	f.procs.mu.Lock()
	all := make([]*proc, 0, len(f.procs.byID))
	for _, p := range f.procs.byID {
		all = append(all, p)
	}
	f.procs.mu.Unlock()
	for _, p := range all {
		p.cancel()
	}
	f.procs.wg.Wait()
	return nil
}
