package lifecycle

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/channel"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// How long a command waits for the agent's channel before it falls back to the engine's exec (auto) or fails
// (agent). A sandbox that was just started, or a listener just created, gets longer: its agent is connecting.
const (
	channelWaitWarm  = 20 * time.Millisecond
	channelWaitFresh = time.Second
	// channelWaitFreshNet: a new pod's agent dials over the pod network, and is believed only once the driver's
	// pod informer saw the pod run with its IP.
	channelWaitFreshNet = 3 * time.Second
	channelWaitForce    = 10 * time.Second
	reconnectWait       = 5 * time.Second // after a broken channel, for the agent to prove the sandbox clean
	acceptWait          = 2 * time.Second // for the agent to acknowledge a request; past it the sandbox is frozen or stuck
)

// errNotStarted: the command did not start over the channel and the sandbox was recycled; run it again.
var errNotStarted = errors.New("command not started; sandbox recycled")

// channelDir is key's channel directory, or "" when the driver cannot bind one or the runtime cannot carry it:
// under gVisor (runsc) a sandbox reaches a host Unix socket only through its gofer, so the host would see the
// gofer, not the sandbox's PID 1, as the peer, and could not verify the agent. Such sandboxes use the engine's
// exec.
func (m *Manager) channelDir(key identity.Key) string {
	if !m.drv.Capabilities().Channel || m.cfg.Runtime == RuntimeGVisor {
		return ""
	}
	return m.home.ChannelDir(key)
}

// listenerFor is channelFor the sandbox this process last ensured for key.
func (m *Manager) listenerFor(key identity.Key) (*channel.Slot, bool) {
	return m.channelFor(key, m.cached(key))
}

// channelFor returns key's agent channel and whether it was just made. The session side is one for every
// driver (channel.Slot); who accepts and verifies the agent's connection is not: a driver that offers its
// sandboxes' channels (driver.AgentChannels: the kubernetes driver's pod network) gives sb's, and otherwise
// this process listens on the Unix socket in key's channel directory (the Docker driver), creating the listener
// when needed. It returns nil when this process does not use the channel (the exec transport, gVisor, a driver
// with none), when another live process serves the socket, or when the driver's channel needs a sandbox and sb
// is nil. Whether a command then goes over the channel or through the driver's Exec is decided here, in the
// lifecycle, and nowhere else.
func (m *Manager) channelFor(key identity.Key, sb *driver.Sandbox) (*channel.Slot, bool) {
	if ac, ok := m.drv.(driver.AgentChannels); ok {
		if sb == nil || m.cfg.Transport == TransportExec {
			return nil, false
		}
		return ac.AgentChannel(sb), false
	}
	l, made := m.listenerWith(key, m.verifier(func() identity.Key { return key }))
	if l == nil {
		return nil, made
	}
	return l.Slot, made
}

// servesChannel reports whether this process carries key's commands over an agent channel at all: a Docker
// sandbox with its channel directory, or a driver that offers its sandboxes' channels and has one on.
func (m *Manager) servesChannel(key identity.Key) bool {
	if m.cfg.Transport == TransportExec {
		return false
	}
	if ac, ok := m.drv.(driver.AgentChannels); ok {
		return ac.HasAgentChannel()
	}
	return m.channelDir(key) != ""
}

// listenerWith is listenerFor with the verifier v for a new listener.
func (m *Manager) listenerWith(key identity.Key, v channel.Verifier) (*channel.Listener, bool) {
	dir := m.channelDir(key)
	if dir == "" || m.cfg.Transport == TransportExec {
		return nil, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if l, ok := m.listeners[key.Hex()]; ok {
		return l, false
	}
	l, err := channel.Listen(dir, v, m.cfg.Logger)
	if err != nil {
		if !errors.Is(err, channel.ErrInUse) {
			m.cfg.Logger.Warn("agent channel unavailable", "key", key.Short(), "err", err)
		}
		return nil, false
	}
	m.listeners[key.Hex()] = l
	return l, true
}

// verifier accepts a connection only from the PID 1 of the sandbox of the key current returns (a pool member's
// key until a key claims it, then that key's), as the engine reports it.
func (m *Manager) verifier(current func() identity.Key) channel.Verifier {
	known := func(pid int) bool {
		sb := m.cached(current())
		return sb != nil && sb.Pid == pid
	}
	// A pid that is not the cached PID 1 costs an engine call at most once a second (channel.Throttle): a
	// process inside dialing the sockets in a loop cannot make this process drive the engine.
	return channel.Throttle(known, func(pid int) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		key := current()
		sb, err := m.inspectKey(ctx, key)
		return err == nil && sb.State == driver.StateRunning && sb.Pid == pid && m.checkOurs(key, sb) == nil
	}, time.Second)
}

// dropListener closes key's listener and removes its channel directory (the sandbox is gone).
func (m *Manager) dropListener(key identity.Key) {
	m.dropEgress(key)
	m.dropServices(key)
	m.dropRelay(key)
	m.mu.Lock()
	l := m.listeners[key.Hex()]
	delete(m.listeners, key.Hex())
	m.mu.Unlock()
	if l != nil {
		l.Close()
	}
	if dir := m.channelDir(key); dir != "" {
		_ = os.RemoveAll(dir)
	}
}

// takeChannel returns the connection to use for this command, or nil to use the engine's exec.
func (m *Manager) takeChannel(ctx context.Context, l *channel.Slot, fresh bool) (*agentproto.Mux, error) {
	if l == nil {
		// A driver without a channel (the host passthrough) has only its own way to run a command: the transport
		// choice is about sandboxes, and a run degraded to the host must not fail over it.
		if m.cfg.Transport == TransportAgent && (m.drv.Capabilities().Channel || m.offersChannel()) {
			if m.cfg.Runtime == RuntimeGVisor {
				return nil, unavailable("sandboxes under gVisor (runsc) have none (docs/SECURITY.md, \"gVisor\")")
			}
			return nil, unavailable("this process cannot serve the sandbox's channel (another process serves it)")
		}
		return nil, nil
	}
	wait := channelWaitWarm
	switch {
	case m.cfg.Transport == TransportAgent:
		wait = channelWaitForce
	case fresh && m.offersChannel():
		wait = channelWaitFreshNet
	case fresh:
		wait = channelWaitFresh
	}
	conn, err := l.Take(ctx, wait)
	switch {
	case err == nil:
		return conn, nil
	case ctx.Err() != nil:
		return nil, err
	case m.cfg.Transport == TransportAgent:
		return nil, unavailable("the agent did not connect within " + wait.String())
	}
	return nil, nil
}

// offersChannel: the driver accepts its sandboxes' agent connections itself and has its channel on.
func (m *Manager) offersChannel() bool {
	ac, ok := m.drv.(driver.AgentChannels)
	return ok && ac.HasAgentChannel()
}

func unavailable(why string) error {
	return fault.New(fault.TransportUnavailable, "use --transport auto (falls back to the engine's exec) or exec",
		"the agent channel is not available: %s", why)
}

// execChannel runs preq over the sandbox's channel. A channel that breaks mid-command is dropped; the agent
// reconnects only once every process of that command is gone, and a sandbox whose agent does not reconnect is
// recycled, in both cases before the gate is released.
func (m *Manager) execChannel(ctx context.Context, key identity.Key, sb *driver.Sandbox, l *channel.Slot,
	conn *agentproto.Mux, preq agentproto.Request, out driver.Output) (*ExecResult, error) {
	res, err := agentproto.RunWith(ctx, conn.Commands(), preq, out.Stdout, out.Stderr, out.Stdin,
		agentproto.RunOptions{AcceptWait: acceptWait, Resize: out.Resize})
	result := &ExecResult{Result: res, Sandbox: sb.Clone(), Transport: TransportAgent}
	switch {
	case err == nil:
		return result, nil
	case errors.Is(err, agentproto.ErrNotAccepted) && ctx.Err() == nil:
		// Paused behind our back, or the agent is stuck: the request may sit unread in it, so the sandbox goes
		// (and the request with it) before the command runs anywhere else.
		l.Broken(conn)
		m.recycle(ctx, key, sb, err)
		return nil, errNotStarted
	case errors.Is(err, agentproto.ErrProtocol):
		l.Broken(conn)
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reconnectWait)
		defer cancel()
		if !l.WaitReconnect(wctx, conn, reconnectWait) {
			m.recycle(ctx, key, sb, err)
		}
		return nil, fault.Wrap(err, fault.AgentProtocol,
			"run the command again; files in /workspace are kept",
			"the agent channel of sandbox %s broke during the command", sb.Name)
	case ctx.Err() != nil:
		return result, err
	}
	return nil, coded(ctx, err, key)
}
