// Package files reads and writes a sandbox's workspace from the host, confined to it: every path is resolved
// through an os.Root of the workspace directory, so neither `..`, an absolute path, nor a symlink the sandbox
// plants (even while a request runs) reaches outside. It never uses `docker cp` on a live container. Uploads and
// downloads stream with bounded memory and are bounded in size.
//
// Paths are as a command inside the sandbox sees them: relative to /workspace, or absolute under /workspace;
// "", "." and "/workspace" name the workspace itself.
//
// SKELETON: the contract below is fixed; the implementation is being written.
package files

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"time"
)

// Limits bound what one operation may move. Zero fields take the defaults.
type Limits struct {
	MaxFileBytes  int64 // one file, uploaded or downloaded; default 1 GiB
	MaxTarBytes   int64 // the sum of a tar's file sizes, either way; default 4 GiB
	MaxTarEntries int   // entries in one tar, either way; default 100000
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

// TarSummary says what ExtractTar wrote.
type TarSummary struct {
	Files int   `json:"files"`
	Dirs  int   `json:"dirs"`
	Links int   `json:"links"`
	Bytes int64 `json:"bytes"`
}

// FS is one workspace, opened for host-side access. It is safe for concurrent use.
type FS struct{}

var errSkeleton = errors.New("files: not implemented yet")

// Open opens the workspace directory dir. Files and directories it creates are owned by uid:gid (the sandbox
// user), so the sandbox can use them.
func Open(dir string, uid, gid int, lim Limits) (*FS, error) { return nil, errSkeleton }

// Close releases the workspace root.
func (f *FS) Close() error { return nil }

// Stat describes path without following a final symlink.
func (f *FS) Stat(path string) (Entry, error) { return Entry{}, errSkeleton }

// Write streams r into the regular file at path, creating missing parent directories. The file appears whole
// or not at all (a temporary file renamed into place); past MaxFileBytes nothing is left (FILE_TOO_LARGE).
func (f *FS) Write(ctx context.Context, path string, r io.Reader, mode fs.FileMode) (int64, error) {
	return 0, errSkeleton
}

// OpenFile opens the regular file at path for reading; a directory, symlink or special file is FILE_TYPE.
func (f *FS) OpenFile(path string) (io.ReadCloser, Entry, error) { return nil, Entry{}, errSkeleton }

// List lists the directory at path, sorted by name.
func (f *FS) List(path string) ([]Entry, error) { return nil, errSkeleton }

// ExtractTar extracts the tar stream r under the directory dir (created when missing).
func (f *FS) ExtractTar(ctx context.Context, dir string, r io.Reader) (TarSummary, error) {
	return TarSummary{}, errSkeleton
}

// WriteTar writes the tree under dir to w as a tar stream; symlinks are written as links, never followed.
func (f *FS) WriteTar(ctx context.Context, dir string, w io.Writer) error { return errSkeleton }
