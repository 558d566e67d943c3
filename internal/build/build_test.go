package build

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// repo writes files (path -> content) under a new temporary repository root and returns the root.
func repo(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

type entry struct {
	typ      byte
	linkname string
	body     string
	mode     int64
}

// contextOf runs Context and reads the tar back.
func contextOf(t *testing.T, req Request) (map[string]entry, []string, string, string) {
	t.Helper()
	rc, df, digest, err := Context(t.Context(), req)
	if err != nil {
		t.Fatalf("Context: %v", err)
	}
	defer rc.Close()
	raw, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]entry{}
	var order []string
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(time.Unix(0, 0)) || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: header not normalised: %+v", h.Name, h)
		}
		entries[h.Name] = entry{typ: h.Typeflag, linkname: h.Linkname, body: string(body), mode: h.Mode}
		order = append(order, h.Name)
	}
	return entries, order, df, digest
}

func TestContext(t *testing.T) {
	root := repo(t, map[string]string{
		"Dockerfile":      "FROM scratch\n",
		"hello.txt":       "hello\n",
		"sub/deep/x.go":   "package x\n",
		"outside-ctx.txt": "not sent when the context is sub\n",
	})
	if err := os.Symlink("/etc/passwd", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "hello.txt"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, order, df, digest := contextOf(t, Request{Root: root})
	if df != "Dockerfile" {
		t.Errorf("dockerfile = %q", df)
	}
	want := []string{"Dockerfile", "hello.txt", "link", "outside-ctx.txt", "sub/", "sub/deep/", "sub/deep/x.go"}
	if strings.Join(order, " ") != strings.Join(want, " ") {
		t.Errorf("entries = %q, want %q", order, want)
	}
	if e := got["hello.txt"]; e.body != "hello\n" || e.mode != 0o755 || e.typ != tar.TypeReg {
		t.Errorf("hello.txt = %+v", e)
	}
	if e := got["link"]; e.typ != tar.TypeSymlink || e.linkname != "/etc/passwd" || e.body != "" {
		t.Errorf("link = %+v, want a symlink to /etc/passwd with no body", e)
	}
	if len(digest) != 64 || Tag(digest) != "sandkeep-build-"+digest[:24]+":latest" {
		t.Errorf("digest %q, tag %q", digest, Tag(digest))
	}

	t.Run("stable", func(t *testing.T) {
		later := time.Now().Add(time.Hour)
		if err := os.Chtimes(filepath.Join(root, "hello.txt"), later, later); err != nil {
			t.Fatal(err)
		}
		if _, _, _, d := contextOf(t, Request{Root: root}); d != digest {
			t.Errorf("digest changed with an mtime: %s != %s", d, digest)
		}
	})
	t.Run("content changes the digest", func(t *testing.T) {
		r2 := repo(t, map[string]string{"Dockerfile": "FROM scratch\n", "hello.txt": "hello!\n"})
		r3 := repo(t, map[string]string{"Dockerfile": "FROM scratch\n", "hello.txt": "hello\n"})
		_, _, _, d2 := contextOf(t, Request{Root: r2})
		_, _, _, d3 := contextOf(t, Request{Root: r3})
		if d2 == d3 {
			t.Error("different content, same digest")
		}
	})
	t.Run("args change the digest", func(t *testing.T) {
		_, _, _, a := contextOf(t, Request{Root: root, Args: map[string]string{"A": "1"}})
		_, _, _, b := contextOf(t, Request{Root: root, Args: map[string]string{"A": "2"}})
		_, _, _, c := contextOf(t, Request{Root: root, Args: map[string]string{"A": "1", "B": ""}})
		_, _, _, a2 := contextOf(t, Request{Root: root, Args: map[string]string{"A": "1"}})
		if a == b || a == c || a == digest || a != a2 {
			t.Errorf("args digests: %s %s %s %s (none %s)", a, b, c, a2, digest)
		}
	})
	t.Run("sub context", func(t *testing.T) {
		got, _, df, _ := contextOf(t, Request{Root: root, Context: "sub", Dockerfile: "Dockerfile"})
		if df != ReservedDockerfile {
			t.Errorf("dockerfile = %q", df)
		}
		if got[ReservedDockerfile].body != "FROM scratch\n" {
			t.Errorf("reserved dockerfile = %+v", got[ReservedDockerfile])
		}
		if got[".dockerignore"].body != ".dockerignore\n/"+ReservedDockerfile+"\n" {
			t.Errorf(".dockerignore = %q", got[".dockerignore"].body)
		}
		if _, ok := got["deep/x.go"]; !ok {
			t.Errorf("deep/x.go missing: %v", got)
		}
		if _, ok := got["outside-ctx.txt"]; ok {
			t.Error("a file outside the context was sent")
		}
	})
}

func TestContextHostFileNotRead(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte("SENTINEL-HOST-CONTENT"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := repo(t, map[string]string{"Dockerfile": "FROM scratch\n"})
	if err := os.Symlink(secret, filepath.Join(root, "abs")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../../../../"+secret, filepath.Join(root, "rel")); err != nil {
		t.Fatal(err)
	}
	rc, _, _, err := Context(t.Context(), Request{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	raw, _ := io.ReadAll(rc)
	if bytes.Contains(raw, []byte("SENTINEL-HOST-CONTENT")) {
		t.Fatal("the content of a host file a symlink points to was sent")
	}
}

func TestContextIgnore(t *testing.T) {
	root := repo(t, map[string]string{
		"Dockerfile":        "FROM scratch\n",
		".dockerignore":     "secret.txt\nbuild\n*.log\n!keep.log\nDockerfile\n.dockerignore\n",
		"secret.txt":        "s",
		"build/out.bin":     "b",
		"a.log":             "l",
		"keep.log":          "k",
		"src/main.go":       "m",
		"df/Dockerfile.dev": "FROM scratch\n",
	})
	got, _, _, _ := contextOf(t, Request{Root: root})
	for _, p := range []string{"secret.txt", "build/", "build/out.bin", "a.log"} {
		if _, ok := got[p]; ok {
			t.Errorf("%s was sent", p)
		}
	}
	for _, p := range []string{"keep.log", "src/main.go", "Dockerfile", ".dockerignore"} {
		if _, ok := got[p]; !ok {
			t.Errorf("%s was not sent", p)
		}
	}

	t.Run("dockerfile in an ignored directory", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(root, ".dockerignore"), []byte("df\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		got, _, df, _ := contextOf(t, Request{Root: root, Dockerfile: "df/Dockerfile.dev"})
		if df != "df/Dockerfile.dev" || got["df/Dockerfile.dev"].body != "FROM scratch\n" {
			t.Errorf("dockerfile %q not sent: %v", df, got)
		}
		if _, ok := got["df/"]; ok {
			t.Error("the ignored directory itself was sent")
		}
	})
	t.Run("out-of-context dockerfile keeps the user's patterns", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(root, "src", ".dockerignore"), []byte("*.tmp"), 0o644); err != nil {
			t.Fatal(err)
		}
		got, _, _, _ := contextOf(t, Request{Root: root, Context: "src", Dockerfile: "Dockerfile"})
		if b := got[".dockerignore"].body; b != "*.tmp\n/"+ReservedDockerfile+"\n" {
			t.Errorf(".dockerignore = %q", b)
		}
	})
}

func TestContextRefused(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "Dockerfile"), []byte("FROM scratch\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, root string)
		req   Request
		code  fault.Code
		want  string
	}{
		{name: "parent context", req: Request{Context: "../x"}, code: CodeContextInvalid, want: "outside the repository"},
		{name: "parent after clean", req: Request{Context: "a/../../x"}, code: CodeContextInvalid, want: "outside the repository"},
		{name: "absolute context", req: Request{Context: "/etc"}, code: CodeContextInvalid, want: "absolute path"},
		{name: "parent dockerfile", req: Request{Dockerfile: "../Dockerfile"}, code: CodeContextInvalid, want: "outside the repository"},
		{name: "absolute dockerfile", req: Request{Dockerfile: filepath.Join(outside, "Dockerfile")}, code: CodeContextInvalid, want: "absolute path"},
		{name: "relative root", req: Request{Root: "repo"}, code: CodeContextInvalid, want: "not an absolute path"},
		{name: "missing dockerfile", req: Request{Dockerfile: "nope"}, code: CodeContextInvalid, want: "cannot be opened"},
		{name: "missing context", req: Request{Context: "nope"}, code: CodeContextInvalid, want: "cannot be opened"},
		{
			name: "context symlink out of the repository",
			setup: func(t *testing.T, root string) {
				if err := os.Symlink(outside, filepath.Join(root, "ctx")); err != nil {
					t.Fatal(err)
				}
			},
			req: Request{Context: "ctx", Dockerfile: "Dockerfile"}, code: CodeContextInvalid, want: "escapes",
		},
		{
			name: "dockerfile symlink out of the repository",
			setup: func(t *testing.T, root string) {
				if err := os.Symlink(filepath.Join(outside, "Dockerfile"), filepath.Join(root, "Evil")); err != nil {
					t.Fatal(err)
				}
			},
			req: Request{Dockerfile: "Evil"}, code: CodeContextInvalid, want: "escapes",
		},
		{
			name: "fifo",
			setup: func(t *testing.T, root string) {
				if err := syscall.Mkfifo(filepath.Join(root, "pipe"), 0o644); err != nil {
					t.Fatal(err)
				}
			},
			code: CodeContextInvalid, want: "pipe in the build context is a special file (a FIFO)",
		},
		{
			name: "socket",
			setup: func(t *testing.T, root string) {
				l, err := net.Listen("unix", filepath.Join(root, "sock"))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Close() })
			},
			code: CodeContextInvalid, want: "sock in the build context is a special file (a socket)",
		},
		{
			name: "reserved name",
			setup: func(t *testing.T, root string) {
				if err := os.WriteFile(filepath.Join(root, "sub", ReservedDockerfile), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			req: Request{Context: "sub", Dockerfile: "Dockerfile"}, code: CodeContextInvalid, want: "reserves",
		},
		{
			name:  "bad ignore",
			setup: func(t *testing.T, root string) { writeFile(t, root, ".dockerignore", "ok\n[bad\n") },
			code:  CodeContextInvalid, want: ".dockerignore line 2",
		},
		{name: "bad arg name", req: Request{Args: map[string]string{"A=B": "x"}}, code: fault.InvalidArgument, want: "not valid"},
		{name: "nul in arg", req: Request{Args: map[string]string{"A": "x\x00"}}, code: fault.InvalidArgument, want: "NUL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := repo(t, map[string]string{"Dockerfile": "FROM scratch\n", "sub/f": "x"})
			if tt.setup != nil {
				tt.setup(t, root)
			}
			req := tt.req
			if req.Root == "" {
				req.Root = root
			}
			rc, _, _, err := Context(t.Context(), req)
			if err == nil {
				rc.Close()
				t.Fatal("no error")
			}
			if fault.CodeOf(err) != tt.code || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v (code %q), want code %s and %q", err, fault.CodeOf(err), tt.code, tt.want)
			}
		})
	}
}

func writeFile(t *testing.T, root, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestContextLimits(t *testing.T) {
	root := repo(t, map[string]string{"Dockerfile": "FROM scratch\n", "a": "12345", "b": "67890"})
	tests := []struct {
		name string
		lim  limits
		want string
	}{
		{"files", limits{bytes: 1 << 20, files: 2}, "more than 2 entries"},
		{"bytes", limits{bytes: 15, files: 100}, "larger than 15 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, _, err := buildContext(t.Context(), Request{Root: root}, tt.lim)
			if !fault.Is(err, CodeContextInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
	rc, _, _, err := buildContext(t.Context(), Request{Root: root}, limits{bytes: 23, files: 3})
	if err != nil {
		t.Fatalf("at the limits: %v", err)
	}
	rc.Close()
}

func TestContextCancelled(t *testing.T) {
	root := repo(t, map[string]string{"Dockerfile": "FROM scratch\n"})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, _, _, err := Context(ctx, Request{Root: root})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// TestContextDockerfileSymlink: a Dockerfile that is a symlink (inside the repository) is sent by content under
// the reserved name, so the daemon never has to follow it.
func TestContextDockerfileSymlink(t *testing.T) {
	root := repo(t, map[string]string{"docker/Dockerfile": "FROM scratch\nLABEL a=b\n"})
	if err := os.Symlink("docker/Dockerfile", filepath.Join(root, "Dockerfile")); err != nil {
		t.Fatal(err)
	}
	got, _, df, _ := contextOf(t, Request{Root: root})
	if df != ReservedDockerfile || got[ReservedDockerfile].body != "FROM scratch\nLABEL a=b\n" {
		t.Fatalf("dockerfile %q: %+v", df, got[ReservedDockerfile])
	}
	if e := got["Dockerfile"]; e.typ != tar.TypeSymlink {
		t.Errorf("the symlink itself should still be sent as a symlink: %+v", e)
	}
}
