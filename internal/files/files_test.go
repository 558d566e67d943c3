package files

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/fault"
)

func TestCleanPath(t *testing.T) {
	long255 := strings.Repeat("n", 255)
	for _, tc := range []struct {
		name, in, want string // want "" means INVALID_PATH
	}{
		{"empty is the workspace", "", "."},
		{"dot is the workspace", ".", "."},
		{"absolute workspace", "/workspace", "."},
		{"absolute workspace with slash", "/workspace/", "."},
		{"relative", "src/main.go", "src/main.go"},
		{"relative with dots and slashes", "./src//app/./main.go/", "src/app/main.go"},
		{"absolute under workspace", "/workspace/src/main.go", "src/main.go"},
		{"absolute with double slash", "/workspace//a", "a"},
		{"a directory named workspace", "workspace/a", "workspace/a"},
		{"a name of 255 bytes", long255, long255},
		{"backslash is a character", `a\..\b`, `a\..\b`},
		{"dot-dot escape", "../etc/passwd", ""},
		{"dot-dot that stays inside", "a/../b", ""},
		{"dot-dot at the end", "a/..", ""},
		{"absolute escape through workspace", "/workspace/../etc", ""},
		{"absolute elsewhere", "/etc/passwd", ""},
		{"absolute prefix lookalike", "/workspacex/a", ""},
		{"double slash root", "//workspace/a", ""},
		{"root", "/", ""},
		{"NUL byte", "a\x00b", ""},
		{"component of 256 bytes", strings.Repeat("n", 256), ""},
		{"path over 4096 bytes", strings.Repeat("a/", 2049), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CleanPath(tc.in)
			if tc.want == "" {
				wantCode(t, err, fault.InvalidPath)
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("CleanPath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	e := newEnv(t, Limits{})
	allBytes := make([]byte, 256*64)
	for i := range allBytes {
		allBytes[i] = byte(i)
	}
	random := make([]byte, 3<<20+17)
	rand.NewChaCha8([32]byte{1}).Read(random)
	for _, tc := range []struct {
		name, path string
		data       []byte
		mode       fs.FileMode
		wantMode   fs.FileMode
	}{
		{"every byte value", "bin/all.bin", allBytes, 0o600, 0o600},
		{"random, unaligned size", "/workspace/deep/er/random.bin", random, 0o755, 0o755},
		{"empty file", "empty", nil, 0, 0o644},
		{"mode 0 is 0644", "text.txt", []byte("hello\n"), 0, 0o644},
		{"setuid and sticky are dropped", "suid", []byte("#!/bin/sh\n"), fs.ModeSetuid | fs.ModeSticky | 0o4755, 0o755},
		{"name with spaces and unicode", "dir with space/ünïcode ✓.txt", []byte("x"), 0o644, 0o644},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := e.fs.Write(context.Background(), tc.path, bytes.NewReader(tc.data), tc.mode)
			must(t, err)
			if n != int64(len(tc.data)) {
				t.Fatalf("Write wrote %d bytes, want %d", n, len(tc.data))
			}
			rc, ent, err := e.fs.OpenFile(tc.path)
			must(t, err)
			got, err := io.ReadAll(rc)
			must(t, err)
			must(t, rc.Close())
			if !bytes.Equal(got, tc.data) {
				t.Fatalf("read back %d bytes (sha %s), wrote %d (sha %s)", len(got), sum(got), len(tc.data), sum(tc.data))
			}
			clean, _ := CleanPath(tc.path)
			if ent.Type != TypeFile || ent.Size != int64(len(tc.data)) || ent.Name != filepath.Base(clean) {
				t.Errorf("entry %+v", ent)
			}
			host := filepath.Join(e.ws, clean)
			fi, err := os.Lstat(host)
			must(t, err)
			if fi.Mode() != tc.wantMode {
				t.Errorf("mode %v, want %v", fi.Mode(), tc.wantMode)
			}
			if want := fmt.Sprintf("%04o", tc.wantMode.Perm()); ent.Mode != want {
				t.Errorf("entry mode %q, want %s", ent.Mode, want)
			}
			checkOwner(t, host)
			// Every directory Write created belongs to the sandbox user, 0755.
			for d := filepath.Dir(host); d != e.ws; d = filepath.Dir(d) {
				fi, err := os.Lstat(d)
				must(t, err)
				if fi.Mode() != fs.ModeDir|0o755 {
					t.Errorf("created directory %s has mode %v, want drwxr-xr-x", d, fi.Mode())
				}
				checkOwner(t, d)
			}
		})
	}
	e.noTemp(t)
	e.untouched(t)
}

func TestWriteReplacesAtomically(t *testing.T) {
	e := newEnv(t, Limits{MaxFileBytes: 1000})
	ctx := context.Background()
	_, err := e.fs.Write(ctx, "f", strings.NewReader("old"), 0o644)
	must(t, err)

	// A failed replacement leaves the old file whole.
	_, err = e.fs.Write(ctx, "f", bytes.NewReader(make([]byte, 1001)), 0o644)
	wantCode(t, err, fault.FileTooLarge)
	if b, _ := os.ReadFile(filepath.Join(e.ws, "f")); string(b) != "old" {
		t.Fatalf("a refused upload changed the file to %d bytes", len(b))
	}
	// Exactly the limit is accepted.
	n, err := e.fs.Write(ctx, "f", bytes.NewReader(make([]byte, 1000)), 0o644)
	if err != nil || n != 1000 {
		t.Fatalf("Write at the limit: %d, %v", n, err)
	}
	// An over-limit new file leaves nothing, not even its new parent's file.
	_, err = e.fs.Write(ctx, "new/big", bytes.NewReader(make([]byte, 5000)), 0o644)
	wantCode(t, err, fault.FileTooLarge)
	if _, err := os.Lstat(filepath.Join(e.ws, "new/big")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("an over-limit upload left a file: %v", err)
	}
	e.noTemp(t)
}

// cancelReader cancels its context after handing out its first chunk, like a client going away mid-upload.
type cancelReader struct {
	cancel context.CancelFunc
	n      int
}

func (c *cancelReader) Read(p []byte) (int, error) {
	c.n++
	if c.n == 2 {
		c.cancel()
	}
	return len(p), nil
}

type failingReader struct{ n int }

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n++; f.n > 3 {
		return 0, io.ErrUnexpectedEOF
	}
	return len(p), nil
}

func TestWriteInterruptedLeavesNothing(t *testing.T) {
	e := newEnv(t, Limits{})
	ctx, cancel := context.WithCancel(context.Background())
	_, err := e.fs.Write(ctx, "cancelled.bin", &cancelReader{cancel: cancel}, 0o644)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	_, err = e.fs.Write(context.Background(), "failed.bin", &failingReader{}, 0o644)
	var re *ReadError
	if !errors.As(err, &re) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %v, want a ReadError wrapping io.ErrUnexpectedEOF", err)
	}
	ents, err := os.ReadDir(e.ws)
	must(t, err)
	if len(ents) != 0 {
		t.Fatalf("an interrupted upload left %v", ents)
	}
}

func TestWriteRefusals(t *testing.T) {
	e := newEnv(t, Limits{})
	e.plantLinks(t)
	must(t, os.Mkdir(filepath.Join(e.ws, "dir"), 0o755))
	must(t, os.WriteFile(filepath.Join(e.ws, "file"), []byte("x"), 0o644))
	for _, tc := range []struct {
		name, path string
		code       fault.Code
	}{
		{"the workspace itself", "/workspace", fault.FileType},
		{"an existing directory", "dir", fault.FileType},
		{"a parent that is a file", "file/x", fault.PathConflict},
		{"a parent that is a file, deeper", "file/x/y", fault.PathConflict},
		{"dot-dot", "../out/pwn", fault.InvalidPath},
		{"absolute elsewhere", filepath.Join(e.out, "pwn"), fault.InvalidPath},
		{"through a relative link out", "out-rel/pwn", fault.PathConflict},
		{"through an absolute link out", "out-abs/pwn", fault.PathConflict},
		{"through a deep relative link out", "deep-rel/pwn", fault.PathConflict},
		{"through a link out, deeper", "out-rel/sub/pwn", fault.PathConflict},
		{"through a link that stays inside", "inside-link/x", fault.PathConflict},
		{"through a link loop", "self-loop/x", fault.PathConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.fs.Write(context.Background(), tc.path, strings.NewReader("pwned"), 0o644)
			wantCode(t, err, tc.code)
			e.untouched(t)
		})
	}
	e.noTemp(t)
	if _, err := os.Lstat(filepath.Join(e.ws, "inside", "x")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("a write went through a link")
	}
}

func TestWriteReplacesLinkNotTarget(t *testing.T) {
	e := newEnv(t, Limits{})
	e.plantLinks(t)
	for _, name := range []string{"secret-rel", "secret-abs", "out-rel"} {
		_, err := e.fs.Write(context.Background(), name, strings.NewReader("mine"), 0o600)
		must(t, err)
		fi, err := os.Lstat(filepath.Join(e.ws, name))
		must(t, err)
		if !fi.Mode().IsRegular() {
			t.Fatalf("%s is %v after Write, want the link replaced by a file", name, fi.Mode())
		}
	}
	e.untouched(t)
}

func TestOpenFileRefusals(t *testing.T) {
	e := newEnv(t, Limits{MaxFileBytes: 10})
	e.plantLinks(t)
	must(t, os.WriteFile(filepath.Join(e.ws, "big"), make([]byte, 11), 0o644))
	must(t, os.WriteFile(filepath.Join(e.ws, "ok"), make([]byte, 10), 0o644))
	must(t, os.WriteFile(filepath.Join(e.ws, "inside", "f"), []byte("in"), 0o644))
	must(t, os.Symlink("inside/f", filepath.Join(e.ws, "link-in")))
	must(t, syscall.Mkfifo(filepath.Join(e.ws, "fifo"), 0o644))
	ln, err := net.Listen("unix", filepath.Join(e.ws, "sock"))
	must(t, err)
	defer ln.Close()
	if os.Geteuid() == 0 {
		// /dev/zero's numbers: a host read through it would never end.
		must(t, syscall.Mknod(filepath.Join(e.ws, "dev"), syscall.S_IFCHR|0o644, int(1<<8|5)))
	}
	for _, tc := range []struct {
		name, path string
		code       fault.Code
	}{
		{"the workspace", ".", fault.FileType},
		{"a directory", "inside", fault.FileType},
		{"a link inside", "link-in", fault.FileType},
		{"a relative link to a host file", "secret-rel", fault.FileType},
		{"an absolute link to a host file", "secret-abs", fault.FileType},
		{"a file through a link out", "out-rel/secret", fault.PathConflict},
		{"a file through an absolute link out", "out-abs/secret", fault.PathConflict},
		{"a FIFO", "fifo", fault.FileType},
		{"a socket", "sock", fault.FileType},
		{"a device", "dev", fault.FileType},
		{"missing", "nope", fault.FileNotFound},
		{"missing parent", "nope/x", fault.FileNotFound},
		{"a parent that is a file", "ok/x", fault.PathConflict},
		{"over the limit", "big", fault.FileTooLarge},
		{"dot-dot", "../out/secret", fault.InvalidPath},
		{"absolute elsewhere", filepath.Join(e.out, "secret"), fault.InvalidPath},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "a device" && os.Geteuid() != 0 {
				t.Skip("mknod needs root")
			}
			rc, _, err := e.fs.OpenFile(tc.path)
			if err == nil {
				rc.Close()
			}
			wantCode(t, err, tc.code)
		})
	}
	rc, ent, err := e.fs.OpenFile("ok")
	must(t, err)
	must(t, rc.Close())
	if ent.Size != 10 {
		t.Fatalf("entry %+v", ent)
	}
	e.untouched(t)
}

// TestOpenSwappedForFIFO swaps a file for a FIFO between the check and the open: the open must neither block
// (no writer will ever come) nor hand out the FIFO.
func TestOpenSwappedForFIFO(t *testing.T) {
	if viaAgent {
		t.Skip("host internals: the agent runs this same code, tested in the first run")
	}
	e := newEnv(t, Limits{})
	p := filepath.Join(e.ws, "f")
	must(t, os.WriteFile(p, []byte("x"), 0o644))
	fi, err := e.fs.root.Lstat("f")
	must(t, err)
	must(t, os.Remove(p))
	must(t, syscall.Mkfifo(p, 0o644))
	done := make(chan error, 1)
	go func() {
		h, _, err := openRegularAt(e.fs.root, "f", fi, []string{"f"})
		if err == nil {
			h.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, errChanged) {
			t.Fatalf("got %v, want the change detected", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("opening a FIFO swapped in blocked")
	}
}

func TestOpenFileStopsAtOpenSize(t *testing.T) {
	e := newEnv(t, Limits{})
	p := filepath.Join(e.ws, "log")
	must(t, os.WriteFile(p, []byte("0123456789"), 0o644))
	rc, ent, err := e.fs.OpenFile("log")
	must(t, err)
	defer rc.Close()
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	must(t, err)
	_, err = f.Write(bytes.Repeat([]byte("more"), 1000))
	must(t, err)
	must(t, f.Close())
	got, err := io.ReadAll(rc)
	must(t, err)
	if string(got) != "0123456789" || ent.Size != 10 {
		t.Fatalf("read %d bytes (entry size %d); a file growing while read must stop at its open size", len(got), ent.Size)
	}
}

func TestList(t *testing.T) {
	e := newEnv(t, Limits{MaxTarEntries: 20})
	e.plantLinks(t)
	ctx := context.Background()
	_, err := e.fs.Write(ctx, "b.txt", strings.NewReader("bee"), 0o640)
	must(t, err)
	_, err = e.fs.Write(ctx, "a/x", strings.NewReader(""), 0)
	must(t, err)
	must(t, syscall.Mkfifo(filepath.Join(e.ws, "fifo"), 0o600))
	mtime := time.Date(2023, 1, 2, 3, 4, 5, 0, time.UTC)
	must(t, os.Chtimes(filepath.Join(e.ws, "b.txt"), mtime, mtime))

	for _, path := range []string{"", ".", "/workspace", "/workspace/"} {
		ents, err := e.fs.List(path)
		must(t, err)
		var names []string
		byName := map[string]Entry{}
		for _, ent := range ents {
			names = append(names, ent.Name)
			byName[ent.Name] = ent
		}
		want := []string{"a", "b.txt", "deep-rel", "fifo", "inside", "inside-link", "out-abs", "out-rel", "secret-abs", "secret-rel", "self-loop"}
		if !slices.Equal(names, want) {
			t.Fatalf("List(%q) names %v, want %v", path, names, want)
		}
		if b := byName["b.txt"]; b.Type != TypeFile || b.Size != 3 || b.Mode != "0640" || !b.MTime.Equal(mtime) || b.Target != "" {
			t.Errorf("b.txt: %+v", b)
		}
		if a := byName["a"]; a.Type != TypeDir || a.Mode != "0755" {
			t.Errorf("a: %+v", a)
		}
		if l := byName["out-abs"]; l.Type != TypeSymlink || l.Target != e.out {
			t.Errorf("out-abs: %+v", l)
		}
		if l := byName["secret-rel"]; l.Type != TypeSymlink || l.Target != "../out/secret" {
			t.Errorf("secret-rel: %+v", l)
		}
		if f := byName["fifo"]; f.Type != TypeOther {
			t.Errorf("fifo: %+v", f)
		}
	}
	ents, err := e.fs.List("a")
	must(t, err)
	if len(ents) != 1 || ents[0].Name != "x" || ents[0].Mode != "0644" {
		t.Fatalf("List(a) = %+v", ents)
	}
	for _, tc := range []struct {
		path string
		code fault.Code
	}{
		{"b.txt", fault.FileType},
		{"out-rel", fault.FileType},
		{"out-abs", fault.FileType},
		{"inside-link", fault.FileType},
		{"out-rel/sub", fault.PathConflict},
		{"nope", fault.FileNotFound},
		{"../out", fault.InvalidPath},
	} {
		_, err := e.fs.List(tc.path)
		wantCode(t, err, tc.code)
	}
	for i := range 20 {
		must(t, os.WriteFile(filepath.Join(e.ws, "inside", "f"+string(rune('a'+i))), nil, 0o644))
	}
	_, err = e.fs.List("inside")
	must(t, err)
	must(t, os.WriteFile(filepath.Join(e.ws, "inside", "one-too-many"), nil, 0o644))
	_, err = e.fs.List("inside")
	wantCode(t, err, fault.FileTooLarge)
	e.untouched(t)
}

func TestStat(t *testing.T) {
	e := newEnv(t, Limits{})
	e.plantLinks(t)
	_, err := e.fs.Write(context.Background(), "d/f", strings.NewReader("abc"), 0o600)
	must(t, err)
	for _, tc := range []struct {
		path, name, typ, target string
	}{
		{"/workspace", "workspace", TypeDir, ""},
		{"d", "d", TypeDir, ""},
		{"d/f", "f", TypeFile, ""},
		{"out-rel", "out-rel", TypeSymlink, "../out"},
		{"secret-abs", "secret-abs", TypeSymlink, filepath.Join(e.out, "secret")},
	} {
		ent, err := e.fs.Stat(tc.path)
		must(t, err)
		if ent.Name != tc.name || ent.Type != tc.typ || ent.Target != tc.target {
			t.Errorf("Stat(%q) = %+v", tc.path, ent)
		}
	}
	_, err = e.fs.Stat("out-rel/secret")
	wantCode(t, err, fault.PathConflict)
	_, err = e.fs.Stat("d/nope")
	wantCode(t, err, fault.FileNotFound)
}

func TestOpenMissingWorkspace(t *testing.T) {
	_, err := Open(filepath.Join(t.TempDir(), "nope"), -1, -1, Limits{})
	wantCode(t, err, fault.FileNotFound)
}

// TestHugeLimit: a limit near the int64 maximum still lets files through (the over-limit probe must not
// overflow into a limit of nothing).
func TestHugeLimit(t *testing.T) {
	e := newEnv(t, Limits{MaxFileBytes: math.MaxInt64, MaxTarBytes: math.MaxInt64})
	n, err := e.fs.Write(context.Background(), "f", strings.NewReader("abc"), 0)
	if err != nil || n != 3 {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.ws, "f")); string(b) != "abc" {
		t.Fatalf("file holds %q", b)
	}
}
