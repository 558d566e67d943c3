// Package engine is sandkeep's engine behind the public API (package sandkeep): admission (the tiers' inputs,
// mode, driver selection, the verdict and its record), the repository (sandkeep.yaml, devcontainer.json, its
// features and compose files), templates, network policy resolution, the driver set, and each admitted run's
// commands on the lifecycle of its driver. It decides; its lifecycle (internal/engine/lifecycle) provides the sandboxes.
package engine

import (
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/devcontainer/feature"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/guard"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/policy"
	"github.com/sandkeep/sandkeep/internal/snapshot"
	"github.com/sandkeep/sandkeep/internal/store"
)

// Key identifies one sandbox: the SHA-256 of a length-prefixed framing of (tenant, user).
type Key = identity.Key

// Error is a failure with a stable Code, a message and a Hint.
type Error = fault.Error

// Code is a stable failure code such as SANDBOX_BUSY.
type Code = fault.Code

// Manager admits runs and runs their commands in per-key sandboxes. It is safe for concurrent use, and several
// processes may use managers over the same Home at once. Every command goes through admission (Admit): the
// CLI, the HTTP API, MCP and library callers get the same decisions, run rows and events.
type Manager struct {
	cfg      Config           // the operator tier, defaults applied
	lcfg     lifecycle.Config // cfg as the lifecycle reads it
	home     *lifecycle.Home
	drivers  *driverSet
	selector *policy.Selector
	kind     policy.Kind
	st       store.Store // nil unless Config.Store: then every Exec belongs to a recorded run

	mu  sync.Mutex                    // guards lcs
	lcs map[string]*lifecycle.Manager // driver name -> the lifecycle over it, made on first admission to it

	policy *egress.Policy // Config.Network resolved once: what a run without a block of its own gets

	snaps    *snapshot.Store   // the snapshots: records in the store (Config.Store) or the home, archives in the home or S3
	features *feature.Registry // fetches OCI features: one client (and connection pool) for every run

	stopSweeper context.CancelFunc // nil with Config.NoSweeper
	sweeperDone chan struct{}      // closed when the sweeper Open started has returned
}

// Open checks cfg and prepares the state home. It does not talk to any engine: admission probes the offered
// drivers when a run first needs one, so a Manager opens (and a server starts) while its engine is down, and
// each run is then sandboxed, degraded or refused by its mode.
func Open(ctx context.Context, cfg Config) (*Manager, error) {
	lcfg, err := cfg.lifecycle()
	if err != nil {
		return nil, err
	}
	kind, err := hostKind(cfg.HostKind)
	if err != nil {
		return nil, err
	}
	home, err := lifecycle.OpenHome(cfg.Home)
	if err != nil {
		return nil, err
	}
	if cfg.SandboxDir != "" {
		if err := home.ShareSandboxes(cfg.SandboxDir); err != nil {
			return nil, err
		}
	}
	ds, err := newDriverSet(cfg.Drivers, DriverEnv{AgentPath: lcfg.AgentPath, PullTimeout: cfg.PullTimeout})
	if err != nil {
		return nil, err
	}
	pol, err := lifecycle.ResolveNetwork(cfg.Network, cfg.NetworkPresets, cfg.NetworkSilent)
	if err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, lcfg: lcfg, home: home, drivers: ds, selector: policy.NewSelector(0),
		kind: kind, st: cfg.Store, lcs: map[string]*lifecycle.Manager{}, policy: &pol,
		features: &feature.Registry{Allow: cfg.Repository.FeatureRegistries, Refused: lcfg.EgressRefused}}
	if err := m.checkTemplates(); err != nil {
		return nil, err
	}
	var arch snapshot.Archives // nil: the home's
	if cfg.SnapshotStore.Bucket != "" {
		if arch, err = snapshot.OpenS3(cfg.SnapshotStore); err != nil {
			return nil, fault.Wrap(err, fault.InvalidArgument, "name the S3 store's endpoint and bucket (snapshot_store)", "%v", err)
		}
	}
	snapDir := filepath.Join(home.Dir, "snapshots")
	if cfg.SandboxDir != "" { // shared by the replicas of a host: a snapshot taken through one restores through another
		snapDir = filepath.Join(cfg.SandboxDir, "snapshots")
	}
	if m.snaps, err = snapshot.Open(snapDir, cfg.SnapshotQuota.resolve(), nil, arch); err != nil {
		return nil, err
	}
	if cfg.Store != nil { // the records where the runs are: every process on that store (a fleet's replicas) sees them
		if err := m.snaps.UseStore(ctx, cfg.Store); err != nil {
			return nil, err
		}
	}
	if !cfg.NoSweeper {
		m.startSweeper(cmp.Or(cfg.SweepInterval, time.Minute))
	}
	return m, nil
}

// startSweeper runs RunSweeper until Close, which waits for it.
func (m *Manager) startSweeper(every time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	m.stopSweeper, m.sweeperDone = cancel, make(chan struct{})
	go func() {
		defer close(m.sweeperDone)
		if err := m.RunSweeper(ctx, every); err != nil {
			logger(m.cfg.Logger).Warn("sweeper stopped", "err", err)
		}
	}()
}

// hostKind is the Config's host kind: local, cloud, or "" for local.
func hostKind(v string) (policy.Kind, error) {
	return policy.HostKind(func(k string) string {
		if k == policy.EnvHostKind {
			return v
		}
		return ""
	})
}

// lifecycleFor returns the lifecycle over the driver called name, making it on first use.
func (m *Manager) lifecycleFor(name string) (*lifecycle.Manager, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if lc := m.lcs[name]; lc != nil {
		return lc, nil
	}
	d, err := m.drivers.get(name)
	if err != nil {
		return nil, err
	}
	lc, err := lifecycle.New(m.home, d, m.lcfg)
	if err != nil {
		return nil, err
	}
	m.lcs[name] = lc
	return lc, nil
}

// primary is the lifecycle of the sandboxing driver this host prefers and can use, for what belongs to no run
// (ps, stop, rm, files, the sweeper). It probes as admission does, and is SANDBOX_DRIVER_UNAVAILABLE when no
// sandboxing driver is usable.
func (m *Manager) primary(ctx context.Context) (*lifecycle.Manager, error) {
	sel, obstacle := m.selector.Select(ctx, m.kind, "", m.drivers.candidates())
	if !sel.Sandboxing {
		return nil, fault.Wrap(obstacle, fault.SandboxDriverUnavailable,
			"start the container engine (docker info), then try again", "no sandboxing driver is usable: %v", obstacle)
	}
	return m.lifecycleFor(sel.Driver)
}

// PodmanSocket finds podman's Docker-API socket: $XDG_RUNTIME_DIR/podman/podman.sock, else
// /run/podman/podman.sock.
func PodmanSocket() (string, error) {
	var candidates []string
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		candidates = append(candidates, filepath.Join(d, "podman", "podman.sock"))
	}
	candidates = append(candidates, "/run/podman/podman.sock")
	for _, c := range candidates {
		if fi, err := os.Stat(c); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return c, nil
		}
	}
	return "", fault.New(fault.DriverUnavailable, "start podman's API service (systemctl start podman.socket)",
		"no podman Docker-API socket at %s", strings.Join(candidates, " or "))
}

// Drivers a Config may name.
const (
	DriverPodman = "podman" // podman through its Docker-API socket (the docker driver at another address)
	DriverDocker = "docker"
	DriverHost   = "host" // runs commands on the host itself, unsandboxed
)

// EventFunc receives what sandkeep did for a command (or, on Config, for no command: the sweeper): the event's
// name (sandbox_started, exec_finished, ...) and its typed payload. See docs/EVENTS.md.
type EventFunc func(name string, payload any)

// Observer is what a caller is told about its run as it happens: every event as it is recorded, and the moment
// each command is running. Nil fields are skipped. Both are called from the goroutine that runs the command:
// they must not block for long.
type Observer struct {
	// Event receives the run's events (docs/EVENTS.md): the policy's, then every command's.
	Event EventFunc
	// Started is told that a command runs: its sandbox is ready and the agent has it. From then on the command's
	// output and result are the answer, and a failure is the command's, not its setup's (the HTTP API commits
	// its 200 here). A command that goes out again (its sandbox was recycled under it) is told again.
	Started func()
}

// ExecRequest is one command: what runs, where, for how long and with what output. Argv runs directly, without
// a shell: use {"sh", "-c", "..."} for shell syntax. Who runs it, and under which policy, is the run's
// (RunRequest).
type ExecRequest struct {
	Argv        []string
	Workdir     string        // relative to /workspace, or absolute under it; created when missing
	Env         []string      // "K=V", added to the sandbox's environment
	Timeout     time.Duration // 1s..24h (Config.MaxTimeout); zero means 120s
	OutputLimit int64         // per stream, in bytes; zero means 1 MiB, at most 64 MiB (Config.MaxOutputLimit)
	Stdin       io.Reader     // nil: the command reads /dev/null
	// Stdout and Stderr, when set, receive output as it is produced, and the result's Stdout/Stderr stay
	// empty; when nil, output is collected into the result.
	Stdout io.Writer
	Stderr io.Writer
	// Secrets are files placed under /run/secrets (a tmpfs owned by the sandbox user) for this command only,
	// and removed when it ends. Their values travel as the agent's stdin: never in argv, env, logs or events.
	Secrets []Secret
	// TTY, when set, runs the command on a pseudo-terminal in the sandbox: its stdin, stdout and stderr are the
	// terminal, so everything comes out on Stdout (bounded by OutputLimit) and Stderr stays empty. A Ctrl-C byte
	// (0x03) on Stdin interrupts the terminal's foreground process, as at a local terminal. Deadline, tree kill
	// and exit status are as without a TTY.
	TTY *TTY
	// Concurrent runs the command beside the user's other concurrent commands and processes (lifecycle).
	Concurrent bool
}

// WindowSize is a terminal's size in character cells.
type WindowSize = agentproto.WindowSize

// TTY asks for a pseudo-terminal of Size (zero: 24x80); each value received on Resize, until the command ends,
// changes its size. Resize may be nil and is never closed by sandkeep.
type TTY struct {
	Size   WindowSize
	Resize <-chan WindowSize
}

func (t *TTY) size() *agentproto.WindowSize {
	if t == nil {
		return nil
	}
	ws := t.Size
	if ws == (WindowSize{}) {
		ws = agentproto.DefaultWindowSize
	}
	return &ws
}

func (t *TTY) resize() <-chan agentproto.WindowSize {
	if t == nil {
		return nil
	}
	return t.Resize
}

// Secret is one secret file for one command. Mode 0 means 0400.
type Secret = lifecycle.Secret

// ExecResult is the outcome of one command.
type ExecResult struct {
	ExitCode        int        `json:"exit_code"` // 0..255; 128+N when killed by signal N; 124 when TimedOut
	TimedOut        bool       `json:"timed_out"` // the deadline passed and the process tree was killed
	Stdout          string     `json:"stdout"`
	Stderr          string     `json:"stderr"`
	StdoutTruncated bool       `json:"stdout_truncated"`
	StderrTruncated bool       `json:"stderr_truncated"`
	DurationMS      int64      `json:"duration_ms"`
	Transport       string     `json:"transport"` // how the command reached the agent: "agent" (channel) or "exec"
	Sandbox         SandboxRef `json:"sandbox"`
}

// exitTimeout is ExecResult.ExitCode of a command killed at its deadline, as timeout(1) reports it.
const exitTimeout = 124

// SandboxRef names the sandbox a command ran in.
type SandboxRef struct {
	Name   string `json:"name"`
	ID     string `json:"id"`
	Driver string `json:"driver"`
	Tenant string `json:"tenant"`
	User   string `json:"user"`
}

// Exec runs req in key's sandbox, creating or starting it when needed: ExecWith a run of key's own, admitted
// with the Config's defaults (its spec, its mode, trusted).
func (m *Manager) Exec(ctx context.Context, key Key, req ExecRequest) (*ExecResult, error) {
	return m.ExecWith(ctx, RunRequest{Key: key}, req)
}

// ExecWith checks req, admits rr (or, with rr.RunID, attaches to that running run, which keeps the mode, trust
// and driver it was admitted with) and runs req in the run's sandbox; a run admitted here is finished with the
// command. One key's commands run one at a time; a caller that cancels ctx gets its answer only once the
// command's process tree is gone, together with the partial result and the ctx error. A malformed req is
// refused before anything is admitted or recorded.
func (m *Manager) ExecWith(ctx context.Context, rr RunRequest, req ExecRequest) (*ExecResult, error) {
	if err := m.checkExec(req); err != nil {
		return nil, err
	}
	run, err := m.Admit(ctx, rr)
	if err != nil {
		return nil, err
	}
	res, err := run.exec(ctx, req)
	run.Finish(err)
	return res, err
}

// Sandbox describes one sandbox, as `sandkeep ps` shows it.
type Sandbox struct {
	Tenant    string    `json:"tenant"`
	User      string    `json:"user"`
	Key       string    `json:"key"`
	Name      string    `json:"name"`
	ID        string    `json:"id"`
	State     string    `json:"state"`
	Image     string    `json:"image"`
	Template  string    `json:"template,omitempty"` // the operator template it was made for
	CreatedAt time.Time `json:"created_at"`
	LastUsed  time.Time `json:"last_used,omitzero"`
	IdleFor   string    `json:"idle_for"`
	// Disk is the workspace quota's use (resources.disk); nil without one.
	Disk *DiskUsage `json:"disk,omitempty"`
}

// DiskUsage is what a quota'd workspace holds: bytes and inodes used, and the file system's size in each.
type DiskUsage struct {
	Bytes       int64 `json:"bytes"`
	BytesLimit  int64 `json:"bytes_limit"`
	Inodes      int64 `json:"inodes"`
	InodesLimit int64 `json:"inodes_limit"`
}

// List returns every sandbox of this installation (this Home) on the preferred sandboxing driver, sorted by
// tenant and user.
func (m *Manager) List(ctx context.Context) ([]Sandbox, error) {
	lc, err := m.primary(ctx)
	if err != nil {
		return nil, err
	}
	infos, err := lc.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Sandbox, 0, len(infos))
	for _, in := range infos {
		out = append(out, sandboxOf(in))
	}
	return out, nil
}

func sandboxOf(in lifecycle.Info) Sandbox {
	out := Sandbox{
		Tenant: in.Key.Tenant, User: in.Key.User, Key: in.Key.Hex(), Name: in.Name, ID: in.ID,
		State: string(in.State), Image: in.Image, Template: in.Template, CreatedAt: in.CreatedAt, LastUsed: in.LastUsed,
		IdleFor: in.IdleFor.String(),
	}
	if d := in.Disk; d != nil {
		out.Disk = &DiskUsage{Bytes: d.Bytes, BytesLimit: d.BytesLimit, Inodes: d.Inodes, InodesLimit: d.InodesLimit}
	}
	return out
}

// Stop stops key's sandbox (waiting for its gate); the next Exec starts the same container again.
func (m *Manager) Stop(ctx context.Context, key Key) error {
	lc, err := m.primary(ctx)
	if err != nil {
		return err
	}
	return lc.Stop(ctx, key)
}

// Remove deletes key's sandbox, and its workspace unless keepWorkspace.
func (m *Manager) Remove(ctx context.Context, key Key, keepWorkspace bool) error {
	lc, err := m.primary(ctx)
	if err != nil {
		return err
	}
	return lc.Remove(ctx, key, keepWorkspace)
}

// WhenWaiting returns ctx carrying notice: when a call under it (Stop, Remove, Exec, a file operation) has waited
// a second for the key's gate, held by another command or operation of the same key, notice is called once with
// the wait's bound (Config.GateWait), from another goroutine, and the call does not return before it has. The CLI
// prints what stop and rm wait for with it.
func WhenWaiting(ctx context.Context, notice func(bound time.Duration)) context.Context {
	return lifecycle.WhenWaiting(ctx, notice)
}

// SweepReport says what one sweep pass did.
type SweepReport = lifecycle.SweepReport

// SweepOnce stops idle sandboxes and removes those past retention, skipping busy keys. It does not take the
// home's sweeper lock; RunSweeper does.
func (m *Manager) SweepOnce(ctx context.Context) (SweepReport, error) {
	lc, err := m.primary(ctx)
	if err != nil {
		return SweepReport{}, err
	}
	return lc.SweepOnce(ctx)
}

// RunSweeper sweeps every interval until ctx ends, as the home's only sweeper (others wait for the lock). While no
// sandboxing driver is usable it waits and tries again, so a server started before its engine sweeps once the
// engine is up.
func (m *Manager) RunSweeper(ctx context.Context, interval time.Duration) error {
	for {
		lc, err := m.primary(ctx)
		if err == nil {
			return lc.RunSweeper(ctx, interval)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// Close releases the manager's sandboxes' channels and proxies. Sandboxes keep running: they are persistent by
// design. The store (Config.Store) is the caller's to close.
func (m *Manager) Close() error {
	if m.stopSweeper != nil {
		m.stopSweeper()
		<-m.sweeperDone
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var err error
	for _, lc := range m.lcs {
		err = errors.Join(err, lc.Close())
	}
	// Then the drivers it made that hold something of their own (the kubernetes driver's channel listener and
	// informer): the next Manager over this home serves the sandboxes, as after a restart.
	return errors.Join(err, m.drivers.close())
}

// Installation is the id of this manager's state home.
func (m *Manager) Installation() string { return m.home.Installation }

func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

func parseMounts(specs []string) ([]driver.Mount, error) {
	out := make([]driver.Mount, 0, len(specs))
	for _, s := range specs {
		m, err := guard.ParseMount(s)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}
