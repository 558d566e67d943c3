package lifecycle

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// postCreateTail is how much of a failed post-create's output the error quotes.
const postCreateTail = 2 << 10

// postCreate runs the configured post-create command in a sandbox that was just created. It runs through the
// engine's exec (the channel may not be up yet) with its own deadline. On failure the sandbox is removed, so
// that a half-prepared sandbox never serves a command and the next run tries again.
func (m *Manager) postCreate(ctx context.Context, key identity.Key, sb *driver.Sandbox, sh *Shape) error {
	if sh.cfg.PostCreate == "" {
		return nil
	}
	res, out, took, err := m.setupCommand(ctx, sb, sh, sh.cfg.PostCreate, LogPostCreate)
	m.emit(ctx, events.NameSandboxPostCreate, events.SandboxPostCreate{ExitCode: res.ExitCode, TimedOut: res.TimedOut,
		DurationMS: took.Milliseconds()})
	if err == nil && res.ExitCode == 0 && !res.TimedOut {
		return nil
	}
	m.recycle(ctx, key, sb, fmt.Errorf("post_create failed"))
	why := failure(res, err, sh.cfg.PostCreateTimeout)
	if err == nil && !res.TimedOut && res.ExitCode == 127 {
		why += " (is there a sh in the image?)"
	}
	return fault.New(fault.PostCreateFailed, "fix post_create in the spec; the sandbox was removed and the next run tries again",
		"post_create %s in the new sandbox %s; its output ended with: %q", why, sb.Name, strings.TrimSpace(out.String()))
}

// setupCommand runs one of the sandbox's own setup command lines (post_create, postStart) through the engine's
// exec with the setup deadline, keeping the tail of its output; the whole output goes to the run log as source,
// followed by how it ended.
func (m *Manager) setupCommand(ctx context.Context, sb *driver.Sandbox, sh *Shape, line, source string) (agentproto.Result, *tail, time.Duration, error) {
	out := &tail{}
	var w io.Writer = out
	if lw := logWriter(ctx, source); lw != nil {
		w = &lockedWriter{w: io.MultiWriter(out, lw)} // stdout and stderr are copied at once
	}
	req := agentproto.Request{
		Version: agentproto.Version, ID: m.nextID.Add(1), Argv: []string{"sh", "-c", line},
		Workdir: sh.workdir(), TimeoutMS: sh.cfg.PostCreateTimeout.Milliseconds(),
		GraceMS: m.cfg.Grace.Milliseconds(), StdoutLimit: agentproto.DefaultLimit, StderrLimit: agentproto.DefaultLimit,
	}
	start := time.Now()
	res, err := m.drv.Exec(ctx, sb, req, driver.Output{Stdout: w, Stderr: w})
	took := time.Since(start)
	logf(ctx, source, "%s in sandbox %s: %s after %dms", source, sb.Name, failureOrOK(res, err, sh.cfg.PostCreateTimeout), took.Milliseconds())
	return res, out, took, err
}

// failureOrOK says how a setup command ended.
func failureOrOK(res agentproto.Result, err error, timeout time.Duration) string {
	if err == nil && !res.TimedOut && res.ExitCode == 0 {
		return "exited 0"
	}
	return failure(res, err, timeout)
}

// lockedWriter serializes writes to w from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// failure says in a few words how a setup command failed.
func failure(res agentproto.Result, err error, timeout time.Duration) string {
	switch {
	case err != nil:
		return err.Error()
	case res.TimedOut:
		return "timed out after " + timeout.String()
	}
	return fmt.Sprintf("exited %d", res.ExitCode)
}

// workdir is where the shape's commands start: its workspace folder, else /workspace.
func (s *Shape) workdir() string {
	if f := s.cfg.WorkspaceFolder; f != "" {
		return f
	}
	return driver.WorkspaceDir
}

// postStart runs the configured post-start command in a sandbox that was just started (created, or started
// again after a stop). A failure fails the command that started it with the exit status and output tail; the
// sandbox is kept, so its next start runs postStart again.
func (m *Manager) postStart(ctx context.Context, sb *driver.Sandbox, sh *Shape) error {
	if sh.cfg.PostStart == "" {
		return nil
	}
	res, out, took, err := m.setupCommand(ctx, sb, sh, sh.cfg.PostStart, LogPostStart)
	m.emit(ctx, events.NameSandboxPostStart, events.SandboxPostStart{ExitCode: res.ExitCode, TimedOut: res.TimedOut,
		DurationMS: took.Milliseconds(), OutputTail: tailOf(out.String(), eventTail)})
	if err == nil && res.ExitCode == 0 && !res.TimedOut {
		return nil
	}
	why := failure(res, err, sh.cfg.PostCreateTimeout)
	return fault.New(fault.PostCreateFailed, "fix postStartCommand in devcontainer.json; the sandbox is kept and its next start runs it again",
		"postStartCommand %s in sandbox %s; its output ended with: %q", why, sb.Name, strings.TrimSpace(out.String()))
}

// eventTail bounds the output a lifecycle command's event carries.
const eventTail = 1 << 10

// tailOf is the last n bytes of s.
func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// tail keeps the last postCreateTail bytes written to it.
type tail struct{ b []byte }

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > postCreateTail {
		t.b = t.b[len(t.b)-postCreateTail:]
	}
	return len(p), nil
}

func (t *tail) String() string { return string(t.b) }
