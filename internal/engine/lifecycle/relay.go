package lifecycle

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/channel"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Relays: the agent channel of a sandbox whose agent cannot dial a host socket (gVisor: its gofer stands
// between the sandbox and a host Unix socket, so the host could not tell PID 1 from any command) or whose
// process uses the exec transport (the operator's choice: nothing but the engine's exec reaches the sandbox).
// This process opens the session itself, as an engine exec of `sandkeep-agent relay` as uid 0
// (driver.AgentRelayer), which the sandbox's init verifies and hands to a serve child like a host connection
// (cmd/sandkeep-agent/relay_linux.go). The session is one channel.Slot, the same as every driver's, so
// processes, concurrent commands and their operations run over it unchanged. One-at-a-time commands keep the
// engine's exec there (each its own `serve`), as before.

// relayRetry bounds how long an open waits for init to take a relay: it turns relays away while it kills the
// last session's processes, which takes moments.
const relayRetry = time.Second

// relaySlot is one key's relayed channel; mu makes its opens one at a time.
type relaySlot struct {
	mu   sync.Mutex
	slot *channel.Slot
	run  string // the container run its session was opened in (relayRun); guarded by mu
}

// relayRun names one run of sb's container, "" when the engine did not report its PID 1: a session opened
// before a stop or restart is not of this run. A relay is an engine exec, whose stream under gVisor may outlive
// its container's stop by a while, so Up alone cannot tell (CI, stop 30: a process List after a restart went to
// the dead run's session and broke).
func relayRun(sb *driver.Sandbox) string {
	if sb.Pid == 0 {
		return ""
	}
	return sb.ID + "/" + strconv.Itoa(sb.Pid)
}

// relayer is the driver's relay when this process carries key's channel sessions by relay, else nil.
func (m *Manager) relayer() driver.AgentRelayer {
	r, ok := m.drv.(driver.AgentRelayer)
	if !ok || (m.cfg.Runtime != RuntimeGVisor && m.cfg.Transport != TransportExec) {
		return nil
	}
	return r
}

// relayFor returns key's relayed channel with a session up in sb, opening one when none is.
func (m *Manager) relayFor(ctx context.Context, key identity.Key, sb *driver.Sandbox) (*channel.Slot, error) {
	v, _ := m.relays.LoadOrStore(key.Hex(), &relaySlot{slot: channel.NewSlot()})
	rs := v.(*relaySlot)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if run := relayRun(sb); run != "" && rs.run != run {
		if rs.run != "" {
			rs.slot.Drop() // a session of an earlier run: its processes died with that run
		}
		rs.run = run
	}
	if rs.slot.Up() {
		return rs.slot, nil
	}
	deadline := time.Now().Add(relayRetry)
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, 200*time.Millisecond) {
		conn, err := m.relayer().Relay(ctx, sb)
		switch {
		case err == nil:
			if !rs.slot.Install(conn) {
				return nil, errors.New("the relay's slot is closed")
			}
			return rs.slot, nil
		case !errors.Is(err, driver.ErrRelayRefused) || time.Now().After(deadline):
			return nil, err
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// channelRelayed is channelShared for a relayed key: its session, opened when needed.
func (m *Manager) channelRelayed(ctx context.Context, key identity.Key, sb *driver.Sandbox) (*channel.Slot, *agentproto.Mux, error) {
	l, err := m.relayFor(ctx, key, sb)
	if err == nil {
		var mux *agentproto.Mux
		if mux, err = l.Current(ctx, channelWaitWarm); err == nil {
			return l, mux, nil
		}
	}
	switch {
	case ctx.Err() != nil:
		return nil, nil, context.Cause(ctx)
	case errors.Is(err, driver.ErrRelayRefused):
		return nil, nil, fault.Wrap(err, fault.ProcessUnavailable,
			"run it through the process that serves this sandbox (`sandkeep serve`, or the daemon: SANDKEEP_DAEMON=auto)",
			"another process holds the agent channel of the sandbox for %s", key)
	}
	m.forget(key)
	return nil, nil, fault.Wrap(err, fault.SandboxNotRunning, "run a command in it, which starts it",
		"the agent of the sandbox for %s cannot be reached through a relay (is the sandbox running?): %v", key, err)
}

// awaitClean is what a caller does after the channel l broke under mux: the agent kills every process of that
// session before it takes the next one, so a next session proves the sandbox clean. A host connection comes
// back by itself (WaitReconnect); a relay is opened again. It reports whether the sandbox proved clean.
func (m *Manager) awaitClean(ctx context.Context, key identity.Key, sb *driver.Sandbox, l *channel.Slot, mux *agentproto.Mux) bool {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reconnectWait)
	defer cancel()
	if m.relayer() == nil {
		return l.WaitReconnect(wctx, mux, reconnectWait)
	}
	for {
		if _, err := m.relayFor(wctx, key, sb); err == nil {
			return true
		}
		select {
		case <-wctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// dropRelay closes key's relayed channel (the sandbox is going): what runs over it ends with it.
func (m *Manager) dropRelay(key identity.Key) {
	if v, ok := m.relays.LoadAndDelete(key.Hex()); ok {
		v.(*relaySlot).slot.Close()
	}
}

// closeRelays closes every relayed channel of this process: the agents end their sessions' processes, as they
// do when a host connection's process goes away.
func (m *Manager) closeRelays() {
	m.relays.Range(func(k, v any) bool {
		m.relays.Delete(k)
		v.(*relaySlot).slot.Close()
		return true
	})
}
