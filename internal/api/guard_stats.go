package api

import (
	"context"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/service"
)

var _ service.StatsReader = (*guarded)(nil)

// Stats is the backend's: a sample is read, not admitted (no run, no gate), as a sandbox's description is.
func (g *guarded) Stats(ctx context.Context, key sandkeep.Key) (sandkeep.Stats, error) {
	sr, ok := g.Backend.(service.StatsReader)
	if !ok {
		return sandkeep.Stats{}, service.ErrNoStats()
	}
	return sr.Stats(ctx, key)
}
