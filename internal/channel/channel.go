// Package channel keeps one persistent connection per sandbox between the host and the agent inside it, so a
// warm command costs a frame round trip instead of an engine exec, and one connection carries concurrent
// commands, background processes and forwarded streams (agentproto.Mux). The session side is one for every
// driver (Slot); drivers differ only in how a connection is accepted and verified before it is installed.
//
// This file is the Docker driver's acceptor. The host listens on a Unix socket in a directory of its own that
// is bound read-only into the sandbox; the agent's PID 1 dials it. The host accepts a connection only when
// SO_PEERCRED says it comes from the sandbox's PID 1, so a command that dials the socket itself is turned away,
// and the sandbox can neither replace the socket nor redirect the host anywhere: the host never opens a path the
// sandbox can change. While the agent's connection is up, every other connection is turned away before it is
// verified: one connection at a time, and a new one only once the old one is gone (the agent reconnects only
// after every process of its last session is dead), so even code running as PID 1 cannot take over a live
// channel, and a command dialling in a loop costs the host no engine inspection. The kubernetes driver's
// acceptor (internal/driver/kube/channel.go) verifies a hello with a per-pod token instead, and installs into
// the same Slot.
package channel

import (
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

// Listener accepts the agent's connections for one sandbox over its Unix socket, verifies each (SO_PEERCRED:
// the sandbox's PID 1) and installs it in its Slot, which hands it out (Take, Current, Broken, WaitReconnect).
type Listener struct {
	*Slot
	path   string
	ln     *net.UnixListener
	verify Verifier
	refuse *refusalLog
	log    *slog.Logger

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
	l := &Listener{Slot: NewSlot(), path: path, ln: ln, verify: verify, log: log, refuse: newRefusalLog(log)}
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
		if l.Up() {
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
		l.Install(c)
	}
}

func peerPID(c *net.UnixConn) (int, error) {
	cred, err := PeerCred(c)
	if err != nil {
		return 0, err
	}
	return int(cred.Pid), nil
}

// PeerCred is what the kernel says of the process at the other end of c (SO_PEERCRED: its pid, uid and gid when
// it connected), which the peer cannot forge.
func PeerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// Close stops accepting, closes the current connection and removes the socket file.
func (l *Listener) Close() error {
	l.Slot.Close()
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
