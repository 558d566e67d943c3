package files

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// tempPrefix starts the names of files being uploaded; the sandbox may see them while an upload runs.
const tempPrefix = ".sandkeep-upload-"

// bufSize is the copy buffer: memory per transfer is this, whatever the file's size.
const bufSize = 256 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}

// writeIn streams r into the file comps[len-1] in parent through a temporary file renamed into place. More
// than max bytes is FILE_TOO_LARGE; a non-zero mtime is set on the file.
func (f *FS) writeIn(ctx context.Context, parent *os.Root, comps []string, r io.Reader, perm fs.FileMode, max int64, mtime time.Time) (int64, error) {
	name := comps[len(comps)-1]
	if fi, err := parent.Lstat(name); err == nil && fi.IsDir() {
		return 0, fault.New(fault.FileType, "remove the directory first, or choose a file name inside it",
			"%s is a directory", display(comps))
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, classify(err, "write", comps)
	}

	tmp := tempName()
	h, err := parent.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, classify(err, "create a temporary file for", comps)
	}
	done := false
	defer func() {
		if !done {
			h.Close()
			// Whatever is at tmp now is ours or the sandbox's, and inside parent either way.
			_ = parent.Remove(tmp)
		}
	}()

	src := &readTracker{r: ctxReader{ctx, r}}
	n, err := copyBuffer(h, &io.LimitedReader{R: src, N: max + 1})
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if src.err != nil {
			return 0, &ReadError{Path: display(comps), Err: src.err}
		}
		return 0, classify(err, "write", comps)
	}
	if n > max {
		return 0, fault.New(fault.FileTooLarge, "upload a smaller file, or raise the file size limit",
			"%s is over the limit of %d bytes", display(comps), max)
	}
	// Owner before mode: chown clears setuid bits, and perm has none anyway. Through the descriptor, so a
	// name swapped meanwhile cannot redirect either.
	if err := h.Chown(f.uid, f.gid); err != nil {
		return 0, classify(err, "set the owner of", comps)
	}
	if err := h.Chmod(perm); err != nil {
		return 0, classify(err, "set the mode of", comps)
	}
	if !mtime.IsZero() {
		if err := setMtime(h, mtime); err != nil {
			return 0, classify(err, "set the time of", comps)
		}
	}
	done = true
	if err := h.Close(); err != nil {
		_ = parent.Remove(tmp)
		return 0, classify(err, "write", comps)
	}
	if err := parent.Rename(tmp, name); err != nil {
		_ = parent.Remove(tmp)
		if errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			return 0, fault.New(fault.FileType, "remove the directory first, or choose a file name inside it",
				"%s is a directory", display(comps))
		}
		return 0, classify(err, "write", comps)
	}
	return n, nil
}

// tempName is a fresh name for a file or link being created; O_EXCL or symlinkat refuse a name that exists.
func tempName() string { return tempPrefix + rand.Text() }

// ReadError is a failure to read what Write or ExtractTar was given (a client that went away, a cut-off
// stream), as opposed to a failure of the workspace; nothing of the file it was writing is left.
type ReadError struct {
	Path string // the file being written, as the sandbox sees it
	Err  error
}

func (e *ReadError) Error() string { return "read the data for " + e.Path + ": " + e.Err.Error() }

func (e *ReadError) Unwrap() error { return e.Err }

// readTracker remembers the error its reader returned, other than io.EOF.
type readTracker struct {
	r   io.Reader
	err error
}

func (t *readTracker) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && err != io.EOF {
		t.err = err
	}
	return n, err
}

// copyBuffer copies src to dst with a pooled buffer, hiding ReaderFrom and WriterTo so that the buffer, and
// nothing larger, is what a transfer holds.
func copyBuffer(dst io.Writer, src io.Reader) (int64, error) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	return io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, *bp)
}

// ctxReader stops reading once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// sizedReader reads an open file up to the size it had when opened.
type sizedReader struct {
	f    *os.File
	left int64
}

func (s *sizedReader) Read(p []byte) (int, error) {
	if s.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > s.left {
		p = p[:s.left]
	}
	n, err := s.f.Read(p)
	s.left -= int64(n)
	return n, err
}

func (s *sizedReader) Close() error { return s.f.Close() }
