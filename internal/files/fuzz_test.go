package files

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// FuzzCleanPath checks that CleanPath refuses only with INVALID_PATH, and that what it accepts is clean,
// relative, confined, within the bounds, and a fixed point whether written relative or under /workspace.
func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"", ".", "/workspace", "/workspace/", "a/b", "./a//b/", "/workspace/a/../b", "../x",
		"/etc/passwd", "/workspacex", "a\x00b", "//workspace", strings.Repeat("a", 256), "…/ü"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := CleanPath(in)
		if err != nil {
			if !fault.Is(err, fault.InvalidPath) {
				t.Fatalf("CleanPath(%q) error %v is not INVALID_PATH", in, err)
			}
			return
		}
		if got == "" || strings.HasPrefix(got, "/") || strings.ContainsRune(got, 0) || len(got) > MaxPathLen {
			t.Fatalf("CleanPath(%q) = %q", in, got)
		}
		if got != "." {
			for _, c := range strings.Split(got, "/") {
				if c == "" || c == "." || c == ".." || len(c) > MaxNameLen {
					t.Fatalf("CleanPath(%q) = %q has component %q", in, got, c)
				}
			}
		}
		for _, again := range []string{got, "/workspace/" + got} {
			if again2, err := CleanPath(again); len(again) <= MaxPathLen && (err != nil || again2 != got) {
				t.Fatalf("CleanPath(%q) = %q, %v; want %q", again, again2, err, got)
			}
		}
	})
}

// FuzzExtractTar extracts arbitrary bytes into a workspace whose neighbour holds sentinel files and into
// which links pointing out are planted: whatever the input, nothing outside changes, nothing is created next
// to the workspace, the workspace keeps its mode, and every refusal is a typed fault.
//
// Inputs are tars, so an interesting one is kilobytes long and the default minimization (quadratic in its
// length, up to a minute each) would take the whole run: fuzz with a bounded minimization, and on tmpfs if the
// disk is slow at metadata:
//
//	TMPDIR=/dev/shm go test -run '^$' -fuzz FuzzExtractTar -fuzztime 30s -fuzzminimizetime 100x ./internal/files
func FuzzExtractTar(f *testing.F) {
	for _, entries := range [][]tarEntry{
		{{name: "a/", typ: tar.TypeDir}, {name: "a/b.txt", body: "hello"}, {name: "a/l", typ: tar.TypeSymlink, link: "b.txt"}},
		{{name: "esc", typ: tar.TypeSymlink, link: "../out"}, {name: "esc/secret", body: "pwn"}},
		{{name: "out-rel/secret", body: "pwn"}},
		{{name: "../out/secret", body: "pwn"}},
		{{name: "h", typ: tar.TypeLink, link: "../out/secret"}},
		{{name: "secret-rel", body: "replace the link"}},
	} {
		f.Add(buildTar(f, entries...))
	}
	// One outside directory for the whole run and a fresh workspace per input: the input's cost is the
	// extraction, not the set-up, which keeps minimization (many runs per interesting input) quick.
	parent := f.TempDir()
	e := &env{ws: filepath.Join(parent, "ws"), out: filepath.Join(parent, "out")}
	must(f, os.MkdirAll(filepath.Join(e.out, "sub"), 0o755))
	for _, p := range []string{"secret", "file.txt", "sub/inner.txt", "sub/secret"} {
		must(f, os.WriteFile(filepath.Join(e.out, p), []byte(sentinel), 0o644))
	}
	e.before = snapshot(f, e.out)
	uid, gid := testOwner()
	f.Fuzz(func(t *testing.T, data []byte) {
		must(t, os.RemoveAll(e.ws))
		must(t, os.Mkdir(e.ws, 0o700))
		e.plantLinks(t)
		fsys, err := Open(e.ws, uid, gid, Limits{MaxFileBytes: 64 << 10, MaxTarBytes: 256 << 10, MaxTarEntries: 64})
		must(t, err)
		defer fsys.Close()
		_, err = fsys.ExtractTar(context.Background(), ".", bytes.NewReader(data))
		if err != nil && fault.CodeOf(err) == "" {
			t.Fatalf("ExtractTar refused with an untyped error: %v", err)
		}
		e.untouched(t)
		if fi, err := os.Lstat(e.ws); err != nil || fi.Mode() != fs.ModeDir|0o700 {
			t.Fatalf("the workspace itself changed: %v, %v", fi, err)
		}
	})
}

// FuzzParseOp checks that what ParseOp accepts is an operation Serve can run: a known op, a clean relative path
// (a fixed point of CleanPath), a mode within 0777, limits that are not negative.
func FuzzParseOp(f *testing.F) {
	for _, s := range []string{`{"op":"stat","path":".","limits":{}}`, `{"op":"write","path":"a/b","mode":420,"limits":{"MaxFileBytes":10}}`,
		`{"op":"read","path":"../x","limits":{}}`, `{"op":"tar","path":"x","limits":{"MaxTarEntries":-1}}`, `{}`, `null`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		op, err := ParseOp(in)
		if err != nil {
			return
		}
		if c, err := CleanPath(op.Path); err != nil || c != op.Path || strings.HasPrefix(op.Path, "/") {
			t.Fatalf("accepted path %q", op.Path)
		}
		if op.Mode > 0o777 || op.Limits.MaxFileBytes < 0 || op.Limits.MaxTarBytes < 0 || op.Limits.MaxTarEntries < 0 {
			t.Fatalf("accepted %+v", op)
		}
	})
}

// FuzzParseReply checks that a reply from the agent becomes a file fault, a read error or an ErrAgent, never
// anything else, and that its text is printable and bounded.
func FuzzParseReply(f *testing.F) {
	for _, s := range []string{`{"code":"FILE_NOT_FOUND","message":"m","hint":"h"}`, `{"code":"UNAUTHORIZED","message":"m"}`,
		`{"message":"cut","read_error":true}`, `garbage`, `{"code":"FILE_TYPE","message":"a\u001bb"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		err := ParseReply(in, "/workspace/p")
		if err == nil {
			t.Fatal("no error")
		}
		var re *ReadError
		code := fault.CodeOf(err)
		switch {
		case code != "":
			if !fileCodes[code] {
				t.Fatalf("believed code %s", code)
			}
		case errors.As(err, &re), errors.Is(err, ErrAgent):
		default:
			t.Fatalf("unexpected error %T %v", err, err)
		}
		if len(err.Error()) > 4*maxReplyText {
			t.Fatalf("unbounded text: %d bytes", len(err.Error()))
		}
	})
}

// FuzzChunkReader checks that a chunked stream either decodes to its chunks (ending at the marker) or fails,
// and never yields more than the input carried.
func FuzzChunkReader(f *testing.F) {
	f.Add([]byte{0, 0, 0, 3, 'a', 'b', 'c', 0, 0, 0, 0})
	f.Add([]byte{0, 0, 0, 3, 'a'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := io.ReadAll(NewChunkReader(bytes.NewReader(in)))
		if len(got) > len(in) {
			t.Fatalf("%d bytes out of %d in", len(got), len(in))
		}
		if err == nil {
			// Re-encoding the payload gives a stream that decodes to the same bytes.
			wire, _ := io.ReadAll(newChunkEncoder(bytes.NewReader(got), func() bool { return false }))
			back, err := io.ReadAll(NewChunkReader(bytes.NewReader(wire)))
			if err != nil || !bytes.Equal(back, got) {
				t.Fatalf("re-encoded: %v", err)
			}
		}
	})
}
