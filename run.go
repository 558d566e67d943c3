package sandkeep

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/guard"
	"github.com/sandkeep/sandkeep/internal/lifecycle"
	"github.com/sandkeep/sandkeep/internal/record"
)

// Exec runs one command of the run in its sandbox (see Manager.Exec): on the run's driver and in its shape, with
// the run's network (a caller's block may only narrow it) and secret files, recording its events in the run.
// postAttachTail bounds the output a failed postAttachCommand's error quotes.
const postAttachTail = 2 << 10

// runPostAttach runs devcontainer.json's postAttachCommand in the run's sandbox, as the first command of the
// run (a session attaching). A failure is the run's: its commands do not run, and the error quotes the exit
// status and the output's tail.
func (r *Run) runPostAttach(ctx context.Context, pol *egress.Policy, sink lifecycle.Sink) error {
	var out bytes.Buffer
	res, err := r.lc.Exec(ctx, r.key, lifecycle.ExecRequest{
		Argv: []string{"sh", "-c", r.postAttach}, Stdout: &out, Stderr: &out, OnEvent: sink,
		Secrets: slices.Clip(r.secrets), Network: pol, NetworkBlock: r.network != nil, Shape: r.shape,
	})
	if err != nil {
		return err
	}
	if res.ExitCode == 0 && !res.TimedOut {
		return nil
	}
	tail := out.String()
	if len(tail) > postAttachTail {
		tail = tail[len(tail)-postAttachTail:]
	}
	return fault.New(fault.PostCreateFailed, "fix postAttachCommand in devcontainer.json; the next run tries it again",
		"postAttachCommand exited %d (timed out: %v) before the run's first command; its output ended with: %q", res.ExitCode, res.TimedOut, strings.TrimSpace(tail))
}

func (r *Run) Exec(ctx context.Context, req ExecRequest) (*ExecResult, error) {
	if r.lc == nil {
		return nil, fault.New(fault.InvalidArgument, "admit a new run", "run %s was refused and runs nothing", r.ID)
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, fault.New(fault.InvalidArgument, "pass the command to run, e.g. [\"sh\", \"-c\", \"ls -la\"]", "no command given")
	}
	// The operator's bounds; the lifecycle checks the workdir, the env and the absolute bounds once, as it builds
	// the agent's request (entry points that want an answer before admission call CheckExec themselves).
	if err := checkBounds(req, r.m.cfg.MaxTimeout, r.m.cfg.MaxOutputLimit); err != nil {
		return nil, err
	}
	pol, err := r.networkFor(req.Network)
	if err != nil {
		return nil, err
	}
	var outBuf, errBuf bytes.Buffer
	stdout, stderr := req.Stdout, req.Stderr
	if stdout == nil {
		stdout = &outBuf
	}
	if stderr == nil {
		stderr = &errBuf
	}
	sink := r.sink(req)
	if r.postAttach != "" {
		r.attachOnce.Do(func() { r.attachErr = r.runPostAttach(ctx, pol, sink) })
		if r.attachErr != nil {
			return nil, r.attachErr
		}
	}
	res, err := r.lc.Exec(ctx, r.key, lifecycle.ExecRequest{
		Argv: req.Argv, Workdir: req.Workdir, Env: req.Env, Timeout: req.Timeout,
		StdoutLimit: req.OutputLimit, StderrLimit: req.OutputLimit,
		Stdin: req.Stdin, Stdout: stdout, Stderr: stderr, OnEvent: sink,
		Secrets: append(slices.Clip(r.secrets), req.Secrets...), Network: pol, NetworkBlock: req.Network != nil || r.network != nil, Shape: r.shape,
		TTY: req.TTY.size(), Resize: req.TTY.resize(), Concurrent: req.Concurrent,
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
		Sandbox: SandboxRef{Name: res.Sandbox.Name, ID: res.Sandbox.ID, Driver: r.Driver,
			Tenant: r.key.Tenant, User: r.key.User},
	}, err
}

// sink is where one command's events go: the run's record, the run's OnEvent and the command's.
func (r *Run) sink(req ExecRequest) lifecycle.Sink {
	rec, run, cmd := r.rec, r.onEvent, req.OnEvent
	if rec == nil && run == nil && cmd == nil {
		return nil
	}
	if req.RequestID != "" && rec != nil && req.RequestID != rec.RequestID {
		rec = &record.Recorder{Store: rec.Store, RunID: rec.RunID, RequestID: req.RequestID}
	}
	return func(name string, payload any) {
		if rec != nil {
			rec.Event(name, payload)
		}
		if run != nil {
			run(name, payload)
		}
		if cmd != nil {
			cmd(name, payload)
		}
	}
}

// networkFor is the policy of a command with block cmd: the run's, resolved once, when it has none. A caller's
// block narrows the run's (lifecycle.NarrowNetwork: both must allow a request; NETWORK_WIDENED for a block that
// asks for more); the operator's is merged as it says.
func (r *Run) networkFor(cmd *Network) (*egress.Policy, error) {
	if cmd == nil {
		return r.pol, nil
	}
	if r.caller {
		base := egress.Policy{Mode: egress.ModeNone}
		if r.pol != nil {
			base = *r.pol
		}
		pol, err := lifecycle.NarrowNetwork(base, cmd, r.m.cfg.NetworkPresets)
		if err != nil {
			return nil, err
		}
		return &pol, nil
	}
	merged, err := lifecycle.MergeNetwork(r.network, cmd)
	if err != nil {
		return nil, err
	}
	pol, err := lifecycle.ResolveNetwork(merged, r.m.cfg.NetworkPresets, r.m.cfg.NetworkSilent)
	if err != nil {
		return nil, err
	}
	return &pol, nil
}

// CheckExec is the one request validator of every entry point (the CLI, the HTTP API, MCP, the library): a
// command, a timeout and an output limit within the operator's bounds (Config.MaxTimeout, MaxOutputLimit), a
// workdir under /workspace and an environment the guard accepts. Zero timeout and limit take the defaults.
func (m *Manager) CheckExec(req ExecRequest) error {
	return CheckExecWithin(req, m.cfg.MaxTimeout, m.cfg.MaxOutputLimit)
}

// CheckExecWithin is CheckExec with the bounds given (for callers that validate before opening a Manager).
func CheckExecWithin(req ExecRequest, maxTimeout time.Duration, maxOutput int64) error {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return fault.New(fault.InvalidArgument, "pass the command to run, e.g. [\"sh\", \"-c\", \"ls -la\"]", "no command given")
	}
	if err := checkBounds(req, maxTimeout, maxOutput); err != nil {
		return err
	}
	if err := guard.WorkdirText(req.Workdir); err != nil { // where it lies: the lifecycle, with the workspace folder
		return err
	}
	return guard.Env(req.Env)
}

// checkBounds checks req's timeout and output limit against the bounds (0 or past the library's: the library's).
func checkBounds(req ExecRequest, maxTimeout time.Duration, maxOutput int64) error {
	if maxTimeout <= 0 || maxTimeout > lifecycle.MaxTimeout {
		maxTimeout = lifecycle.MaxTimeout
	}
	if maxOutput <= 0 || maxOutput > agentproto.MaxOutputLimit {
		maxOutput = agentproto.MaxOutputLimit
	}
	if req.Timeout != 0 && (req.Timeout < lifecycle.MinTimeout || req.Timeout > maxTimeout) {
		return fault.New(fault.InvalidTimeout, "use a timeout between 1s and "+maxTimeout.String(),
			"timeout %s is out of range (1s..%s)", req.Timeout, maxTimeout)
	}
	if req.OutputLimit < 0 || req.OutputLimit > maxOutput {
		return fault.New(fault.InvalidArgument, "use an output limit between 1 byte and the operator's bound",
			"output limit %d is out of range (1..%d bytes)", req.OutputLimit, maxOutput)
	}
	return nil
}
