package sandkeep

import (
	"context"
	"io"
	"os"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/engine"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// Trust levels of a run. An untrusted run never runs outside a sandbox.
const (
	TrustTrusted   = "trusted"
	TrustUntrusted = "untrusted"
)

// RunRequest asks admission for a run: the unit of work (a session, a workflow run) that commands attach to.
// The operator tier (the CLI's flags, a server's configuration) fills Mode, Driver and Spec; a caller (an API
// token, an MCP session, a library call) picks a Template, may lower its Trust and narrow its Network.
type RunRequest struct {
	Key Key
	// RunID attaches to that running run instead of admitting a new one: the run keeps the mode, trust and
	// driver it was admitted with (Mode, Trust and Driver here are ignored) and stays open when its commands end.
	RunID string
	// Mode is the operator's explicit sandbox mode for the run (the CLI's --sandbox, source cli): none, auto or
	// inline; "" leaves it to the spec, then Config.SandboxDefault, then auto. A repository may raise it, never
	// lower it.
	Mode string
	// Trust is trusted ("", the default) or untrusted.
	Trust string
	// Driver, when set, is the only driver the run may use: unavailable is a refusal, never a fallback.
	Driver string
	// Spec is the repository's sandkeep.yaml; "" is the template's, else Config.Spec (none when both are empty).
	Spec string
	// Template is an operator template by name; "" is the tenant's default (Config.TenantTemplates, then
	// Config.DefaultTemplate), else none. A template the tenant may not use is TEMPLATE_NOT_FOUND, as a missing
	// one is.
	Template string
	// Caller marks a request of the caller tier: its Network may only narrow the run's.
	Caller bool
	// Network, when set, is a block for the run's commands over the run's own (the Config's, the template's, the
	// repository's), merged as its Inherit says; a Caller's may only narrow it (NETWORK_WIDENED) and replaces it.
	Network *Network
	// HostState is the operator's host_state for this run (the CLI's --host-state): auto or none, over the
	// template's and the Config's. A Caller may not set it (TIER_REFUSED).
	HostState string
	// RequestID, when set, is recorded on the run's events.
	RequestID string
	// BuildOutput receives the progress of an image build the spec asks for (nil: discarded).
	BuildOutput io.Writer
	// Observer is told the run's events as they are recorded and when each of its commands runs.
	Observer Observer
}

func (rr RunRequest) engine() engine.RunRequest {
	return engine.RunRequest{Key: rr.Key, RunID: rr.RunID, Mode: rr.Mode, Trust: rr.Trust, Driver: rr.Driver,
		Spec: rr.Spec, Template: rr.Template, Caller: rr.Caller, Network: rr.Network.engine(), RequestID: rr.RequestID, HostState: rr.HostState,
		BuildOutput: rr.BuildOutput, Observer: engine.Observer{Event: engine.EventFunc(rr.Observer.Event), Started: rr.Observer.Started}}
}

// EventFunc receives what sandkeep did: the event's name (sandbox_started, exec_finished, ...) and its typed
// payload. See docs/EVENTS.md.
type EventFunc func(name string, payload any)

// Observer is what a caller is told about its run as it happens: every event as it is recorded, and the moment
// each command runs. Nil fields are skipped. Both are called from the goroutine that runs the command: they must
// not block for long.
type Observer struct {
	// Event receives the run's events (docs/EVENTS.md): the policy's, then every command's.
	Event EventFunc
	// Started is told that a command runs: its sandbox is ready and the agent has it. From then on the command's
	// output and result are the answer, and a failure is the command's, not its setup's (the HTTP API commits
	// its 200 here). A command that goes out again (its sandbox was recycled under it) is told again.
	Started func()
}

// Run is one admitted unit of work. Its fields are the admission verdict as recorded; Exec runs a command in it.
type Run struct {
	ID        string `json:"id,omitempty"` // "" when no store records runs
	Tenant    string `json:"tenant"`
	User      string `json:"user"`
	Mode      string `json:"mode"`   // the resolved mode: none, auto or inline
	Source    string `json:"source"` // the tier that chose it: cli, spec, env or default
	Trust     string `json:"trust"`
	Driver    string `json:"driver,omitempty"` // what its commands run on; "" for a refused run
	Admission string `json:"admission"`        // admitted or refused
	Template  string `json:"template,omitempty"`
	// Warnings are the repository's diagnostics that did not stop the run, one line each.
	Warnings []string `json:"warnings,omitempty"`
	// Notice is the one loud line of a run that degraded to the host ("" otherwise): show it to a person.
	Notice string `json:"notice,omitempty"`
	// Dropped is the one line saying what the repository's devcontainer.json asked that would weaken the
	// sandbox and was dropped ("" when nothing was); the sandbox_devcontainer_dropped event lists each with why.
	Dropped string `json:"dropped,omitempty"`

	r *engine.Run // nil for a Run made by hand (a test's): it runs nothing
}

func runOf(r *engine.Run) *Run {
	if r == nil {
		return nil
	}
	return &Run{ID: r.ID, Tenant: r.Tenant, User: r.User, Mode: r.Mode, Source: r.Source, Trust: r.Trust,
		Driver: r.Driver, Admission: r.Admission, Template: r.Template, Warnings: r.Warnings, Notice: r.Notice,
		Dropped: r.Dropped, r: r}
}

// Exec checks req and runs it as one command of the run in its sandbox: on the run's driver and in its shape,
// with the run's network and secret files, recording its events in the run (see Manager.ExecWith).
func (r *Run) Exec(ctx context.Context, req ExecRequest) (*ExecResult, error) {
	if r.r == nil {
		return nil, errNotAdmitted(r.ID)
	}
	res, err := r.r.Exec(ctx, req.engine())
	return resultOf(res), err
}

// Finish records how an admitted run ended: succeeded when sandkeep ran its commands (whatever their exit
// statuses), else failed with the failure's code. It does nothing for an attached or refused run, or without a
// store. It returns the store's error, which the run's outcome does not depend on.
func (r *Run) Finish(err error) error {
	if r.r == nil {
		return nil
	}
	return r.r.Finish(err)
}

// DefaultTimeout is a command's deadline when its ExecRequest names none.
const DefaultTimeout = 120 * time.Second

// ExecRequest is one command: what runs, where, for how long and with what output. Argv runs directly, without
// a shell: use {"sh", "-c", "..."} for shell syntax. Who runs it, and under which policy, is its run's
// (RunRequest).
type ExecRequest struct {
	Argv        []string
	Workdir     string        // relative to /workspace, or absolute under it; created when missing
	Env         []string      // "K=V", added to the sandbox's environment
	Timeout     time.Duration // 1s..24h (Config.MaxTimeout); zero means DefaultTimeout
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
	// Concurrent runs the command beside the user's other concurrent commands and processes instead of one at a
	// time (the default). Stop, rm and recycles still wait for it. A command with secret files or a network runs
	// alone anyway, and so does one where the sandbox has no agent channel this process serves.
	Concurrent bool
}

// Check is the one validator of a command, within the library's bounds: an argv, a timeout and an output limit
// in range, a terminal size, a workdir under /workspace and an environment the guard accepts. The engine checks
// every command with it (within the operator's bounds) before anything is admitted or run; an entry point that
// wants the answer before it opens a Manager (the CLI) may ask it first.
func (req ExecRequest) Check() error { return req.engine().Check() }

func (req ExecRequest) engine() engine.ExecRequest {
	e := engine.ExecRequest{Argv: req.Argv, Workdir: req.Workdir, Env: req.Env, Timeout: req.Timeout,
		OutputLimit: req.OutputLimit, Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr, Concurrent: req.Concurrent}
	for _, s := range req.Secrets {
		e.Secrets = append(e.Secrets, engine.Secret(s))
	}
	if req.TTY != nil {
		e.TTY = &engine.TTY{Size: req.TTY.Size, Resize: req.TTY.Resize}
	}
	return e
}

// Secret is one secret file for one command: Value at Path (absolute, under /run/secrets), readable as Mode (0:
// 0400) by the sandbox's user. Name is for messages.
type Secret struct {
	Name  string
	Path  string
	Mode  os.FileMode
	Value []byte `json:"-"`
}

// WindowSize is a terminal's size in character cells (the agent wire's own type).
type WindowSize = agentproto.WindowSize

// TTY asks for a pseudo-terminal of Size (zero: 24x80); each value received on Resize, until the command ends,
// changes its size. Resize may be nil and is never closed by sandkeep.
type TTY struct {
	Size   WindowSize
	Resize <-chan WindowSize
}

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

// SandboxRef names the sandbox a command ran in.
type SandboxRef struct {
	Name   string `json:"name"`
	ID     string `json:"id"`
	Driver string `json:"driver"`
	Tenant string `json:"tenant"`
	User   string `json:"user"`
}

func resultOf(r *engine.ExecResult) *ExecResult {
	if r == nil {
		return nil
	}
	return &ExecResult{ExitCode: r.ExitCode, TimedOut: r.TimedOut, Stdout: r.Stdout, Stderr: r.Stderr,
		StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated, DurationMS: r.DurationMS,
		Transport: r.Transport, Sandbox: SandboxRef(r.Sandbox)}
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

func sandboxOf(sb engine.Sandbox) Sandbox {
	out := Sandbox{Tenant: sb.Tenant, User: sb.User, Key: sb.Key, Name: sb.Name, ID: sb.ID, State: sb.State,
		Image: sb.Image, Template: sb.Template, CreatedAt: sb.CreatedAt, LastUsed: sb.LastUsed, IdleFor: sb.IdleFor}
	if sb.Disk != nil {
		d := DiskUsage(*sb.Disk)
		out.Disk = &d
	}
	return out
}

// ForwardPort is one of the repository's devcontainer.json forwardPorts and what port forwarding does with it
// (`sandkeep port-forward` with no port, GET /v1/sandboxes/{user}/ports, doctor). A forward always connects to
// 127.0.0.1:Port inside the sandbox's own network namespace, from the local Port: a bare port,
// "localhost:PORT" and "127.0.0.1:PORT" are forwarded; "SERVICE:PORT" is forwarded when SERVICE is the
// compose service the sandbox is, or one of its companions (runServices), which share the sandbox's loopback.
// Anything else is not forwarded, and Why says why: the sandbox has no route to another host.
type ForwardPort struct {
	Entry     string `json:"entry"`               // as devcontainer.json writes it: 3000, "localhost:3000", "db:5432"
	Port      int    `json:"port,omitempty"`      // the port inside the sandbox and the local one; 0 when Entry is not a port
	Companion string `json:"companion,omitempty"` // the compose companion listening on Port, for "SERVICE:PORT"
	Forwarded bool   `json:"forwarded"`
	Why       string `json:"why,omitempty"` // why not, when not Forwarded
}

// String is the entry and its fate, one line: doctor's and the CLI's.
func (f ForwardPort) String() string { return engine.ForwardPort(f).String() }

func forwardPortsOf(in []engine.ForwardPort) []ForwardPort {
	if in == nil {
		return nil
	}
	out := make([]ForwardPort, 0, len(in))
	for _, f := range in {
		out = append(out, ForwardPort(f))
	}
	return out
}

func errNotAdmitted(id string) error {
	return fault.New(fault.InvalidArgument, "admit a run with Manager.Admit", "run %q was not admitted by this Manager", id)
}
