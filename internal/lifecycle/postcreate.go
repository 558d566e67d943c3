package lifecycle

import (
	"context"
	"fmt"
	"strings"
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
	var out tail
	req := agentproto.Request{
		Version: agentproto.Version, ID: m.nextID.Add(1), Argv: []string{"sh", "-c", sh.cfg.PostCreate},
		Workdir: sh.workdir(), TimeoutMS: sh.cfg.PostCreateTimeout.Milliseconds(),
		GraceMS: m.cfg.Grace.Milliseconds(), StdoutLimit: agentproto.DefaultLimit, StderrLimit: agentproto.DefaultLimit,
	}
	start := time.Now()
	res, err := m.drv.Exec(ctx, sb, req, driver.Output{Stdout: &out, Stderr: &out})
	m.emit(ctx, events.NameSandboxPostCreate, events.SandboxPostCreate{ExitCode: res.ExitCode, TimedOut: res.TimedOut,
		DurationMS: time.Since(start).Milliseconds()})
	if err == nil && res.ExitCode == 0 && !res.TimedOut {
		return nil
	}
	m.recycle(ctx, key, sb, fmt.Errorf("post_create failed"))
	why := fmt.Sprintf("exited %d", res.ExitCode)
	switch {
	case err != nil:
		why = err.Error()
	case res.TimedOut:
		why = "timed out after " + sh.cfg.PostCreateTimeout.String()
	case res.ExitCode == 127:
		why += " (is there a sh in the image?)"
	}
	return fault.New(fault.PostCreateFailed, "fix post_create in the spec; the sandbox was removed and the next run tries again",
		"post_create %s in the new sandbox %s; its output ended with: %q", why, sb.Name, strings.TrimSpace(out.String()))
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
	var out tail
	req := agentproto.Request{
		Version: agentproto.Version, ID: m.nextID.Add(1), Argv: []string{"sh", "-c", sh.cfg.PostStart},
		Workdir: sh.workdir(), TimeoutMS: sh.cfg.PostCreateTimeout.Milliseconds(),
		GraceMS: m.cfg.Grace.Milliseconds(), StdoutLimit: agentproto.DefaultLimit, StderrLimit: agentproto.DefaultLimit,
	}
	start := time.Now()
	res, err := m.drv.Exec(ctx, sb, req, driver.Output{Stdout: &out, Stderr: &out})
	m.emit(ctx, events.NameSandboxPostStart, events.SandboxPostStart{ExitCode: res.ExitCode, TimedOut: res.TimedOut,
		DurationMS: time.Since(start).Milliseconds(), OutputTail: tailOf(out.String(), eventTail)})
	if err == nil && res.ExitCode == 0 && !res.TimedOut {
		return nil
	}
	why := fmt.Sprintf("exited %d", res.ExitCode)
	switch {
	case err != nil:
		why = err.Error()
	case res.TimedOut:
		why = "timed out after " + sh.cfg.PostCreateTimeout.String()
	}
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
