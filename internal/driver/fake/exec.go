package fake

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
)

// drainBound is how long Exec keeps reading output after the command's process group was killed. Only a process
// that left the group (setsid) can hold the pipes longer; its output is then cut.
const drainBound = 2 * time.Second

// Exec runs req.Argv on this host, in the sandbox's workspace directory, in a new process group, and streams its
// output to out within the request's limits. It behaves as the agent does: on the deadline the group gets
// SIGTERM, then SIGKILL after GraceMS (TimedOut, exit 128+signal); when the command's leader exits, whatever is
// left of its group is killed; on ctx cancellation the group is killed and the error wraps ctx.Err().
//
// A sandbox that is not running is errdefs.ErrConflict; an absent one errdefs.ErrNotFound; a workdir outside
// /workspace errdefs.ErrInvalidArgument. A command that cannot start is a result (127 not found, 126 otherwise),
// not an error. If Stop or Remove kills the command, the error wraps agentproto.ErrProtocol, as a cut stream does.
//
// With req.Stdin and out.Stdin set, Exec copies out.Stdin to the command and does not return before that copy
// ends: a reader that blocks must be closed by its owner.
func (d *Driver) Exec(ctx context.Context, sb *driver.Sandbox, req agentproto.Request, out driver.Output) (agentproto.Result, error) {
	res := agentproto.Result{ID: req.ID}
	if err := d.enter(OpExec); err != nil {
		return res, err
	}
	if h := d.currentHooks().BeforeExec; h != nil {
		h(sb, req)
	}
	if err := ctx.Err(); err != nil { // do not start what would be killed at once
		return res, fmt.Errorf("exec in %s: %w", sb.Name, err)
	}
	if len(req.Argv) == 0 {
		return res, fmt.Errorf("exec in %s: empty argv: %w", sb.Name, errdefs.ErrInvalidArgument)
	}
	rel, err := workdirRel(req.Workdir)
	if err != nil {
		return res, fmt.Errorf("exec in %s: %w", sb.Name, err)
	}
	p, b, err := d.register(sb)
	if err != nil {
		return res, err
	}
	defer d.unregister(b, p)

	start := time.Now()
	res, err = p.run(ctx, req, b.workspace, rel, b.env, out)
	res.DurationMS = time.Since(start).Milliseconds()
	switch {
	case err != nil:
		return res, fmt.Errorf("exec in %s: %w", sb.Name, err)
	case res.Cancelled:
		return res, fmt.Errorf("exec in %s: %w", sb.Name, ctx.Err())
	case p.killedBy() != nil:
		return res, fmt.Errorf("exec in %s: %w", sb.Name, p.killedBy())
	}
	return res, nil
}

// workdirRel maps a workdir under /workspace to a path relative to the workspace directory.
func workdirRel(workdir string) (string, error) {
	clean := path.Clean("/" + workdir)
	if workdir == "" || !path.IsAbs(workdir) {
		return "", fmt.Errorf("workdir %q is not absolute: %w", workdir, errdefs.ErrInvalidArgument)
	}
	if clean == driver.WorkspaceDir {
		return ".", nil
	}
	rel, ok := strings.CutPrefix(clean, driver.WorkspaceDir+"/")
	if !ok {
		return "", fmt.Errorf("workdir %q is outside %s: %w", workdir, driver.WorkspaceDir, errdefs.ErrInvalidArgument)
	}
	return rel, nil
}

// execBox is what a running command needs of its sandbox, copied under the lock.
type execBox struct {
	box       *box
	workspace string
	env       []string
}

// register checks that sb is running and records a new command in it, so that Stop and Remove can kill it.
func (d *Driver) register(sb *driver.Sandbox) (*proc, *execBox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.lookup(sb)
	if b == nil {
		return nil, nil, fmt.Errorf("exec in %s: %w", sb.Name, errdefs.ErrNotFound)
	}
	if b.sb.State != driver.StateRunning {
		return nil, nil, fmt.Errorf("exec in %s: sandbox is %s, not running: %w", sb.Name, b.sb.State, errdefs.ErrConflict)
	}
	p := &proc{done: make(chan struct{})}
	b.procs[p] = struct{}{}
	return p, &execBox{box: b, workspace: b.workspace, env: b.env}, nil
}

func (d *Driver) unregister(b *execBox, p *proc) {
	d.mu.Lock()
	delete(b.box.procs, p)
	d.mu.Unlock()
	close(p.done)
}

// proc is one running command as Stop and Remove see it. Signals asked for before the process exists are kept
// and delivered when it starts; after it is reaped they are dropped, so a reused pid is never signalled.
type proc struct {
	done chan struct{} // closed when Exec is finished with the process

	mu      sync.Mutex
	pgid    int            // 0: not started; -1: reaped
	pending syscall.Signal // strongest signal asked for before the start
	reason  error          // why the sandbox killed the command; nil when it ended on its own
}

func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.pgid == 0:
		if p.pending != syscall.SIGKILL {
			p.pending = sig
		}
	case p.pgid > 0:
		// The leader is not reaped before pgid is set to -1 (see run), so the group id cannot be reused yet.
		_ = syscall.Kill(-p.pgid, sig)
	}
}

func (p *proc) kill(reason error, sig syscall.Signal) {
	p.mu.Lock()
	if p.reason == nil {
		p.reason = reason
	}
	p.mu.Unlock()
	p.signal(sig)
}

func (p *proc) killedBy() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reason
}

func (p *proc) setPgid(pgid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pgid = pgid
	if pgid > 0 && p.pending != 0 {
		_ = syscall.Kill(-pgid, p.pending)
	}
}

// stopProcs kills commands as a container stop does: SIGTERM, grace, SIGKILL, each wait bounded by ctx.
func stopProcs(ctx context.Context, procs []*proc, grace time.Duration, reason error) {
	if len(procs) == 0 {
		return
	}
	if grace > 0 {
		for _, p := range procs {
			p.kill(reason, syscall.SIGTERM)
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		waitProcs(ctx, procs, t.C)
	}
	for _, p := range procs {
		p.kill(reason, syscall.SIGKILL)
	}
	waitProcs(ctx, procs, nil)
}

func waitProcs(ctx context.Context, procs []*proc, timeout <-chan time.Time) {
	for _, p := range procs {
		select {
		case <-p.done:
		case <-timeout:
			return
		case <-ctx.Done():
			return
		}
	}
}

// run starts the command, supervises it to its end and reports its status.
func (p *proc) run(ctx context.Context, req agentproto.Request, workspace, rel string, env []string, out driver.Output) (agentproto.Result, error) {
	res := agentproto.Result{ID: req.ID}
	dir, err := makeWorkdir(workspace, rel)
	if err != nil {
		return startFailed(res, err), nil
	}
	s, err := newStreams(req, out)
	if err != nil {
		return res, err
	}
	defer s.closeAll()

	cmd := exec.Command(req.Argv[0], req.Argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(append(env, "HOME="+workspace), req.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the group is what timeouts and stops kill
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s.childStdin(), s.outW, s.errW
	if err := cmd.Start(); err != nil {
		p.setPgid(-1)
		return startFailed(res, err), nil
	}
	p.setPgid(cmd.Process.Pid)
	s.start(out)

	exited := make(chan struct{})
	go func() { // owner: run, which always receives from exited below
		waitExitNoReap(cmd.Process.Pid)
		close(exited)
	}()
	res.TimedOut, res.Cancelled = supervise(ctx, p, req, exited)
	p.signal(syscall.SIGKILL) // the command's tree does not outlive its leader
	s.drain(drainBound)
	_ = cmd.Wait() // reaps the leader; its status is in ProcessState
	p.setPgid(-1)

	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	res.ExitCode, res.Signal = agentproto.ExitFromWait(ws)
	res.StdoutTruncated, res.StderrTruncated = s.outLim.Truncated(), s.errLim.Truncated()
	return res, s.writeErr()
}

func makeWorkdir(workspace, rel string) (string, error) {
	root, err := os.OpenRoot(workspace)
	if err != nil {
		return "", err
	}
	defer root.Close()
	if err := root.MkdirAll(rel, 0o755); err != nil {
		return "", err
	}
	return workspace + "/" + rel, nil
}

// startFailed reports a command that could not start as the agent does: 127 when not found, 126 otherwise.
func startFailed(res agentproto.Result, err error) agentproto.Result {
	res.ExitCode = 126
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		res.ExitCode = 127
	}
	res.StartError = err.Error()
	return res
}

// waitExitNoReap blocks until the process exits but leaves it a zombie, so its pid and process group id stay
// reserved while the rest of the group is killed.
func waitExitNoReap(pid int) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// supervise waits for the leader to exit, applying the deadline (SIGTERM, grace, SIGKILL) and ctx (SIGKILL).
func supervise(ctx context.Context, p *proc, req agentproto.Request, exited <-chan struct{}) (timedOut, cancelled bool) {
	var deadline, grace <-chan time.Time
	if req.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		deadline = t.C
	}
	done := ctx.Done()
	for {
		select {
		case <-exited:
			return timedOut, cancelled
		case <-deadline:
			timedOut, deadline = true, nil
			p.signal(syscall.SIGTERM)
			g := time.NewTimer(time.Duration(max(req.GraceMS, 0)) * time.Millisecond)
			defer g.Stop()
			grace = g.C
		case <-grace:
			grace = nil
			p.signal(syscall.SIGKILL)
		case <-done:
			cancelled, done = true, nil
			p.signal(syscall.SIGKILL)
		}
	}
}

// streams are a command's pipes and the goroutines that copy them. run owns them: drain waits for the copiers.
type streams struct {
	outR, outW, errR, errW *os.File
	inR, inW               *os.File // nil without stdin
	outLim, errLim         *agentproto.Limiter

	wg     sync.WaitGroup // the copiers
	mu     sync.Mutex     // guards werr
	werr   error          // the first error writing to out
	closed sync.Once
}

func newStreams(req agentproto.Request, out driver.Output) (*streams, error) {
	s := &streams{outLim: agentproto.NewLimiter(req.StdoutLimit), errLim: agentproto.NewLimiter(req.StderrLimit)}
	var err error
	if s.outR, s.outW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if s.errR, s.errW, err = os.Pipe(); err != nil {
		s.closeAll()
		return nil, err
	}
	if req.Stdin && out.Stdin != nil {
		if s.inR, s.inW, err = os.Pipe(); err != nil {
			s.closeAll()
			return nil, err
		}
	}
	return s, nil
}

// childStdin is the command's stdin: the pipe, or nil for /dev/null.
func (s *streams) childStdin() io.Reader {
	if s.inR == nil {
		return nil
	}
	return s.inR
}

// start closes the parent's copies of the child's ends, so that EOF comes when the group dies, and starts the
// copiers.
func (s *streams) start(out driver.Output) {
	closeFiles(s.outW, s.errW, s.inR)
	s.wg.Go(func() { s.copyOut(s.outR, s.outLim, out.Stdout) })
	s.wg.Go(func() { s.copyOut(s.errR, s.errLim, out.Stderr) })
	if s.inW != nil {
		s.wg.Go(func() {
			_, _ = io.Copy(s.inW, out.Stdin) // ends at the reader's EOF or when the command's stdin closes
			_ = s.inW.Close()
		})
	}
}

// copyOut reads a stream to its end, passing what the limit allows to w. It never stops reading early, so a
// failed consumer never blocks the command.
func (s *streams) copyOut(r *os.File, lim *agentproto.Limiter, w io.Writer) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		keep := lim.Write(buf[:n])
		if err != nil {
			keep = append(keep, lim.Flush()...) // at the end, a held-back partial rune is due
		}
		if len(keep) > 0 && w != nil {
			if _, werr := w.Write(keep); werr != nil {
				w = nil
				s.setWriteErr(werr)
			}
		}
		if err != nil {
			return
		}
	}
}

func (s *streams) setWriteErr(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.werr == nil {
		s.werr = fmt.Errorf("write output: %w", err)
	}
}

func (s *streams) writeErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.werr
}

// drain waits for the copiers; after bound it closes the read ends, which ends them.
func (s *streams) drain(bound time.Duration) {
	done := make(chan struct{})
	go func() { // owner: drain, which waits for done in every branch
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-time.After(bound):
	}
	closeFiles(s.outR, s.errR, s.inW)
	<-done
}

func (s *streams) closeAll() {
	s.closed.Do(func() { closeFiles(s.outR, s.outW, s.errR, s.errW, s.inR, s.inW) })
}

// closeFiles closes each non-nil file; closing twice is harmless (os.File reports ErrClosed, ignored).
func closeFiles(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			_ = f.Close()
		}
	}
}
