package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// ForkLimits bound what a fork may copy into its new key (its tenant's quota): zero is no bound.
type ForkLimits struct {
	Bytes  int64 // regular files' bytes in all
	Inodes int64 // entries in all (files, directories, links)
}

// ForkOptions are a fork's bounds and where its events go.
type ForkOptions struct {
	Limits  ForkLimits
	OnEvent Sink // the caller's run: sandbox_started of the new sandbox, then sandbox_forked
}

// Fork makes to a new key with a copy of from's workspace (reflinked file by file where the file system can, a
// copy where it cannot) and to's sandbox in shape sh (from's template); from is left running. Both keys' gates
// are held, so no command of either runs during the copy. to must be new: a key with a sandbox or a workspace is
// SANDBOX_EXISTS. A copy that would pass opts.Limits, or the shape's workspace quota, is QUOTA_EXCEEDED and
// leaves nothing; so does any other failure.
func (m *Manager) Fork(ctx context.Context, from, to identity.Key, sh *Shape, opts ForkOptions) (*driver.Sandbox, error) {
	sh = m.shapeOf(sh)
	ctx = withSink(ctx, opts.OnEvent)
	lim := opts.Limits
	start := time.Now()
	if from.Hex() == to.Hex() {
		return nil, fault.New(fault.InvalidArgument, "name another user to fork into", "cannot fork %s into itself", from)
	}
	remote := m.RemoteWorkspaces()
	var src string
	if !remote {
		var err error
		if src, _, _, err = m.Workspace(from, false); err != nil {
			if fault.Is(err, fault.FileNotFound) {
				return nil, errNoSandbox(from)
			}
			return nil, err
		}
	}
	first, second := from, to // one lock order for every fork: no two forks wait on each other
	if second.Hex() < first.Hex() {
		first, second = second, first
	}
	release1, err := m.gates.acquire(ctx, first, m.cfg.GateWait)
	if err != nil {
		return nil, err
	}
	defer release1()
	release2, err := m.gates.acquire(ctx, second, m.cfg.GateWait)
	if err != nil {
		return nil, err
	}
	defer release2()
	if err := m.checkNew(ctx, to); err != nil {
		return nil, err
	}
	if sh.cfg.DiskBytes > 0 && (lim.Bytes == 0 || sh.cfg.DiskBytes < lim.Bytes) {
		lim.Bytes = sh.cfg.DiskBytes // the new key's file system could not hold more (its metadata aside)
	}
	if remote {
		return m.forkRemote(ctx, from, to, sh, lim, start)
	}
	if err := measure(src, lim); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok { // nothing half-made: the copy, the workspace, a sandbox made for it
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
	copied, err := copyTree(src, dst, uid, gid, lim)
	if err != nil {
		return nil, err
	}
	sb, _, err := m.ensure(ctx, to, sh)
	if err != nil {
		return nil, err
	}
	ok = true
	m.emit(ctx, events.NameSandboxForked, events.SandboxForked{Sandbox: sb.Name, From: from.ContainerName(),
		Driver: m.drv.Name(), Template: sh.Template, Files: copied.files, Bytes: copied.bytes, Reflinked: copied.reflinked,
		DurationMS: time.Since(start).Milliseconds()})
	return sb.Clone(), nil
}

const time30s = 30 * time.Second

// checkNew refuses a key that has a sandbox or a workspace.
func (m *Manager) checkNew(ctx context.Context, key identity.Key) error {
	_, err := m.inspectKey(ctx, key)
	switch {
	case err == nil:
		return errExists(key)
	case !cerrdefs.IsNotFound(err):
		return err
	case m.home.HasWorkspace(key):
		return errExists(key)
	}
	if ck, ok := m.drv.(driver.ClaimKeeper); ok && m.RemoteWorkspaces() {
		// The workspace is the driver's (a claim kept by an rm that kept it, or made by another replica).
		if exists, err := ck.Exists(ctx, key.ContainerName()); err != nil {
			return err
		} else if exists {
			return errExists(key)
		}
	}
	return nil
}

func errExists(key identity.Key) error {
	return fault.New(fault.SandboxExists, "name a new user, or remove that one first (sandkeep rm)",
		"%s already has a sandbox or a workspace", key)
}

// errQuota is a copy that would not fit.
func errQuota(what string, n, limit int64) error {
	return fault.New(fault.QuotaExceeded, "remove files from the source, or ask the operator for a larger quota",
		"the copy needs %d %s, over the new key's quota of %d; nothing was made", n, what, limit)
}

// measure walks the tree at dir (never following a link) and refuses it when it passes lim.
func measure(dir string, lim ForkLimits) error {
	if lim.Bytes == 0 && lim.Inodes == 0 {
		return nil
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("fork: %w", err)
	}
	defer root.Close()
	var bytes, inodes int64
	return fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		inodes++
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			bytes += fi.Size()
		}
		switch {
		case lim.Bytes > 0 && bytes > lim.Bytes:
			return errQuota("bytes", bytes, lim.Bytes)
		case lim.Inodes > 0 && inodes > lim.Inodes:
			return errQuota("files", inodes, lim.Inodes)
		}
		return nil
	})
}

// copied is what copyTree copied: regular files, their bytes, and how many of them were reflinked.
type copied struct {
	files, bytes, reflinked int64
}

// copyTree copies the tree at src into the existing directory dst, owned by uid:gid: directories, regular files
// (a reflink (FICLONE) where the file system shares extents, a copy otherwise) and symbolic links as links. It
// goes through os.Root on both sides and never follows a link: src is what a sandbox wrote. Other file types
// (FIFOs, sockets, devices) are skipped. Bytes past lim fail the copy with QUOTA_EXCEEDED.
func copyTree(src, dst string, uid, gid int, lim ForkLimits) (copied, error) {
	var c copied
	sr, err := os.OpenRoot(src)
	if err != nil {
		return c, fmt.Errorf("fork: source: %w", err)
	}
	defer sr.Close()
	dr, err := os.OpenRoot(dst)
	if err != nil {
		return c, fmt.Errorf("fork: target: %w", err)
	}
	defer dr.Close()
	chown := os.Geteuid() == 0
	type dirMode struct {
		path string
		mode fs.FileMode
	}
	var dirs []dirMode // modes set last: a read-only directory must still take its entries
	err = fs.WalkDir(sr.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := sr.Lstat(p)
		if err != nil {
			return err
		}
		switch t := fi.Mode().Type(); {
		case p == ".":
			dirs = append(dirs, dirMode{p, fi.Mode().Perm()})
			return nil
		case t == fs.ModeDir:
			if err := dr.Mkdir(p, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, dirMode{p, fi.Mode().Perm()})
		case t == fs.ModeSymlink:
			target, err := sr.Readlink(p)
			if err != nil {
				return err
			}
			if err := dr.Symlink(target, p); err != nil {
				return err
			}
		case t.IsRegular():
			n, cloned, err := copyFile(sr, dr, p, fi.Mode().Perm())
			if err != nil {
				return err
			}
			c.files++
			c.bytes += n
			if cloned {
				c.reflinked++
			}
			if lim.Bytes > 0 && c.bytes > lim.Bytes {
				return errQuota("bytes", c.bytes, lim.Bytes)
			}
		default:
			return nil
		}
		if chown {
			return dr.Lchown(p, uid, gid)
		}
		return nil
	})
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return c, fault.Wrap(err, fault.QuotaExceeded, "remove files from the source, or ask the operator for a larger quota",
			"the copy does not fit the new key's workspace; nothing was made")
	}
	if err != nil {
		return c, fmt.Errorf("fork: copy: %w", err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := dr.Chmod(dirs[i].path, dirs[i].mode); err != nil {
			return c, fmt.Errorf("fork: copy: %w", err)
		}
	}
	return c, nil
}

// copyFile copies the regular file p from sr to a new file in dr, by reflink when it can (cloned).
func copyFile(sr, dr *os.Root, p string, perm fs.FileMode) (n int64, cloned bool, err error) {
	in, err := sr.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return 0, false, err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return 0, false, err
	}
	if !st.Mode().IsRegular() { // swapped since the walk looked
		return 0, false, nil
	}
	out, err := dr.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, perm)
	if err != nil {
		return 0, false, err
	}
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err == nil {
		return st.Size(), true, out.Close()
	}
	n, err = io.Copy(out, in) // copy_file_range where the kernel can
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return n, false, err
}
