package files

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"syscall"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// errChanged marks an entry that was replaced between the check and the open: the sandbox is changing the
// tree while the host reads it. It is wrapped in a PATH_CONFLICT or FILE_TYPE fault; WriteTar skips such entries.
var errChanged = errors.New("changed while the request ran")

const (
	retryHint    = "the sandbox changed this path while the request ran; retry when it is done"
	linkHint     = "symbolic links in /workspace are never followed: use the path of the link's target"
	notFoundHint = "check the path; list the parent directory to see what is there"
)

// owner is who files and directories created on the sandbox's behalf belong to.
type owner struct{ uid, gid int }

// apply gives the directory open as d the owner and the permission bits perm, through its descriptor so
// that no name is resolved again.
func (o *owner) apply(d *os.Root, perm fs.FileMode) error {
	h, err := d.Open(".")
	if err != nil {
		return err
	}
	defer h.Close()
	if err := h.Chown(o.uid, o.gid); err != nil {
		return err
	}
	return h.Chmod(perm)
}

// walk opens the directory comps under start, never following a symlink: each component is checked with
// Lstat, opened through the Root, and the opened directory compared with what Lstat saw. With own, missing
// directories are created (0755, owned by own). A component that is a link or not a directory is
// PATH_CONFLICT, or lastCode for the last one. prefix is where start is, for messages. The caller closes the
// returned Root; for no components it is a new handle on start.
func walk(start *os.Root, prefix, comps []string, own *owner, lastCode fault.Code) (*os.Root, error) {
	cur, err := start.OpenRoot(".")
	if err != nil {
		return nil, classify(err, "open directory", prefix)
	}
	for i, name := range comps {
		code := fault.PathConflict
		if i == len(comps)-1 {
			code = lastCode
		}
		next, err := stepDir(cur, name, concat(prefix, comps[:i+1]), own, code)
		cur.Close()
		if err != nil {
			return nil, err
		}
		cur = next
	}
	return cur, nil
}

// stepDir opens the directory name in cur, creating it with own when it is missing; at names it for messages.
func stepDir(cur *os.Root, name string, at []string, own *owner, code fault.Code) (*os.Root, error) {
	created := false
	fi, err := cur.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) && own != nil {
		// 0700 until it has its owner and mode, so it is never, even briefly, a host-owned open directory.
		switch err = cur.Mkdir(name, 0o700); {
		case err == nil:
			created = true
		case !errors.Is(err, fs.ErrExist): // else made meanwhile, by the sandbox or another request: use it
			return nil, classify(err, "create directory", at)
		}
		fi, err = cur.Lstat(name)
	}
	if err != nil {
		return nil, classify(err, "open directory", at)
	}
	if !fi.IsDir() {
		return nil, typeFault(at, fi, code, "a directory")
	}
	next, err := openDirAt(cur, name, fi, at)
	if err != nil {
		return nil, err
	}
	if created {
		if err := own.apply(next, 0o755); err != nil {
			next.Close()
			return nil, classify(err, "set the owner of directory", at)
		}
	}
	return next, nil
}

// openDirAt opens the directory name in cur that Lstat described as fi, and checks that what it opened is
// that directory: Root.OpenRoot would follow a link swapped in meanwhile (within the Root), and this is where
// such a swap is caught. A mismatch is errChanged.
func openDirAt(cur *os.Root, name string, fi fs.FileInfo, at []string) (*os.Root, error) {
	next, err := cur.OpenRoot(name)
	if err != nil {
		return nil, openFailure(err, cur, name, fi, "open directory", at)
	}
	got, err := next.Stat(".")
	if err != nil {
		next.Close()
		return nil, classify(err, "open directory", at)
	}
	if !got.IsDir() || !os.SameFile(fi, got) {
		next.Close()
		return nil, changedFault(at)
	}
	return next, nil
}

// openRegular opens the regular file comps[len-1] in parent for reading.
func openRegular(parent *os.Root, comps []string) (*os.File, fs.FileInfo, error) {
	name := comps[len(comps)-1]
	fi, err := parent.Lstat(name)
	if err != nil {
		return nil, nil, classify(err, "open", comps)
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, typeFault(comps, fi, fault.FileType, "a regular file")
	}
	return openRegularAt(parent, name, fi, comps)
}

// openRegularAt opens the file name in parent that Lstat described as fi (a regular file) and checks that
// the open file is that one. O_NONBLOCK keeps a FIFO swapped in meanwhile from blocking the open, and
// O_NOCTTY a terminal from becoming ours; the fstat check then refuses either, and any file that is not the
// one Lstat saw (a link swapped in is followed by Root.OpenFile, but only to a file within the Root).
func openRegularAt(parent *os.Root, name string, fi fs.FileInfo, at []string) (*os.File, fs.FileInfo, error) {
	h, err := parent.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, nil, openFailure(err, parent, name, fi, "open", at)
	}
	got, err := h.Stat()
	if err != nil {
		h.Close()
		return nil, nil, classify(err, "open", at)
	}
	if !got.Mode().IsRegular() || !os.SameFile(fi, got) {
		h.Close()
		return nil, nil, changedFault(at)
	}
	return h, got, nil
}

// openFailure explains why opening name in dir, which Lstat described as fi, failed. An error that is not
// the kernel's is the Root refusing to follow a link out of it, and ELOOP or ENOTDIR a link or file where
// Lstat saw a directory or a file: either way the name was swapped meanwhile, even if it is back now.
func openFailure(err error, dir *os.Root, name string, fi fs.FileInfo, op string, at []string) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) || errno == syscall.ELOOP || errno == syscall.ENOTDIR || changed(dir, name, fi) {
		return changedFault(at)
	}
	return classify(err, op, at)
}

// changed reports whether name in dir is no longer what Lstat described as fi.
func changed(dir *os.Root, name string, fi fs.FileInfo) bool {
	now, err := dir.Lstat(name)
	return err != nil || !os.SameFile(fi, now) || now.Mode().Type() != fi.Mode().Type()
}

// readNames returns the names in dir, sorted; more than max is FILE_TOO_LARGE, which bounds the memory a
// directory the sandbox filled can make the host spend.
func readNames(dir *os.Root, at []string, max int) ([]string, error) {
	h, err := dir.Open(".")
	if err != nil {
		return nil, classify(err, "read directory", at)
	}
	defer h.Close()
	var names []string
	for {
		batch, err := h.Readdirnames(1024)
		names = append(names, batch...)
		if len(names) > max {
			return nil, fault.New(fault.FileTooLarge, "list or archive a smaller directory, or raise the tar entry limit",
				"%s has more than %d entries", display(at), max)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, classify(err, "read directory", at)
		}
	}
	slices.Sort(names)
	return names, nil
}

// describe is the Entry for name in dir, which Lstat described as fi.
func describe(dir *os.Root, name string, fi fs.FileInfo) Entry {
	target := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		// A link replaced since Lstat reads as no target; the entry is a snapshot either way.
		target, _ = dir.Readlink(name)
	}
	return entryOf(name, fi, target)
}

func entryOf(name string, fi fs.FileInfo, target string) Entry {
	return Entry{
		Name:   name,
		Size:   fi.Size(),
		Mode:   fmt.Sprintf("%04o", fi.Mode().Perm()),
		Type:   typeOf(fi.Mode()),
		MTime:  fi.ModTime().UTC(),
		Target: target,
	}
}

func typeOf(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return TypeFile
	case m.IsDir():
		return TypeDir
	case m&fs.ModeSymlink != 0:
		return TypeSymlink
	default:
		return TypeOther
	}
}

// kindOf names m's type for messages.
func kindOf(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	default:
		return "a special file"
	}
}

// typeFault says that at is of the wrong type: it is fi, where want was needed.
func typeFault(at []string, fi fs.FileInfo, code fault.Code, want string) error {
	if fi.Mode()&fs.ModeSymlink != 0 {
		return fault.New(code, linkHint, "%s is a symbolic link, not %s", display(at), want)
	}
	hint := "use a path that names " + want
	if code == fault.PathConflict {
		hint = "a parent of the path must be a directory: remove or rename what is there"
	}
	return fault.New(code, hint, "%s is %s, not %s", display(at), kindOf(fi.Mode()), want)
}

func changedFault(at []string) error {
	return fault.Wrap(errChanged, fault.PathConflict, retryHint, "%s changed while the request ran", display(at))
}

// classify turns a file system error into a fault where a person can act on it; other errors are wrapped
// with what was being done, and surface as INTERNAL.
func classify(err error, op string, at []string) error {
	var fe *fault.Error
	switch {
	case errors.As(err, &fe):
		return err
	case errors.Is(err, fs.ErrNotExist):
		return fault.Wrap(err, fault.FileNotFound, notFoundHint, "%s does not exist", display(at))
	case errors.Is(err, syscall.ENOTDIR):
		return fault.Wrap(err, fault.PathConflict, "a parent of the path must be a directory: remove or rename what is there",
			"a parent of %s is not a directory", display(at))
	case errors.Is(err, syscall.EISDIR):
		return fault.Wrap(err, fault.FileType, "use a path that names a file", "%s is a directory", display(at))
	case errors.Is(err, syscall.ELOOP):
		return fault.Wrap(err, fault.FileType, linkHint, "%s is a symbolic link", display(at))
	case errors.Is(err, syscall.ENAMETOOLONG):
		return fault.Wrap(err, fault.InvalidPath, pathHint, "%s is too long", display(at))
	case errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT):
		return fault.Wrap(err, fault.WorkspaceFull, "free space in the workspace (or on the host), then retry",
			"no space left to write %s", display(at))
	}
	return fmt.Errorf("%s %s: %w", op, display(at), err)
}

// concat returns a new slice of a followed by b, so that callers can keep appending to either.
func concat(a, b []string) []string {
	out := make([]string, 0, len(a)+len(b)+1)
	return append(append(out, a...), b...)
}
