package files

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"github.com/sandkeep/sandkeep/internal/fault"
)

const (
	tarSizeHint  = "send fewer or smaller files per tar, or raise the tar limits"
	tarEntryHint = "archive regular files, directories and symbolic links only (GNU tar: --hard-dereference for hard links)"
)

// ExtractTar extracts the tar stream r under the directory dir (created when missing).
//
// Regular files, directories and symbolic links are extracted, owned by the sandbox user, with their
// permission bits (never setuid, setgid or sticky) and, for files, their modification time. Each file lands
// whole through a temporary file, and an existing file or link is replaced; a directory entry for dir itself
// changes nothing. A link's target is data: it is created as written and never followed, and a later entry
// whose path goes through a link is PATH_CONFLICT. Hard links (their target could be anything the archive
// names), devices, FIFOs and other entry types are FILE_TYPE. Entry names are relative to dir: an absolute
// name, or one with a ".." component, is INVALID_PATH. More than MaxTarEntries entries, a file over
// MaxFileBytes or files summing over MaxTarBytes is FILE_TOO_LARGE. A stream that is not a tar is
// INVALID_ARGUMENT.
//
// A failure stops the extraction and fails the whole request, but it is not undone: the entries before the
// one that failed stay written (the one that failed leaves nothing). The summary counts what was written.
func (f *FS) ExtractTar(ctx context.Context, dir string, r io.Reader) (TarSummary, error) {
	var sum TarSummary
	comps, err := f.parse(dir)
	if err != nil {
		return sum, err
	}
	if err := ctx.Err(); err != nil {
		return sum, err
	}
	if f.run != nil {
		return f.remoteExtract(ctx, comps, r)
	}
	own := f.owner()
	base, err := walk(f.root, nil, comps, own, fault.PathConflict)
	if err != nil {
		return sum, err
	}
	defer base.Close()
	tr := tar.NewReader(ctxReader{ctx, r})
	for entries := 1; ; entries++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return sum, nil
		}
		// ErrInsecurePath comes with a usable header; parseEntryName is the judge of names here.
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			if ctx.Err() != nil {
				return sum, ctx.Err()
			}
			return sum, fault.Wrap(err, fault.InvalidArgument, "send an uncompressed tar stream (tar -cf - ...)",
				"the tar stream is malformed after %d entries: %v", entries-1, err)
		}
		if entries > f.lim.MaxTarEntries {
			return sum, fault.New(fault.FileTooLarge, tarSizeHint, "the tar has more than %d entries", f.lim.MaxTarEntries)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue // pax defaults for the entries after it; archive/tar has applied what matters
		}
		ec, err := parseEntryName(hdr.Name)
		if err != nil {
			return sum, err
		}
		full := concat(comps, ec)
		if len(joinComps(full)) > MaxPathLen {
			return sum, fault.New(fault.InvalidPath, tarPathHint, "the tar entry %q makes a path over %d bytes", hdr.Name, MaxPathLen)
		}
		if err := f.extractEntry(ctx, base, comps, ec, hdr, tr, &sum); err != nil {
			return sum, err
		}
	}
}

// extractEntry writes one entry, ec under base (which is comps), and counts it in sum.
func (f *FS) extractEntry(ctx context.Context, base *os.Root, comps, ec []string, hdr *tar.Header, tr io.Reader, sum *TarSummary) error {
	full := concat(comps, ec)
	perm := fs.FileMode(hdr.Mode) & fs.ModePerm
	own := f.owner()
	switch hdr.Typeflag {
	case tar.TypeDir:
		if len(ec) == 0 {
			return nil // dir itself keeps its mode: it may be the workspace, which stays 0700
		}
		d, err := walk(base, comps, ec, own, fault.PathConflict)
		if err != nil {
			return err
		}
		defer d.Close()
		if err := own.apply(d, perm); err != nil {
			return classify(err, "set the mode of", full)
		}
		sum.Dirs++
		return nil

	case tar.TypeReg, tar.TypeGNUSparse:
		if len(ec) == 0 {
			return fault.New(fault.InvalidPath, tarPathHint, "the tar entry %q names the target directory, not a file", hdr.Name)
		}
		if hdr.Size > f.lim.MaxFileBytes {
			return fault.New(fault.FileTooLarge, tarSizeHint, "the tar entry %q is %d bytes, over the file limit of %d",
				hdr.Name, hdr.Size, f.lim.MaxFileBytes)
		}
		if hdr.Size > f.lim.MaxTarBytes-sum.Bytes {
			return fault.New(fault.FileTooLarge, tarSizeHint, "the tar's files sum to more than %d bytes", f.lim.MaxTarBytes)
		}
		parent, err := walk(base, comps, ec[:len(ec)-1], own, fault.PathConflict)
		if err != nil {
			return err
		}
		defer parent.Close()
		n, err := f.writeIn(ctx, parent, full, tr, perm, hdr.Size, hdr.ModTime)
		var re *ReadError
		if errors.As(err, &re) {
			return fault.Wrap(err, fault.InvalidArgument, "send a whole, uncompressed tar stream (tar -cf - ...)",
				"the tar stream is cut off or malformed in the entry %q", hdr.Name)
		}
		if err != nil {
			return err
		}
		sum.Files++
		sum.Bytes += n
		return nil

	case tar.TypeSymlink:
		if len(ec) == 0 {
			return fault.New(fault.InvalidPath, tarPathHint, "the tar entry %q names the target directory, not a link", hdr.Name)
		}
		if hdr.Linkname == "" || len(hdr.Linkname) > MaxPathLen || strings.IndexByte(hdr.Linkname, 0) >= 0 {
			return fault.New(fault.InvalidArgument, tarEntryHint, "the tar entry %q is a link with an unusable target", hdr.Name)
		}
		parent, err := walk(base, comps, ec[:len(ec)-1], own, fault.PathConflict)
		if err != nil {
			return err
		}
		defer parent.Close()
		if err := f.symlinkIn(parent, full, hdr.Linkname); err != nil {
			return err
		}
		sum.Links++
		return nil

	case tar.TypeLink:
		return fault.New(fault.FileType, tarEntryHint, "the tar entry %q is a hard link, which is not extracted", hdr.Name)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return fault.New(fault.FileType, tarEntryHint, "the tar entry %q is a device or FIFO, which is not extracted", hdr.Name)
	default:
		return fault.New(fault.FileType, tarEntryHint, "the tar entry %q has type %q, which is not extracted", hdr.Name, hdr.Typeflag)
	}
}

// symlinkIn makes comps[len-1] in parent a link to target, replacing a file or link there: created under a
// temporary name, given its owner without following it, then renamed into place.
func (f *FS) symlinkIn(parent *os.Root, comps []string, target string) error {
	name := comps[len(comps)-1]
	if fi, err := parent.Lstat(name); err == nil && fi.IsDir() {
		return fault.New(fault.FileType, "remove the directory first", "%s is a directory", display(comps))
	}
	tmp := tempName()
	if err := parent.Symlink(target, tmp); err != nil {
		return classify(err, "create link", comps)
	}
	if err := parent.Lchown(tmp, f.uid, f.gid); err != nil {
		_ = parent.Remove(tmp)
		return classify(err, "set the owner of link", comps)
	}
	if err := parent.Rename(tmp, name); err != nil {
		_ = parent.Remove(tmp)
		if errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			return fault.New(fault.FileType, "remove the directory first", "%s is a directory", display(comps))
		}
		return classify(err, "create link", comps)
	}
	return nil
}

// WriteTar writes the tree under dir to w as a tar stream; symlinks are written as links, never followed.
//
// Names are relative to dir (directories end in "/"); dir itself has no entry. Entries come in name order, with
// their permission bits and modification time, and no owner. FIFOs, sockets and devices are left out, as are
// entries that vanish or change type while the walk runs: the tree is live, and the tar is a snapshot of what
// could be read safely. A file is cut at the size it had when opened, and padded with zeros if it shrank. A
// path that is not a directory is FILE_TYPE; more than MaxTarEntries entries, a file over MaxFileBytes or files
// summing over MaxTarBytes is FILE_TOO_LARGE, and so is a tree deeper than MaxPathLen bytes of path.
//
// An error can come after part of the stream was written; the tar is then left unterminated, so that a reader
// sees a truncated archive rather than a complete-looking one, and the caller must report the failure (e.g.
// abort the HTTP response).
func (f *FS) WriteTar(ctx context.Context, dir string, w io.Writer) error {
	comps, err := f.parse(dir)
	if err != nil {
		return err
	}
	if f.run != nil {
		return f.remoteTar(ctx, comps, w)
	}
	d, err := walk(f.root, nil, comps, nil, fault.FileType)
	if err != nil {
		return err
	}
	defer d.Close()
	tw := tar.NewWriter(w)
	t := &tarWalk{ctx: ctx, tw: tw, lim: f.lim}
	top, err := d.OpenRoot(".")
	if err != nil {
		return classify(err, "archive", comps)
	}
	if err := t.dir(d, top, comps, nil); err != nil {
		return err
	}
	return tw.Close()
}

// tarWalk is one WriteTar.
type tarWalk struct {
	ctx   context.Context
	tw    *tar.Writer
	lim   Limits
	seen  int   // names read so far; bounds the names held in memory down the recursion
	bytes int64 // file bytes written so far
}

// dir writes the entries of d, which is top/rel, in name order, and closes d. It closes d before it goes into a
// subdirectory and opens it again after, from root (the archived directory) by its path through the same
// symlink-safe walk, checking it is still the directory that was listed; the subdirectory is opened the same way.
// So a deep tree costs a few descriptors, not one per level.
func (t *tarWalk) dir(root, d *os.Root, top, rel []string) error {
	at := concat(top, rel)
	names, err := readNames(d, at, t.lim.MaxTarEntries-t.seen)
	if err != nil {
		d.Close()
		return err
	}
	self, err := d.Stat(".")
	if err != nil {
		d.Close()
		return classify(err, "archive", at)
	}
	t.seen += len(names)
	for _, name := range names {
		if err := t.ctx.Err(); err != nil {
			d.Close()
			return err
		}
		srel := concat(rel, []string{name})
		fi, err := t.entry(d, top, srel)
		if err != nil {
			d.Close()
			return err
		}
		if fi == nil {
			continue
		}
		d.Close()
		if err := t.subdir(root, top, srel, fi); err != nil {
			return err
		}
		if d = t.reopen(root, top, rel, self); d == nil {
			return nil // the directory was removed or replaced meanwhile: what is left of it is not archived
		}
	}
	d.Close()
	return nil
}

// subdir writes the directory rel (under top), listed with fi, and its entries.
func (t *tarWalk) subdir(root *os.Root, top, rel []string, fi fs.FileInfo) error {
	sub := t.reopen(root, top, rel, fi)
	if sub == nil {
		return nil // removed or replaced by the sandbox since its parent was read
	}
	hdr := &tar.Header{Typeflag: tar.TypeDir, Name: strings.Join(rel, "/") + "/", Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime()}
	if err := t.tw.WriteHeader(hdr); err != nil {
		sub.Close()
		return fmt.Errorf("write tar: %w", err)
	}
	return t.dir(root, sub, top, rel)
}

// reopen opens top/rel from root again, or returns nil when it is gone or is no longer the directory fi.
func (t *tarWalk) reopen(root *os.Root, top, rel []string, fi fs.FileInfo) *os.Root {
	d, err := walk(root, top, rel, nil, fault.FileType)
	if err != nil {
		return nil
	}
	if got, err := d.Stat("."); err != nil || !os.SameFile(fi, got) {
		d.Close()
		return nil
	}
	return d
}

// entry writes the entry rel (under top), whose last component is in d, unless it is a directory: then it writes
// nothing and returns its FileInfo, for dir to archive once d is closed.
func (t *tarWalk) entry(d *os.Root, top, rel []string) (fs.FileInfo, error) {
	name := rel[len(rel)-1]
	at := concat(top, rel)
	tarName := strings.Join(rel, "/")
	if len(tarName) > MaxPathLen {
		return nil, fault.New(fault.FileTooLarge, "archive a shallower directory", "%s is deeper than %d bytes of path", display(at), MaxPathLen)
	}
	fi, err := d.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // removed by the sandbox since the directory was read
	}
	if err != nil {
		return nil, classify(err, "archive", at)
	}
	hdr := &tar.Header{Name: tarName, Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime()}
	switch {
	case fi.IsDir():
		return fi, nil

	case fi.Mode().IsRegular():
		h, got, err := openRegularAt(d, name, fi, at)
		if skippable(err) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		defer h.Close()
		size := got.Size()
		if size > t.lim.MaxFileBytes {
			return nil, fault.New(fault.FileTooLarge, "archive without it, or raise the file size limit",
				"%s is %d bytes, over the limit of %d", display(at), size, t.lim.MaxFileBytes)
		}
		if size > t.lim.MaxTarBytes-t.bytes {
			return nil, fault.New(fault.FileTooLarge, tarSizeHint, "the files under the directory sum to more than %d bytes", t.lim.MaxTarBytes)
		}
		t.bytes += size
		hdr.Typeflag, hdr.Size, hdr.ModTime = tar.TypeReg, size, got.ModTime()
		if err := t.tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("write tar: %w", err)
		}
		n, err := copyBuffer(t.tw, &io.LimitedReader{R: ctxReader{t.ctx, h}, N: size})
		if err != nil {
			if t.ctx.Err() != nil {
				return nil, t.ctx.Err()
			}
			return nil, fmt.Errorf("archive %s: %w", display(at), err)
		}
		if n < size { // shrank while read: keep the stream well-formed
			if _, err := copyBuffer(t.tw, io.LimitReader(zeros{}, size-n)); err != nil {
				return nil, fmt.Errorf("write tar: %w", err)
			}
		}
		return nil, nil

	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := d.Readlink(name)
		if err != nil {
			return nil, nil // no longer a link: replaced since Lstat
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		if err := t.tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("write tar: %w", err)
		}
		return nil, nil

	default:
		return nil, nil // FIFOs, sockets, devices: nothing a tar of a workspace should carry
	}
}

// skippable reports whether err says an entry vanished or changed between the check and the open.
func skippable(err error) bool {
	return err != nil && (errors.Is(err, errChanged) || errors.Is(err, fs.ErrNotExist))
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
