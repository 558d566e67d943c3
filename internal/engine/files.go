package engine

import (
	"context"
	"time"

	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/files"
)

// Files is one sandbox's workspace, opened for file access: reads and writes confined to it, whatever the
// sandbox plants in it. On a driver whose workspaces are on this host (Docker) they go to the workspace
// directory directly; on one that keeps them itself (kubernetes: a claim mounted in the pod) each operation runs
// in the sandbox through its agent, with the same confinement, limits and faults. See Manager.Files.
type Files = files.FS

// FileLimits bound what one file operation may move; zero fields take the defaults (1 GiB per file, 4 GiB and
// 100000 entries per tar).
type FileLimits = files.Limits

// FileEntry is one entry of a workspace listing.
type FileEntry = files.Entry

// Files opens key's workspace (/workspace in its sandbox) for file access; it is FilesContext without a
// context. The caller closes it.
func (m *Manager) Files(key Key, create bool, lim FileLimits) (*Files, error) {
	return m.FilesContext(context.Background(), key, create, lim)
}

// FilesContext opens key's workspace (/workspace in its sandbox) for file access. The caller closes it.
//
// Where the workspace is on this host (the docker driver), it is opened there, without touching the sandbox: no
// exec, no `docker cp`, and it works while no engine answers. With create, a missing workspace is created
// (owned by the sandbox user); without, it is FILE_NOT_FOUND.
//
// Where the driver keeps the workspace (the kubernetes driver), every operation runs inside the sandbox, as its
// user, through the agent (`sandkeep-agent fs`); ctx bounds the operations that take no context of their own
// (Stat, List, OpenFile and its reader). The sandbox is provided as a command would provide it: a stopped pod
// is started (its claim kept the files), a drifted one recreated. Without create, a key that has no sandbox is
// FILE_NOT_FOUND; with create, its sandbox is made.
func (m *Manager) FilesContext(ctx context.Context, key Key, create bool, lim FileLimits) (*Files, error) {
	if err := key.Check(); err != nil {
		return nil, err
	}
	var dir string
	var uid, gid int
	var err error
	var fs *files.FS
	if lc, perr := m.primary(ctx); perr == nil && lc.RemoteWorkspaces() {
		run, err := lc.RemoteWorkspace(ctx, key, create)
		if err != nil {
			return nil, err
		}
		fs = files.OpenRemote(ctx, run, lim)
	} else {
		if perr == nil {
			dir, uid, gid, err = lc.Workspace(key, create)
		} else {
			// No engine: the workspace is still there to read and write, as long as its owner is the Config's.
			dir, uid, gid, err = lifecycle.HomeWorkspace(m.home, m.lcfg, key, create)
		}
		if err != nil {
			return nil, err
		}
		if fs, err = files.Open(dir, uid, gid, lim); err != nil {
			return nil, err
		}
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
