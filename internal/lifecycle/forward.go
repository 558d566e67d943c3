package lifecycle

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// forwardConns numbers the forwarded connections of this process, for matching their events.
var forwardConns atomic.Uint64

// DialPort opens one forwarded connection to 127.0.0.1:port inside key's running sandbox, through the driver
// (driver.PortDialer: for Docker, the agent dials from inside the sandbox's own network namespace; the sandbox
// keeps network mode none). It does not take the key's gate: a forward lives alongside the user's commands, as a
// server started by one of them does. A sandbox that is missing, stopped or not ours is refused; so is a port
// nothing listens on (PORT_UNREACHABLE). via ("cli", "api") labels the events; onEvent receives them (nil: the
// Manager's own sink). The connection's Close records port_forward_closed.
func (m *Manager) DialPort(ctx context.Context, key identity.Key, port int, via string, onEvent Sink) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fault.New(fault.InvalidArgument, "pass a TCP port between 1 and 65535, e.g. 8080",
			"port %d is out of range", port)
	}
	pd, ok := m.drv.(driver.PortDialer)
	if !ok {
		return nil, fault.New(fault.PortForwardUnavailable, "use the docker driver for port forwarding",
			"the %s driver cannot forward ports", m.drv.Name())
	}
	sb, err := m.owned(ctx, key)
	if err != nil {
		return nil, err
	}
	if sb.State != driver.StateRunning {
		return nil, fault.New(fault.SandboxNotRunning, "run a command in it first (sandkeep exec), which starts it",
			"sandbox %s is %s; a port can be forwarded only to a running sandbox", sb.Name, sb.State)
	}
	c, err := pd.DialPort(ctx, sb, port)
	switch {
	case errors.Is(err, driver.ErrPortUnreachable):
		return nil, fault.Wrap(err, fault.PortUnreachable,
			"start the server in the sandbox first, listening on 127.0.0.1 or 0.0.0.0 of that port",
			"nothing in sandbox %s accepts connections on port %d: %v", sb.Name, port, err)
	case err != nil:
		return nil, coded(ctx, err, key)
	}
	emit := func(name string, payload any) {
		if onEvent != nil {
			onEvent(name, payload)
		} else if m.cfg.OnEvent != nil {
			m.cfg.OnEvent(name, payload)
		}
	}
	fc := &forwardConn{Conn: c, emit: emit, opened: time.Now(),
		closed: events.PortForwardClosed{Sandbox: sb.Name, Port: port, Conn: forwardConns.Add(1)}}
	emit(events.NamePortForwardOpened, events.PortForwardOpened{Sandbox: sb.Name, Port: port, Conn: fc.closed.Conn, Via: via})
	return fc, nil
}

// forwardConn counts a forwarded connection's bytes and records its end once.
type forwardConn struct {
	net.Conn
	in, out atomic.Int64
	emit    func(string, any)
	opened  time.Time
	once    sync.Once
	closed  events.PortForwardClosed
}

func (c *forwardConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.out.Add(int64(n))
	return n, err
}

func (c *forwardConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.in.Add(int64(n))
	return n, err
}

// CloseWrite half-closes when the underlying connection can.
func (c *forwardConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *forwardConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		ev := c.closed
		ev.BytesIn, ev.BytesOut = c.in.Load(), c.out.Load()
		ev.DurationMS = time.Since(c.opened).Milliseconds()
		c.emit(events.NamePortForwardClosed, ev)
	})
	return err
}
