// Package pools keeps warm pools of a Manager's templates: a template that asks for one (Template.Pool) has that
// many sandboxes made ahead, and a new key's first command with that template claims one instead of creating a
// sandbox. It is the operator's (sandkeep serve keeps them); a library user who does not serve leaves it out.
package pools

import (
	"context"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/engine"
)

// Warm starts the warm pools of m's templates that ask for one, on the primary driver, at most Config.PoolCap
// members in all (0: the sum of the pools). Only one process per state home keeps pools: ok is false when
// another one does, or when no template asks for one. The pools end with m's Close; their members stay for the
// next process to adopt.
func Warm(ctx context.Context, m *sandkeep.Manager) (ok bool, err error) {
	return engine.Facade.Manager(m).WarmPools(ctx, false)
}

// WarmReplica is Warm for one replica of a fleet whose replicas have homes of their own: it keeps pools only on a
// driver that records each claim in the engine (kubernetes), and refuses with SPEC_UNSUPPORTED on another (each
// replica would keep its own pool, and two could hand one member to two keys).
func WarmReplica(ctx context.Context, m *sandkeep.Manager) (ok bool, err error) {
	return engine.Facade.Manager(m).WarmPools(ctx, true)
}

// Status is what one template's warm pool holds now: its size (the operator's N), the members ready to be
// claimed and those being made.
type Status struct {
	Template string
	Size     int
	Ready    int
	Making   int
}

// List reports the warm pools m keeps (none: nil).
func List(m *sandkeep.Manager) []Status {
	var out []Status
	for _, p := range engine.Facade.Manager(m).Pools() {
		out = append(out, Status(p))
	}
	return out
}
