package host

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// Exec runs req through a fresh `sandkeep-agent serve` child on this host and speaks the agent protocol over its
// stdin and stdout. The request's Workdir (/workspace or below; "" means /workspace) is rewritten to the same
// place under the sandbox's workspace directory; anything else is INVALID_WORKDIR (errdefs.ErrInvalidArgument).
//
// Errors follow driver.Driver: a sandbox that is not running is errdefs.ErrConflict, an absent one
// errdefs.ErrNotFound; a command ended by Stop or Remove, or an agent that broke the protocol, is an error
// wrapping agentproto.ErrProtocol; a cancelled ctx returns the agent's partial result with an error wrapping
// ctx's cause once the command's tree is gone. Exec returns only after the agent process is reaped.
func (d *Driver) Exec(ctx context.Context, sb *driver.Sandbox, req agentproto.Request, out driver.Output) (agentproto.Result, error) {
	res := agentproto.Result{ID: req.ID}
	if err := ctx.Err(); err != nil { // do not start what would be killed at once
		return res, fmt.Errorf("exec in %s: %w", sb.Name, context.Cause(ctx))
	}
	rel, err := workdirRel(req.Workdir)
	if err != nil {
		return res, fmt.Errorf("exec in %s: %w", sb.Name, err)
	}
	p, ws, env, err := d.register(sb, req.Grace())
	if err != nil {
		return res, err
	}
	defer d.unregister(sb, p)

	req.Workdir = filepath.Join(ws, filepath.FromSlash(rel))
	conn, diag, err := p.start(d.agent, ws, env, d.as)
	if err != nil {
		return res, err
	}
	res, runErr := agentproto.RunWith(ctx, conn, req, out.Stdout, out.Stderr, out.Stdin,
		agentproto.RunOptions{Resize: out.Resize})
	exit := p.finish(conn)

	switch reason := p.endedBy(); {
	case runErr != nil && ctx.Err() != nil:
		return res, fmt.Errorf("exec in %s: %w", sb.Name, runErr)
	case reason != nil:
		return res, fmt.Errorf("exec in %s: %w", sb.Name, reason)
	case runErr != nil && errors.Is(runErr, agentproto.ErrProtocol):
		detail := ""
		if exit != nil {
			detail = fmt.Sprintf(" (agent: %v)", exit)
		}
		if s := diag.String(); s != "" {
			detail += fmt.Sprintf(" agent stderr: %q", s)
		}
		return res, fmt.Errorf("exec in %s%s: %w", sb.Name, detail, runErr)
	case runErr != nil:
		return res, fmt.Errorf("exec in %s: %w", sb.Name, runErr)
	}
	return res, nil
}

// workdirRel maps a workdir at or under /workspace to a slash path relative to the workspace ("." for the
// workspace itself). "" is the workspace.
func workdirRel(workdir string) (string, error) {
	if workdir == "" {
		return ".", nil
	}
	bad := func() error {
		return fault.Wrap(errdefs.ErrInvalidArgument, fault.InvalidWorkdir, "use "+driver.WorkspaceDir+" or a directory under it",
			"workdir %q is not under %s", workdir, driver.WorkspaceDir)
	}
	if !path.IsAbs(workdir) || strings.ContainsRune(workdir, 0) {
		return "", bad()
	}
	clean := path.Clean(workdir)
	if clean == driver.WorkspaceDir {
		return ".", nil
	}
	rel, ok := strings.CutPrefix(clean, driver.WorkspaceDir+"/")
	if !ok {
		return "", bad()
	}
	return rel, nil
}

// register checks that sb is running and records a new command in it, so that Stop and Remove can end it.
func (d *Driver) register(sb *driver.Sandbox, grace time.Duration) (*proc, string, []string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.lookup(sb)
	if b == nil {
		return nil, "", nil, fmt.Errorf("exec in %s: %w", sb.Name, errdefs.ErrNotFound)
	}
	if b.sb.State != driver.StateRunning {
		return nil, "", nil, fmt.Errorf("exec in %s: sandbox is %s, not running: %w", sb.Name, b.sb.State, errdefs.ErrConflict)
	}
	p := &proc{done: make(chan struct{}), grace: grace}
	b.procs[p] = struct{}{}
	return p, b.workspace, b.env, nil
}

// unregister forgets p (its sandbox may be gone already) and tells Stop and Remove that it is over.
func (d *Driver) unregister(sb *driver.Sandbox, p *proc) {
	d.mu.Lock()
	if b, ok := d.boxes[sb.Name]; ok {
		delete(b.procs, p)
	}
	d.mu.Unlock()
	close(p.done)
}

// proc is one command's agent process, as Exec, Stop and Remove see it.
type proc struct {
	done  chan struct{} // closed when Exec is finished with the agent (it is reaped)
	grace time.Duration // the command's grace: how long its agent may take to kill it

	mu     sync.Mutex
	cmd    *exec.Cmd // nil until started
	stdin  *os.File  // our end of the agent's stdin; nil once closed
	reaped bool      // the agent was waited for: never signal it again
	reason error     // why Stop or Remove ended the command; nil when it ended on its own
}

// start runs the agent with its stdin and stdout on fresh pipes. It refuses to start once p was ended.
func (p *proc) start(agent, dir string, env []string, as *syscall.Credential) (*pipeConn, *driver.DiagBuffer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reason != nil {
		return nil, nil, p.reason
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("agent pipes: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, nil, fmt.Errorf("agent pipes: %w", err)
	}
	diag := &driver.DiagBuffer{Limit: driver.AgentDiagLimit}
	cmd := &exec.Cmd{
		Path:   agent,
		Args:   []string{agent, "serve"},
		Dir:    dir,
		Env:    env,
		Stdin:  inR,
		Stdout: outW,
		Stderr: diag,
		// The agent's own stderr is copied by a goroutine that Wait waits for; bound it should a descendant
		// ever hold the pipe.
		WaitDelay: time.Second,
		// Its own process group: a Ctrl-C at sandkeep's terminal must not kill the agent (its command, in a
		// session of its own, would then outlive it). sandkeep cancels through the protocol instead.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Credential: as},
	}
	err = cmd.Start()
	inR.Close() // the child has its copies; ours would keep the pipes from reaching EOF
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		hint := "check the host driver's agent path"
		if as != nil && errors.Is(err, fs.ErrPermission) {
			// Start reports a workspace the user cannot reach as the exec's EACCES too.
			hint = fmt.Sprintf("the host user %d:%d (host_passthrough.user) must be able to run the agent and to reach the workspace %s: make the state home's directories traversable by it (mode 0711, e.g. --home /var/lib/sandkeep), not under a 0700 home such as /root", as.Uid, as.Gid, dir)
		}
		return nil, nil, fault.Wrap(err, fault.AgentMissing, hint, "start the agent %s: %v", agent, err)
	}
	p.cmd, p.stdin = cmd, inW
	return &pipeConn{r: outR, w: inW}, diag, nil
}

// closeStdin closes the agent's stdin: an idle agent exits, a busy one kills its command's tree and exits.
func (p *proc) closeStdin() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
}

func (p *proc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !p.reaped {
		_ = p.cmd.Process.Kill()
	}
}

// finish ends the conversation with the agent and reaps it: stdin closed (it exits, after killing a command
// still running), stdout closed (nothing more is read), and SIGKILL if it is not gone within the command's
// grace plus agentproto.ReportSlack. It returns how the agent ended (nil: exit 0).
func (p *proc) finish(conn *pipeConn) error {
	p.closeStdin()
	conn.r.Close()
	waited := make(chan error, 1)
	go func() { waited <- p.cmd.Wait() }()
	timer := time.NewTimer(p.grace + agentproto.ReportSlack)
	defer timer.Stop()
	var err error
	select {
	case err = <-waited:
	case <-timer.C:
		p.kill()
		err = <-waited
	}
	p.mu.Lock()
	p.reaped = true
	p.mu.Unlock()
	return err
}

// end is Stop's and Remove's part: record why and close the agent's stdin.
func (p *proc) end(reason error) {
	p.mu.Lock()
	if p.reason == nil {
		p.reason = reason
	}
	p.mu.Unlock()
	p.closeStdin()
}

func (p *proc) endedBy() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reason
}

// waitEnded waits until Exec is finished with p: at most the command's grace plus agentproto.ReportSlack, then
// the agent is killed and waited for again (until ctx ends).
func (p *proc) waitEnded(ctx context.Context) error {
	timer := time.NewTimer(p.grace + agentproto.ReportSlack)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
	case <-ctx.Done():
	}
	p.kill()
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("end command: %w", context.Cause(ctx))
	}
}

// pipeConn is the agent's stdout (frames in) and stdin (frames out). Its deadlines let agentproto.Run unblock
// its own I/O when it gives up on a broken channel.
type pipeConn struct {
	r *os.File
	w *os.File
}

func (c *pipeConn) Read(b []byte) (int, error)         { return c.r.Read(b) }
func (c *pipeConn) Write(b []byte) (int, error)        { return c.w.Write(b) }
func (c *pipeConn) SetReadDeadline(t time.Time) error  { return c.r.SetReadDeadline(t) }
func (c *pipeConn) SetWriteDeadline(t time.Time) error { return c.w.SetWriteDeadline(t) }
