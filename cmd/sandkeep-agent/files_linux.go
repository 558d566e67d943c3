package main

// The file builtins place and remove the files of a run's secrets on the sandbox's secrets tmpfs. The host runs
// them as ordinary commands through the agent protocol (argv [agent, put-file, PATH, MODE] with the content on
// stdin, which travels in frames), so a secret's value is never in an argv, an environment, a `docker inspect`
// or a log:
//
//	sandkeep-agent put-file PATH MODE   writes stdin (at most 1 MiB) to PATH with the octal MODE
//	sandkeep-agent rm-file PATH...      removes each PATH (one that is missing is fine)
//
// Both exit 0 on success and 1 with a one-line message on stderr otherwise; neither ever prints the content.
//
// PATH must be a clean absolute path strictly under /run/secrets. Every directory from /run/secrets down is
// opened with O_DIRECTORY|O_NOFOLLOW and the file with openat relative to its parent, so a symlink planted by a
// command (in the parent chain or at PATH itself) can never redirect the content, e.g. into /workspace, which
// lives on the host's disk. A new file is created with O_CREAT|O_EXCL|O_NOFOLLOW; an existing entry is replaced
// only by renaming a fresh temporary file of the same directory over it (a rename replaces a symlink itself,
// never its target).

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// secretsDir is the tmpfs the lifecycle mounts for secret files (spec.SecretsDir; the agent is stdlib-only, so
// the value is repeated here and a test checks that the two agree).
const secretsDir = "/run/secrets"

// secretsRoot is the only directory tree put-file and rm-file touch. It is a variable only so that this
// package's tests can point it at a temporary directory: nothing outside _test.go files assigns it, and no flag,
// argument or environment variable reaches it, so a shipped agent always works under secretsDir.
var secretsRoot = secretsDir

// maxFileBytes bounds what put-file reads from stdin: the size of the whole secrets tmpfs.
const maxFileBytes = 1 << 20

// atRemoveDir is AT_REMOVEDIR, for unlinkat on a directory (package syscall has no constant for it).
const atRemoveDir = 0x200

// fileBuiltin runs put-file or rm-file when args (os.Args[1:]) name one, and returns its exit code; ok is false
// for any other mode.
func fileBuiltin(args []string) (code int, ok bool) {
	if len(args) == 0 {
		return 0, false
	}
	var err error
	switch args[0] {
	case "put-file":
		err = putFile(secretsRoot, args[1:], os.Stdin)
	case "rm-file":
		err = rmFiles(secretsRoot, args[1:])
	default:
		return 0, false
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandkeep-agent %s: %v\n", args[0], err)
		return 1, true
	}
	return 0, true
}

// putFile writes what it reads from stdin to args[0] (under root) with the mode args[1].
func putFile(root string, args []string, stdin io.Reader) error {
	if len(args) != 2 {
		return errors.New("usage: put-file PATH MODE (content on stdin)")
	}
	dirs, name, err := splitBeneath(root, args[0])
	if err != nil {
		return err
	}
	mode, err := parseFileMode(args[1])
	if err != nil {
		return err
	}
	data, err := io.ReadAll(io.LimitReader(stdin, maxFileBytes+1))
	if err != nil {
		return fmt.Errorf("read stdin: %w", err)
	}
	defer clear(data)
	if len(data) > maxFileBytes {
		return fmt.Errorf("content for %s is over %d bytes", args[0], maxFileBytes)
	}
	chain, err := openChain(root, dirs, true)
	defer closeAll(chain)
	if err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	if err := writeAt(chain[len(chain)-1], name, data, mode); err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	return nil
}

// writeAt creates name in dir with data and mode, or, when an entry of that name exists, replaces it by
// renaming a new temporary file over it. A failure leaves no temporary file behind.
func writeAt(dir int, name string, data []byte, mode uint32) error {
	err := createAt(dir, name, data, mode)
	if !errors.Is(err, syscall.EEXIST) {
		return err
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:]) // never fails on Linux (Go 1.24+)
	tmp := "." + name + ".sandkeep-" + hex.EncodeToString(rnd[:])
	if len(tmp) > 255 {
		tmp = ".sandkeep-" + hex.EncodeToString(rnd[:])
	}
	if err := createAt(dir, tmp, data, mode); err != nil {
		return err
	}
	if err := syscall.Renameat(dir, tmp, dir, name); err != nil {
		_ = syscall.Unlinkat(dir, tmp)
		return fmt.Errorf("replace: %w", err)
	}
	return nil
}

// createAt creates a new file name in dir (never following a symlink, never opening an existing entry) and
// writes data to it with exactly mode (not masked by the umask). On failure the new file is removed.
func createAt(dir int, name string, data []byte, mode uint32) error {
	fd, err := syscall.Openat(dir, name, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600&mode)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	_, err = f.Write(data)
	if err == nil {
		err = syscall.Fchmod(fd, mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = syscall.Unlinkat(dir, name)
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// rmFiles removes each path (under root), then the directories below root that became empty. A path that is
// already gone, or whose directory is (or is a symlink or a file: never followed), is not an error.
func rmFiles(root string, paths []string) error {
	if len(paths) == 0 {
		return errors.New("usage: rm-file PATH...")
	}
	var failed []string
	for _, p := range paths {
		if err := rmFile(root, p); err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", p, err))
		}
	}
	if len(failed) > 0 {
		return errors.New(strings.Join(failed, "; ")) // one line, every path tried; never any content
	}
	return nil
}

func rmFile(root, p string) error {
	dirs, name, err := splitBeneath(root, p)
	if err != nil {
		return err
	}
	chain, err := openChain(root, dirs, false)
	defer closeAll(chain)
	if len(chain) > 0 && (errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENOTDIR)) {
		// A directory below the root that is missing, a symlink or a file: nothing put-file wrote can be at
		// this path (it never writes through such a parent), and nothing is followed to look.
		return nil
	}
	if err != nil {
		return err
	}
	if err := syscall.Unlinkat(chain[len(chain)-1], name); err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("remove: %w", err)
	}
	// Directories put-file created for nested paths go too when nothing else is in them.
	for i := len(dirs) - 1; i >= 0; i-- {
		if unlinkDirAt(chain[i], dirs[i]) != nil {
			break // not empty (or already gone): so are its parents
		}
	}
	return nil
}

// splitBeneath checks that p is a clean absolute path strictly under root and returns the directories between
// root and the file, and the file's name.
func splitBeneath(root, p string) (dirs []string, name string, err error) {
	switch {
	case !path.IsAbs(p) || path.Clean(p) != p || strings.Contains(p, "/../") || strings.HasSuffix(p, "/.."):
		return nil, "", fmt.Errorf("path %q is not a clean absolute path", p)
	case !strings.HasPrefix(p, root+"/"):
		return nil, "", fmt.Errorf("path %q is not under %s", p, root)
	}
	parts := strings.Split(strings.TrimPrefix(p, root+"/"), "/")
	for _, c := range parts {
		if c == "" || c == "." || c == ".." || strings.ContainsRune(c, 0) {
			return nil, "", fmt.Errorf("path %q has an invalid component", p)
		}
	}
	return parts[:len(parts)-1], parts[len(parts)-1], nil
}

// openChain opens root, then each of dirs in turn relative to the one before, none of them through a symlink,
// creating missing ones (0700) when create is set. It returns the descriptors opened so far, root first, also
// on error; the caller closes them.
func openChain(root string, dirs []string, create bool) ([]int, error) {
	const flags = syscall.O_RDONLY | syscall.O_DIRECTORY | syscall.O_NOFOLLOW | syscall.O_CLOEXEC
	fd, err := syscall.Open(root, flags, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", root, dirError(err))
	}
	chain := []int{fd}
	for _, d := range dirs {
		parent := chain[len(chain)-1]
		fd, err := syscall.Openat(parent, d, flags, 0)
		if errors.Is(err, syscall.ENOENT) && create {
			if err = syscall.Mkdirat(parent, d, 0o700); err == nil || errors.Is(err, syscall.EEXIST) {
				fd, err = syscall.Openat(parent, d, flags, 0)
			}
		}
		if err != nil {
			return chain, fmt.Errorf("directory %q: %w", d, dirError(err))
		}
		chain = append(chain, fd)
		if err := notThroughLink(parent, d, fd); err != nil {
			return chain, fmt.Errorf("directory %q: %w", d, err)
		}
	}
	return chain, nil
}

// notThroughLink checks that fd, opened as name in parent, is the directory entry name itself: some kernels
// follow a final symlink despite O_NOFOLLOW when O_DIRECTORY is set (gVisor's Sentry did: a secret went through
// a planted link into /workspace), so the entry is looked at again without following it and must be no
// symlink and the same inode as fd.
func notThroughLink(parent int, name string, fd int) error {
	var entry, opened unix.Stat_t
	if err := unix.Fstatat(parent, name, &entry, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if err := unix.Fstat(fd, &opened); err != nil {
		return err
	}
	if entry.Mode&unix.S_IFMT == unix.S_IFLNK || entry.Dev != opened.Dev || entry.Ino != opened.Ino {
		return fmt.Errorf("a symlink or not a directory: %w", syscall.ELOOP)
	}
	return nil
}

// dirError says plainly what O_DIRECTORY|O_NOFOLLOW refused.
func dirError(err error) error {
	if errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("a symlink or not a directory: %w", err)
	}
	return err
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = syscall.Close(fd)
	}
}

// unlinkDirAt removes the empty directory name in dir.
func unlinkDirAt(dir int, name string) error {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return err
	}
	if _, _, e := syscall.Syscall(syscall.SYS_UNLINKAT, uintptr(dir), uintptr(unsafe.Pointer(p)), atRemoveDir); e != 0 {
		return e
	}
	return nil
}

// parseFileMode reads an octal mode with a leading zero, at most 0777, that lets the owner read the file (as
// spec.ParseSecretMode does).
func parseFileMode(s string) (uint32, error) {
	if len(s) < 2 || s[0] != '0' {
		return 0, fmt.Errorf("mode %q is not an octal mode with a leading zero", s)
	}
	v, err := strconv.ParseUint(s, 8, 32)
	switch {
	case err != nil:
		return 0, fmt.Errorf("mode %q is not an octal mode with a leading zero", s)
	case v > 0o777:
		return 0, fmt.Errorf("mode %q is over 0777", s)
	case v&0o400 == 0:
		return 0, fmt.Errorf("mode %q does not let the owner read the file", s)
	}
	return uint32(v), nil
}
