// Package build turns a spec's `build:` (a Dockerfile and a context directory, both inside the repository) into
// the tar stream a container engine builds from, without ever reading outside the repository, and names the
// result by a digest of exactly what is sent, so the same inputs give the same image tag.
//
// Confinement: every file is read through an os.Root opened at the repository root. Absolute paths and `..`
// are refused before anything is read; a symlink inside the context is put in the tar AS a symlink (its target
// is never read); the context directory itself and an out-of-context Dockerfile may be reached through a
// symlink only when it stays inside the repository. Devices, sockets and FIFOs are refused. The context is
// bounded by MaxContextBytes and MaxContextFiles.
//
// Reproducibility: entries are written in lexical order with mtime 0 (the Unix epoch), uid/gid 0 and no user
// or group names, so the digest depends only on paths, permission bits, file contents, symlink targets, the
// Dockerfile's name and the build args. Files in the built image carry that mtime.
//
// The Dockerfile: when it is a regular file inside the context it goes in under its own path and is sent even
// when .dockerignore excludes it (as `docker build` does; the daemon then drops it from what COPY sees). When it
// lies elsewhere in the repository, or is a symlink, its content is read through the repository's os.Root and
// sent as ReservedDockerfile at the context root, and the tar's .dockerignore gets a line naming it, so the
// daemon removes it before any COPY. A context entry with that reserved name is refused.
//
// .dockerignore is read from the context root (at most MaxIgnoreBytes) and is itself always sent, as `docker
// build` does. The subset of Docker's syntax understood (anything else is an error, never a silent difference):
//   - one pattern a line; a line whose first character is '#' is a comment; blank lines are skipped; leading
//     and trailing white space is trimmed; a UTF-8 byte-order mark on the first line is dropped;
//   - a pattern is a slash-separated path relative to the context root, cleaned like path.Clean, a leading '/'
//     dropped; patterns are anchored at the root (`foo` matches `foo`, not `a/foo`: write `**/foo` for that);
//   - each element is matched with path.Match (`*`, `?`, `[...]`, `\` escapes; none of them crosses a '/');
//   - an element that is exactly `**` matches zero or more elements (`**/*.log`, `a/**/b`, `a/**`, which also
//     matches `a` itself). `**` inside a longer element (`a**b`) is two `*`s: unlike Docker's regexp
//     translation, it does not cross a '/';
//   - a pattern that matches a directory excludes everything under it;
//   - `!pattern` re-includes what it matches; the last pattern that matches a path decides.
//
// Refused: a malformed element (path.Match's ErrBadPattern), a pattern that cleans to `.` or `/` (the context
// itself) or leaves the context (`..`), a bare `!`.
package build

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// Failure codes of builds. They belong in internal/fault (and docs/ERRORS.md); until they move there, they are
// defined here with the same spelling.
const (
	// CodeContextInvalid: the Dockerfile or context cannot be sent (outside the repository, special files,
	// too large, a malformed .dockerignore). Retrying will not help; fixing the repository will.
	CodeContextInvalid = fault.BuildContextInvalid
	// CodeFailed: the engine ran the build and it failed (a failing RUN, a missing base image, ...).
	CodeFailed = fault.BuildFailed
)

// Bounds of a build context.
const (
	MaxContextBytes    int64 = 2 << 30 // total size of the regular files sent
	MaxContextFiles          = 100_000 // entries (files, directories, symlinks) sent
	MaxDockerfileBytes int64 = 1 << 20
	MaxIgnoreBytes           = 1 << 20
)

// Names.
const (
	// ReservedDockerfile is the context-root name an out-of-context (or symlinked) Dockerfile is sent under.
	ReservedDockerfile = ".sandkeep-build.Dockerfile"
	// TagPrefix starts the tag of every image sandkeep builds: TagPrefix + digest[:24] + ":latest".
	TagPrefix = "sandkeep-build-"
	// LabelDigest is set on every image sandkeep builds to the full digest of its inputs, so a tag that was
	// moved to another image (or a 24-hex-digit prefix collision) is not taken for a cache hit.
	LabelDigest = driver.LabelPrefix + "build-digest"
)

// digestVersion goes into every digest: bump it when what a digest stands for changes (tar layout, builder
// options such as the network mode), so images built the old way are not reused.
const digestVersion = "sandkeep-build/v1"

// Request is one build: a Dockerfile and a context directory inside a repository.
type Request struct {
	Root       string            // the repository root; absolute
	Dockerfile string            // relative to Root; "" means Context/Dockerfile
	Context    string            // relative to Root; "" means "." (the repository root)
	Args       map[string]string // build args (Dockerfile ARG); never logged
	Target     string            // the stage to build ("" is the last); part of the digest when set
	// Base, when set, is called with each image the Dockerfile builds FROM or copies from (Bases) before
	// anything is sent: the engine pulls an absent one from the registry its name says, so a repository's
	// build has its bases checked against the operator's image_registries. Its error stops the build as it is.
	Base func(ctx context.Context, ref string) error
}

// Builder builds images from a Request. It is optional for drivers (the Docker driver has it); callers find it
// with a type assertion. progress receives the build's output as plain lines (nil: discard). The result is the
// image's tag (Tag of the inputs' digest) and its ID. Failures are a *fault.Error with CodeContextInvalid or
// CodeFailed, or an error wrapping ctx's cause when ctx ended.
type Builder interface {
	Build(ctx context.Context, req Request, progress io.Writer) (imageRef, imageID string, err error)
}

// Tag is the image tag for a digest returned by Context.
func Tag(digest string) string {
	if len(digest) > 24 {
		digest = digest[:24]
	}
	return TagPrefix + digest + ":latest"
}

type limits struct {
	bytes int64
	files int
}

var defaultLimits = limits{bytes: MaxContextBytes, files: MaxContextFiles}

// Context builds the context tar of req and returns it (a temporary file, already unlinked, positioned at its
// start: Close it), the Dockerfile's name inside it, and the hex SHA-256 digest of the tar's bytes, that name
// and the args. The digest is over the very bytes returned: a file that changes while it is read cannot make
// the tag lie. Errors are *fault.Error with CodeContextInvalid (fault.InvalidArgument for a bad arg name), or
// wrap ctx's cause.
func Context(ctx context.Context, req Request) (tarball io.ReadCloser, dockerfile, digest string, err error) {
	return buildContext(ctx, req, defaultLimits)
}

func invalid(hint, format string, args ...any) error {
	return fault.New(CodeContextInvalid, hint, format, args...)
}

func invalidWrap(err error, hint, format string, args ...any) error {
	return fault.Wrap(err, CodeContextInvalid, hint, format, args...)
}

const hintPaths = "give build.context and build.dockerfile as paths relative to the repository root, inside it"

// local cleans a path relative to the repository root; "" becomes ".".
func local(what, p string) (string, error) {
	if p == "" {
		return ".", nil
	}
	if filepath.IsAbs(p) {
		return "", invalid(hintPaths, "build %s %q is an absolute path", what, p)
	}
	c := filepath.Clean(p)
	if c != "." && !filepath.IsLocal(c) {
		return "", invalid(hintPaths, "build %s %q points outside the repository", what, p)
	}
	return filepath.ToSlash(c), nil
}

func checkArgs(args map[string]string) error {
	for k, v := range args {
		if k == "" || len(k) > 256 || strings.ContainsFunc(k, func(r rune) bool {
			return r == '=' || r <= ' ' || r == 0x7f
		}) {
			return fault.New(fault.InvalidArgument, "a build arg name is a word like GREETING (no '=', spaces or control characters)",
				"build arg name %q is not valid", k)
		}
		if strings.ContainsRune(v, 0) {
			return fault.New(fault.InvalidArgument, "remove the NUL byte", "build arg %s has a NUL byte in its value", k)
		}
	}
	return nil
}

func buildContext(ctx context.Context, req Request, lim limits) (_ io.ReadCloser, dockerfile, digest string, err error) {
	if !filepath.IsAbs(req.Root) {
		return nil, "", "", invalid("this is a bug in the caller", "the repository root %q is not an absolute path", req.Root)
	}
	ctxRel, err := local("context", req.Context)
	if err != nil {
		return nil, "", "", err
	}
	dfRel := path.Join(ctxRel, "Dockerfile")
	if req.Dockerfile != "" {
		if dfRel, err = local("dockerfile", req.Dockerfile); err != nil {
			return nil, "", "", err
		}
	}
	if err := checkArgs(req.Args); err != nil {
		return nil, "", "", err
	}

	root, err := os.OpenRoot(req.Root)
	if err != nil {
		return nil, "", "", invalidWrap(err, "check the spec's location", "cannot open the repository at %s", req.Root)
	}
	defer root.Close()
	croot, err := root.OpenRoot(ctxRel)
	if err != nil {
		return nil, "", "", invalidWrap(err, hintPaths, "build context %q cannot be opened inside the repository: %v", ctxRel, err)
	}
	defer croot.Close()

	s := &sender{ctx: ctx, croot: croot, lim: lim}
	if err := s.planDockerfile(root, ctxRel, dfRel); err != nil {
		return nil, "", "", err
	}
	if req.Base != nil {
		bases, err := Bases(dfRel, s.dfText, req.Args)
		if err != nil {
			return nil, "", "", err
		}
		for _, b := range bases {
			if err := req.Base(ctx, b); err != nil {
				return nil, "", "", err
			}
		}
	}
	if err := s.readIgnore(); err != nil {
		return nil, "", "", err
	}

	f, err := os.CreateTemp("", "sandkeep-build-context-*.tar")
	if err != nil {
		return nil, "", "", fmt.Errorf("build context: %w", err)
	}
	// Unlinked now: nothing is left on disk whatever happens next; the open file keeps the data.
	_ = os.Remove(f.Name())
	defer func() {
		if err != nil {
			_ = f.Close()
		}
	}()
	sum := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(f, sum), 64<<10)
	s.tw = tar.NewWriter(bw)
	if err := s.walk(); err != nil {
		return nil, "", "", err
	}
	if err := s.tw.Close(); err != nil {
		return nil, "", "", fmt.Errorf("build context: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return nil, "", "", fmt.Errorf("build context: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, "", "", fmt.Errorf("build context: %w", err)
	}
	return f, s.dfName, digestOf(s.dfName, req.Args, req.Target, sum.Sum(nil)), nil
}

// digestOf frames every input with its length, so no two different inputs hash the same bytes.
func digestOf(dockerfile string, args map[string]string, target string, tarSum []byte) string {
	h := sha256.New()
	frame := func(s string) {
		_ = binary.Write(h, binary.BigEndian, uint64(len(s)))
		_, _ = io.WriteString(h, s)
	}
	frame(digestVersion)
	frame(dockerfile)
	keys := make([]string, 0, len(args))
	for k := range args {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	_ = binary.Write(h, binary.BigEndian, uint64(len(keys)))
	for _, k := range keys {
		frame(k)
		frame(args[k])
	}
	if target != "" { // only when set, so digests of builds without one are unchanged
		frame("target")
		frame(target)
	}
	h.Write(tarSum)
	return hex.EncodeToString(h.Sum(nil))
}

// sender writes one context tar.
type sender struct {
	ctx   context.Context
	croot *os.Root // the context directory, inside the repository's root
	lim   limits

	dfName     string // the Dockerfile's name in the tar
	dfInCtx    bool   // dfName is a regular file of the context, sent as it is
	dfReserved []byte // otherwise: its content, sent as ReservedDockerfile
	dfText     []byte // the Dockerfile's content, either way

	ignore    *ignore
	ignoreRaw []byte // the context's .dockerignore, nil when there is none
	hasIgnore bool

	tw    *tar.Writer
	files int
	bytes int64
}

// planDockerfile decides how the Dockerfile travels (see the package comment).
func (s *sender) planDockerfile(root *os.Root, ctxRel, dfRel string) error {
	inCtx := ""
	switch {
	case ctxRel == ".":
		inCtx = dfRel
	case strings.HasPrefix(dfRel, ctxRel+"/"):
		inCtx = dfRel[len(ctxRel)+1:]
	}
	if inCtx != "" {
		if fi, err := s.croot.Lstat(inCtx); err == nil && fi.Mode().IsRegular() {
			if fi.Size() > MaxDockerfileBytes {
				return invalid("", "the Dockerfile %s is larger than %d bytes", dfRel, MaxDockerfileBytes)
			}
			data, err := s.croot.ReadFile(inCtx)
			if err != nil {
				return invalidWrap(err, "", "the Dockerfile %s cannot be read: %v", dfRel, err)
			}
			if int64(len(data)) > MaxDockerfileBytes {
				return invalid("", "the Dockerfile %s is larger than %d bytes", dfRel, MaxDockerfileBytes)
			}
			if err := CheckDockerfile(dfRel, data); err != nil {
				return err
			}
			s.dfName, s.dfInCtx, s.dfText = inCtx, true, data
			return nil
		}
	}
	f, err := root.OpenFile(dfRel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return invalidWrap(err, hintPaths, "the Dockerfile %s cannot be opened inside the repository: %v", dfRel, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return invalidWrap(err, "", "the Dockerfile %s: %v", dfRel, err)
	}
	if !fi.Mode().IsRegular() {
		return invalid("point build.dockerfile at a regular file", "the Dockerfile %s is not a regular file", dfRel)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxDockerfileBytes+1))
	if err != nil {
		return invalidWrap(err, "", "the Dockerfile %s cannot be read: %v", dfRel, err)
	}
	if int64(len(data)) > MaxDockerfileBytes {
		return invalid("", "the Dockerfile %s is larger than %d bytes", dfRel, MaxDockerfileBytes)
	}
	if err := CheckDockerfile(dfRel, data); err != nil {
		return err
	}
	s.dfName, s.dfReserved, s.dfText = ReservedDockerfile, data, data
	return nil
}

func (s *sender) readIgnore() error {
	f, err := s.croot.OpenFile(".dockerignore", os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return invalidWrap(err, "", ".dockerignore cannot be opened inside the repository: %v", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return invalid("make .dockerignore a regular file", ".dockerignore is not a regular file")
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxIgnoreBytes+1))
	if err != nil {
		return invalidWrap(err, "", ".dockerignore cannot be read: %v", err)
	}
	if len(data) > MaxIgnoreBytes {
		return invalid("", ".dockerignore is larger than %d bytes", MaxIgnoreBytes)
	}
	ig, err := parseIgnore(data)
	if err != nil {
		return invalidWrap(err, "fix the pattern (see internal/build: the supported .dockerignore syntax)", "%v", err)
	}
	s.ignore, s.ignoreRaw, s.hasIgnore = ig, data, true
	return nil
}

// epoch is the mtime of every entry.
var epoch = time.Unix(0, 0)

func (s *sender) walk() error {
	if s.dfReserved != nil {
		if err := s.writeReserved(); err != nil {
			return err
		}
	}
	err := fs.WalkDir(s.croot.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if s.ctx.Err() != nil {
			return fmt.Errorf("build context: %w", context.Cause(s.ctx))
		}
		if err != nil {
			return invalidWrap(err, "check the permissions of the build context", "cannot read %s in the build context: %v", p, err)
		}
		if p == "." {
			return nil
		}
		always := p == ".dockerignore" || (s.dfInCtx && p == s.dfName)
		if !always && s.ignore.excluded(p) {
			// An excluded directory is still walked when an exception may re-include something in it, or
			// when it holds the Dockerfile.
			holdsDockerfile := s.dfInCtx && strings.HasPrefix(s.dfName, p+"/")
			if d.IsDir() && !s.ignore.hasExceptions && !holdsDockerfile {
				return fs.SkipDir
			}
			return nil
		}
		if s.dfReserved != nil && (p == ReservedDockerfile || p == ".dockerignore") {
			if p == ReservedDockerfile {
				return invalid("rename it", "the build context has a file named %s, a name sandkeep reserves", ReservedDockerfile)
			}
			return nil // already sent by writeReserved, with the reserved name appended
		}
		return s.add(p, d)
	})
	return err
}

// writeReserved sends the out-of-context Dockerfile and a .dockerignore that makes the daemon drop it.
func (s *sender) writeReserved() error {
	if err := s.writeFile(ReservedDockerfile, s.dfReserved, 0o644); err != nil {
		return err
	}
	ign := slices.Clone(s.ignoreRaw)
	if !s.hasIgnore {
		ign = []byte(".dockerignore\n") // it was not the user's: drop it too
	} else if len(ign) > 0 && ign[len(ign)-1] != '\n' {
		ign = append(ign, '\n')
	}
	ign = append(ign, "/"+ReservedDockerfile+"\n"...)
	return s.writeFile(".dockerignore", ign, 0o644)
}

func (s *sender) writeFile(name string, data []byte, mode int64) error {
	if err := s.count(int64(len(data))); err != nil {
		return err
	}
	h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch}
	if err := s.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("build context: %w", err)
	}
	if _, err := s.tw.Write(data); err != nil {
		return fmt.Errorf("build context: %w", err)
	}
	return nil
}

func (s *sender) count(size int64) error {
	s.files++
	s.bytes += size
	if s.files > s.lim.files {
		return invalid("add a .dockerignore or narrow build.context", "the build context has more than %d entries", s.lim.files)
	}
	if s.bytes > s.lim.bytes {
		return invalid("add a .dockerignore or narrow build.context", "the build context is larger than %d bytes", s.lim.bytes)
	}
	return nil
}

// add sends one entry of the context, by its lstat type.
func (s *sender) add(p string, d fs.DirEntry) error {
	fi, err := d.Info()
	if err != nil {
		return invalidWrap(err, "", "cannot stat %s in the build context: %v", p, err)
	}
	perm := int64(fi.Mode().Perm())
	switch t := fi.Mode().Type(); {
	case t == fs.ModeDir:
		if err := s.count(0); err != nil {
			return err
		}
		return s.header(&tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: perm, ModTime: epoch})
	case t == fs.ModeSymlink:
		target, err := s.croot.Readlink(p)
		if err != nil {
			return invalidWrap(err, "", "cannot read the symlink %s in the build context: %v", p, err)
		}
		if err := s.count(0); err != nil {
			return err
		}
		return s.header(&tar.Header{Typeflag: tar.TypeSymlink, Name: p, Linkname: target, Mode: 0o777, ModTime: epoch})
	case t == 0:
		return s.addRegular(p, perm)
	default:
		return invalid("remove it or list it in .dockerignore",
			"%s in the build context is a special file (%s); only regular files, directories and symlinks can be sent", p, kind(t))
	}
}

func kind(t fs.FileMode) string {
	switch {
	case t&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case t&fs.ModeSocket != 0:
		return "a socket"
	case t&fs.ModeCharDevice != 0:
		return "a character device"
	case t&fs.ModeDevice != 0:
		return "a device"
	default:
		return "irregular"
	}
}

func (s *sender) addRegular(p string, perm int64) error {
	// O_NONBLOCK: if p was swapped for a FIFO since it was listed, opening it does not hang; Stat then refuses.
	f, err := s.croot.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return invalidWrap(err, "", "cannot open %s in the build context: %v", p, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return invalidWrap(err, "", "cannot stat %s in the build context: %v", p, err)
	}
	if !fi.Mode().IsRegular() {
		return invalid("do not change the repository during a build", "%s in the build context changed while it was read", p)
	}
	size := fi.Size()
	if err := s.count(size); err != nil {
		return err
	}
	if err := s.header(&tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: perm, Size: size, ModTime: epoch}); err != nil {
		return err
	}
	if _, err := io.CopyN(s.tw, f, size); err != nil {
		if errors.Is(err, io.EOF) {
			return invalid("do not change the repository during a build", "%s in the build context shrank while it was read", p)
		}
		return invalidWrap(err, "", "cannot read %s in the build context: %v", p, err)
	}
	return nil
}

func (s *sender) header(h *tar.Header) error {
	if err := s.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("build context: %s: %w", h.Name, err)
	}
	return nil
}
