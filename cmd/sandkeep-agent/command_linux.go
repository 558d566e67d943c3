package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// outputChunk is the largest read from a command's pipe, so the largest 'O'/'E' payload (< MaxFrame).
const outputChunk = 32 << 10

// stdinQueue bounds the stdin frames waiting for a command that does not read: beyond it the agent stops
// reading frames until the command reads or ends (its deadline still applies).
const stdinQueue = 16

// defaultPath is searched when the environment has no PATH, as a shell would.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// command is one request being run. The server goroutine owns stdin and stdinShut and calls feed, closeStdin
// and cancel; run owns the rest.
type command struct {
	req      agentproto.Request
	received time.Time
	srv      *server

	stdin     chan []byte // stdin frames for the feeder; nil when the command's stdin is /dev/null
	stdinShut bool        // stdin was closed (an 'i' frame)

	ptyMu   sync.Mutex             // guards pty and resized
	pty     *os.File               // a TTY command's terminal master while it runs, for resize; nil otherwise
	resized *agentproto.WindowSize // the last size asked for before the terminal was open

	cancelOnce sync.Once
	cancelled  chan struct{} // closed by cancel
	reaped     chan struct{} // closed when the whole tree is gone (or nothing was started)
	pid        atomic.Int64  // the command's pid once it runs (its process group's id: it leads a session)
	fgStatus   <-chan syscall.WaitStatus
	done       chan struct{} // closed after the report was sent
}

func newCommand(req agentproto.Request, received time.Time, srv *server) *command {
	c := &command{
		req: req, received: received, srv: srv,
		cancelled: make(chan struct{}),
		reaped:    make(chan struct{}),
		done:      make(chan struct{}),
	}
	if req.Stdin {
		c.stdin = make(chan []byte, stdinQueue)
	}
	return c
}

// feed queues stdin bytes; it blocks while the queue is full, until the command reads or its tree is gone.
func (c *command) feed(p []byte) {
	if c.stdin == nil || c.stdinShut {
		return
	}
	select {
	case c.stdin <- p:
	case <-c.reaped:
	}
}

func (c *command) closeStdin() {
	if c.stdin != nil && !c.stdinShut {
		c.stdinShut = true
		close(c.stdin)
	}
}

func (c *command) cancel() { c.cancelOnce.Do(func() { close(c.cancelled) }) }

// signal sends sig to the command's process group (a shell's children with it, as a terminal's Ctrl-C would);
// before the command runs or once its tree is gone it does nothing.
func (c *command) signal(sig syscall.Signal) {
	pid := int(c.pid.Load())
	if pid <= 0 {
		return
	}
	select {
	case <-c.reaped:
		return
	default:
	}
	if err := syscall.Kill(-pid, sig); err == syscall.ESRCH {
		_ = syscall.Kill(pid, sig) // it left its group: the command itself still gets it
	}
}

// resize sets a TTY command's window size; for any other command, or one whose terminal is closed, it does
// nothing.
func (c *command) resize(ws agentproto.WindowSize) {
	c.ptyMu.Lock()
	defer c.ptyMu.Unlock()
	if c.pty != nil {
		_ = setWindow(c.pty, ws) // a terminal already closed: the command is over
		return
	}
	c.resized = &ws // the terminal is not open yet: startTTY applies it
}

// run executes the command and sends its report.
func (c *command) run() {
	defer close(c.done)
	res := c.execute()
	res.ID = c.req.ID
	res.DurationMS = time.Since(c.received).Milliseconds()
	c.srv.report(res)
}

// execute starts the command, supervises it until its whole tree is gone and its output drained, and returns
// the result without ID and duration.
func (c *command) execute() agentproto.Result {
	dir, err := workdir(c.req.Workdir)
	if err != nil {
		return c.startFailed(126, err.Error())
	}
	env := mergeEnv(os.Environ(), c.req.Env)
	path, code, msg := lookPath(c.req.Argv[0], dir, env)
	if code != 0 {
		return c.startFailed(code, msg)
	}
	p, err := c.startProcess(path, dir, env)
	if err != nil {
		return c.startFailed(startCode(err), c.req.Argv[0]+": "+errText(err))
	}
	return c.supervise(p)
}

// proc is a started command: its pid and the agent's ends of its pipes.
type proc struct {
	pid            int
	stdout, errs   *os.File // a TTY command: stdout is the terminal's master, errs is nil
	stdin          *os.File // nil when the command's stdin is /dev/null; a TTY command's: a dup of the master
	outLim, errLim *agentproto.Limiter
}

// startProcess starts argv in a new session with pipes for stdout and stderr (and stdin when asked for), and
// closes the agent's copies of the command's ends, so that the pipes reach EOF when the last writer dies.
func (c *command) startProcess(path, dir string, env []string) (*proc, error) {
	if c.req.TTY != nil {
		return c.startTTY(path, dir, env)
	}
	var files []*os.File // the command's ends, closed once it has them
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	p := &proc{outLim: agentproto.NewLimiter(c.req.StdoutLimit), errLim: agentproto.NewLimiter(c.req.StderrLimit)}
	var in *os.File
	var err error
	if c.stdin != nil {
		if in, p.stdin, err = os.Pipe(); err != nil {
			return nil, err
		}
	} else if in, err = os.Open(os.DevNull); err != nil {
		return nil, err
	}
	files = append(files, in)
	outR, outW, err := os.Pipe()
	if err != nil {
		p.closeAll()
		return nil, err
	}
	p.stdout = outR
	files = append(files, outW)
	errR, errW, err := os.Pipe()
	if err != nil {
		p.closeAll()
		return nil, err
	}
	p.errs = errR
	files = append(files, errW)
	// os.StartProcess rather than os/exec: no copy goroutines, and no Wait (the agent reaps with wait4(-1)).
	if err := c.spawn(p, path, &os.ProcAttr{
		Dir:   dir,
		Env:   env,
		Files: []*os.File{in, outW, errW},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	}); err != nil {
		p.closeAll()
		return nil, err
	}
	return p, nil
}

// startTTY starts argv in a new session whose controlling terminal is a new pseudo-terminal; the agent keeps
// the master (output, and input when the request has stdin) and closes its copy of the slave once the command
// has it, so that the master reads EIO when the last process holding the terminal is gone.
func (c *command) startTTY(path, dir string, env []string) (*proc, error) {
	master, slave, err := openPTY(*c.req.TTY)
	if err != nil {
		return nil, err
	}
	defer slave.Close()
	p := &proc{stdout: master, outLim: agentproto.NewLimiter(c.req.StdoutLimit), errLim: agentproto.NewLimiter(c.req.StderrLimit)}
	if c.stdin != nil {
		if p.stdin, err = dupFile(master); err != nil {
			p.closeAll()
			return nil, err
		}
	}
	if err := c.spawn(p, path, &os.ProcAttr{
		Dir:   dir,
		Env:   env,
		Files: []*os.File{slave, slave, slave},
		Sys:   &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0},
	}); err != nil {
		p.closeAll()
		return nil, err
	}
	c.ptyMu.Lock()
	c.pty = master
	if c.resized != nil {
		_ = setWindow(master, *c.resized)
	}
	c.ptyMu.Unlock()
	return p, nil
}

// spawn starts the command through the reaper, which hands its exit status to c.fgStatus.
func (c *command) spawn(p *proc, path string, attr *os.ProcAttr) error {
	pid, status, err := c.srv.reaper.start(func() (int, error) {
		process, err := os.StartProcess(path, c.req.Argv, attr)
		if err != nil {
			return 0, err
		}
		pid := process.Pid
		_ = process.Release() // frees the pidfd (and clears Pid); the process itself is reaped by the reaper
		return pid, nil
	})
	if err != nil {
		return err
	}
	p.pid = pid
	c.fgStatus = status
	c.pid.Store(int64(pid))
	if c.req.Started {
		c.send(agentproto.FrameStarted, agentproto.EncodePID(pid))
	}
	return nil
}

func (p *proc) closeAll() {
	for _, f := range []*os.File{p.stdout, p.errs, p.stdin} {
		if f != nil {
			f.Close()
		}
	}
}

// startFailed reports a command that could not start: the reason goes to the command's stderr stream (as a
// shell would print it) and to StartError.
func (c *command) startFailed(code int, msg string) agentproto.Result {
	close(c.reaped) // nothing was started, so nothing is left to wait for
	lim := agentproto.NewLimiter(c.req.StderrLimit)
	c.send(agentproto.FrameStderr, lim.Write([]byte("sandkeep-agent: "+msg+"\n")))
	c.send(agentproto.FrameStderr, lim.Flush())
	return agentproto.Result{ExitCode: code, StartError: msg, StderrTruncated: lim.Truncated()}
}

// supervise runs a started command to the end: until the foreground process exits, the deadline passes or
// the host cancels; then it kills whatever is left of the tree, drains the output and builds the result.
func (c *command) supervise(p *proc) agentproto.Result {
	fgStatus := c.fgStatus
	var pumps, feeder sync.WaitGroup
	pumps.Add(1)
	go func() { defer pumps.Done(); c.pump(p.stdout, agentproto.FrameStdout, p.outLim) }()
	if p.errs != nil {
		pumps.Add(1)
		go func() { defer pumps.Done(); c.pump(p.errs, agentproto.FrameStderr, p.errLim) }()
	}
	if p.stdin != nil {
		feeder.Add(1)
		go func() { defer feeder.Done(); c.feedStdin(p.stdin) }()
	}

	var res agentproto.Result
	deadline := time.NewTimer(c.req.Timeout() - time.Since(c.received))
	defer deadline.Stop()
	var ws syscall.WaitStatus
	exited := false
	select {
	case ws = <-fgStatus:
		exited = true
	case <-deadline.C:
		res.TimedOut = true
	case <-c.cancelled:
		res.Cancelled = true
	}
	// Always: after a normal exit this ends the background processes, so none outlives its command.
	c.srv.tree.kill(c.req.Grace())
	if !exited {
		ws = <-fgStatus // the foreground is dead by now; the reaper passes its status on as it collects it
	}
	close(c.reaped)
	if p.stdin != nil {
		_ = p.stdin.SetWriteDeadline(time.Unix(1, 0)) // no reader is left; never block the feeder
	}
	feeder.Wait()
	c.drain(p, &pumps)
	res.ExitCode, res.Signal = agentproto.ExitFromWait(ws)
	res.StdoutTruncated = p.outLim.Truncated()
	res.StderrTruncated = p.errLim.Truncated()
	return res
}

// drainBound is how long the output may keep flowing once the tree is gone. Only a process outside the tree
// (one handed the pipe over a socket) can hold it open that long; the agent then stops reading.
const drainBound = 2 * time.Second

// drain waits for both output pipes to reach EOF, then closes them.
func (c *command) drain(p *proc, pumps *sync.WaitGroup) {
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	t := time.NewTimer(drainBound)
	defer t.Stop()
	select {
	case <-drained:
	case <-t.C:
		_ = p.stdout.SetReadDeadline(time.Unix(1, 0))
		if p.errs != nil {
			_ = p.errs.SetReadDeadline(time.Unix(1, 0))
		}
		<-drained
	}
	c.ptyMu.Lock()
	c.pty = nil
	c.ptyMu.Unlock()
	p.closeAll()
}

// pump streams one output pipe (or a terminal's master, which reads EIO once no process holds the terminal):
// each chunk goes out as soon as it is read, within the limit; past the limit
// the pipe is still read to EOF and discarded (discard), so the command never blocks on a full pipe.
func (c *command) pump(r *os.File, t agentproto.FrameType, lim *agentproto.Limiter) {
	buf := make([]byte, outputChunk)
	for !lim.Truncated() {
		n, err := r.Read(buf)
		if n > 0 {
			c.send(t, lim.Write(buf[:n]))
		}
		if err != nil {
			c.send(t, lim.Flush())
			return
		}
	}
	discard(r)
}

// Past the output limit, discard reads in batches: discardPipe is the size the pipe is grown to (the kernel's
// default pipe-max-size), discardChunk the read size, and discardPause how long discard waits after a read that
// emptied the pipe, so the writer's small writes pile up for the next read instead of waking the agent one by one.
const (
	fSetPipeSz   = 1031 // F_SETPIPE_SZ from <linux/fcntl.h>
	discardPipe  = 1 << 20
	discardChunk = 256 << 10
	discardPause = time.Millisecond
)

// discard reads r to its end (EOF, EIO, or the read deadline drain sets) and drops the bytes. A flood past the
// limit then costs the agent one read per batch instead of one per write of the command: under gVisor's
// ptrace platform, where every system call is a round trip to the Sentry, waking per 4 KiB write made a 1 GB
// flood take minutes.
func discard(r *os.File) {
	if rc, err := r.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			// Best effort: a terminal has no pipe size, and a user over its pipe quota keeps the default.
			_, _, _ = syscall.Syscall(syscall.SYS_FCNTL, fd, fSetPipeSz, discardPipe)
		})
	}
	buf := make([]byte, discardChunk)
	for {
		n, err := r.Read(buf)
		if err != nil {
			return
		}
		if n < len(buf) {
			time.Sleep(discardPause)
		}
	}
}

// send writes an output frame. A failure means the host is gone; the agent learns it from stdin EOF and
// keeps draining meanwhile.
func (c *command) send(t agentproto.FrameType, p []byte) {
	if len(p) > 0 {
		_ = c.srv.fw.WriteFrame(t, c.req.ID, p)
	}
}

// feedStdin writes queued stdin frames to the command until the host closes stdin or the tree is gone. When
// the command stops reading (EPIPE), later frames are dropped.
func (c *command) feedStdin(w *os.File) {
	defer w.Close()
	broken := false
	for {
		select {
		case b, ok := <-c.stdin:
			if !ok {
				return
			}
			if !broken {
				_, err := w.Write(b)
				broken = err != nil
			}
		case <-c.reaped:
			return
		}
	}
}

// workdir makes sure the command's directory exists; "" keeps the agent's own.
func workdir(dir string) (string, error) {
	if dir == "" {
		return "", nil
	}
	fi, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", errors.New("workdir " + dir + ": " + errText(err))
		}
		return dir, nil
	}
	if err != nil {
		return "", errors.New("workdir " + dir + ": " + errText(err))
	}
	if !fi.IsDir() {
		return "", errors.New("workdir " + dir + ": not a directory")
	}
	return dir, nil
}

// mergeEnv returns base followed by extra, where a later entry for a key replaces an earlier one in place.
func mergeEnv(base, extra []string) []string {
	out := make([]string, 0, len(base)+len(extra))
	at := make(map[string]int, len(base)+len(extra))
	for _, kv := range append(base[:len(base):len(base)], extra...) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := at[k]; ok {
			out[i] = kv
			continue
		}
		at[k] = len(out)
		out = append(out, kv)
	}
	return out
}

// lookupEnv returns the value of key in env, the last entry winning.
func lookupEnv(env []string, key string) (string, bool) {
	val, found := "", false
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			val, found = v, true
		}
	}
	return val, found
}

// lookPath resolves argv[0] as a shell would: a name with a slash is a path (relative to the workdir), any
// other is searched in the command's PATH. It returns 127 (not found) or 126 (found but not executable) and a
// message when the command cannot run.
func lookPath(name, dir string, env []string) (path string, code int, msg string) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) && dir != "" {
			p = filepath.Join(dir, p)
		}
		if code, why := checkExec(p); code != 0 {
			return "", code, name + ": " + why
		}
		return p, 0, ""
	}
	search, ok := lookupEnv(env, "PATH")
	if !ok {
		search = defaultPath
	}
	denied := false
	for _, d := range filepath.SplitList(search) {
		if d == "" {
			d = "." // an empty PATH element is the current directory
		}
		if !filepath.IsAbs(d) && dir != "" {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, name)
		switch code, _ := checkExec(p); code {
		case 0:
			return p, 0, ""
		case 126:
			denied = true
		}
	}
	if denied {
		return "", 126, name + ": permission denied"
	}
	return "", 127, name + ": command not found"
}

// checkExec returns 0 when p is an executable file for this user, 127 when it does not exist, 126 otherwise.
func checkExec(p string) (code int, why string) {
	fi, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return 127, "no such file or directory"
		}
		return 126, errText(err)
	}
	if fi.IsDir() {
		return 126, "is a directory"
	}
	if err := syscall.Access(p, 1); err != nil { // X_OK, as this user (root needs one x bit)
		return 126, "permission denied"
	}
	return 0, ""
}

// startCode maps a failed exec to the shell's convention: 127 not found (e.g. a missing script interpreter),
// 126 anything else (permission denied, exec format error...).
func startCode(err error) int {
	if errors.Is(err, os.ErrNotExist) {
		return 127
	}
	return 126
}

// errText is the bare reason of an error: "permission denied", not the full path error.
func errText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}
