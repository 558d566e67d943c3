package devcontainer

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/sandkeep/sandkeep/internal/diag"
)

// candidates are where devcontainer.json is looked up, in order, relative to the repository root.
var candidates = []string{".devcontainer/devcontainer.json", ".devcontainer.json"}

// Find returns the repository's devcontainer.json: <root>/.devcontainer/devcontainer.json, else
// <root>/.devcontainer.json. ok is true only when that file could be opened through an os.Root at root and is
// a regular file of at most MaxSize bytes: a symlink that leaves the repository (or a directory on the way
// that does) is refused, not followed. When the first candidate that exists is refused, Find returns its path
// with ok false and does not fall back to the next one (that would let a planted symlink choose the config).
// Read the file with Load, which goes through the same os.Root, rather than by path.
func Find(root string) (path string, ok bool) {
	rel, _, err := locate(root)
	if rel == "" {
		return "", false
	}
	return filepath.Join(root, filepath.FromSlash(rel)), err == nil
}

// Load finds, reads and parses the repository's devcontainer.json (see Find and Parse). found is false when
// the repository has none. A file that exists but cannot be read through the os.Root (it escapes the
// repository, is not a regular file, or is too large) is a SK215 error. An empty env.WorkspaceFolder is root, made absolute.
// found is true when there is a file, or an error to report (root cannot be opened).
func Load(root string, env Env) (cfg *Config, list diag.List, found bool) {
	if env.WorkspaceFolder == "" {
		env.WorkspaceFolder = root
		if abs, err := filepath.Abs(root); err == nil {
			env.WorkspaceFolder = abs
		}
	}
	rel, data, err := locate(root)
	if rel == "" && err == nil {
		return nil, nil, false
	}
	path := filepath.Join(root, filepath.FromSlash(rel))
	if err != nil {
		return nil, diag.List{{Code: diag.DevcontainerUnreadable, Severity: diag.Error, File: path,
			Message: fmt.Sprintf("devcontainer.json cannot be read inside the repository: %v", err),
			Hint:    "make it a regular file inside the repository (not a symlink out of it), under 1 MiB"}}, true
	}
	cfg, list = Parse(path, data, env)
	return cfg, list, true
}

// locate returns the first candidate that exists (rel, slash-separated) and its content. rel is "" when there
// is none; err is set when root cannot be opened or the candidate is refused.
func locate(root string) (rel string, data []byte, err error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return "", nil, fmt.Errorf("open repository root: %w", err)
	}
	defer r.Close()
	for _, c := range candidates {
		name := filepath.FromSlash(c)
		if _, err := r.Lstat(name); err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
				continue
			}
			return c, nil, err // e.g. .devcontainer is a symlink out of the repository
		}
		data, err := readIn(r, name)
		return c, data, err
	}
	return "", nil, nil
}

// readIn reads a regular file of at most MaxSize bytes through r. O_NONBLOCK keeps a FIFO planted in the
// repository from blocking the open; the file is then refused as not regular.
func readIn(r *os.Root, name string) ([]byte, error) {
	f, err := r.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", name)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxSize {
		return nil, fmt.Errorf("%s is over the limit of %d bytes", name, MaxSize)
	}
	return data, nil
}
