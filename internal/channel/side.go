package channel

import (
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"
)

// EgressSocketName is the egress proxy's socket in the channel directory: the agent's init forwards the
// sandbox's proxy address to it (cmd/sandkeep-agent/egress_linux.go names the same file).
const EgressSocketName = "e.sock"

// SideListener is a Unix listener on another socket of the channel directory (the egress proxy's), whose
// Accept hands out only connections that SO_PEERCRED says come from the sandbox's PID 1. Like the channel
// socket, it is never opened through a path the sandbox can change: the directory is bound read-only.
type SideListener struct {
	ln     *net.UnixListener
	path   string
	verify Verifier
	log    *slog.Logger
	refuse *refusalLog
}

var _ net.Listener = (*SideListener)(nil)

// ListenSide listens on dir/name. A socket left by a process that is gone is replaced; one a live process
// serves is not (ErrInUse): that process owns this sandbox's side service.
func ListenSide(dir, name string, verify Verifier, log *slog.Logger) (*SideListener, error) {
	ln, path, err := listenIn(dir, name)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &SideListener{ln: ln, path: path, verify: verify, log: log, refuse: newRefusalLog(log)}, nil
}

// Accept returns the next connection from the sandbox's PID 1; others are closed and logged (at most once per
// ten seconds, with a count).
func (l *SideListener) Accept() (net.Conn, error) {
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) && isTemporary(err) {
				time.Sleep(10 * time.Millisecond) // EMFILE and the like: do not spin
				continue
			}
			return nil, err
		}
		pid, err := peerPID(c)
		if err != nil || !l.verify(pid) {
			l.refuse.refused("refused a connection that is not the sandbox's init", "socket", filepath.Base(l.path), "peer_pid", pid, "err", err)
			c.Close()
			continue
		}
		return c, nil
	}
}

func isTemporary(err error) bool {
	var ne interface{ Temporary() bool }
	return errors.As(err, &ne) && ne.Temporary()
}

// Close stops listening and removes the socket file while it is still ours (another process may have taken the
// path over since).
func (l *SideListener) Close() error {
	err := l.ln.Close()
	if fi, serr := os.Lstat(l.path); serr == nil && fi.Mode()&fs.ModeSocket != 0 && !live(l.path) {
		_ = os.Remove(l.path)
	}
	return err
}

// Addr is the socket's address.
func (l *SideListener) Addr() net.Addr { return l.ln.Addr() }
