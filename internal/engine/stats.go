package engine

import (
	"context"

	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
)

// Stats is one sample of a sandbox's resource use (lifecycle.Stats).
type Stats = lifecycle.Stats

// Stats samples key's running sandbox: CPU and memory as its engine counts them, and its workspace's disk.
func (m *Manager) Stats(ctx context.Context, key Key) (Stats, error) {
	lc, err := m.primary(ctx)
	if err != nil {
		return Stats{}, err
	}
	return lc.Stats(ctx, key)
}
