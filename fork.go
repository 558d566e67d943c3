package sandkeep

import (
	"context"

	"github.com/sandkeep/sandkeep/internal/engine"
)

// ForkLimits bound what a fork may copy: regular files' bytes and entries in all (zero: no bound of its own; the
// new key's template's workspace quota, resources.disk, bounds it anyway).
type ForkLimits struct {
	Bytes  int64
	Inodes int64
}

// Fork makes rr.Key a new sandbox holding a copy of from's workspace (reflinked where the file system can, a copy
// where it cannot) in from's template, and leaves from running; later changes on either side stay apart. The fork
// is admitted as rr.Key's first command would be (the same mode, trust, driver and template checks, recorded as
// a run that ends with the fork, with sandbox_forked among its events). rr.Template must be "" or from's own.
// Failures: a source without a sandbox is SANDBOX_NOT_FOUND, a target with a sandbox or a workspace
// SANDBOX_EXISTS, a copy past lim or the template's quota QUOTA_EXCEEDED; a refused fork leaves nothing.
func (m *Manager) Fork(ctx context.Context, from Key, rr RunRequest, lim ForkLimits) (Sandbox, error) {
	sb, err := m.e.Fork(ctx, from, rr.engine(), engine.ForkLimits{Bytes: lim.Bytes, Inodes: lim.Inodes})
	if err != nil {
		return Sandbox{}, err
	}
	return sandboxOf(sb), nil
}
