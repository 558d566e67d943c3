package feature

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// Bounds of one resolution (all the features one devcontainer.json pulls in), beyond a feature's own
// MaxFeatureBytes: issue 22 (finding 7) found 32 features of sparse 256 MiB files held in memory, 1.8 GB of RSS
// from a 60 KB repository. Files are kept in memory only while they are small and few; the rest go to files in
// the spool's directory, and all of them together are bounded.
const (
	MaxTotalFeatureBytes  int64 = 512 << 20 // every feature's files together, memory and disk
	maxInlineFile         int64 = 64 << 10  // a larger file goes to disk
	maxInlineBytes        int64 = 8 << 20   // the files kept in memory together; past it every file goes to disk
	MaxConcurrentResolves       = 4         // resolutions at once in this process; more wait (Resolve)
)

// resolveSlots bounds the resolutions running at once, so that many runs resolving features at the same
// time cannot multiply the bounds above.
var resolveSlots = make(chan struct{}, MaxConcurrentResolves)

// Spool holds the files of one resolution. Dir is where files that are not kept in memory go; "" keeps them
// all in memory (within the same total bound). The caller removes Dir when it is done with the features.
type Spool struct {
	Dir string

	total, inline int64 // bytes taken, all and in memory
	n             int   // files written to Dir
}

// take reads one file of at most limit bytes from r (more is an error) and returns it as a File, in memory or
// in Dir; what it took counts against MaxTotalFeatureBytes.
func (s *Spool) take(name string, mode os.FileMode, r io.Reader, limit int64) (File, error) {
	over := fmt.Errorf("more than %d bytes", MaxFeatureBytes)
	if left := MaxTotalFeatureBytes - s.total; left < limit {
		limit = left
		over = fmt.Errorf("the features' files are more than %d bytes together", MaxTotalFeatureBytes)
	}
	f := File{Path: name, Mode: mode}
	// Small files stay in memory while the memory budget lasts: most of a feature is a few small scripts.
	head, err := io.ReadAll(io.LimitReader(r, min(limit, maxInlineFile)+1))
	if err != nil {
		return File{}, err
	}
	if int64(len(head)) <= maxInlineFile && (s.Dir == "" || s.inline+int64(len(head)) <= maxInlineBytes) {
		if int64(len(head)) > limit {
			return File{}, over
		}
		s.total += int64(len(head))
		s.inline += int64(len(head))
		f.Data, f.Size = head, int64(len(head))
		return f, nil
	}
	if s.Dir == "" {
		rest, err := io.ReadAll(io.LimitReader(r, limit-int64(len(head))+1))
		if err != nil {
			return File{}, err
		}
		if int64(len(head)+len(rest)) > limit {
			return File{}, over
		}
		f.Data = append(head, rest...)
		f.Size = int64(len(f.Data))
		s.total += f.Size
		return f, nil
	}
	s.n++
	p := filepath.Join(s.Dir, strconv.Itoa(s.n))
	out, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return File{}, err
	}
	n, err := io.Copy(out, io.LimitReader(io.MultiReader(bytes.NewReader(head), r), limit+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > limit {
		err = over
	}
	if err != nil {
		_ = os.Remove(p)
		return File{}, err
	}
	s.total += n
	f.spooled, f.Size = p, n
	return f, nil
}

// Open reads the file's content, from memory or from the spool.
func (f File) Open() (io.ReadCloser, error) {
	if f.spooled == "" {
		return io.NopCloser(bytes.NewReader(f.Data)), nil
	}
	return os.Open(f.spooled)
}

// Bytes is the file's content; for the metadata file, which ParseMetadata bounds again.
func (f File) Bytes() ([]byte, error) {
	if f.spooled == "" {
		return f.Data, nil
	}
	return os.ReadFile(f.spooled)
}

// acquireResolve waits for one of resolveSlots, or ctx.
func acquireResolve(ctx context.Context) (release func(), err error) {
	select {
	case resolveSlots <- struct{}{}:
		return func() { <-resolveSlots }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting to resolve features: %w", context.Cause(ctx))
	}
}
