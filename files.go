package sandkeep

import (
	"context"
	"time"

	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/lifecycle"
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
	var dir string
	var uid, gid int
	var err error
	if lc, perr := m.primary(context.Background()); perr == nil {
		dir, uid, gid, err = lc.Workspace(key, create)
	} else {
		// No engine: the workspace is still there to read and write, as long as its owner is the Config's.
		dir, uid, gid, err = lifecycle.HomeWorkspace(m.home, m.lcfg, key, create)
	}
	if err != nil {
		return nil, err
	}
	fs, err := files.Open(dir, uid, gid, lim)
	if err != nil {
		return nil, err
	}
	// The file API follows the repository's workspace folder (devcontainer.json's workspaceFolder): its
	// absolute paths are accepted as the sandbox sees them.
	if r, rerr := m.loadRepository(m.cfg.Spec); rerr == nil && r.sb.WorkspaceFolder != "" {
		fs.InFolder(r.sb.WorkspaceFolder)
	}
	return fs, nil
}

// Sandbox describes key's sandbox; none is SANDBOX_NOT_FOUND.
func (m *Manager) Sandbox(ctx context.Context, key Key) (Sandbox, error) {
	lc, err := m.primary(ctx)
	if err != nil {
		return Sandbox{}, err
	}
	in, err := lc.Info(ctx, key)
	if err != nil {
		return Sandbox{}, err
	}
	return sandboxOf(in), nil
}

// Ping checks that a sandboxing driver is usable and answers now; the error says why not.
func (m *Manager) Ping(ctx context.Context) error {
	lc, err := m.primary(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return lc.Driver().Ping(ctx)
}
