package channel

import (
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// EgressSocketName is the egress proxy's socket in the channel directory: the agent's init forwards the
// sandbox's proxy address to it (cmd/sandkeep-agent/egress_linux.go names the same file).
const EgressSocketName = "e.sock"

// SideListener is a Unix listener on another socket of the channel directory (the egress proxy's), whose
// Accept hands out only connections that SO_PEERCRED says come from the sandbox's PID 1. Like the channel
// socket, it is never opened through a path the sandbox can change: the directory is bound read-only. What Accept
// hands out is the command's own socket when init passed it (handoff.go), else the verified Unix connection.
type SideListener struct {
	ln     *net.UnixListener
	path   string
	verify Verifier
	log    *slog.Logger
	refuse *refusalLog

	start     sync.Once
	closeOnce sync.Once
	ready     chan net.Conn // connections through their handoff, for Accept
	done      chan struct{} // closed by Close
	err       error         // why the accept loop ended; read once ready is closed
	slots     chan struct{} // one per handed-off socket being served
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
	return &SideListener{ln: ln, path: path, verify: verify, log: log, refuse: newRefusalLog(log),
		ready: make(chan net.Conn), done: make(chan struct{}), slots: make(chan struct{}, maxHandoffs)}, nil
}

// Accept returns the next connection from the sandbox's PID 1, through its handoff; others are closed and
// logged (at most once per ten seconds, with a count). The handoffs run on their own goroutines, so a peer that
// is slow to send its first byte holds up no other connection.
func (l *SideListener) Accept() (net.Conn, error) {
	l.start.Do(func() { go l.acceptLoop() })
	c, ok := <-l.ready
	if !ok {
		return nil, l.err
	}
	return c, nil
}

// acceptLoop accepts until the listener is closed, starting one handoff per verified connection. Each handoff
// delivers to ready or, once Close has been called, closes what it got; ready is closed when the loop and every
// handoff it started are over.
func (l *SideListener) acceptLoop() {
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		close(l.ready)
	}()
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) && isTemporary(err) {
				time.Sleep(10 * time.Millisecond) // EMFILE and the like: do not spin
				continue
			}
			l.err = err
			return
		}
		pid, err := peerPID(c)
		if err != nil || !l.verify(pid) {
			l.refuse.refused("refused a connection that is not the sandbox's init", "socket", filepath.Base(l.path), "peer_pid", pid, "err", err)
			c.Close()
			continue
		}
		wg.Go(func() {
			hc := l.handoff(c)
			if hc == nil {
				return
			}
			select {
			case l.ready <- hc:
			case <-l.done:
				hc.Close()
			}
		})
	}
}

func isTemporary(err error) bool {
	var ne interface{ Temporary() bool }
	return errors.As(err, &ne) && ne.Temporary()
}

// Close stops listening and removes the socket file while it is still ours (another process may have taken the
// path over since).
func (l *SideListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	err := l.ln.Close()
	if fi, serr := os.Lstat(l.path); serr == nil && fi.Mode()&fs.ModeSocket != 0 && !live(l.path) {
		_ = os.Remove(l.path)
	}
	return err
}

// Addr is the socket's address.
func (l *SideListener) Addr() net.Addr { return l.ln.Addr() }
