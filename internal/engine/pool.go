package engine

import (
	"context"
	"maps"
	"slices"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// WarmPools starts the warm pools of the templates that ask for one (Template.Pool) on the primary driver: each
// keeps that many sandboxes of its template made ahead, and a new key's first command with that template claims
// one instead of creating a sandbox. At most Config.PoolCap members in all (0: the sum of the pools). Only one
// process per state home keeps pools: ok is false when another one does, or when no template asks for one. The
// pools end with Close; their members stay for the next process to adopt.
//
// replicated says this process is one replica of a fleet whose replicas have homes of their own. Pools are then
// kept only on a driver that records each claim in the engine (driver.ClaimKeeper: kubernetes); on another, each
// replica's home alone would know its claims, so one replica could adopt, as ready, a member another replica had
// already given to a key, and hand it to a second key. That is refused, and the fleet creates on demand.
func (m *Manager) WarmPools(ctx context.Context, replicated bool) (ok bool, err error) {
	var names []string
	for _, name := range slices.Sorted(maps.Keys(m.cfg.Templates)) {
		if m.cfg.Templates[name].Pool > 0 {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return false, nil
	}
	lc, err := m.primary(ctx)
	if err != nil {
		return false, err
	}
	if _, keeps := lc.Driver().(driver.ClaimKeeper); replicated && !keeps {
		return false, fault.New(fault.SpecUnsupported, "remove pool from the templates, or run the fleet on the kubernetes driver",
			"warm pools in a fleet need a driver that records each claim in the engine (kubernetes): on %s each replica's home keeps its own claims, and two replicas could hand one member to two keys",
			lc.Driver().Name())
	}
	specs := make([]lifecycle.PoolSpec, 0, len(names))
	for _, name := range names {
		tpl := &template{Template: m.cfg.Templates[name], nm: name}
		// The shape a run of this template gets (prepare), so a claim's posture is the run's.
		repo, err := m.loadRepository(m.specFor("", tpl))
		if err != nil {
			return false, err
		}
		if repo.sb.Build != nil || len(repo.features) > 0 || len(repo.companions) > 0 || len(repo.containerRefs) > 0 {
			return false, fault.New(fault.InvalidArgument, "give the pooled template an image (no build, features or compose services)",
				"template %q cannot be pooled: its sandboxes are built per run", name)
		}
		var applyErr error
		sh, err := lc.NewShape(name, func(c *lifecycle.Config) {
			tpl.apply(c)
			applyErr = repo.apply(c)
		})
		if err == nil {
			err = applyErr
		}
		if err != nil {
			return false, err
		}
		specs = append(specs, lifecycle.PoolSpec{Shape: sh, Size: tpl.Pool})
	}
	return lc.StartPools(ctx, specs, m.cfg.PoolCap)
}

// PoolStatus is what one template's warm pool holds now.
type PoolStatus = lifecycle.PoolStatus

// Pools reports the warm pools this process keeps (none: nil).
func (m *Manager) Pools() []PoolStatus {
	m.mu.Lock()
	lcs := slices.Collect(maps.Values(m.lcs))
	m.mu.Unlock()
	var out []PoolStatus
	for _, lc := range lcs {
		out = append(out, lc.Pools()...)
	}
	return out
}
