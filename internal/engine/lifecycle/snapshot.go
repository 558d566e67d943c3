package lifecycle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// ArchiveWorkspace writes key's workspace to w as a tar (files.FS.WriteTar: links as links, never followed),
// holding the key's gate so that no command of the key writes meanwhile. A key without a sandbox is
// SANDBOX_NOT_FOUND. On a driver that keeps workspaces itself (kubernetes) the archive is written by the
// sandbox's agent (remotecopy.go), the sandbox started first when it was stopped.
func (m *Manager) ArchiveWorkspace(ctx context.Context, key identity.Key, w io.Writer, lim files.Limits) error {
	release, err := m.gates.acquire(ctx, key, m.cfg.GateWait)
	if err != nil {
		return err
	}
	defer release()
	if m.RemoteWorkspaces() {
		return m.archiveRemote(ctx, key, w, lim)
	}
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
	// Replace lets to be a key that exists: the archive is extracted beside its workspace first (a damaged one
	// leaves the key as it was), then its sandbox is stopped and the workspace replaced whole; its next start
	// binds the restored one (replaceWorkspace).
	Replace bool
}

// Restore makes to a new key whose workspace holds the tar archive r (files.FS.ExtractTar: confined to the
// workspace, owned by to's user), and its sandbox in shape sh. to must be new (SANDBOX_EXISTS otherwise); any
// failure, a damaged archive included, leaves nothing of to.
func (m *Manager) Restore(ctx context.Context, to identity.Key, sh *Shape, r io.Reader, opts RestoreOptions) (*driver.Sandbox, error) {
	sh = m.shapeOf(sh)
	ctx = withSink(ctx, opts.OnEvent)
	release, err := m.gates.acquire(ctx, to, m.cfg.GateWait)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := m.checkNew(ctx, to); err != nil {
		if !opts.Replace || !fault.Is(err, fault.SandboxExists) {
			return nil, err
		}
		if m.RemoteWorkspaces() {
			return m.restoreRemote(ctx, to, sh, r, opts, true)
		}
		return m.replaceWorkspace(ctx, to, sh, r, opts)
	}
	if m.RemoteWorkspaces() {
		return m.restoreRemote(ctx, to, sh, r, opts, false)
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
	if err := extractInto(ctx, dst, uid, gid, opts.Limits, r); err != nil {
		return nil, err
	}
	sb, _, err := m.ensure(ctx, to, sh)
	if err != nil {
		return nil, err
	}
	ok = true
	return sb.Clone(), nil
}

// extractInto extracts the archive r into dir as uid:gid through the file API (files.FS.ExtractTar: its
// entry checks, and lim's sizes): a restore into a new key and one onto an existing key.
func extractInto(ctx context.Context, dir string, uid, gid int, lim files.Limits, r io.Reader) error {
	fs, err := files.Open(dir, uid, gid, lim)
	if err != nil {
		return err
	}
	defer fs.Close()
	_, err = fs.ExtractTar(ctx, "", r)
	return err
}

// undoNew removes what was made for a new key that did not come to be: its sandbox, workspace and listener.
func (m *Manager) undoNew(ctx context.Context, key identity.Key) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time30s)
	defer cancel()
	sb, err := m.inspectKey(cctx, key)
	if err != nil || m.checkOurs(key, sb) != nil {
		sb = nil
	}
	if sb != nil {
		_ = m.drv.Remove(cctx, sb)
	}
	m.forget(key)
	m.dropListener(key)
	if err := m.removeWorkspace(cctx, key, sb); err != nil {
		m.cfg.Logger.Warn("the workspace of a key that did not come to be was not removed", "key", key.Short(), "err", err)
	}
}

// replaceWorkspace is Restore onto key, which exists (the caller holds its gate): the archive is extracted into a
// directory beside key's workspace (same file system), and only once it is whole is key's sandbox stopped and the
// workspace swapped for it, the old one removed; key's sandbox is then started again over the restored files. A
// failure before the swap leaves key as it was. A workspace on its own quota file system (resources.disk) is a
// mount point, which a rename cannot swap: refused.
func (m *Manager) replaceWorkspace(ctx context.Context, key identity.Key, sh *Shape, r io.Reader, opts RestoreOptions) (*driver.Sandbox, error) {
	if sh.cfg.DiskBytes > 0 {
		return nil, fault.New(fault.InvalidArgument, "restore into a new user, or remove this one first (sandkeep rm)",
			"%s's workspace is on its own quota file system (resources.disk), which a restore cannot replace yet", key)
	}
	uid, gid, err := m.idOf(key, sh)
	if err != nil {
		return nil, err
	}
	dst, err := m.ensureWorkspace(ctx, key, sh, false)
	if err != nil {
		return nil, err
	}
	var raw [6]byte
	_, _ = rand.Read(raw[:])
	suffix := hex.EncodeToString(raw[:])
	staging, old := dst+".restore-"+suffix, dst+".replaced-"+suffix
	if err := os.Mkdir(staging, 0o700); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	defer os.RemoveAll(staging) // gone by the swap when it succeeded
	if geteuid() == 0 {
		if err := os.Lchown(staging, uid, gid); err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
	}
	if err := extractInto(ctx, staging, uid, gid, opts.Limits, r); err != nil {
		return nil, err
	}
	if sb, err := m.owned(ctx, key); err == nil {
		m.forget(key)
		if err := m.drv.Stop(ctx, sb, m.cfg.StopGrace); err != nil {
			return nil, err
		}
	} else if !fault.Is(err, fault.NotFound) {
		return nil, err
	}
	if err := os.Rename(dst, old); err != nil {
		return nil, fmt.Errorf("restore: set the old workspace aside: %w", err)
	}
	if err := os.Rename(staging, dst); err != nil {
		_ = os.Rename(old, dst)
		return nil, fmt.Errorf("restore: put the restored workspace in place: %w", err)
	}
	if err := os.RemoveAll(old); err != nil {
		m.cfg.Logger.Warn("restore: the replaced workspace was not removed", "dir", old, "err", err)
	}
	sb, _, err := m.ensure(ctx, key, sh)
	if err != nil {
		return nil, err
	}
	return sb.Clone(), nil
}
