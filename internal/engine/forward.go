package engine

import (
	"context"
	"net"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/record"
)

// PortForward says who opens a forwarded connection and where its events go.
type PortForward struct {
	// Via labels the events: "cli" (sandkeep port-forward), "api" (the server's route) or the embedder's own word.
	Via string
	// RequestID, when set, is recorded on the connection's events.
	RequestID string
	// OnEvent, when set, also receives port_forward_opened and port_forward_closed.
	OnEvent EventFunc
}

// DialPort opens one connection to 127.0.0.1:port inside key's running sandbox, like one connection of
// `kubectl port-forward`: the sandbox keeps its network (mode none: nothing goes out), and the connection is made
// from inside it by the agent. Call it once per connection; they run in parallel and do not take the user's
// gate. A missing sandbox is SANDBOX_NOT_FOUND, a stopped one SANDBOX_NOT_RUNNING, a port nothing listens on
// PORT_UNREACHABLE, a driver that cannot forward PORT_FORWARD_UNAVAILABLE. The connection ends when either side
// closes it or the sandbox stops; opening and closing are recorded as events (in the store when Config.Store is
// set, with no run) and also go to Config.OnEvent.
//
// Who may open one is the caller's business: the CLI is the operator, the API requires the exec scope for the
// tenant (docs/SECURITY.md, "Port forwarding").
func (m *Manager) DialPort(ctx context.Context, key Key, port int, pf PortForward) (net.Conn, error) {
	lc, err := m.primary(ctx)
	if err != nil {
		return nil, err
	}
	var rec *record.Recorder
	if m.st != nil {
		rec = &record.Recorder{Store: m.st, RequestID: pf.RequestID}
	}
	sink := func(name string, payload any) {
		if rec != nil {
			rec.Event(name, payload)
		}
		if pf.OnEvent != nil {
			pf.OnEvent(name, payload)
		}
		if m.cfg.OnEvent != nil {
			m.cfg.OnEvent(name, payload)
		}
	}
	return lc.DialPort(ctx, key, port, pf.Via, lifecycle.Sink(sink))
}

// DialPortExec opens a forwarded connection the fallback way, one engine exec of the agent per connection,
// whether or not this manager has the sandbox's channel: the other side of the port-forward benchmark.
func (m *Manager) DialPortExec(ctx context.Context, key Key, port int) (net.Conn, error) {
	lc, err := m.primary(ctx)
	if err != nil {
		return nil, err
	}
	drv := lc.Driver()
	sb, err := lc.Sandbox(ctx, key)
	if err != nil {
		return nil, err
	}
	pd, ok := drv.(driver.PortDialer)
	if !ok {
		return nil, fault.New(fault.PortForwardUnavailable, "use a driver that forwards ports", "the %s driver cannot forward ports", drv.Name())
	}
	return pd.DialPort(ctx, sb, port)
}
