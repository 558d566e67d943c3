// Package files reads and writes a sandbox's workspace from the host, confined to it: every path is resolved
// through an os.Root of the workspace directory, so neither `..`, an absolute path, nor a symlink the sandbox
// plants (even while a request runs) reaches outside. It never uses `docker cp` on a live container. Uploads and
// downloads stream with bounded memory and are bounded in size.
//
// Paths are as a command inside the sandbox sees them: relative to /workspace, or absolute under /workspace;
// "", "." and "/workspace" name the workspace itself.
//
// No symbolic link is ever followed, in any component of a path: the sandbox writes the tree, so every link in it
// is data. A path that goes through a link is PATH_CONFLICT (like a parent that is a file); a link as the last
// component is FILE_TYPE for reading and listing, and is replaced (never written through) by Write and
// ExtractTar; listings and tars report links as links. Each directory on the way is opened by a check-then-verify walk (Lstat the name, open it through the
// Root, compare the opened directory's identity with what Lstat saw), so a directory swapped for a link while a
// request runs is caught rather than entered; and because every step goes through an os.Root, even a walk that
// lost such a race could not leave the workspace.
package files

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// Default limits, used for the zero fields of Limits.
const (
	DefaultMaxFileBytes  int64 = 1 << 30
	DefaultMaxTarBytes   int64 = 4 << 30
	DefaultMaxTarEntries       = 100000
)

// Limits bound what one operation may move. Zero fields take the defaults.
type Limits struct {
	MaxFileBytes  int64 // one file, uploaded or downloaded; default 1 GiB
	MaxTarBytes   int64 // the sum of a tar's file sizes, either way; default 4 GiB
	MaxTarEntries int   // entries in one tar, either way; default 100000
}

// maxBytes caps the byte limits, so that a limit plus one (how an upload detects that it is over) cannot
// overflow.
const maxBytes = 1 << 62

// withDefaults returns l with its zero (or negative) fields set to the defaults.
func (l Limits) withDefaults() Limits {
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = DefaultMaxFileBytes
	}
	if l.MaxTarBytes <= 0 {
		l.MaxTarBytes = DefaultMaxTarBytes
	}
	l.MaxFileBytes = min(l.MaxFileBytes, maxBytes)
	l.MaxTarBytes = min(l.MaxTarBytes, maxBytes)
	if l.MaxTarEntries <= 0 {
		l.MaxTarEntries = DefaultMaxTarEntries
	}
	return l
}

// Entry is one directory entry or a Stat result. Target is a symlink's target, as data: never followed.
type Entry struct {
	Name   string    `json:"name"`
	Size   int64     `json:"size"`
	Mode   string    `json:"mode"` // permission bits in octal, e.g. "0644"
	Type   string    `json:"type"` // file, dir, symlink or other
	MTime  time.Time `json:"mtime"`
	Target string    `json:"target,omitempty"`
}

// Entry types, the values of Entry.Type.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeOther   = "other"
)

// TarSummary says what ExtractTar wrote.
type TarSummary struct {
	Files int   `json:"files"`
	Dirs  int   `json:"dirs"`
	Links int   `json:"links"`
	Bytes int64 `json:"bytes"`
}

// FS is one workspace, opened for host-side access. It is safe for concurrent use.
//
// An FS is one of two kinds: a host directory (Open), every access through an os.Root of it; or a workspace in
// a sandbox elsewhere (OpenRemote: a Kubernetes pod's claim), every operation run inside the sandbox by the
// agent, which applies this same code there (Serve). Both have the same methods, limits and faults.
type FS struct {
	run Runner          // OpenRemote's: operations run in the sandbox; nil for a host directory
	ctx context.Context // OpenRemote's: bounds the operations that take no context

	root     *os.Root // the workspace directory; every access goes through it (nil when remote)
	uid, gid int      // owner of what FS creates; -1 leaves that id as the creating process's
	lim      Limits   // with defaults applied
	folder   string   // where the workspace is also mounted (a devcontainer.json's workspaceFolder); "" for none

	closeOnce sync.Once
	onClose   []func() // run once by Close, after the root is closed; set before FS is shared
}

// InFolder makes f also accept absolute paths under folder, where the sandbox sees the same workspace (a
// devcontainer.json's workspaceFolder such as /workspaces/app). folder must be absolute and clean; "" and
// /workspace change nothing.
func (f *FS) InFolder(folder string) *FS {
	if folder != workspaceDir && path.IsAbs(folder) && path.Clean(folder) == folder && folder != "/" {
		f.folder = folder
	}
	return f
}

// parse is parsePath, with a path under f.folder taken as relative to the workspace.
func (f *FS) parse(p string) ([]string, error) {
	if f.folder != "" && (p == f.folder || strings.HasPrefix(p, f.folder+"/")) {
		p = strings.TrimPrefix(strings.TrimPrefix(p, f.folder), "/")
	}
	return parsePath(p)
}

// Open opens the workspace directory dir. Files and directories it creates are owned by uid:gid (the sandbox
// user), so the sandbox can use them.
//
// A uid or gid of -1 leaves that id unchanged (the host process's), as with chown(2); that is for running
// without root, e.g. in tests.
func Open(dir string, uid, gid int, lim Limits) (*FS, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fault.Wrap(err, fault.FileNotFound, "create the sandbox first (run a command in it)",
				"the workspace directory %s does not exist", dir)
		}
		return nil, fmt.Errorf("open workspace %s: %w", dir, err)
	}
	return &FS{root: root, uid: uid, gid: gid, lim: lim.withDefaults()}, nil
}

// Close releases the workspace root, then runs the functions given to OnClose. Only the first call does
// anything; later ones return nil.
func (f *FS) Close() error {
	var err error
	f.closeOnce.Do(func() {
		if f.root != nil {
			err = f.root.Close()
		}
		for _, fn := range f.onClose {
			fn()
		}
	})
	return err
}

// OnClose makes Close run fn (e.g. to release a slot its opener took). Call it before f is shared.
func (f *FS) OnClose(fn func()) { f.onClose = append(f.onClose, fn) }

// Limits returns the limits in force, defaults applied.
func (f *FS) Limits() Limits { return f.lim }

// Stat describes path without following a final symlink.
func (f *FS) Stat(path string) (Entry, error) {
	comps, err := f.parse(path)
	if err != nil {
		return Entry{}, err
	}
	if f.run != nil {
		return f.remoteStat(comps)
	}
	if len(comps) == 0 {
		fi, err := f.root.Lstat(".")
		if err != nil {
			return Entry{}, classify(err, "stat", comps)
		}
		return entryOf("workspace", fi, ""), nil
	}
	parent, err := walk(f.root, nil, comps[:len(comps)-1], nil, fault.PathConflict)
	if err != nil {
		return Entry{}, err
	}
	defer parent.Close()
	name := comps[len(comps)-1]
	fi, err := parent.Lstat(name)
	if err != nil {
		return Entry{}, classify(err, "stat", comps)
	}
	return describe(parent, name, fi), nil
}

// Write streams r into the regular file at path, creating missing parent directories. The file appears whole
// or not at all (a temporary file renamed into place); past MaxFileBytes nothing is left (FILE_TOO_LARGE).
//
// A mode of 0 means 0644; only the permission bits (0777) are applied, never setuid, setgid or sticky. Missing
// parents are created 0755, owned by the sandbox user. An existing file or symlink at path is replaced (the
// link itself, never its target); an existing directory is FILE_TYPE, a parent that is a file or a link is
// PATH_CONFLICT. Parent directories it created stay if the upload then fails. The file is not fsynced: the workspace is a scratch tree, and a host crash right after an
// upload may lose it. A cancelled ctx stops the copy at the next read and leaves nothing behind; a Read that
// blocks is the reader's to unblock (an HTTP body does when its request ends).
func (f *FS) Write(ctx context.Context, path string, r io.Reader, mode fs.FileMode) (int64, error) {
	comps, err := f.parse(path)
	if err != nil {
		return 0, err
	}
	if len(comps) == 0 {
		return 0, fault.New(fault.FileType, "name a file under /workspace, e.g. src/main.go",
			"cannot write a file over the workspace directory itself")
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if mode.Perm() == 0 {
		mode = 0o644
	}
	if f.run != nil {
		return f.remoteWrite(ctx, comps, r, mode)
	}
	parent, err := walk(f.root, nil, comps[:len(comps)-1], f.owner(), fault.PathConflict)
	if err != nil {
		return 0, err
	}
	defer parent.Close()
	return f.writeIn(ctx, parent, comps, r, mode.Perm(), f.lim.MaxFileBytes, time.Time{})
}

// OpenFile opens the regular file at path for reading; a directory, symlink or special file is FILE_TYPE.
//
// The reader stops at the size the file had when it was opened, so a file the sandbox keeps appending to
// cannot make a download unbounded; a file that shrinks meanwhile ends early. The open never blocks on a FIFO
// and never follows a link.
func (f *FS) OpenFile(path string) (io.ReadCloser, Entry, error) {
	comps, err := f.parse(path)
	if err != nil {
		return nil, Entry{}, err
	}
	if len(comps) == 0 {
		return nil, Entry{}, fault.New(fault.FileType, "list it or download it as a tar instead",
			"/workspace is a directory, not a file")
	}
	if f.run != nil {
		return f.remoteOpen(comps)
	}
	parent, err := walk(f.root, nil, comps[:len(comps)-1], nil, fault.PathConflict)
	if err != nil {
		return nil, Entry{}, err
	}
	defer parent.Close()
	file, fi, err := openRegular(parent, comps)
	if err != nil {
		return nil, Entry{}, err
	}
	if fi.Size() > f.lim.MaxFileBytes {
		file.Close()
		return nil, Entry{}, fault.New(fault.FileTooLarge, "download it in parts with a command, or raise the file size limit",
			"%s is %d bytes, over the limit of %d", display(comps), fi.Size(), f.lim.MaxFileBytes)
	}
	return &sizedReader{f: file, left: fi.Size()}, entryOf(comps[len(comps)-1], fi, ""), nil
}

// List lists the directory at path, sorted by name.
//
// Symlinks are listed as links with their target; nothing is followed. An entry that vanishes while the
// listing runs is left out. A directory with more than MaxTarEntries entries is FILE_TOO_LARGE, which bounds
// the memory one listing takes.
func (f *FS) List(path string) ([]Entry, error) {
	comps, err := f.parse(path)
	if err != nil {
		return nil, err
	}
	if f.run != nil {
		return f.remoteList(comps)
	}
	dir, err := walk(f.root, nil, comps, nil, fault.FileType)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	names, err := readNames(dir, comps, f.lim.MaxTarEntries)
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(names))
	for _, name := range names {
		fi, err := dir.Lstat(name)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // removed by the sandbox since it was read
			}
			return nil, classify(err, "list", append(comps, name))
		}
		out = append(out, describe(dir, name, fi))
	}
	return out, nil
}

// owner returns the ids that created files and directories get.
func (f *FS) owner() *owner { return &owner{uid: f.uid, gid: f.gid} }
