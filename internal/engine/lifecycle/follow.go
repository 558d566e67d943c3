package lifecycle

import (
	"context"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// announceChannel is told of a running sandbox this process takes on without having made or started it (no
// cached sandbox: a restart, or in a fleet a replica that took the key over from a dead one). A driver whose
// agents dial an address (driver.AgentAnnouncer: the kubernetes driver) tells the agent to dial this process
// now, rather than the address it was made with, where nobody may answer any more. It reports whether the
// agent was told: the sandbox is then adopted (sandbox_adopted), and the command waits for its agent as for a
// fresh sandbox's. A failure only costs the channel: the command goes through the driver's exec.
func (m *Manager) announceChannel(ctx context.Context, key identity.Key, sb *driver.Sandbox) bool {
	a, ok := m.drv.(driver.AgentAnnouncer)
	if !ok || m.cfg.Transport == TransportExec {
		return false
	}
	told, err := a.AnnounceChannel(ctx, sb)
	if err != nil {
		m.cfg.Logger.Warn("agent channel: cannot announce this process to the sandbox's agent; its commands go through the driver's exec",
			"key", key.Short(), "sandbox", sb.Name, "err", err)
	}
	if told {
		logf(ctx, LogDriver, "%s: told the agent of %s to dial this process", m.drv.Name(), sb.Name)
	}
	return told
}
