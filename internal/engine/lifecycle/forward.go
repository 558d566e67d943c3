package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// forwardConns numbers the forwarded connections of this process, for matching their events.
var forwardConns atomic.Uint64

// DialPort opens one forwarded connection to 127.0.0.1:port inside key's running sandbox: a stream on the
// sandbox's agent channel when this process serves it, otherwise one engine exec through the driver
// (driver.PortDialer); either way the agent dials from inside the sandbox's own network namespace, and the
// sandbox keeps network mode none (see dialPort). It does not take the key's gate: a forward lives alongside the user's commands, as a
// server started by one of them does. A sandbox that is missing, stopped or not ours is refused; so is a port
// nothing listens on (PORT_UNREACHABLE). via ("cli", "api") labels the events; onEvent receives them (nil: the
// Manager's own sink). The connection's Close records port_forward_closed.
func (m *Manager) DialPort(ctx context.Context, key identity.Key, port int, via string, onEvent Sink) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fault.New(fault.InvalidArgument, "pass a TCP port between 1 and 65535, e.g. 8080",
			"port %d is out of range", port)
	}
	if _, ok := m.drv.(driver.PortDialer); !ok && !m.servesChannel(key) {
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
	c, transport, err := m.dialPort(ctx, key, sb, port)
	switch {
	case errors.Is(err, driver.ErrPortUnreachable):
		return nil, fault.Wrap(err, fault.PortUnreachable,
			"start the server in the sandbox first, listening on 127.0.0.1 or 0.0.0.0 of that port",
			"nothing in sandbox %s accepts connections on port %d: %v", sb.Name, port, err)
	case errors.Is(err, agentproto.ErrForwardRefused):
		return nil, fault.Wrap(err, fault.PortForwardUnavailable,
			fmt.Sprintf("close some forwarded connections to this sandbox (at most %d at once)", agentproto.MaxForwards),
			"the agent of sandbox %s refused the connection: %v", sb.Name, err)
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
	emit(events.NamePortForwardOpened, events.PortForwardOpened{Sandbox: sb.Name, Port: port, Conn: fc.closed.Conn, Via: via,
		Transport: string(transport)})
	return fc, nil
}

// dialPort opens the connection: a stream on the sandbox's agent channel when this process serves it (the
// fast path: no engine call), otherwise one engine exec of the agent through the driver (driver.PortDialer), the
// fallback for a process that has no channel to the sandbox (another process serves it, the exec transport,
// gVisor). A channel that broke just now falls back too.
func (m *Manager) dialPort(ctx context.Context, key identity.Key, sb *driver.Sandbox, port int) (net.Conn, Transport, error) {
	if l, fresh := m.channelFor(key, sb); l != nil {
		wait := channelWaitWarm
		if fresh {
			wait = channelWaitFresh
		}
		if mux, err := l.Current(ctx, wait); err == nil {
			s, err := mux.Dial(ctx, netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(port)))
			switch {
			case err == nil:
				return s, TransportAgent, nil
			case errors.Is(err, agentproto.ErrForwardUnreachable):
				return nil, "", fmt.Errorf("%w: %w", driver.ErrPortUnreachable, err)
			case errors.Is(err, agentproto.ErrForwardRefused), ctx.Err() != nil:
				return nil, "", err
			}
			m.cfg.Logger.Warn("port forward: the agent channel broke; using the engine's exec", "key", key.Short(), "err", err)
		} else if ctx.Err() != nil {
			return nil, "", err
		}
	}
	pd, ok := m.drv.(driver.PortDialer)
	if !ok {
		return nil, "", fault.New(fault.PortForwardUnavailable, "run the forward where the sandbox's channel is served (sandkeep serve, the daemon)",
			"the %s driver forwards ports only over the agent channel, and this process has none to sandbox %s", m.drv.Name(), sb.Name)
	}
	c, err := pd.DialPort(ctx, sb, port)
	return c, TransportExec, err
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
