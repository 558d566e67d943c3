package docker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/driver"
)

var _ driver.PortDialer = (*Driver)(nil)

// dialReady is the line `sandkeep-agent dial` writes once its connection is up (cmd/sandkeep-agent/dial_linux.go),
// and `sandkeep-agent relay` once init took its session (relay_linux.go).
const dialReady = "ok\n"

// DialPort connects to 127.0.0.1:port inside sb through `sandkeep-agent dial` in a Docker exec: the sandbox's
// network stays what it is (none), and the connection is made from inside its own namespace, as the sandbox
// user. Each connection is one exec, so connections run in parallel and each has TCP's own flow control end to
// end. The connection ends when either side closes it, or when the sandbox stops (the exec dies with it).
func (d *Driver) DialPort(ctx context.Context, sb *driver.Sandbox, port int) (net.Conn, error) {
	c, why, err := d.execStream(ctx, sb, "", driver.AgentPath, "dial", strconv.Itoa(port))
	if err != nil {
		return nil, err
	}
	if c == nil {
		if why == "" {
			why = "the agent ended without connecting"
		}
		return nil, fmt.Errorf("%w: %s", driver.ErrPortUnreachable, why)
	}
	return c, nil
}

var _ driver.AgentRelayer = (*Driver)(nil)

// Relay opens a session of sb's agent channel through `sandkeep-agent relay` in a Docker exec as uid 0, the
// identity the sandbox's init believes (cmd/sandkeep-agent/relay_linux.go): the channel of a sandbox under
// gVisor, or of one whose process uses the exec transport. An init that does not take the session (another one
// is up, or it is still killing the last one's processes) is driver.ErrRelayRefused.
func (d *Driver) Relay(ctx context.Context, sb *driver.Sandbox) (net.Conn, error) {
	c, why, err := d.execStream(ctx, sb, "0:0", driver.AgentPath, "relay")
	if err != nil {
		return nil, err
	}
	if c == nil {
		if why == "" {
			why = "the agent ended without a session"
		}
		return nil, fmt.Errorf("%w: %s", driver.ErrRelayRefused, why)
	}
	return c, nil
}

// execStream runs cmd in sb through a Docker exec (as user, "" for the sandbox's) and returns its hijacked
// stream once the agent wrote its ready line. An agent that ended without it is a nil conn and what it said on
// stderr.
func (d *Driver) execStream(ctx context.Context, sb *driver.Sandbox, user string, cmd ...string) (net.Conn, string, error) {
	created, err := d.api.ExecCreate(ctx, sb.ID, client.ExecCreateOptions{
		AttachStdin: true, AttachStdout: true, AttachStderr: true, User: user, Cmd: cmd,
	})
	if err != nil {
		return nil, "", d.execCreateError(sb, err)
	}
	att, err := d.api.ExecAttach(ctx, created.ID, client.ExecAttachOptions{})
	if err != nil {
		return nil, "", d.execCreateError(sb, err)
	}
	out, demux := demultiplex(att.Reader)
	c := &portConn{Conn: att.Conn, r: out, close: func() {
		att.Close()
		out.(io.Closer).Close() // a demultiplexer blocked on a reader that left returns too
		demux.wait()
	}}
	ready := make([]byte, len(dialReady))
	// The agent answers within its own bounds; past ctx the exec is abandoned.
	stop := context.AfterFunc(ctx, func() { _ = att.Conn.SetReadDeadline(time.Unix(1, 0)) })
	_, err = io.ReadFull(out, ready)
	if !stop() || err != nil || string(ready) != dialReady {
		c.Close()
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		return nil, string(bytes.TrimSpace(demux.diag.Bytes())), nil
	}
	return c, "", nil
}

// portConn is the hijacked exec stream as a net.Conn: reads come from the demultiplexed stdout of the agent,
// writes go to its stdin, CloseWrite half-closes (the agent then half-closes its TCP connection).
type portConn struct {
	net.Conn
	r     io.Reader
	once  sync.Once
	close func()
}

func (c *portConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite ends the agent's stdin.
func (c *portConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *portConn) Close() error {
	c.once.Do(c.close)
	return nil
}
