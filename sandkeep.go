// Package sandkeep runs the shell commands of AI agents inside persistent, hardened, per-user sandboxes.
//
// A Manager keeps one sandbox per Key (tenant, user), reused across commands, sessions and processes, and runs
// each command with an exact deadline, exact exit status and bounded output:
//
//	cfg := sandkeep.ConfigFromEnv()
//	cfg.Drivers = drivers.Local() // package github.com/sandkeep/sandkeep/drivers
//	m, err := sandkeep.Open(ctx, cfg)
//	key, _ := sandkeep.NewKey("acme", "alice")
//	res, err := m.Exec(ctx, key, sandkeep.ExecRequest{Argv: []string{"sh", "-c", "echo hi"}})
//
// Every command belongs to a run, admitted first (Manager.Admit, or implicitly by Exec and ExecWith): the mode
// (none, auto, inline) is resolved from the operator's Config and the repository's spec, a driver is selected,
// and the run is sandboxed, degraded to the host (auto, loudly) or refused, and recorded in Config.Store. An
// ExecRequest says what runs; a RunRequest says for whom and under which policy, and carries the Observer that
// is told what happens.
//
// Failures that a caller can act on are *Error values with a stable Code and a Hint. The engine behind this API
// (admission, the repository's files, templates, network policy, the drivers) lives in internal packages.
package sandkeep

import (
	"context"
	"net"
	"time"

	"github.com/sandkeep/sandkeep/internal/engine"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Key identifies one sandbox: the SHA-256 of a length-prefixed framing of (tenant, user).
type Key = identity.Key

// NewKey validates tenant and user (non-empty, at most 256 bytes, no control characters) and returns their Key.
func NewKey(tenant, user string) (Key, error) { return identity.New(tenant, user) }

// Error is a failure with a stable Code, a message and a Hint.
type Error = fault.Error

// Code is a stable failure code such as SANDBOX_BUSY.
type Code = fault.Code

// CodeOf returns the Code carried by err, or "" when err is not a sandkeep *Error.
func CodeOf(err error) Code { return fault.CodeOf(err) }

func init() {
	// The engine's views for packages processes and snapshots and for doctor (internal/doctor).
	engine.Facade.Manager = func(m any) *engine.Manager { return m.(*Manager).e }
	engine.Facade.Run = func(r any) *engine.Run { return r.(*Run).r }
	engine.Facade.RunRequest = func(rr any) engine.RunRequest { return rr.(RunRequest).engine() }
	engine.Facade.Sandbox = func(sb engine.Sandbox) any { return sandboxOf(sb) }
}

// Manager admits runs and runs their commands in per-key sandboxes. It is safe for concurrent use, and several
// processes may use managers over the same Home at once. Every command goes through admission: the CLI, the
// HTTP API, MCP and library callers get the same decisions, run rows and events.
type Manager struct {
	e *engine.Manager
}

// Open checks cfg and prepares the state home. It does not talk to any engine: admission probes the offered
// drivers when a run first needs one, so a Manager opens (and a server starts) while its engine is down, and
// each run is then sandboxed, degraded or refused by its mode.
func Open(ctx context.Context, cfg Config) (*Manager, error) {
	e, err := engine.Open(ctx, cfg.engine())
	if err != nil {
		return nil, err
	}
	return &Manager{e: e}, nil
}

// Admit decides whether and how key's work runs, records the run with that verdict before anything runs, and
// returns it ready for Exec. It gathers the tiers' inputs (the operator's Config, the repository's spec and
// devcontainer.json, the caller's template), refuses what a tier may not set, resolves the mode (cli > spec >
// env > default; a repository may raise isolation, never lower it), selects the driver (host kind, preference
// order, one probe each) and decides: sandbox, degrade to the host (auto, trusted: sandbox_skipped and Notice),
// or refuse. A refused run is recorded (admission refused, finished) and returned together with its error. With
// rr.RunID it attaches to that running run instead, which keeps the mode, trust and driver it was admitted with.
//
// Input that is not understood (a malformed spec, an unknown template, a bad trust) is an error without a run.
func (m *Manager) Admit(ctx context.Context, rr RunRequest) (*Run, error) {
	r, err := m.e.Admit(ctx, rr.engine())
	return runOf(r), err
}

// Exec runs req in key's sandbox, creating or starting it when needed: ExecWith a run of key's own, admitted
// with the Config's defaults (its spec, its mode, trusted).
func (m *Manager) Exec(ctx context.Context, key Key, req ExecRequest) (*ExecResult, error) {
	return m.ExecWith(ctx, RunRequest{Key: key}, req)
}

// ExecWith checks req, admits rr (or attaches to rr.RunID) and runs req in the run's sandbox; a run admitted here
// is finished with the command. One key's commands run one at a time; a caller that cancels ctx gets its answer
// only once the command's process tree is gone, together with the partial result and the ctx error. A malformed
// req is refused before anything is admitted or recorded.
func (m *Manager) ExecWith(ctx context.Context, rr RunRequest, req ExecRequest) (*ExecResult, error) {
	res, err := m.e.ExecWith(ctx, rr.engine(), req.engine())
	return resultOf(res), err
}

// Templates lists the templates tenant may use, sorted by name.
func (m *Manager) Templates(tenant string) []string { return m.e.Templates(tenant) }

// List returns every sandbox of this installation (this Home) on the preferred sandboxing driver, sorted by
// tenant and user.
func (m *Manager) List(ctx context.Context) ([]Sandbox, error) {
	in, err := m.e.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Sandbox, 0, len(in))
	for _, sb := range in {
		out = append(out, sandboxOf(sb))
	}
	return out, nil
}

// Sandbox describes key's sandbox; none is SANDBOX_NOT_FOUND.
func (m *Manager) Sandbox(ctx context.Context, key Key) (Sandbox, error) {
	sb, err := m.e.Sandbox(ctx, key)
	return sandboxOf(sb), err
}

// Stop stops key's sandbox (waiting for its gate); the next Exec starts the same container again.
func (m *Manager) Stop(ctx context.Context, key Key) error { return m.e.Stop(ctx, key) }

// Remove deletes key's sandbox, and its workspace unless keepWorkspace.
func (m *Manager) Remove(ctx context.Context, key Key, keepWorkspace bool) error {
	return m.e.Remove(ctx, key, keepWorkspace)
}

// WhenWaiting returns ctx carrying notice: when a call under it (Stop, Remove, Exec, a file operation) has waited
// a second for the key's gate, held by another command or operation of the same key, notice is called once with
// the wait's bound (Config.GateWait), from another goroutine, and the call does not return before it has. The CLI
// prints what stop and rm wait for with it.
func WhenWaiting(ctx context.Context, notice func(bound time.Duration)) context.Context {
	return engine.WhenWaiting(ctx, notice)
}

// SweepReport says what one sweep pass did: the sandboxes stopped for idleness, suspended and removed past
// retention (by name), and the busy keys left alone.
type SweepReport struct {
	Stopped   []string
	Suspended []string // removed with their workspaces kept (a template's SuspendAfter); the next command resumes
	Removed   []string
	Skipped   []string
}

// SweepOnce stops idle sandboxes and removes those past retention, skipping busy keys. It does not take the
// home's sweeper lock; RunSweeper does.
func (m *Manager) SweepOnce(ctx context.Context) (SweepReport, error) {
	r, err := m.e.SweepOnce(ctx)
	return SweepReport(r), err
}

// RunSweeper sweeps every interval until ctx ends, as the home's only sweeper (others wait for the lock). While no
// sandboxing driver is usable it waits and tries again, so a server started before its engine sweeps once the
// engine is up.
func (m *Manager) RunSweeper(ctx context.Context, interval time.Duration) error {
	return m.e.RunSweeper(ctx, interval)
}

// Files is one sandbox's workspace, opened for file access: reads and writes confined to it, whatever the
// sandbox plants in it. On a driver whose workspaces are on this host (Docker) they go to the workspace
// directory directly; on one that keeps them itself (kubernetes: a claim mounted in the pod) each operation runs
// in the sandbox through its agent, with the same confinement, limits and faults.
type Files = files.FS

// FileLimits bound what one file operation may move; zero fields take the defaults (1 GiB per file, 4 GiB and
// 100000 entries per tar).
type FileLimits = files.Limits

// Files opens key's workspace (/workspace in its sandbox) for file access; it is FilesContext without a
// context. The caller closes it.
func (m *Manager) Files(key Key, create bool, lim FileLimits) (*Files, error) {
	return m.FilesContext(context.Background(), key, create, lim)
}

// FilesContext opens key's workspace (/workspace in its sandbox) for file access. The caller closes it. Where the
// workspace is on this host (the docker driver) it is opened there, without touching the sandbox, and it works
// while no engine answers; where the driver keeps it (kubernetes), every operation runs inside the sandbox as its
// user, through the agent, and ctx bounds the operations that take no context of their own. With create, a
// missing workspace (or sandbox) is made; without, it is FILE_NOT_FOUND.
func (m *Manager) FilesContext(ctx context.Context, key Key, create bool, lim FileLimits) (*Files, error) {
	return m.e.FilesContext(ctx, key, create, lim)
}

// PortForward says who opens a forwarded connection and where its events go.
type PortForward struct {
	// Via labels the events: "cli" (sandkeep port-forward), "api" (the server's route) or the embedder's own word.
	Via string
	// RequestID, when set, is recorded on the connection's events.
	RequestID string
	// OnEvent, when set, also receives port_forward_opened and port_forward_closed.
	OnEvent EventFunc
}

// DialPort opens one connection to 127.0.0.1:port inside key's running sandbox, like one connection of
// `kubectl port-forward`: the sandbox keeps its network (mode none: nothing goes out), and the connection is made
// from inside it by the agent. Call it once per connection; they run in parallel and do not take the user's
// gate. A missing sandbox is SANDBOX_NOT_FOUND, a stopped one SANDBOX_NOT_RUNNING, a port nothing listens on
// PORT_UNREACHABLE, a driver that cannot forward PORT_FORWARD_UNAVAILABLE. Opening and closing are recorded as
// events (in the store when Config.Store is set, with no run) and also go to Config.OnEvent. Who may open one is
// the caller's business: the CLI is the operator, the API requires the exec scope for the tenant.
func (m *Manager) DialPort(ctx context.Context, key Key, port int, pf PortForward) (net.Conn, error) {
	return m.e.DialPort(ctx, key, port, engine.PortForward{Via: pf.Via, RequestID: pf.RequestID, OnEvent: engine.EventFunc(pf.OnEvent)})
}

// ForwardPorts are the forwardPorts of the repository key's runs follow (spec, else the template key's sandbox
// was made for, else the tenant's, else Config.Spec), each with what port forwarding does with it; nil when the
// repository has none. A file that is not valid is its SPEC_INVALID (or TIER_REFUSED) error.
func (m *Manager) ForwardPorts(ctx context.Context, key Key, spec string) ([]ForwardPort, error) {
	fps, err := m.e.ForwardPorts(ctx, key, spec)
	return forwardPortsOf(fps), err
}

// Ping checks that a sandboxing driver is usable and answers now; the error says why not.
func (m *Manager) Ping(ctx context.Context) error { return m.e.Ping(ctx) }

// Close releases the manager's sandboxes' channels and proxies, and the drivers it made. Sandboxes keep running:
// they are persistent by design. The store (Config.Store) is the caller's to close.
func (m *Manager) Close() error { return m.e.Close() }

// Installation is the id of this manager's state home.
func (m *Manager) Installation() string { return m.e.Installation() }

// DriverOption offers one driver to admission (Config.Drivers): package github.com/sandkeep/sandkeep/drivers
// offers Docker and podman, drivers/kubernetes a cluster, HostDriver the passthrough. The driver contract itself
// is not exported: a driver is part of sandkeep's isolation, tested against the engine by one conformance suite
// (internal/driver/drivertest) and changed with the lifecycle that drives it, so it stays in this module.
type DriverOption interface {
	Option() engine.DriverOption
}

// Drivers a Config may name.
const (
	DriverPodman = engine.DriverPodman // podman through its Docker-API socket (the docker driver at another address)
	DriverDocker = engine.DriverDocker
	DriverHost   = engine.DriverHost // runs commands on the host itself, unsandboxed
)

// HostDriver offers the host passthrough: commands run on the host itself, unsandboxed, only where policy allows
// it (mode none, or mode auto for a trusted run when no sandboxing driver is usable). Leave it out of
// Config.Drivers and nothing ever runs outside a sandbox.
func HostDriver() DriverOption { return engine.HostDriver() }

// HostDriverAs is HostDriver with every command run as the host user uid:gid (never 0) and each workspace
// handed to it: the only host passthrough a multi-tenant server offers (sandkeep serve's host_passthrough.user).
func HostDriverAs(uid, gid uint32) DriverOption { return engine.HostDriverAs(uid, gid) }
