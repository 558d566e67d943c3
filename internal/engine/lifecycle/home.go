package lifecycle

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Home is a state directory: the installation id, the workspaces, the per-key lock and last-used files, and
// the content-addressed copy of the agent that sandboxes bind read-only. Several processes may share one.
type Home struct {
	Dir          string
	Installation string // created once, kept in Dir/installation-id

	claimed sync.Map // key hex -> identity.Key of the pool member it claimed (claims.go); done claims only
	shared  string   // ShareSandboxes' directory; "": Dir
}

// OpenHome creates dir and its layout when missing and reads (or creates, exactly once across processes)
// the installation id.
func OpenHome(dir string) (*Home, error) {
	if !filepath.IsAbs(dir) {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return nil, fmt.Errorf("state home %q: %w", dir, err)
		}
		dir = abs
	}
	for _, sub := range []string{"", "workspaces", "locks", "keys", "agent", "chan"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fault.Wrap(err, fault.InvalidArgument, "set SANDKEEP_HOME to a directory you can write",
				"cannot create state home %s", dir)
		}
	}
	id, err := installationID(dir)
	if err != nil {
		return nil, err
	}
	return &Home{Dir: dir, Installation: id}, nil
}

// ShareSandboxes keeps what sandboxes see of the host (workspaces, volumes, channel directories, the agent,
// per-key uids) in dir instead of the home (sandkeep.Config.SandboxDir). Call it before the home is used.
func (h *Home) ShareSandboxes(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("sandbox dir %q: %w", dir, err)
	}
	for _, sub := range []string{"", "workspaces", "agent", "chan"} {
		if err := os.MkdirAll(filepath.Join(abs, sub), 0o700); err != nil {
			return fault.Wrap(err, fault.InvalidArgument, "set the sandbox directory to one you can write", "cannot create sandbox directory %s", abs)
		}
	}
	h.shared = abs
	return nil
}

// sandboxes is the directory sandboxes' host side lives in: the shared one, else the home.
func (h *Home) sandboxes() string {
	if h.shared != "" {
		return h.shared
	}
	return h.Dir
}

// installationID reads the id, or creates it with a link so that racing processes agree on one.
func installationID(dir string) (string, error) {
	path := filepath.Join(dir, "installation-id")
	for range 3 {
		b, err := os.ReadFile(path)
		if err == nil {
			id := strings.TrimSpace(string(b))
			if len(id) != 32 {
				return "", fault.New(fault.Internal, "remove "+path+" only if no sandbox of this home exists",
					"installation id in %s is malformed", path)
			}
			return id, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("read installation id: %w", err)
		}
		var raw [16]byte
		_, _ = rand.Read(raw[:])
		tmp, err := os.CreateTemp(dir, ".installation-id-*")
		if err != nil {
			return "", fmt.Errorf("create installation id: %w", err)
		}
		_, werr := tmp.WriteString(hex.EncodeToString(raw[:]) + "\n")
		cerr := tmp.Close()
		if werr == nil && cerr == nil {
			err = os.Link(tmp.Name(), path) // fails with ErrExist when another process won: read theirs
		}
		os.Remove(tmp.Name())
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("create installation id: %w", err)
		}
	}
	return "", fmt.Errorf("installation id in %s: could not be created", dir)
}

// Workspace is the host directory bound at /workspace for key.
// A key that claimed a warm pool member has the member's (claims.go).
func (h *Home) Workspace(k identity.Key) string {
	return filepath.Join(h.sandboxes(), "workspaces", h.phys(k).Hex())
}

// Volumes is the host directory that holds key's named volumes, one directory each (Config.Volumes).
func (h *Home) Volumes(k identity.Key) string {
	return filepath.Join(h.sandboxes(), "volumes", h.phys(k).Hex())
}

// QuotaVolumesDir is where a key's volumes live when its workspace has a quota: a directory of the workspace's
// own file system, so that what a volume holds counts against the same bound (issue 22, finding 8: a volume
// outside it took 150 MB of the host's disk past a 64 MB quota). The sandbox sees it under /workspace too.
const QuotaVolumesDir = ".sandkeep-volumes"

// volumesRoot is the directory that holds key's volumes: Volumes, or inside the workspace when it has a quota.
func (h *Home) volumesRoot(k identity.Key, quota bool) string {
	if quota {
		return filepath.Join(h.Workspace(k), QuotaVolumesDir)
	}
	return h.Volumes(k)
}

// EnsureVolume creates one of key's volumes, owned by uid:gid with mode 0700, as EnsureWorkspace does, in
// volumesRoot(k, quota) (the workspace's file system must be mounted by then).
func (h *Home) EnsureVolume(k identity.Key, v Volume, uid, gid int, quota bool) error {
	root := h.volumesRoot(k, quota)
	if quota {
		// The directory is the workspace's, which the sandbox writes: it must be a directory, not a link out.
		if fi, err := os.Lstat(root); err == nil && !fi.IsDir() {
			return fault.New(fault.PostureRefused, "remove "+QuotaVolumesDir+" from the workspace", "the workspace's %s is not a directory", QuotaVolumesDir)
		}
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("create volumes: %w", err)
	}
	dir := filepath.Join(root, v.dirName())
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create volume %s: %w", v.dirName(), err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("volume: %w", err)
	}
	if !fi.IsDir() {
		return fault.New(fault.Internal, "remove "+dir, "volume %s is not a directory", dir)
	}
	if os.Geteuid() == 0 {
		if err := os.Lchown(dir, uid, gid); err != nil {
			return fmt.Errorf("volume owner: %w", err)
		}
	}
	return nil
}

// ChannelDir is the key's channel directory: the host's socket for the agent, bound read-only into the
// sandbox. The short key keeps socket paths well under the 108 bytes of sockaddr_un.
func (h *Home) ChannelDir(k identity.Key) string {
	return filepath.Join(h.sandboxes(), "chan", h.phys(k).Short())
}

func (h *Home) lockPath(k identity.Key) string { return filepath.Join(h.Dir, "locks", k.Hex()+".lock") }

func (h *Home) usedPath(k identity.Key) string { return filepath.Join(h.Dir, "keys", k.Hex()+".used") }

// EnsureWorkspace creates the key's workspace, owned by uid:gid with mode 0700. The directory itself is
// sandkeep's (its parent is not writable from a sandbox), so checking it with Lstat is enough: what lies
// inside is the sandbox's and is never followed here.
func (h *Home) EnsureWorkspace(k identity.Key, uid, gid int) (string, error) {
	dir, _, err := h.ensureWorkspace(k, uid, gid)
	return dir, err
}

// ownership is what EnsureWorkspace found of a workspace's owner: who it handed the workspace over from, or who
// owns it still because this process could not (not root). -1: nothing of the kind.
type ownership struct {
	handedFrom int // the previous owner's uid, whose files now belong to the sandbox's uid
	mismatch   int // the owner's uid, which is not the sandbox's and was left as it was
}

// geteuid is os.Geteuid; tests stand in for a sandkeep that does not run as root.
var geteuid = os.Geteuid

// ensureWorkspace is EnsureWorkspace, saying what it did about the workspace's owner.
func (h *Home) ensureWorkspace(k identity.Key, uid, gid int) (string, ownership, error) {
	own := ownership{handedFrom: -1, mismatch: -1}
	dir, err := h.ensureWorkspaceOwned(k, uid, gid, &own)
	return dir, own, err
}

func (h *Home) ensureWorkspaceOwned(k identity.Key, uid, gid int, own *ownership) (string, error) {
	dir := h.Workspace(k)
	err := os.Mkdir(dir, 0o700)
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("create workspace: %w", err)
	}
	created := err == nil
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", fmt.Errorf("workspace: %w", err)
	}
	if !fi.IsDir() {
		return "", fault.New(fault.Internal, "remove "+dir, "workspace %s is not a directory", dir)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", fmt.Errorf("workspace mode: %w", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	euid := geteuid()
	if st != nil && euid != 0 && int(st.Uid) != uid {
		own.mismatch = int(st.Uid) // not ours to hand over: the sandbox runs anyway, and its run says so
	}
	if euid == 0 || euid == uid {
		if st != nil && euid == 0 && (int(st.Uid) != uid || int(st.Gid) != gid) {
			// The key's sandbox user changed (a uid range was set or changed): what it wrote is handed over.
			if err := chownTree(dir, int(st.Uid), uid, gid); err != nil {
				return "", fmt.Errorf("workspace owner: %w", err)
			}
			if int(st.Uid) != uid && !created {
				own.handedFrom = int(st.Uid)
			}
		}
		if err := os.Lchown(dir, uid, gid); err != nil {
			return "", fmt.Errorf("workspace owner: %w", err)
		}
	}
	return dir, nil
}

// chownTree gives uid:gid every entry under dir that the previous owner old owns. It walks and changes through an
// os.Root at dir, so no path it follows leaves dir, whatever a command still running there swaps in: a
// directory replaced by a symlink to elsewhere between being listed and being read is refused (the walk fails,
// nothing outside is touched), and Lchown changes a link itself, never its target (issue 22, Low 10: a walk by
// path with os.Lchown followed such a swap).
func chownTree(dir string, old, uid, gid int) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	return fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == old {
			if err := root.Lchown(p, uid, gid); err != nil {
				return err
			}
		}
		if chownVisited != nil {
			chownVisited(p)
		}
		return nil
	})
}

// chownVisited, when set (tests), is called after chownTree handled each path: where a test swaps a directory.
var chownVisited func(p string)

// HasWorkspace reports whether key's workspace directory exists.
func (h *Home) HasWorkspace(k identity.Key) bool {
	_, err := os.Lstat(h.Workspace(k))
	return err == nil
}

// RemoveWorkspace deletes the key's workspace, and its quota file system with its image when it has one.
// RemoveAll does not follow symlinks planted inside it.
func (h *Home) RemoveWorkspace(k identity.Key) error {
	if err := h.unmountQuota(k); err != nil {
		return err
	}
	if err := os.RemoveAll(h.Workspace(k)); err != nil {
		return fmt.Errorf("remove workspace: %w", err)
	}
	if err := os.RemoveAll(h.Volumes(k)); err != nil { // the sandbox's volumes go with its workspace
		return fmt.Errorf("remove volumes: %w", err)
	}
	h.dropClaim(k) // a claimed member's files were the key's; with them gone the key is new again
	return nil
}

// Touch records that key was used now. Its mtime is the key's last use, shared by every process.
func (h *Home) Touch(k identity.Key, now time.Time) {
	p := h.usedPath(k)
	if err := os.Chtimes(p, now, now); err != nil {
		if f, cerr := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600); cerr == nil {
			f.Close()
			_ = os.Chtimes(p, now, now)
		}
	}
}

// LastUsed is when key last ran a command, or zero when never recorded.
func (h *Home) LastUsed(k identity.Key) time.Time {
	fi, err := os.Stat(h.usedPath(k))
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// ForgetKey drops the key's last-used record (after the sandbox is removed).
func (h *Home) ForgetKey(k identity.Key) { os.Remove(h.usedPath(k)) }

// InstallAgent copies the agent binary at src into a content-addressed directory of the home and returns that
// directory. Sandboxes bind it read-only; a new agent gets a new directory, which changes the posture.
func (h *Home) InstallAgent(src string) (string, error) {
	const hint = "build it with `make build` (or `CGO_ENABLED=0 go build -o bin/ ./cmd/sandkeep-agent`) and set SANDKEEP_AGENT to its path"
	f, err := os.Open(src)
	if err != nil {
		return "", fault.Wrap(err, fault.AgentMissing, hint, "cannot read the agent binary %s", src)
	}
	defer f.Close()
	sum := sha256.New()
	if _, err := io.Copy(sum, f); err != nil {
		return "", fault.Wrap(err, fault.AgentMissing, hint, "cannot read the agent binary %s", src)
	}
	dir := filepath.Join(h.sandboxes(), "agent", hex.EncodeToString(sum.Sum(nil))[:16])
	dst := filepath.Join(dir, "sandkeep-agent")
	if _, err := os.Stat(dst); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	if err := replaceFile(dst, f, 0o755); err != nil {
		return "", fmt.Errorf("install agent: %w", err)
	}
	return dir, nil
}

// replaceFile writes r to path with mode through a temporary file in the same directory renamed into place, so
// a reader (a sandbox's agent or its commands) sees the old file or the new one, never a part.
func replaceFile(path string, r io.Reader, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	_, cerr := io.Copy(tmp, r)
	if err := errors.Join(cerr, tmp.Chmod(mode), tmp.Close()); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}
