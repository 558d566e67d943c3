package service

import (
	"context"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// StatsReader is optional: a Backend that samples a running sandbox's resource use (sandkeep.Manager.Stats).
// The E2B front's metrics read it; without it they have no samples.
type StatsReader interface {
	Stats(ctx context.Context, key sandkeep.Key) (sandkeep.Stats, error)
}

var _ StatsReader = (*Service)(nil)

// Stats is sandkeep.Manager.Stats.
func (s *Service) Stats(ctx context.Context, key sandkeep.Key) (sandkeep.Stats, error) {
	return s.m.Stats(ctx, key)
}

// ErrNoStats is the answer of an entry point whose Backend is no StatsReader.
func ErrNoStats() error {
	return fault.New(fault.SpecUnsupported, "run sandkeep serve over a sandkeep Manager, which reads stats",
		"this server's backend reads no resource stats")
}
