package channel

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The egress handoff. A sandbox's init used to copy every byte of a command's proxy connection (TCP on the
// sandbox's loopback) onto its own connection to the host's egress socket: three socket hops per byte (command to
// init, init to host proxy, proxy to upstream) where a direct copy has one. Instead, init passes the accepted
// TCP socket itself (SCM_RIGHTS) over its verified connection to e.sock, and the host proxy serves the command's
// socket directly: two hops, and init moves no byte. The socket stays in the sandbox's network namespace; the
// host only reads and writes it.
//
// The first byte init sends on a connection to e.sock says which way it goes (cmd/sandkeep-agent/egress_linux.go
// names the same values):
//   - HandoffMarker, carrying exactly one descriptor: the host checks it is a connected TCP stream socket, answers
//     HandoffTaken and serves that socket; this Unix connection is then closed. A message without a usable
//     descriptor (a kernel or runtime, gVisor's, that does not pass it) is answered HandoffStream, and the
//     command's bytes follow on this Unix connection as below;
//   - StreamMarker: the command's bytes follow on this Unix connection (init copies them);
//   - anything else: an init from before the handoff; the byte is the command's first and is not consumed.
const (
	HandoffMarker = 0x00
	StreamMarker  = 0x01
	HandoffTaken  = 'k'
	HandoffStream = 's'
)

// handoffTimeout bounds waiting for a verified peer's first byte; init sends it as soon as it has connected. A
// connection still silent then is served as a byte stream.
const handoffTimeout = 2 * time.Second

// maxHandoffs bounds the sandbox sockets one listener serves at once. Init used to bound them (each held one of its
// copy slots); a handed-off socket holds none of init's, so the host keeps the same bound: past it a socket is
// closed at once, as init closed a connection past its own.
const maxHandoffs = 256

// handedConn is a sandbox's TCP socket the host serves. It embeds the *net.TCPConn, so io.Copy still finds its
// ReadFrom and WriteTo (splice, both ways); Close also frees its slot.
type handedConn struct {
	*net.TCPConn
	release func()
	once    sync.Once
}

func (c *handedConn) Close() error {
	err := c.TCPConn.Close()
	c.once.Do(c.release)
	return err
}

// handoff reads c's first byte and returns the connection to serve: the sandbox socket c carried (c is then
// closed), or c itself for a byte stream. nil: c was closed (an unusable handoff past the bound, or the peer
// went away).
func (l *SideListener) handoff(c *net.UnixConn) net.Conn {
	_ = c.SetReadDeadline(time.Now().Add(handoffTimeout))
	first, err := peekByte(c)
	_ = c.SetReadDeadline(time.Time{})
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return c // silent: a stream whose first byte is still to come
	case err != nil:
		c.Close()
		return nil
	case first == StreamMarker:
		if _, err := c.Read(make([]byte, 1)); err != nil {
			c.Close()
			return nil
		}
		return c
	case first != HandoffMarker:
		return c // an init from before the handoff: the command's own first byte, left in place
	}
	tc, err := receiveTCP(c)
	if err != nil {
		l.log.Debug("egress handoff without a usable socket: copying bytes instead", "err", err)
		if _, werr := c.Write([]byte{HandoffStream}); werr != nil {
			c.Close()
			return nil
		}
		return c
	}
	_ = c.SetWriteDeadline(time.Now().Add(handoffTimeout))
	_, err = c.Write([]byte{HandoffTaken})
	c.Close()
	if err != nil {
		tc.Close() // init did not hear that the host took it: it closes its copy, the command sees the end
		return nil
	}
	select {
	case l.slots <- struct{}{}:
	default:
		l.refuse.refused("refused a sandbox connection past the bound", "socket", filepath.Base(l.path), "max", maxHandoffs)
		tc.Close()
		return nil
	}
	return &handedConn{TCPConn: tc, release: func() { <-l.slots }}
}

// peekByte returns c's next byte without consuming it, waiting under c's read deadline.
func peekByte(c *net.UnixConn) (byte, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var b [1]byte
	var n int
	var rerr error
	err = raw.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return rerr != unix.EAGAIN
	})
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, net.ErrClosed // the peer hung up before its first byte
	}
	return b[0], nil
}

// receiveTCP consumes the handoff marker and returns the one descriptor it carried as a connected TCP stream
// socket. Every descriptor received is closed unless it is that socket.
func receiveTCP(c *net.UnixConn) (*net.TCPConn, error) {
	oob := make([]byte, unix.CmsgSpace(4*4)) // room for a few: extra descriptors are received and closed
	_, oobn, flags, _, err := c.ReadMsgUnix(make([]byte, 1), oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
		for _, m := range msgs {
			if got, rerr := unix.ParseUnixRights(&m); rerr == nil {
				fds = append(fds, got...)
			}
		}
	}
	if len(fds) != 1 || flags&unix.MSG_CTRUNC != 0 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, errors.New("not exactly one descriptor")
	}
	if err := checkTCPSocket(fds[0]); err != nil {
		unix.Close(fds[0])
		return nil, err
	}
	f := os.NewFile(uintptr(fds[0]), "sandbox-tcp")
	nc, err := net.FileConn(f) // a duplicate, non-blocking, in the runtime's poller
	f.Close()
	if err != nil {
		return nil, err
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		return nil, errors.New("not a TCP connection")
	}
	return tc, nil
}

// checkTCPSocket accepts only a connected TCP stream socket (IPv4 or IPv6): whatever else a sandbox might send
// (a file, a pipe, a Unix or listening socket) is refused before the host treats it as a connection.
func checkTCPSocket(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return errors.New("not a socket")
	}
	for _, o := range []struct {
		opt  int
		want []int
	}{
		{unix.SO_DOMAIN, []int{unix.AF_INET, unix.AF_INET6}},
		{unix.SO_TYPE, []int{unix.SOCK_STREAM}},
		{unix.SO_PROTOCOL, []int{unix.IPPROTO_TCP}},
		{unix.SO_ACCEPTCONN, []int{0}},
	} {
		v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, o.opt)
		if err != nil {
			return err
		}
		ok := false
		for _, w := range o.want {
			ok = ok || v == w
		}
		if !ok {
			return errors.New("not a connected TCP stream socket")
		}
	}
	if _, err := unix.Getpeername(fd); err != nil {
		return errors.New("not a connected TCP stream socket")
	}
	return nil
}

// HandOff passes c's socket to the host over u, as a sandbox's init does, and returns the host's answer
// (HandoffTaken or HandoffStream). The sandbox's own init (cmd/sandkeep-agent, stdlib only) has its copy of this;
// this one is for what stands in for init outside a sandbox (benchmarks, tests).
func HandOff(u *net.UnixConn, c *net.TCPConn) (byte, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var werr error
	if err := raw.Control(func(fd uintptr) {
		_, _, werr = u.WriteMsgUnix([]byte{HandoffMarker}, unix.UnixRights(int(fd)), nil)
	}); err != nil {
		return 0, err
	}
	if werr != nil {
		return 0, werr
	}
	_ = u.SetReadDeadline(time.Now().Add(handoffTimeout))
	defer u.SetReadDeadline(time.Time{})
	var b [1]byte
	if _, err := u.Read(b[:]); err != nil {
		return 0, err
	}
	if b[0] != HandoffTaken && b[0] != HandoffStream {
		return 0, errors.New("egress handoff: unknown answer")
	}
	return b[0], nil
}
