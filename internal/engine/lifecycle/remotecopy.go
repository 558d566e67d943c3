package lifecycle

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Fork, snapshots and restores on a driver that keeps the workspace itself (the kubernetes driver's claim,
// mounted only in the pod). The host cannot reach the claim, so every copy goes through the sandboxes' agents as
// the file API does (`sandkeep-agent fs tar` and `fs extract`, files.OpenRemote): the same confinement (an
// os.Root of /workspace, no link followed), the same limits, the files owned by the sandbox's user. A fork reads
// the source's tree into a temporary archive in the home first, so that the quota is measured before anything of
// the new key is made, and then extracts it into the new key's sandbox; a clone that shares blocks (a volume
// snapshot) would need a CSI driver with snapshots, which the claims' storage class need not have.

// runningSandbox is key's sandbox, running, for a caller that holds key's gate: a stopped one (an idle stop) is
// started as it was recorded. A key without a sandbox is SANDBOX_NOT_FOUND.
func (m *Manager) runningSandbox(ctx context.Context, key identity.Key) (*driver.Sandbox, error) {
	sb, err := m.owned(ctx, key)
	if fault.Is(err, fault.ForeignContainer) {
		return nil, errNoSandbox(key)
	}
	if err != nil {
		return nil, err
	}
	if sb.State == driver.StateRunning {
		return sb, nil
	}
	m.forget(key)
	if err := m.drv.Start(ctx, sb); err != nil {
		return nil, coded(ctx, err, key)
	}
	return m.owned(ctx, key)
}

// archiveRemote writes the workspace of key's sandbox to w as a tar, through its agent (the caller holds key's
// gate).
func (m *Manager) archiveRemote(ctx context.Context, key identity.Key, w io.Writer, lim files.Limits) error {
	sb, err := m.runningSandbox(ctx, key)
	if err != nil {
		return err
	}
	fs := files.OpenRemote(ctx, m.heldRunner(key, sb), lim)
	defer fs.Close()
	return fs.WriteTar(ctx, "", w)
}

// extractRemote extracts the archive r into the workspace of key's running sandbox sb, through its agent (the
// caller holds key's gate).
func (m *Manager) extractRemote(ctx context.Context, key identity.Key, sb *driver.Sandbox, lim files.Limits, r io.Reader) error {
	fs := files.OpenRemote(ctx, m.heldRunner(key, sb), lim)
	defer fs.Close()
	_, err := fs.ExtractTar(ctx, "", r)
	return err
}

// spool is a temporary archive in the home's tmp directory, removed by Close.
type spool struct{ *os.File }

func (m *Manager) newSpool() (*spool, error) {
	dir := filepath.Join(m.home.Dir, "tmp")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	f, err := os.CreateTemp(dir, "copy-*.tar")
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	return &spool{f}, nil
}

func (s *spool) Close() error {
	err := s.File.Close()
	_ = os.Remove(s.Name())
	return err
}

// rewind seeks the spool back to its start for reading.
func (s *spool) rewind() error {
	_, err := s.Seek(0, io.SeekStart)
	return err
}

// measureTar counts the archive's entries and its regular files' bytes, and refuses it (QUOTA_EXCEEDED) when it
// passes lim: the remote counterpart of measure, on the archive a fork copies.
func measureTar(r io.Reader, lim ForkLimits) (copied, error) {
	var c copied
	var inodes int64 = 1 // the workspace itself, as measure counts it
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return c, nil
		}
		if err != nil {
			return c, fmt.Errorf("fork: the source's archive: %w", err)
		}
		inodes++
		if hdr.Typeflag == tar.TypeReg {
			c.files++
			c.bytes += hdr.Size
		}
		switch {
		case lim.Bytes > 0 && c.bytes > lim.Bytes:
			return c, errQuota("bytes", c.bytes, lim.Bytes)
		case lim.Inodes > 0 && inodes > lim.Inodes:
			return c, errQuota("files", inodes, lim.Inodes)
		}
	}
}

// forkRemote is Fork on a driver that keeps workspaces (the caller holds both keys' gates and checked that to is
// new): from's tree is archived through its agent into a spool and measured against lim, then to's sandbox is
// made (from a warm pool when its template keeps one: a member's workspace is empty) and the archive extracted
// into it through its agent. Any failure removes what was made for to.
func (m *Manager) forkRemote(ctx context.Context, from, to identity.Key, sh *Shape, lim ForkLimits, start time.Time) (*driver.Sandbox, error) {
	sp, err := m.newSpool()
	if err != nil {
		return nil, err
	}
	defer sp.Close()
	if err := m.archiveRemote(ctx, from, sp, files.Limits{}); err != nil {
		return nil, err
	}
	if err := sp.rewind(); err != nil {
		return nil, err
	}
	c, err := measureTar(sp, lim)
	if err != nil {
		return nil, err
	}
	if err := sp.rewind(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			m.undoNew(ctx, to)
		}
	}()
	sb, _, err := m.ensure(ctx, to, sh)
	if err != nil {
		return nil, err
	}
	if err := m.extractRemote(ctx, to, sb, files.Limits{}, sp); err != nil {
		return nil, err
	}
	ok = true
	src, _ := m.inspectKey(ctx, from)
	fromName := from.ContainerName()
	if src != nil {
		fromName = src.Name
	}
	m.emit(ctx, events.NameSandboxForked, events.SandboxForked{Sandbox: sb.Name, From: fromName,
		Driver: m.drv.Name(), Template: sh.Template, Files: c.files, Bytes: c.bytes,
		DurationMS: time.Since(start).Milliseconds()})
	return sb.Clone(), nil
}

// restoreRemote is Restore on a driver that keeps workspaces (the caller holds to's gate). A new key's sandbox is
// made (from a warm pool when its template keeps one) and the archive extracted into it through its agent. An
// existing key (opts.Replace) is replaced only once the archive was read whole into a spool (the snapshot store's
// reader fails at its end unless the content hashes to its digest: a damaged or unknown snapshot leaves the key
// as it was); its sandbox and workspace claim are then removed and made again with the archive's files.
func (m *Manager) restoreRemote(ctx context.Context, to identity.Key, sh *Shape, r io.Reader, opts RestoreOptions, replace bool) (*driver.Sandbox, error) {
	if replace {
		sp, err := m.newSpool()
		if err != nil {
			return nil, err
		}
		defer sp.Close()
		if _, err := io.Copy(sp, r); err != nil {
			return nil, fmt.Errorf("restore: read the archive: %w", err)
		}
		if err := sp.rewind(); err != nil {
			return nil, err
		}
		if err := m.removeHeld(ctx, to, false); err != nil && !fault.Is(err, fault.NotFound) {
			return nil, err
		}
		r = sp
	}
	ok := false
	defer func() {
		if !ok {
			m.undoNew(ctx, to)
		}
	}()
	sb, _, err := m.ensure(ctx, to, sh)
	if err != nil {
		return nil, err
	}
	if err := m.extractRemote(ctx, to, sb, opts.Limits, r); err != nil {
		return nil, err
	}
	ok = true
	return sb.Clone(), nil
}
