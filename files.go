package sandkeep

import (
	"context"
	"time"

	"github.com/sandkeep/sandkeep/internal/files"
)

// Files is one sandbox's workspace, opened on the host: reads and writes confined to it, whatever the sandbox
// plants in it. See Manager.Files.
type Files = files.FS

// FileLimits bound what one file operation may move; zero fields take the defaults (1 GiB per file, 4 GiB and
// 100000 entries per tar).
type FileLimits = files.Limits

// FileEntry is one entry of a workspace listing.
type FileEntry = files.Entry

// Files opens key's workspace (/workspace in its sandbox) for host-side file access, without touching the
// sandbox itself: no exec, no `docker cp`. With create, a missing workspace is created (owned by the sandbox
// user); without, it is FILE_NOT_FOUND. The caller closes it.
func (m *Manager) Files(key Key, create bool, lim FileLimits) (*Files, error) {
	dir, uid, gid, err := m.lc.Workspace(key, create)
	if err != nil {
		return nil, err
	}
	return files.Open(dir, uid, gid, lim)
}

// Sandbox describes key's sandbox; none is SANDBOX_NOT_FOUND.
func (m *Manager) Sandbox(ctx context.Context, key Key) (Sandbox, error) {
	in, err := m.lc.Info(ctx, key)
	if err != nil {
		return Sandbox{}, err
	}
	return sandboxOf(in), nil
}

// Ping checks that the driver answers.
func (m *Manager) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return m.drv.Ping(ctx)
}
