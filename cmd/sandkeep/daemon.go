package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gofrs/flock"
	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/cmd/sandkeep/internal/fastpath"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
)

// The local daemon: one process per state home that owns its sandboxes' channels, egress proxies and the
// sweeper, and runs the CLI's commands for the CLI processes of its owner (and root) over a Unix socket in the
// home. A call through it runs the very same command code as in-process, on the daemon's long-lived Manager and
// store, with the caller's arguments and streams: output, exit statuses and errors are those of in-process work.
//
// The daemon runs with one operator environment (the one it was started with). A caller whose operator input
// differs (a SANDKEEP_* variable, DOCKER_HOST, KUBECONFIG, PATH, a global flag, the config file's content) is
// not served: with SANDKEEP_DAEMON=auto it works in-process, with on it is refused (DAEMON_MISMATCH).
const (
	envDaemon     = fastpath.EnvDaemon     // auto (default), on, off
	envDaemonIdle = fastpath.EnvDaemonIdle // how long an auto-started daemon waits idle before it exits (default 10m)

	daemonSocketName = fastpath.SocketName
	daemonLockName   = fastpath.LockName
	daemonLogName    = fastpath.LogName

	defaultDaemonIdle = 10 * time.Minute
	daemonStartWait   = 15 * time.Second // how long a CLI call waits for the daemon it started to answer
	daemonDrainWait   = 30 * time.Second // how long a stopping daemon lets running calls finish
)

// interactive reports whether cmd asks for a terminal (exec -t).
func interactive(cmd *cobra.Command) bool {
	f := cmd.Flags().Lookup("tty")
	return f != nil && f.Changed && f.Value.String() == "true"
}

// routedCommands are the CLI commands that go through the daemon when one runs.
var routedCommands = map[string]bool{"exec": true, "ps": true, "stop": true, "rm": true, "runs": true, "events": true, "doctor": true,
	"port-forward": true, "fork": true, "proc": true, "snapshot": true} // port-forward: the daemon holds the channels, so its forwards are streams on them

// The socket protocol's frames (cmd/sandkeep/internal/fastpath, shared with the start-up fast path).
const (
	frameHello    = fastpath.FrameHello
	frameStdin    = fastpath.FrameStdin
	frameStdinEOF = fastpath.FrameStdinEOF
	frameSignal   = fastpath.FrameSignal
	frameAccept   = fastpath.FrameAccept
	frameRefuse   = fastpath.FrameRefuse
	frameStdout   = fastpath.FrameStdout
	frameStderr   = fastpath.FrameStderr
	frameWant     = fastpath.FrameWant
	frameExit     = fastpath.FrameExit

	maxFrame = fastpath.MaxFrame
)

type daemonHello = fastpath.Hello

type daemonStatus struct {
	PID     int       `json:"pid"`
	Home    string    `json:"home"`
	Since   time.Time `json:"since"`
	Auto    bool      `json:"auto"`
	Serve   bool      `json:"serve"`
	Idle    string    `json:"idle_exit,omitempty"`
	Active  int64     `json:"active"`
	Version string    `json:"version"`
}

type frameConn = fastpath.Conn

var readFrame = fastpath.ReadFrame

// daemonMode reads SANDKEEP_DAEMON.
func daemonMode() (string, error) {
	switch v := os.Getenv(envDaemon); v {
	case "", "auto":
		return "auto", nil
	case "on", "off":
		return v, nil
	default:
		return "", fault.New(fault.InvalidArgument, "set "+envDaemon+" to auto, on or off", "%s=%q is not auto, on or off", envDaemon, v)
	}
}

// resolvedHome is the state home these flags and the environment name.
func (g *globals) resolvedHome() string { return fastpath.ResolveHome(g.home) }

// operatorInput is the fingerprint of everything the in-process path reads from the operator besides the
// command line of the call itself (fastpath.Fingerprint): the daemon serves only callers whose input is its own.
func (g *globals) operatorInput() string {
	return fastpath.Fingerprint(fastpath.Globals{Home: g.home, Image: g.image, Agent: g.agent, Transport: g.transport, Store: g.store})
}

// forwarded is the result of a call the daemon ran: its exit status, already reported.
type forwarded struct{ code int }

func (f forwarded) Error() string { return fmt.Sprintf("exit status %d (through the daemon)", f.code) }

// viaDaemon runs cmd through the home's daemon when SANDKEEP_DAEMON allows and one runs (or, in auto mode, can
// be started). handled is false when the call is to run in-process.
func (g *globals) viaDaemon(cmd *cobra.Command) (handled bool, err error) {
	if g.daemon != nil || g.args == nil {
		return false, nil // inside the daemon, or not a command line of ours
	}
	top := cmd
	for top.HasParent() && top.Parent().HasParent() {
		top = top.Parent()
	}
	if !routedCommands[top.Name()] {
		return false, nil
	}
	mode, err := daemonMode()
	if err != nil {
		return true, err
	}
	if mode == "off" || cmd.Flags().Changed("log-level") || interactive(cmd) {
		// --log-level: the Manager's log goes to this process's stderr only in-process. A terminal (exec -t) is
		// this process's: raw mode and window sizes cannot cross the socket's byte streams, so -t runs here.
		return false, nil
	}
	home := g.resolvedHome()
	fc, err := dialDaemon(home)
	if err != nil && mode == "auto" {
		if serr := g.spawnDaemon(home, "--auto"); serr == nil {
			fc, err = waitDaemon(home, daemonStartWait)
		}
	}
	if err != nil {
		if mode == "on" {
			return true, fault.Wrap(err, fault.DaemonUnavailable,
				"start it with 'sandkeep daemon start' (or set SANDKEEP_DAEMON=auto or off)", "no daemon answers on %s", filepath.Join(home, daemonSocketName))
		}
		return false, nil
	}
	defer fc.C.Close()
	hello, _ := json.Marshal(daemonHello{Args: absoluteFlags(cmd, g.args), Fingerprint: g.operatorInput()})
	if err := fc.Write(frameHello, hello); err != nil {
		return g.lost(mode, err, false)
	}
	typ, p, err := fc.Read()
	if err != nil {
		return g.lost(mode, err, false)
	}
	if typ == frameRefuse {
		if mode == "on" {
			var fe struct{ Code, Message, Hint string }
			_ = json.Unmarshal(p, &fe)
			return true, fault.New(fault.Code(fe.Code), fe.Hint, "%s", fe.Message)
		}
		return false, nil
	}
	return true, g.relay(cmd.Context(), fc)
}

// lost reports a daemon that went away. Before the call was accepted, auto mode works in-process.
func (g *globals) lost(mode string, err error, accepted bool) (bool, error) {
	if !accepted && mode == "auto" {
		return false, nil
	}
	return true, fromFastPath(fastpath.Lost(err))
}

// fromFastPath is the fast path's typed error as internal/fault's (the fast path does not import it).
func fromFastPath(f *fastpath.Failure) error {
	return fault.Wrap(f.Err, fault.Code(f.Code), f.Hint, "%s", f.Message)
}

// absoluteFlags rewrites a relative --spec in args to an absolute path: the daemon resolves it elsewhere.
func absoluteFlags(cmd *cobra.Command, args []string) []string {
	f := cmd.Flags().Lookup("spec")
	if f == nil || !f.Changed {
		return args
	}
	return fastpath.AbsoluteSpec(args, f.Value.String())
}

// relay passes the daemon's output to this process's streams, stdin when the command reads it, and an
// interruption of this process to the command, until the daemon sends the exit status (fastpath.Relay).
func (g *globals) relay(ctx context.Context, fc *frameConn) error {
	interrupts := make(chan syscall.Signal, 1)
	stop := context.AfterFunc(ctx, func() {
		if in, ok := interruptedBy(ctx); ok {
			interrupts <- in.sig
		}
	})
	defer stop()
	code, fail := fastpath.Relay(fc, g.stdin, g.stdout, g.stderr, interrupts)
	if fail != nil {
		return fromFastPath(fail)
	}
	return forwarded{code}
}

var dialDaemon = fastpath.Dial

func waitDaemon(home string, bound time.Duration) (*frameConn, error) {
	deadline := time.Now().Add(bound)
	for {
		fc, err := dialDaemon(home)
		if err == nil || time.Now().After(deadline) {
			return fc, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// spawnDaemon starts `sandkeep daemon run FLAGS` in the background, in its own session, with this process's
// environment and global flags, logging to the home.
func (g *globals) spawnDaemon(home string, flags ...string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(home, daemonLogName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{"--home", home}
	for _, f := range []struct{ name, v string }{{"image", g.image}, {"agent", g.agent}, {"transport", g.transport}, {"store", g.store}} {
		if f.v != "" {
			args = append(args, "--"+f.name, f.v)
		}
	}
	args = append(append(args, "daemon", "run"), flags...)
	c := exec.Command(exe, args...)
	c.Stdout, c.Stderr = logf, logf
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := c.Start(); err != nil {
		return err
	}
	return c.Process.Release()
}

// daemon is the serving side: the home's lock, the socket, and the Managers and store every call shares.
type daemon struct {
	base    *globals // the owner's own flags and streams (its log)
	home    string
	fp      string
	auto    bool
	serve   bool
	idle    time.Duration
	since   time.Time
	lock    *flock.Flock
	ln      *net.UnixListener
	st      store.Store
	ownsSt  bool
	ctx     context.Context // the calls' parent: cancelled when the daemon gives up waiting for them
	cancel  context.CancelFunc
	active  atomic.Int64
	last    atomic.Int64 // unix nanoseconds of the last call's end
	stopReq chan struct{}
	stopped sync.Once

	mu       sync.Mutex
	managers map[managerKey]*sandkeep.Manager
	calls    sync.WaitGroup
}

// managerKey tells apart the Managers the CLI's commands open: with or without the store, and exec's --gate-wait.
type managerKey struct {
	withStore bool
	gateWait  time.Duration
}

// ownHome takes the home's lock and listens on its socket. An auto-started daemon that holds the lock is asked
// to stop and waited for when takeOver is set (serve on a home replaces it); any other owner is HOME_OWNED.
func ownHome(g *globals, takeOver bool) (*daemon, error) {
	home := g.resolvedHome()
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, fault.Wrap(err, fault.StoreUnavailable, "set SANDKEEP_HOME to a directory you can write", "state home %s", home)
	}
	lk := flock.New(filepath.Join(home, daemonLockName))
	deadline := time.Now().Add(daemonDrainWait + 10*time.Second)
	asked := false
	for {
		ok, err := lk.TryLock()
		if err != nil {
			return nil, fault.Wrap(err, fault.StoreUnavailable, "check the state home's permissions", "cannot lock %s", lk.Path())
		}
		if ok {
			break
		}
		st, serr := daemonControl(home, "status")
		if !takeOver || (serr == nil && !st.Auto) || time.Now().After(deadline) {
			who := "another process"
			if serr == nil {
				who = fmt.Sprintf("process %d", st.PID)
			}
			return nil, fault.New(fault.HomeOwned, "stop it first ('sandkeep daemon stop'), or use another --home",
				"state home %s is owned by %s (its daemon or server)", home, who)
		}
		if serr == nil && !asked {
			_, _ = daemonControl(home, "stop")
			asked = true
		}
		time.Sleep(50 * time.Millisecond)
	}
	sock := filepath.Join(home, daemonSocketName)
	_ = os.Remove(sock) // we hold the lock: a socket left here is stale (its owner died)
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		_ = lk.Unlock()
		return nil, fault.Wrap(err, fault.StoreUnavailable, "check the state home's permissions", "cannot listen on %s", sock)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(sock, 0o600); err != nil {
		ln.Close()
		_ = lk.Unlock()
		return nil, fault.Wrap(err, fault.StoreUnavailable, "check the state home's permissions", "cannot restrict %s", sock)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &daemon{base: g, home: home, fp: g.operatorInput(), since: time.Now(), lock: lk, ln: ln, ctx: ctx, cancel: cancel,
		stopReq: make(chan struct{}), managers: map[managerKey]*sandkeep.Manager{}}
	d.last.Store(time.Now().UnixNano())
	return d, nil
}

// daemonControl sends a control call (status, stop) to the home's daemon.
func daemonControl(home, control string) (daemonStatus, error) {
	fc, err := dialDaemon(home)
	if err != nil {
		return daemonStatus{}, err
	}
	defer fc.C.Close()
	hello, _ := json.Marshal(daemonHello{Control: control})
	if err := fc.Write(frameHello, hello); err != nil {
		return daemonStatus{}, err
	}
	typ, p, err := fc.Read()
	if err != nil {
		return daemonStatus{}, err
	}
	if typ != frameAccept {
		var fe struct{ Code, Message, Hint string }
		_ = json.Unmarshal(p, &fe)
		return daemonStatus{}, fault.New(fault.Code(fe.Code), fe.Hint, "%s", fe.Message)
	}
	var st daemonStatus
	return st, json.Unmarshal(p, &st)
}

// useStore makes st the store every call shares (serve's own); otherwise the daemon opens one on first use.
func (d *daemon) useStore(st store.Store) { d.st = st }

// useManager makes m the Manager of calls with the store and no --gate-wait (serve's own).
func (d *daemon) useManager(m *sandkeep.Manager) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.managers[managerKey{withStore: true}] = m
}

func (d *daemon) store(ctx context.Context) (store.Store, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.st == nil {
		st, err := d.base.openStore(ctx)
		if err != nil {
			return nil, err
		}
		d.st, d.ownsSt = st, true
	}
	return d.st, nil
}

// manager is the shared Manager for k, opened on first use on the owner's operator Config.
func (d *daemon) manager(ctx context.Context, k managerKey) (*sandkeep.Manager, error) {
	var st store.Store
	if k.withStore {
		var err error
		if st, err = d.store(ctx); err != nil {
			return nil, err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if m := d.managers[k]; m != nil {
		return m, nil
	}
	sc, err := loadServerConfig(os.Getenv(envConfig))
	if err != nil {
		return nil, err
	}
	c, err := d.base.operator(sc)
	if err != nil {
		return nil, err
	}
	c.Store = st
	if k.gateWait > 0 {
		c.GateWait = k.gateWait
	}
	m, err := sandkeep.Open(context.WithoutCancel(ctx), c)
	if err != nil {
		return nil, err
	}
	d.managers[k] = m
	return m, nil
}

// serveCalls accepts calls until stop; then lets running calls finish (bounded) and returns.
func (d *daemon) serveCalls() {
	var accepting sync.WaitGroup
	accepting.Go(func() {
		for {
			c, err := d.ln.AcceptUnix()
			if err != nil {
				return
			}
			d.calls.Go(func() { d.serveConn(c) })
		}
	})
	var tick <-chan time.Time
	if d.idle > 0 {
		t := time.NewTicker(min(d.idle/4+time.Millisecond, 5*time.Second))
		defer t.Stop()
		tick = t.C
	}
loop:
	for {
		select {
		case <-d.stopReq:
			break loop
		case <-tick:
			if d.active.Load() == 0 && time.Since(time.Unix(0, d.last.Load())) >= d.idle {
				fmt.Fprintf(d.base.stderr, "sandkeep: daemon idle for %s; exiting\n", d.idle)
				break loop
			}
		}
	}
	d.ln.Close()
	accepting.Wait()
	done := make(chan struct{})
	go func() { d.calls.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(daemonDrainWait):
		d.cancel() // the calls' commands are stopped, their trees killed
		<-done
	}
}

// requestStop asks serveCalls to stop (a stop call, a signal).
func (d *daemon) requestStop() { d.stopped.Do(func() { close(d.stopReq) }) }

// close releases the Managers, the store it opened, the socket and the lock, in that order.
func (d *daemon) close(keep *sandkeep.Manager) {
	d.cancel()
	d.mu.Lock()
	for _, m := range d.managers {
		if m != keep {
			_ = m.Close()
		}
	}
	d.mu.Unlock()
	if d.ownsSt {
		_ = d.st.Close()
	}
	_ = os.Remove(filepath.Join(d.home, daemonSocketName))
	_ = d.lock.Unlock()
}

// peerAllowed: the socket's owner (this process's uid) and root are the operator tier; anyone else is refused.
func peerAllowed(c *net.UnixConn) (uint32, bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, false
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return 0, false
	}
	return cred.Uid, cred.Uid == 0 || int(cred.Uid) == os.Getuid()
}

func refuse(fc *frameConn, code fault.Code, hint, msg string) {
	b, _ := json.Marshal(map[string]string{"code": string(code), "message": msg, "hint": hint})
	_ = fc.Write(frameRefuse, b)
}

// serveConn runs one call.
func (d *daemon) serveConn(c *net.UnixConn) {
	defer c.Close()
	fc := &frameConn{C: c}
	if uid, ok := peerAllowed(c); !ok {
		refuse(fc, fault.Forbidden, "run sandkeep as the daemon's owner or root, or use your own --home",
			fmt.Sprintf("uid %d is not the operator of this daemon", uid))
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	typ, p, err := fc.Read()
	_ = c.SetReadDeadline(time.Time{})
	var hello daemonHello
	if err != nil || typ != frameHello || json.Unmarshal(p, &hello) != nil {
		return
	}
	switch hello.Control {
	case "status", "stop":
		st := daemonStatus{PID: os.Getpid(), Home: d.home, Since: d.since, Auto: d.auto, Serve: d.serve,
			Active: d.active.Load(), Version: version()}
		if d.idle > 0 {
			st.Idle = d.idle.String()
		}
		b, _ := json.Marshal(st)
		_ = fc.Write(frameAccept, b)
		if hello.Control == "stop" {
			d.requestStop()
		}
		return
	case "":
	default:
		return
	}
	if hello.Fingerprint != d.fp {
		refuse(fc, fault.DaemonMismatch,
			"run it with the daemon's environment, restart the daemon with yours ('sandkeep daemon stop'), or set SANDKEEP_DAEMON=auto or off",
			"the home's daemon runs with another operator environment (SANDKEEP_* variables, DOCKER_HOST, PATH, global flags or the config file)")
		return
	}
	d.active.Add(1)
	defer func() { d.last.Store(time.Now().UnixNano()); d.active.Add(-1) }()
	if err := fc.Write(frameAccept, nil); err != nil {
		return
	}
	ctx, cancel := context.WithCancelCause(d.ctx)
	defer cancel(nil)
	stdin := newWantReader(fc)
	var reading sync.WaitGroup
	reading.Go(func() {
		for {
			typ, p, err := fc.Read()
			if err != nil { // the caller went away: stop its command as a hangup would
				cancel(interrupted{syscall.SIGHUP})
				stdin.fail(io.ErrUnexpectedEOF)
				return
			}
			switch typ {
			case frameStdin:
				if !stdin.feed(ctx, p) {
					return
				}
			case frameStdinEOF:
				stdin.fail(io.EOF)
			case frameSignal:
				if len(p) == 1 {
					cancel(interrupted{syscall.Signal(p[0])})
				}
			}
		}
	})
	code := runWith(ctx, hello.Args, stdin, frameWriter{fc, frameStdout}, frameWriter{fc, frameStderr}, d)
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(int32(code)))
	_ = fc.Write(frameExit, b[:])
	c.CloseRead()
	reading.Wait()
}

type frameWriter struct {
	fc  *frameConn
	typ byte
}

func (w frameWriter) Write(p []byte) (int, error) {
	if err := w.fc.WriteData(w.typ, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// wantReader is a call's stdin: its first Read asks the caller for it, so a command that never reads its stdin
// never consumes the caller's.
type wantReader struct {
	fc     *frameConn
	once   sync.Once
	chunks chan []byte
	mu     sync.Mutex
	err    error
	done   chan struct{}
	cur    []byte
}

func newWantReader(fc *frameConn) *wantReader {
	return &wantReader{fc: fc, chunks: make(chan []byte, 64), done: make(chan struct{})}
}

func (r *wantReader) feed(ctx context.Context, p []byte) bool {
	select {
	case r.chunks <- p:
		return true
	case <-ctx.Done():
		return false
	case <-r.done:
		return true
	}
}

func (r *wantReader) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
		close(r.done)
	}
}

func (r *wantReader) Read(p []byte) (int, error) {
	r.once.Do(func() { _ = r.fc.Write(frameWant, nil) })
	if len(r.cur) == 0 {
		select {
		case r.cur = <-r.chunks:
		case <-r.done:
			select {
			case r.cur = <-r.chunks:
			default:
				r.mu.Lock()
				defer r.mu.Unlock()
				return 0, r.err
			}
		}
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

const daemonLong = `The local daemon owns a state home's sandboxes: their agent channels, egress proxies and the sweeper. The
CLI's exec, ps, stop, rm, runs, events and doctor go through it when it runs (same output, exit statuses and
errors as in-process), over a Unix socket in the home (mode 0600; only its owner and root are served).

SANDKEEP_DAEMON picks how the CLI uses it: auto (default: the first command starts one in the background,
which exits after SANDKEEP_DAEMON_IDLE, default 10m, without calls), on (require it: a clear error when none
answers) or off (in-process only). The daemon serves callers whose operator environment is its own (SANDKEEP_*
variables, DOCKER_HOST, KUBECONFIG, PATH, global flags, the config file); others work in-process (auto) or are
refused (on, DAEMON_MISMATCH). 'sandkeep serve' on a home is that home's daemon too.`

func newDaemon(g *globals) *cobra.Command {
	d := &cobra.Command{Use: "daemon", Short: "The local daemon that owns a state home's sandboxes (start, stop, status, run)", Long: daemonLong}
	var idle time.Duration
	start := &cobra.Command{
		Use:   "start [--idle D]",
		Short: "Start the home's daemon in the background (nothing when one runs)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			home := g.resolvedHome()
			if st, err := daemonControl(home, "status"); err == nil {
				fmt.Fprintf(g.stdout, "sandkeep: daemon already running (pid %d, home %s)\n", st.PID, st.Home)
				return nil
			}
			if err := g.spawnDaemon(home, "--idle", idle.String()); err != nil {
				return fault.Wrap(err, fault.DaemonUnavailable, "see "+filepath.Join(home, daemonLogName), "cannot start the daemon: %v", err)
			}
			fc, err := waitDaemon(home, daemonStartWait)
			if err != nil {
				return fault.Wrap(err, fault.DaemonUnavailable, "see "+filepath.Join(home, daemonLogName), "the daemon did not answer: %v", err)
			}
			fc.C.Close()
			st, err := daemonControl(home, "status")
			if err != nil {
				return fault.Wrap(err, fault.DaemonUnavailable, "see "+filepath.Join(home, daemonLogName), "the daemon did not answer: %v", err)
			}
			fmt.Fprintf(g.stdout, "sandkeep: daemon started (pid %d, home %s)\n", st.PID, st.Home)
			return nil
		},
	}
	start.Flags().DurationVar(&idle, "idle", 0, "exit after this long without calls (default: never)")
	stop := &cobra.Command{
		Use:   "stop",
		Short: "Stop the home's daemon (running calls finish first, at most 30s); sandboxes keep running",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			home := g.resolvedHome()
			st, err := daemonControl(home, "stop")
			if err != nil {
				fmt.Fprintf(g.stdout, "sandkeep: no daemon running (home %s)\n", home)
				return nil
			}
			lk := flock.New(filepath.Join(home, daemonLockName))
			deadline := time.Now().Add(daemonDrainWait + 10*time.Second)
			for {
				if ok, _ := lk.TryLock(); ok {
					_ = lk.Unlock()
					break
				}
				if time.Now().After(deadline) {
					return fault.New(fault.DaemonUnavailable, fmt.Sprintf("kill it: kill %d", st.PID), "daemon %d did not stop", st.PID)
				}
				time.Sleep(20 * time.Millisecond)
			}
			fmt.Fprintf(g.stdout, "sandkeep: daemon stopped (pid %d)\n", st.PID)
			return nil
		},
	}
	var asJSON bool
	status := &cobra.Command{
		Use:   "status [--json]",
		Short: "Tell whether the home's daemon runs (exit 0) or not (exit 3)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			home := g.resolvedHome()
			st, err := daemonControl(home, "status")
			if err != nil {
				if asJSON {
					fmt.Fprintln(g.stdout, `{"running":false}`)
				} else {
					fmt.Fprintf(g.stdout, "sandkeep: no daemon running (home %s)\n", home)
				}
				return exitError{3}
			}
			if asJSON {
				b, _ := json.Marshal(struct {
					Running bool `json:"running"`
					daemonStatus
				}{true, st})
				fmt.Fprintln(g.stdout, string(b))
				return nil
			}
			kind := "started by 'sandkeep daemon'"
			switch {
			case st.Serve:
				kind = "sandkeep serve"
			case st.Auto:
				kind = "started by the CLI"
			}
			fmt.Fprintf(g.stdout, "sandkeep: daemon running (pid %d, home %s, %s, since %s, %d calls running", st.PID, st.Home, kind,
				st.Since.UTC().Format(time.RFC3339), st.Active)
			if st.Idle != "" {
				fmt.Fprintf(g.stdout, ", exits after %s idle", st.Idle)
			}
			fmt.Fprintln(g.stdout, ")")
			return nil
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	var auto bool
	runCmd := &cobra.Command{
		Use:   "run [--idle D]",
		Short: "Run the home's daemon in the foreground (for systemd; see docs/DAEMON.md)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if auto && !cmd.Flags().Changed("idle") {
				idle = defaultDaemonIdle
				if v := os.Getenv(envDaemonIdle); v != "" {
					d, err := time.ParseDuration(v)
					if err != nil || d <= 0 {
						return fault.New(fault.InvalidArgument, "write a positive duration, e.g. "+envDaemonIdle+"=10m", "%s=%q is not a duration", envDaemonIdle, v)
					}
					idle = d
				}
			}
			return runDaemon(cmd.Context(), g, idle, auto)
		},
	}
	runCmd.Flags().DurationVar(&idle, "idle", 0, "exit after this long without calls (default: never; "+envDaemonIdle+" or 10m when --auto)")
	runCmd.Flags().BoolVar(&auto, "auto", false, "started by the CLI (SANDKEEP_DAEMON=auto): a 'sandkeep serve' on the home replaces it")
	_ = runCmd.Flags().MarkHidden("auto")
	d.AddCommand(start, stop, status, runCmd)
	return d
}

// runDaemon is `sandkeep daemon run`: own the home, open the shared Manager (the engine and drivers are probed
// once, here), sweep, serve calls until stopped, a signal or the idle bound.
func runDaemon(ctx context.Context, g *globals, idle time.Duration, auto bool) error {
	d, err := ownHome(g, false)
	if err != nil {
		if auto && fault.CodeOf(err) == fault.HomeOwned {
			return nil // another CLI call's daemon won the race: it serves
		}
		return err
	}
	d.auto, d.idle = auto, idle
	defer d.close(nil)
	m, err := d.manager(ctx, managerKey{withStore: true})
	if err != nil {
		return err
	}
	sc, err := loadServerConfig(os.Getenv(envConfig))
	if err != nil {
		return err
	}
	sweepCtx, stopSweep := context.WithCancel(context.WithoutCancel(ctx))
	var sweeping sync.WaitGroup
	if every := duration(sc.Sweep.Interval, time.Minute); every > 0 {
		sweeping.Go(func() {
			if err := m.RunSweeper(sweepCtx, every); err != nil {
				fmt.Fprintf(g.stderr, "sandkeep: sweeper stopped: %v\n", err)
			}
		})
	}
	defer func() { stopSweep(); sweeping.Wait() }()
	warmPools(ctx, g, m, false)
	stopOnSignal := context.AfterFunc(ctx, d.requestStop)
	defer stopOnSignal()
	fmt.Fprintf(g.stderr, "sandkeep: daemon %d serving %s\n", os.Getpid(), filepath.Join(d.home, daemonSocketName))
	d.serveCalls()
	fmt.Fprintln(g.stderr, "sandkeep: daemon stopped")
	return nil
}
