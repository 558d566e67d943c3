package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// A workspace quota is a file system of its own per key: a sparse ext4 image at <home>/disks/<key hex>.img,
// loop-mounted nosuid,nodev,noatime on the key's workspace directory before its sandbox is created or started,
// so the bind the engine makes is of that file system. The kernel enforces both bounds (blocks and inodes), for
// the sandbox and for the host's own writes into the workspace alike (no blocks reserved for root), and the
// host's file system loses at most the image's size. Project quotas would do the same without a loop device but
// need the host file system mounted with prjquota, which sandkeep cannot arrange; a loop mount needs only root.

// Quota is a workspace's bounds; zero Bytes is no quota.
type Quota struct {
	Bytes  int64 // the file system's size
	Inodes int64 // how many files and directories it holds; 0: ext4's default for the size
}

// Usage is what a quota'd workspace holds now, from statfs.
type Usage struct {
	Bytes, BytesLimit   int64
	Inodes, InodesLimit int64
}

// MinQuotaBytes is the smallest workspace file system: ext4's metadata and journal need a few MiB.
const MinQuotaBytes = 8 << 20

func (h *Home) diskPath(k identity.Key) string {
	return filepath.Join(h.sandboxes(), "disks", h.phys(k).Hex()+".img")
}

// toolTimeout bounds mkfs, mount and resize: they take well under a second on an idle host.
const toolTimeout = time.Minute

// ensureQuotaMount makes sure key's workspace directory has its quota file system mounted, creating the image
// on first use. With grow (the key's sandbox is not running: it is being created or started), an image smaller
// than q.Bytes is unmounted and grown first. A workspace that already holds files outside a file system of its
// own is refused rather than hidden under a new mount. mount(8) reuses the loop device of an image that is still
// attached, so an image is never mounted through two devices at once.
func (h *Home) ensureQuotaMount(k identity.Key, q Quota, uid, gid int, grow bool) error {
	dir := h.Workspace(k)
	mounted, err := isMountPoint(dir)
	if err != nil {
		return fmt.Errorf("workspace quota: %w", err)
	}
	if mounted && grow {
		if fi, err := os.Stat(h.diskPath(k)); err == nil && fi.Size() < q.Bytes {
			if err := unix.Unmount(dir, 0); err != nil {
				return fmt.Errorf("workspace quota: unmount to grow: %w", err)
			}
			mounted = false
		}
	}
	if mounted {
		return nil
	}
	if os.Geteuid() != 0 {
		return fault.New(fault.SpecUnsupported, "run sandkeep as root, or drop resources.disk",
			"a workspace quota needs a loop mount, which needs root")
	}
	if empty, err := dirEmpty(dir); err != nil {
		return fmt.Errorf("workspace quota: %w", err)
	} else if !empty {
		return fault.New(fault.PostureRefused,
			"move the files out and remove the workspace (sandkeep rm), or run this user without resources.disk",
			"the workspace of %s already holds files outside a quota; they would be hidden by the quota's file system", k)
	}
	img := h.diskPath(k)
	if err := os.MkdirAll(filepath.Dir(img), 0o700); err != nil {
		return fmt.Errorf("workspace quota: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	fresh := false
	if _, err := os.Stat(img); errors.Is(err, fs.ErrNotExist) {
		if err := makeImage(ctx, img, q, uid, gid); err != nil {
			_ = os.Remove(img)
			return err
		}
		fresh = true
	} else if err != nil {
		return fmt.Errorf("workspace quota: %w", err)
	} else if err := growImage(ctx, img, q); err != nil {
		return err
	}
	if err := runTool(ctx, "mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", img, dir); err != nil {
		return fault.Wrap(err, fault.SandboxFailed, "check that the host has loop devices (modprobe loop) and ext4",
			"the workspace file system of %s could not be mounted", k)
	}
	if fresh {
		_ = os.Remove(filepath.Join(dir, "lost+found")) // empty on a new file system; fsck makes it again if needed
	}
	return nil
}

// makeImage creates a sparse image of q.Bytes and an ext4 file system on it whose root uid:gid own.
func makeImage(ctx context.Context, img string, q Quota, uid, gid int) error {
	f, err := os.OpenFile(img, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("workspace quota: %w", err)
	}
	err = f.Truncate(q.Bytes)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("workspace quota: %w", err)
	}
	args := []string{"-q", "-F", "-t", "ext4", "-m", "0", "-L", "sandkeep-ws",
		"-E", fmt.Sprintf("root_owner=%d:%d,lazy_itable_init=1,lazy_journal_init=1", uid, gid)}
	if q.Inodes > 0 {
		args = append(args, "-N", strconv.FormatInt(q.Inodes, 10))
	}
	if err := runTool(ctx, "mkfs.ext4", append(args, img)...); err != nil {
		return fault.Wrap(err, fault.SandboxFailed, "install e2fsprogs (mkfs.ext4) on the host",
			"the workspace file system could not be made")
	}
	return nil
}

// growImage grows an unmounted image to q.Bytes when the quota was raised. A lowered quota is kept at the
// image's size: shrinking could lose files.
func growImage(ctx context.Context, img string, q Quota) error {
	fi, err := os.Stat(img)
	if err != nil || fi.Size() >= q.Bytes {
		return err
	}
	if err := os.Truncate(img, q.Bytes); err != nil {
		return fmt.Errorf("workspace quota: %w", err)
	}
	if err := runTool(ctx, "e2fsck", "-f", "-p", img); err != nil {
		return fmt.Errorf("workspace quota: check before growing: %w", err)
	}
	if err := runTool(ctx, "resize2fs", img); err != nil {
		return fmt.Errorf("workspace quota: grow: %w", err)
	}
	return nil
}

// unmountQuota unmounts key's workspace file system (lazily when something still holds it) and deletes its
// image; nothing mounted and no image is fine.
func (h *Home) unmountQuota(k identity.Key) error {
	dir := h.Workspace(k)
	if mounted, err := isMountPoint(dir); err == nil && mounted {
		if err := unix.Unmount(dir, 0); err != nil {
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				return fmt.Errorf("unmount workspace: %w", err)
			}
		}
	}
	if err := os.Remove(h.diskPath(k)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove workspace image: %w", err)
	}
	return nil
}

// WorkspaceUsage reports what key's quota'd workspace holds; ok is false when it has no file system of its own
// mounted (no quota, or not mounted right now).
func (h *Home) WorkspaceUsage(k identity.Key) (u Usage, ok bool) {
	dir := h.Workspace(k)
	if mounted, err := isMountPoint(dir); err != nil || !mounted {
		return Usage{}, false
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return Usage{}, false
	}
	bs := int64(st.Bsize)
	return Usage{
		Bytes: (int64(st.Blocks) - int64(st.Bfree)) * bs, BytesLimit: int64(st.Blocks) * bs,
		Inodes: int64(st.Files) - int64(st.Ffree), InodesLimit: int64(st.Files),
	}, true
}

// isMountPoint reports whether dir is the root of a mount of another file system than its parent's (a bind of the
// same file system onto itself would not show; only sandkeep mounts here, and only file systems of their own).
func isMountPoint(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}

func dirEmpty(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}

// runTool runs a host tool, folding its output into the error.
func runTool(ctx context.Context, name string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}
