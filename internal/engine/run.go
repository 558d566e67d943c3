package engine

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/guard"
	"github.com/sandkeep/sandkeep/internal/store"
)

// postAttachTail bounds the output a failed postAttachCommand's error quotes.
const postAttachTail = 2 << 10

// runPostAttach runs devcontainer.json's postAttachCommand in the run's sandbox, as the first command of the
// run (a session attaching). A failure is the run's: its commands do not run, and the error quotes the exit
// status and the output's tail.
func (r *Run) runPostAttach(ctx context.Context) error {
	var out bytes.Buffer
	w, flush := r.logTee(store.LogPostAttach, &out)
	defer flush()
	res, err := r.lc.Exec(ctx, r.key, lifecycle.ExecRequest{
		Argv: []string{"sh", "-c", r.postAttach}, Stdout: w, Stderr: w, OnEvent: r.sink, OnLog: r.logLine,
		Secrets: slices.Clip(r.secrets), Network: r.cmdPol, NetworkBlock: r.network != nil || r.cmdNet != nil, Shape: r.shape,
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

// Exec checks req and runs it as one command of the run in its sandbox (see Manager.ExecWith): on the run's
// driver and in its shape, with the run's network and secret files, recording its events in the run.
func (r *Run) Exec(ctx context.Context, req ExecRequest) (*ExecResult, error) {
	if err := r.m.checkExec(req); err != nil {
		return nil, err
	}
	return r.exec(ctx, req)
}

// exec runs req, checked, in the run.
func (r *Run) exec(ctx context.Context, req ExecRequest) (*ExecResult, error) {
	if r.lc == nil {
		return nil, fault.New(fault.InvalidArgument, "admit a new run", "run %s was refused and runs nothing", r.ID)
	}
	var outBuf, errBuf bytes.Buffer
	stdout, stderr := req.Stdout, req.Stderr
	if stdout == nil {
		stdout = &outBuf
	}
	if stderr == nil {
		stderr = &errBuf
	}
	if r.postAttach != "" {
		r.attachOnce.Do(func() { r.attachErr = r.runPostAttach(ctx) })
		if r.attachErr != nil {
			return nil, r.attachErr
		}
	}
	res, err := r.lc.Exec(ctx, r.key, lifecycle.ExecRequest{
		Argv: req.Argv, Workdir: req.Workdir, Env: req.Env, Timeout: req.Timeout,
		StdoutLimit: req.OutputLimit, StderrLimit: req.OutputLimit,
		Stdin: req.Stdin, Stdout: stdout, Stderr: stderr, OnEvent: r.sink, OnLog: r.logLine, OnStarted: r.obs.Started,
		Secrets: append(slices.Clip(r.secrets), req.Secrets...), Network: r.cmdPol, NetworkBlock: r.network != nil || r.cmdNet != nil,
		Shape: r.shape, TTY: req.TTY.size(), Resize: req.TTY.resize(), Concurrent: req.Concurrent, Services: r.services,
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

// sink is where the run's events go: its record, then its observer. It is the one place events fan out.
func (r *Run) sink(name string, payload any) {
	if shared, ok := r.shared(name, payload); ok {
		r.emit(events.NameSandboxShared, shared)
	}
	r.emit(name, payload)
}

// shared watches the run's events up to its first command: when that command goes out to a sandbox that no
// event of the run made, started or claimed, the run shares a live sandbox, and sandbox_shared says so before
// the command's exec_started. Runs on the host passthrough share nothing.
func (r *Run) shared(name string, payload any) (events.SandboxShared, bool) {
	r.shareMu.Lock()
	defer r.shareMu.Unlock()
	if r.shareSeen || r.Driver == DriverHost {
		return events.SandboxShared{}, false
	}
	switch name {
	case events.NameSandboxStarted, events.NameSandboxClaimed:
		r.shareSeen = true // the run provided the sandbox it runs in
	case events.NameSandboxAdopted:
		r.shareAdopted = true
	case events.NameExecStarted:
		r.shareSeen = true
		if es, ok := payload.(events.ExecStarted); ok {
			return events.SandboxShared{Sandbox: es.Sandbox, Driver: r.Driver, Adopted: r.shareAdopted}, true
		}
	}
	return events.SandboxShared{}, false
}

// emit records one event of the run and tells its observer.
func (r *Run) emit(name string, payload any) {
	if r.rec != nil {
		r.rec.Event(name, payload)
	}
	if r.obs.Event != nil {
		r.obs.Event(name, payload)
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

// checkExec is checkExec within the operator's bounds (Config.MaxTimeout, MaxOutputLimit).
func (m *Manager) checkExec(req ExecRequest) error {
	return checkExec(req, m.cfg.MaxTimeout, m.cfg.MaxOutputLimit)
}

// Check is the one validator of a command, within the library's bounds: the engine checks every command with it
// (within the operator's bounds) before anything is admitted or run; an entry point that wants the answer before
// it opens a Manager (the CLI) may ask it first.
func (req ExecRequest) Check() error { return checkExec(req, 0, 0) }

// checkExec checks a command: an argv, a timeout and an output limit within the bounds (0 or past the library's:
// the library's; zero timeout and limit take the defaults), a terminal size, a workdir under /workspace and an
// environment the guard accepts. Where the workdir lies is the lifecycle's, which knows the workspace folder.
func checkExec(req ExecRequest, maxTimeout time.Duration, maxOutput int64) error {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return fault.New(fault.InvalidArgument, "pass the command to run, e.g. [\"sh\", \"-c\", \"ls -la\"]", "no command given")
	}
	if maxTimeout <= 0 || maxTimeout > lifecycle.MaxTimeout {
		maxTimeout = lifecycle.MaxTimeout
	}
	if maxOutput <= 0 || maxOutput > agentproto.MaxOutputLimit {
		maxOutput = agentproto.MaxOutputLimit
	}
	if req.Timeout != 0 && (req.Timeout < lifecycle.MinTimeout || req.Timeout > maxTimeout) {
		return fault.New(fault.InvalidTimeout, "use a timeout between 1s and "+maxTimeout.String(),
			"timeout %s is out of range", req.Timeout)
	}
	if req.OutputLimit < 0 || req.OutputLimit > maxOutput {
		return fault.New(fault.InvalidArgument, "use an output limit between 1 byte and "+sizeString(maxOutput),
			"output limit %s is out of range", sizeString(req.OutputLimit))
	}
	if ws := req.TTY.size(); ws != nil {
		if err := ws.Check(); err != nil {
			return fault.New(fault.InvalidArgument, "pass a terminal size between 1x1 and 1000x1000",
				"terminal size %dx%d is out of range", ws.Rows, ws.Cols)
		}
	}
	if err := guard.WorkdirText(req.Workdir); err != nil {
		return err
	}
	return guard.Env(req.Env)
}

// sizeString writes n bytes exactly, in the largest binary unit that divides it: 0B, 512KiB, 65MiB, 1000B.
func sizeString(n int64) string {
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.n == 0 {
			return strconv.FormatInt(n/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}
