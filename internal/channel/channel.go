// Package channel keeps one persistent connection per sandbox between the host and the agent inside it, so a
// warm command costs a frame round trip instead of a Docker exec. The host listens on a Unix socket in a
// directory of its own that is bound read-only into the sandbox; the agent's PID 1 dials it. The host accepts a
// connection only when SO_PEERCRED says it comes from the sandbox's PID 1, so a command that dials the socket
// itself is turned away, and the sandbox can neither replace the socket nor redirect the host anywhere: the host
// never opens a path the sandbox can change. While the agent's connection is up, every other connection is
// turned away before it is verified: one connection at a time, and a new one only once the old one is gone
// (the agent reconnects only after every process of its last session is dead), so even code running as PID 1
// cannot take over a live channel, and a command dialling in a loop costs the host no engine inspection.
package channel

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// SocketName is the socket's name inside the channel directory; inside a sandbox the directory is at MountPoint.
const (
	SocketName = "a.sock"
	MountPoint = "/.sandkeep-chan"
	SocketPath = MountPoint + "/" + SocketName
)

// ErrInUse means another live process already listens for this sandbox; use another transport.
var ErrInUse = errors.New("channel socket is served by another process")

// ErrNoChannel means no verified agent connection arrived within the wait.
var ErrNoChannel = errors.New("no agent channel")

// Verifier reports whether pid (as the host sees it) is the sandbox's PID 1.
type Verifier func(pid int) bool

// Listener accepts the agent's connections for one sandbox and hands out the current one.
type Listener struct {
	path   string
	ln     *net.UnixListener
	verify Verifier
	refuse *refusalLog
	log    *slog.Logger

	mu      sync.Mutex
	mux     *agentproto.Mux // the verified connection, read by its Mux (commands and forwarded streams); nil when none
	arrived chan struct{}   // closed when a connection is verified; replaced after each arrival
	closed  bool

	wg sync.WaitGroup // the accept loop
}

// Listen creates dir (mode 0755, the sandbox's agent must traverse it) and listens on dir/a.sock. A socket file
// left by a process that is gone is replaced; one that a live process serves is not (ErrInUse).
func Listen(dir string, verify Verifier, log *slog.Logger) (*Listener, error) {
	ln, path, err := listenIn(dir, SocketName)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Listener{path: path, ln: ln, verify: verify, log: log, refuse: newRefusalLog(log), arrived: make(chan struct{})}
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// listenIn creates dir (mode 0755, the sandbox's init must traverse it) and listens on dir/name, replacing a
// socket file left by a process that is gone but not one a live process serves (ErrInUse). The socket is mode
// 0666: the sandbox user connects, and connect(2) needs write permission on it. Its file is removed by the
// caller's Close, and only while it is still ours.
func listenIn(dir, name string) (*net.UnixListener, string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", fmt.Errorf("channel dir: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, "", fmt.Errorf("channel dir: %w", err)
	}
	path := filepath.Join(dir, name)
	if live(path) {
		return nil, "", ErrInUse
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, "", fmt.Errorf("channel socket: %w", err)
	}
	ln, err := listenUnix(dir, path)
	if err != nil {
		return nil, "", err
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, "", fmt.Errorf("channel socket: %w", err)
	}
	return ln, path, nil
}

// listenUnix binds path through /proc/self/fd/N of its directory, which names the same place. The name a
// socket is bound with is what a connected peer reads back (getpeername), so binding by the host's path would
// show the sandbox the state home's location (issue 22, Low 12); this name says nothing of the host. It also
// keeps the name inside sockaddr_un's 108 bytes whatever the path's length.
func listenUnix(dir, path string) (*net.UnixListener, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("channel dir: %w", err)
	}
	defer d.Close()
	addr := fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), filepath.Base(path))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("channel listen: %w", err)
	}
	return ln, nil
}

// live reports whether a process is accepting on path right now.
func live(path string) bool {
	c, err := Dial(path, 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Dial connects to the socket at path, through /proc/self/fd when path is too long for sockaddr_un.
func Dial(path string, timeout time.Duration) (net.Conn, error) {
	if len(path) < 100 {
		return net.DialTimeout("unix", path, timeout)
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return net.DialTimeout("unix", fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), filepath.Base(path)), timeout)
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			l.log.Warn("channel accept", "err", err)
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE: do not spin
			continue
		}
		if l.connected() {
			l.log.Warn("channel: refused a second connection while the agent's is up")
			c.Close()
			continue
		}
		pid, err := peerPID(c)
		if err != nil || !l.verify(pid) {
			l.refuse.refused("channel: refused a connection that is not the sandbox's agent", "peer_pid", pid, "err", err)
			c.Close()
			continue
		}
		l.install(c)
	}
}

// connected reports whether the current connection is up. One whose peer is gone (EOF, reset) is dropped.
func (l *Listener) connected() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mux == nil {
		return false
	}
	if !l.mux.Alive() {
		l.mux.Close()
		l.mux = nil
		return false
	}
	return true
}

func (l *Listener) install(c *net.UnixConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		c.Close()
		return
	}
	if l.mux != nil {
		if l.mux.Alive() { // another connection got in since connected(): the first one stays
			c.Close()
			return
		}
		l.mux.Close()
	}
	l.mux = agentproto.NewMux(c)
	close(l.arrived)
	l.arrived = make(chan struct{})
}

func peerPID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return int(cred.Pid), nil
}

// Take returns the current connection, after checking that it is alive and idle, or waits up to wait for the
// agent to connect. The caller must hold the sandbox's gate: one command at a time uses a connection (its
// Commands); forwarded streams share it (Current). After a command that broke the channel, the caller must call
// Broken.
func (l *Listener) Take(ctx context.Context, wait time.Duration) (*agentproto.Mux, error) {
	return l.current(ctx, wait, true)
}

// Current returns the current connection when it is up, or waits up to wait for the agent to connect, without
// the gate and whether a command runs on it or not: forwarded streams run alongside commands.
func (l *Listener) Current(ctx context.Context, wait time.Duration) (*agentproto.Mux, error) {
	return l.current(ctx, wait, false)
}

func (l *Listener) current(ctx context.Context, wait time.Duration, idle bool) (*agentproto.Mux, error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		l.mu.Lock()
		c, arrived, closed := l.mux, l.arrived, l.closed
		l.mu.Unlock()
		if closed {
			return nil, fmt.Errorf("%w: listener closed", ErrNoChannel)
		}
		if c != nil {
			if (idle && c.Idle()) || (!idle && c.Alive()) {
				return c, nil
			}
			l.Broken(c)
			continue
		}
		select {
		case <-arrived:
		case <-timer.C:
			return nil, ErrNoChannel
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// Broken drops c when it is the current connection: a command over it failed at the protocol level. Its
// forwarded streams end with it.
func (l *Listener) Broken(c *agentproto.Mux) {
	l.mu.Lock()
	if l.mux == c {
		l.mux = nil
	}
	l.mu.Unlock()
	c.Close()
}

// WaitReconnect waits up to wait for a connection other than old: after a broken command, the agent reconnects
// only once every process of that command is gone, so a reconnection proves the sandbox is clean again.
func (l *Listener) WaitReconnect(ctx context.Context, old *agentproto.Mux, wait time.Duration) bool {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		l.mu.Lock()
		c, arrived := l.mux, l.arrived
		l.mu.Unlock()
		if c != nil && c != old {
			return true
		}
		select {
		case <-arrived:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// Close stops accepting, closes the current connection and removes the socket file.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	c := l.mux
	l.mux = nil
	l.mu.Unlock()
	if c != nil {
		c.Close() // outside mu: it waits for the Mux's reader
	}
	err := l.ln.Close()
	l.wg.Wait()
	// Remove the file only while it is still ours: another process may have taken the path over since.
	if fi, serr := os.Lstat(l.path); serr == nil && fi.Mode()&fs.ModeSocket != 0 && !live(l.path) {
		_ = os.Remove(l.path)
	}
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
