package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	cerrdefs "github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// The file API on a driver that keeps the workspace itself (the kubernetes driver's claim, mounted only in the
// pod): every operation runs in the sandbox as `sandkeep-agent fs OP` (internal/files/wire.go), through the
// driver's Exec like any command (the pod's agent channel, else the API server's exec), as the sandbox's user.
// It takes no gate: as on Docker, files move while commands run.

// fileOpStderr bounds what is kept of an operation's stderr: its one-line JSON reply, with room to tell that
// it was cut.
const fileOpStderr = 32 << 10

// RemoteWorkspaces reports whether the driver keeps the workspaces (WorkspaceRemover): the file API then goes
// through the agent (RemoteWorkspace), and Workspace refuses.
func (m *Manager) RemoteWorkspaces() bool {
	_, ok := m.drv.(driver.WorkspaceRemover)
	return ok
}

// RemoteWorkspace returns the Runner through which the file API reaches key's workspace inside its sandbox
// (files.OpenRemote). The sandbox is provided as a command would provide it: a stopped one (an idle-stopped pod,
// its claim kept) is started, a drifted one recreated. Without create, a key with no sandbox is FILE_NOT_FOUND,
// as on Docker when nothing was ever written for the user; with create, its sandbox is made.
func (m *Manager) RemoteWorkspace(ctx context.Context, key identity.Key, create bool) (files.Runner, error) {
	if !m.RemoteWorkspaces() {
		return nil, fault.New(fault.FilesUnavailable, "open the workspace on the host (Workspace)",
			"the %s driver's workspaces are on this host", m.drv.Name())
	}
	if !create && m.cached(key) == nil {
		if _, err := m.owned(ctx, key); fault.Is(err, fault.NotFound) {
			return nil, fault.New(fault.FileNotFound, "run a command or upload a file first", "no workspace for %s", key)
		} else if err != nil {
			return nil, coded(ctx, err, key)
		}
	}
	if _, err := m.fileSandbox(ctx, key); err != nil {
		return nil, err
	}
	return func(ctx context.Context, arg string, stdin io.Reader, stdout, stderr io.Writer, limit int64) (int, error) {
		return m.runFileOp(ctx, key, arg, stdin, stdout, stderr, limit)
	}, nil
}

// fileSandbox is key's running sandbox: the one this process last ensured, else ensured now under key's gate.
func (m *Manager) fileSandbox(ctx context.Context, key identity.Key) (*driver.Sandbox, error) {
	if sb := m.cached(key); sb != nil {
		return sb, nil // as for a command: if it stopped since, the exec says so and runFileOp ensures again
	}
	release, err := m.gates.acquire(ctx, key, m.cfg.GateWait)
	if err != nil {
		return nil, err
	}
	defer release()
	sb, _, err := m.ensure(ctx, key, m.shapeOf(nil))
	if err != nil {
		return nil, coded(ctx, err, key)
	}
	return sb, nil
}

// runFileOp runs `sandkeep-agent fs arg` in key's sandbox (files.Runner). A sandbox found stopped or gone
// before anything ran is provided again once; a channel that broke recycles it (AGENT_PROTOCOL), as for a
// command.
func (m *Manager) runFileOp(ctx context.Context, key identity.Key, arg string, stdin io.Reader, stdout, stderr io.Writer, limit int64) (int, error) {
	for attempt := 0; ; attempt++ {
		sb, err := m.fileSandbox(ctx, key)
		if err != nil {
			return 0, err
		}
		exit, gone, err := m.execFileOp(ctx, key, sb, arg, stdin, stdout, stderr, limit)
		switch {
		case gone && attempt == 0:
			m.forget(key) // stopped or removed behind this process's back: nothing ran
			continue
		case gone:
			return 0, coded(ctx, err, key)
		}
		return exit, err
	}
}

// heldRunner is the file Runner of key's sandbox sb for a caller that holds key's gate (a fork, a snapshot, a
// restore): one attempt on sb, never a sandbox provided again (that would wait for the gate the caller holds).
func (m *Manager) heldRunner(key identity.Key, sb *driver.Sandbox) files.Runner {
	return func(ctx context.Context, arg string, stdin io.Reader, stdout, stderr io.Writer, limit int64) (int, error) {
		exit, gone, err := m.execFileOp(ctx, key, sb, arg, stdin, stdout, stderr, limit)
		if gone {
			m.forget(key)
			return 0, coded(ctx, err, key)
		}
		return exit, err
	}
}

// execFileOp runs one file operation in sb. gone reports a sandbox found stopped or removed before anything
// ran (nothing was read of stdin), which the caller may provide again.
func (m *Manager) execFileOp(ctx context.Context, key identity.Key, sb *driver.Sandbox, arg string, stdin io.Reader, stdout, stderr io.Writer, limit int64) (exit int, gone bool, err error) {
	preq := agentproto.Request{
		Version: agentproto.Version, ID: m.nextID.Add(1), Argv: []string{driver.AgentPath, "fs", arg},
		TimeoutMS: MaxTimeout.Milliseconds(), GraceMS: m.cfg.Grace.Milliseconds(),
		StdoutLimit: max(limit, 1), StderrLimit: fileOpStderr, Stdin: stdin != nil, Stream: true,
	}
	var in *touchedReader
	out := driver.Output{Stdout: stdout, Stderr: stderr}
	if stdin != nil {
		in = &touchedReader{r: stdin}
		out.Stdin = in
	}
	m.home.Touch(key, m.cfg.Now())
	res, err := m.drv.Exec(ctx, sb, preq, out)
	m.home.Touch(key, m.cfg.Now())
	switch {
	case err == nil && (res.TimedOut || res.StdoutTruncated || res.StartError != ""):
		return 0, false, fmt.Errorf("%w: the file operation in sandbox %s did not complete (timed out %v, output over its bound %v, start error %q)",
			files.ErrAgent, sb.Name, res.TimedOut, res.StdoutTruncated, res.StartError)
	case err == nil:
		return res.ExitCode, false, nil
	case ctx.Err() == nil && (in == nil || !in.touched.Load()) && (cerrdefs.IsNotFound(err) || cerrdefs.IsConflict(err)):
		return 0, true, err
	case errors.Is(err, agentproto.ErrProtocol):
		m.recycle(ctx, key, sb, err)
		return 0, false, fault.Wrap(err, fault.AgentProtocol, "the sandbox was recycled; try again (files in /workspace are kept)",
			"the agent in sandbox %s stopped answering correctly during a file operation", sb.Name)
	case ctx.Err() != nil:
		return 0, false, ctx.Err()
	default:
		return 0, false, coded(ctx, err, key)
	}
}

// touchedReader notes whether anything was read from r.
type touchedReader struct {
	r       io.Reader
	touched atomic.Bool
}

func (t *touchedReader) Read(p []byte) (int, error) {
	t.touched.Store(true)
	return t.r.Read(p)
}
