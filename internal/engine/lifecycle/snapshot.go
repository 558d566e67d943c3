package lifecycle

import (
	"context"
	"io"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// ArchiveWorkspace writes key's workspace to w as a tar (files.FS.WriteTar: links as links, never followed),
// holding the key's gate so that no command of the key writes meanwhile. A key without a sandbox is
// SANDBOX_NOT_FOUND; a driver that keeps workspaces itself (kubernetes) FILES_UNAVAILABLE.
func (m *Manager) ArchiveWorkspace(ctx context.Context, key identity.Key, w io.Writer, lim files.Limits) error {
	release, err := m.gates.acquire(ctx, key, m.cfg.GateWait)
	if err != nil {
		return err
	}
	defer release()
	if _, err := m.owned(ctx, key); err != nil {
		if fault.Is(err, fault.ForeignContainer) {
			return errNoSandbox(key)
		}
		return err
	}
	dir, uid, gid, err := m.Workspace(key, false)
	if err != nil {
		return err
	}
	fs, err := files.Open(dir, uid, gid, lim)
	if err != nil {
		return err
	}
	defer fs.Close()
	return fs.WriteTar(ctx, "", w)
}

// RestoreOptions bound a restore's archive and say where its events go.
type RestoreOptions struct {
	Limits  files.Limits
	OnEvent Sink // the caller's run: sandbox_started of the new sandbox
}

// Restore makes to a new key whose workspace holds the tar archive r (files.FS.ExtractTar: confined to the
// workspace, owned by to's user), and its sandbox in shape sh. to must be new (SANDBOX_EXISTS otherwise); any
// failure, a damaged archive included, leaves nothing of to.
func (m *Manager) Restore(ctx context.Context, to identity.Key, sh *Shape, r io.Reader, opts RestoreOptions) (*driver.Sandbox, error) {
	sh = m.shapeOf(sh)
	ctx = withSink(ctx, opts.OnEvent)
	if _, elsewhere := m.drv.(driver.WorkspaceRemover); elsewhere {
		return nil, fault.New(fault.FilesUnavailable, "restore snapshots with the docker driver",
			"the %s driver keeps workspaces in the cluster; restoring one is not done yet", m.drv.Name())
	}
	release, err := m.gates.acquire(ctx, to, m.cfg.GateWait)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := m.checkNew(ctx, to); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			m.undoNew(ctx, to)
		}
	}()
	dst, err := m.ensureWorkspace(ctx, to, sh, true)
	if err != nil {
		return nil, err
	}
	uid, gid, err := m.idOf(to, sh)
	if err != nil {
		return nil, err
	}
	fs, err := files.Open(dst, uid, gid, opts.Limits)
	if err != nil {
		return nil, err
	}
	_, err = fs.ExtractTar(ctx, "", r)
	fs.Close()
	if err != nil {
		return nil, err
	}
	sb, _, err := m.ensure(ctx, to, sh)
	if err != nil {
		return nil, err
	}
	ok = true
	return sb.Clone(), nil
}

// undoNew removes what was made for a new key that did not come to be: its sandbox, workspace and listener.
func (m *Manager) undoNew(ctx context.Context, key identity.Key) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time30s)
	defer cancel()
	if sb, err := m.inspectKey(cctx, key); err == nil && m.checkOurs(key, sb) == nil {
		_ = m.drv.Remove(cctx, sb)
	}
	m.forget(key)
	m.dropListener(key)
	_ = m.home.RemoveWorkspace(key)
}
