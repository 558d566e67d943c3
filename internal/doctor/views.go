package doctor

import (
	"context"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/engine"
)

// The engine's views doctor judges: what admission would decide for a run, the offered drivers, their network
// probe and capacity. They are the operator's, not the library user's, so the public API leaves them out and
// doctor asks the engine behind the CLI's Manager (engine.Facade).
type (
	Plan               = engine.Plan               // what admission would decide, with nothing recorded, created or run
	DriverStatus       = engine.DriverStatus       // one offered driver and whether it is usable here
	DriverCapabilities = engine.DriverCapabilities // the optional things a driver can do
	Capacity           = engine.Capacity           // how many sandboxes of each shape a driver's room holds
)

// Views are the engine's views of one Manager.
type Views struct{ e *engine.Manager }

// ViewsOf is m's engine's views.
func ViewsOf(m *sandkeep.Manager) Views { return Views{e: engine.Facade.Manager(m)} }

// Plan decides as Manager.Admit would for rr, and records, creates and runs nothing. An input that is not
// understood, or a repository that asks for what it may not, is its error; a refusal of the verdict is
// Plan.Refusal.
func (v Views) Plan(ctx context.Context, rr sandkeep.RunRequest) (*Plan, error) {
	return v.e.Plan(ctx, engine.Facade.RunRequest(rr))
}

// ForwardPorts are p's forwardPorts as port forwarding reports them.
func ForwardPorts(p *Plan) []sandkeep.ForwardPort {
	var out []sandkeep.ForwardPort
	for _, f := range p.ForwardPorts {
		out = append(out, sandkeep.ForwardPort(f))
	}
	return out
}

// HostKind is the kind of host the Manager chose drivers for: local or cloud.
func (v Views) HostKind() string { return v.e.HostKind() }

// Drivers probes the offered drivers of this host kind's preference order, best first.
func (v Views) Drivers(ctx context.Context) []DriverStatus { return v.e.Drivers(ctx) }

// ProbeNetworkPolicy runs the network confinement probe of the driver named drv (the kubernetes driver's probe
// pod, which takes seconds) and returns its verdict and what it found; ok is false for a driver that needs none
// or is not offered.
func (v Views) ProbeNetworkPolicy(ctx context.Context, drv string) (enforced bool, detail string, ok bool) {
	return v.e.ProbeNetworkPolicy(ctx, drv)
}

// Capacity asks the driver named drv what its sandboxes can reserve in all (a cluster's schedulable nodes, else
// its namespace's quota; a Docker host's CPUs and memory) and divides it by each shape's reservation: the
// Config's shape, then every template's by name. nil for a driver that reserves nothing (the host).
func (v Views) Capacity(ctx context.Context, drv string) (*Capacity, error) {
	return v.e.Capacity(ctx, drv)
}
