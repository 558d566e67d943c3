// Package sandkeep runs the shell commands of AI agents inside persistent, hardened, per-user sandboxes.
//
// A Manager keeps one sandbox per Key (tenant, user), reused across commands, sessions and processes, and runs
// each command with an exact deadline, exact exit status and bounded output:
//
//	m, err := sandkeep.Open(ctx, sandkeep.ConfigFromEnv())
//	key, _ := sandkeep.NewKey("acme", "alice")
//	res, err := m.Exec(ctx, key, sandkeep.ExecRequest{Argv: []string{"sh", "-c", "echo hi"}})
//
// Failures that a caller can act on are *Error values with a stable Code and a Hint.
package sandkeep

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/driver/host"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/guard"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/lifecycle"
	"github.com/sandkeep/sandkeep/internal/record"
	"github.com/sandkeep/sandkeep/internal/spec"
	"github.com/sandkeep/sandkeep/internal/store"
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

// Manager runs commands in per-key sandboxes. It is safe for concurrent use, and several processes may use
// managers over the same Home at once.
type Manager struct {
	lc  *lifecycle.Manager
	drv driver.Driver
	st  store.Store // nil unless Config.Store: then every Exec belongs to a recorded run

	network *Network            // Config.Network, merged with each command's
	presets map[string][]string // Config.NetworkPresets
	silent  []string            // Config.NetworkSilent
	policy  *egress.Policy      // Config.Network resolved once: what a command without a block of its own gets
}

// Open checks cfg, connects to the Docker engine (a real ping) and prepares the state home.
func Open(ctx context.Context, cfg Config) (*Manager, error) {
	lcfg, err := cfg.lifecycle()
	if err != nil {
		return nil, err
	}
	home, err := lifecycle.OpenHome(cfg.Home)
	if err != nil {
		return nil, err
	}
	drv, err := newDriver(cfg.Driver, cfg.PullTimeout, lcfg.AgentPath)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := drv.Ping(pctx); err != nil {
		return nil, err
	}
	pol, err := lifecycle.ResolveNetwork(cfg.Network, cfg.NetworkPresets, cfg.NetworkSilent)
	if err != nil {
		return nil, err
	}
	lc, err := lifecycle.New(home, drv, lcfg)
	if err != nil {
		return nil, err
	}
	m := &Manager{lc: lc, drv: drv, network: cfg.Network, presets: cfg.NetworkPresets, silent: cfg.NetworkSilent, policy: &pol}
	if cfg.Store != "" {
		if m.st, err = record.Open(ctx, cfg.Store); err != nil {
			lc.Close()
			return nil, err
		}
	}
	return m, nil
}

// newDriver makes the driver cfg names: docker by default; host (no isolation at all) only when named.
func newDriver(name string, pullTimeout time.Duration, agent string) (driver.Driver, error) {
	switch name {
	case "", DriverDocker:
		d, err := docker.New(docker.Options{PullTimeout: pullTimeout})
		if err != nil {
			return nil, fault.Wrap(err, fault.DriverUnavailable, "check DOCKER_HOST", "cannot set up the Docker client")
		}
		return d, nil
	case DriverPodman:
		sock, err := PodmanSocket()
		if err != nil {
			return nil, err
		}
		d, err := docker.New(docker.Options{PullTimeout: pullTimeout, Host: "unix://" + sock, Name: DriverPodman})
		if err != nil {
			return nil, fault.Wrap(err, fault.DriverUnavailable, "check podman's socket", "cannot set up the podman client")
		}
		return d, nil
	case DriverHost:
		return host.New(agent), nil
	}
	return nil, fault.New(fault.InvalidArgument, "use docker, or host (no isolation; only when policy allows it)",
		"unknown driver %q", name)
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

// ExecRequest is one command. Argv runs directly, without a shell: use {"sh", "-c", "..."} for shell syntax.
type ExecRequest struct {
	Argv        []string
	Workdir     string        // relative to /workspace, or absolute under it; created when missing
	Env         []string      // "K=V", added to the sandbox's environment
	Timeout     time.Duration // 1s..24h; zero means 120s
	OutputLimit int64         // per stream, in bytes; zero means 1 MiB, at most 64 MiB
	Stdin       io.Reader     // nil: the command reads /dev/null
	// Stdout and Stderr, when set, receive output as it is produced, and the result's Stdout/Stderr stay
	// empty; when nil, output is collected into the result.
	Stdout io.Writer
	Stderr io.Writer
	// OnEvent, when set, receives this command's events: ensure decisions, exec started and finished.
	OnEvent EventFunc
	// RunID attaches the command to a running run (same tenant and user) when Config.Store is set; empty: the
	// command gets a run of its own.
	RunID string
	// Secrets are files placed under /run/secrets (a tmpfs owned by the sandbox user) for this command only,
	// and removed when it ends. Their values travel as the agent's stdin: never in argv, env, logs or events.
	Secrets []Secret
	// RequestID, when set, is recorded on the command's events (the service passes its request id).
	RequestID string
	// Network, when set, is this command's network block, merged with Config.Network (Inherit: append or
	// replace).
	Network *Network
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

// Exec runs req in key's sandbox, creating or starting it when needed. One key's commands run one at a
// time; a caller that cancels ctx gets its answer only once the command's process tree is gone. When ctx is
// cancelled, the partial result is returned together with the ctx error.
func (m *Manager) Exec(ctx context.Context, key Key, req ExecRequest) (*ExecResult, error) {
	if m.st == nil {
		return m.exec(ctx, key, req)
	}
	id, owned, err := m.runFor(ctx, key, req.RunID)
	if err != nil {
		return nil, err
	}
	rec := &record.Recorder{Store: m.st, RunID: id, RequestID: req.RequestID}
	user := req.OnEvent
	req.OnEvent = func(name string, payload any) {
		rec.Event(name, payload)
		if user != nil {
			user(name, payload)
		}
	}
	res, err := m.exec(ctx, key, req)
	if owned {
		_ = record.Finish(m.st, id, err)
	}
	return res, err
}

// runFor returns the run a library command belongs to: the named one (checked), or a new one of its own. The
// library does not resolve modes: its Manager always runs on its configured driver, so the run records that
// driver with mode inline (a sandbox or nothing), or none for the host passthrough.
func (m *Manager) runFor(ctx context.Context, key Key, named string) (id string, owned bool, err error) {
	if named != "" {
		run, err := record.Attach(ctx, m.st, named, key.Tenant, key.User)
		return run.ID, false, err
	}
	mode := spec.ModeInline
	if m.drv.Name() == DriverHost {
		mode = spec.ModeNone
	}
	run, err := record.Create(ctx, m.st, store.Run{Tenant: key.Tenant, User: key.User, Trust: store.TrustTrusted,
		ResolvedMode: mode, Source: "default", Driver: m.drv.Name(), Admission: store.AdmissionAdmitted})
	return run.ID, err == nil, err
}

func (m *Manager) exec(ctx context.Context, key Key, req ExecRequest) (*ExecResult, error) {
	var outBuf, errBuf bytes.Buffer
	stdout, stderr := req.Stdout, req.Stderr
	if stdout == nil {
		stdout = &outBuf
	}
	if stderr == nil {
		stderr = &errBuf
	}
	pol, err := m.networkFor(req.Network)
	if err != nil {
		return nil, err
	}
	res, err := m.lc.Exec(ctx, key, lifecycle.ExecRequest{
		Argv: req.Argv, Workdir: req.Workdir, Env: req.Env, Timeout: req.Timeout,
		StdoutLimit: req.OutputLimit, StderrLimit: req.OutputLimit,
		Stdin: req.Stdin, Stdout: stdout, Stderr: stderr, OnEvent: lifecycle.Sink(req.OnEvent), Secrets: req.Secrets,
		Network: pol,
	})
	if res == nil {
		return nil, err
	}
	code := res.ExitCode
	if res.TimedOut {
		// The agent reports how the killed tree died (143, 137); callers, the CLI's exit status and its
		// --json see 124 as timeout(1) does, and TimedOut tells it apart from a real exit 124.
		code = exitTimeout
	}
	return &ExecResult{
		ExitCode: code, TimedOut: res.TimedOut,
		Stdout: outBuf.String(), Stderr: errBuf.String(),
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		DurationMS: res.DurationMS, Transport: string(res.Transport),
		Sandbox: SandboxRef{Name: res.Sandbox.Name, ID: res.Sandbox.ID, Driver: m.drv.Name(),
			Tenant: key.Tenant, User: key.User},
	}, err
}

// networkFor is the policy of a command with block cmd: the Config's, resolved once, when it has none.
func (m *Manager) networkFor(cmd *Network) (*egress.Policy, error) {
	if cmd == nil {
		return m.policy, nil
	}
	merged, err := lifecycle.MergeNetwork(m.network, cmd)
	if err != nil {
		return nil, err
	}
	pol, err := lifecycle.ResolveNetwork(merged, m.presets, m.silent)
	if err != nil {
		return nil, err
	}
	return &pol, nil
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

// List returns every sandbox of this installation (this Home), sorted by tenant and user.
func (m *Manager) List(ctx context.Context) ([]Sandbox, error) {
	infos, err := m.lc.List(ctx)
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
		State: string(in.State), Image: in.Image, CreatedAt: in.CreatedAt, LastUsed: in.LastUsed,
		IdleFor: in.IdleFor.String(),
	}
	if d := in.Disk; d != nil {
		out.Disk = &DiskUsage{Bytes: d.Bytes, BytesLimit: d.BytesLimit, Inodes: d.Inodes, InodesLimit: d.InodesLimit}
	}
	return out
}

// Stop stops key's sandbox (waiting for its gate); the next Exec starts the same container again.
func (m *Manager) Stop(ctx context.Context, key Key) error { return m.lc.Stop(ctx, key) }

// Remove deletes key's sandbox, and its workspace unless keepWorkspace.
func (m *Manager) Remove(ctx context.Context, key Key, keepWorkspace bool) error {
	return m.lc.Remove(ctx, key, keepWorkspace)
}

// SweepReport says what one sweep pass did.
type SweepReport = lifecycle.SweepReport

// SweepOnce stops idle sandboxes and removes those past retention, skipping busy keys. It does not take the
// home's sweeper lock; RunSweeper does.
func (m *Manager) SweepOnce(ctx context.Context) (SweepReport, error) { return m.lc.SweepOnce(ctx) }

// RunSweeper sweeps every interval until ctx ends, as the home's only sweeper (others wait for the lock).
func (m *Manager) RunSweeper(ctx context.Context, interval time.Duration) error {
	return m.lc.RunSweeper(ctx, interval)
}

// Close releases the manager and its store. Sandboxes keep running: they are persistent by design.
func (m *Manager) Close() error {
	err := m.lc.Close()
	if m.st != nil {
		err = errors.Join(err, m.st.Close())
	}
	return err
}

// Installation is the id of this manager's state home.
func (m *Manager) Installation() string { return m.lc.Home().Installation }

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
