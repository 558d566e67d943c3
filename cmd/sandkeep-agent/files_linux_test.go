package main

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/spec"
)

const fileContent = "s3cr3t-file-content"

// TestPutFile runs put-file under a temporary root (the package variable tests may set; see
// TestFileBuiltinsIgnoreOverridesInProduction for the shipped binary).
func TestPutFile(t *testing.T) {
	type world struct {
		root, outside string // the secrets root, and a directory beside it standing for /workspace
	}
	tests := []struct {
		name    string
		setup   func(t *testing.T, w world)
		path    string // relative to root, or absolute when it starts with "/"
		mode    string
		content string
		wantErr string // substring of the error; "" for success
		check   func(t *testing.T, w world)
	}{
		{name: "new file 0400", path: "token", mode: "0400"},
		{name: "new file, mode not masked by the umask", path: "token", mode: "0660"},
		{name: "empty content", path: "token", mode: "0400", content: "-"},
		{name: "nested path creates 0700 directories", path: "npm/rc", mode: "0440", check: func(t *testing.T, w world) {
			assertMode(t, filepath.Join(w.root, "npm"), fs.ModeDir|0o700)
		}},
		{name: "existing file replaced", path: "token", mode: "0400",
			setup: func(t *testing.T, w world) { write(t, filepath.Join(w.root, "token"), "old", 0o644) },
			check: func(t *testing.T, w world) { assertOnly(t, w.root, "token") }},
		{name: "existing read-only file replaced", path: "token", mode: "0600",
			setup: func(t *testing.T, w world) { write(t, filepath.Join(w.root, "token"), "old", 0o400) },
			check: func(t *testing.T, w world) { assertOnly(t, w.root, "token") }},
		{name: "symlink at the path is replaced, its target untouched", path: "token", mode: "0400",
			setup: func(t *testing.T, w world) {
				write(t, filepath.Join(w.outside, "leak"), "untouched", 0o644)
				symlink(t, filepath.Join(w.outside, "leak"), filepath.Join(w.root, "token"))
			},
			check: func(t *testing.T, w world) {
				assertContent(t, filepath.Join(w.outside, "leak"), "untouched")
				assertOnly(t, w.root, "token")
			}},
		{name: "dangling symlink at the path is replaced, nothing created at its target", path: "token", mode: "0400",
			setup: func(t *testing.T, w world) {
				symlink(t, filepath.Join(w.outside, "leak"), filepath.Join(w.root, "token"))
			},
			check: func(t *testing.T, w world) { assertAbsent(t, filepath.Join(w.outside, "leak")) }},
		{name: "symlinked parent refused", path: "dir/token", mode: "0400", wantErr: "symlink",
			setup: func(t *testing.T, w world) { symlink(t, w.outside, filepath.Join(w.root, "dir")) },
			check: func(t *testing.T, w world) { assertAbsent(t, filepath.Join(w.outside, "token")) }},
		{name: "parent that is a file refused", path: "dir/token", mode: "0400", wantErr: "not a directory",
			setup: func(t *testing.T, w world) { write(t, filepath.Join(w.root, "dir"), "x", 0o600) }},
		{name: "outside the root refused", path: "/etc/sandkeep-token", mode: "0400", wantErr: "not under"},
		{name: "the root itself refused", path: "", mode: "0400", wantErr: "not under"},
		{name: "dot-dot refused", path: "../escape", mode: "0400", wantErr: "not a clean absolute path",
			check: func(t *testing.T, w world) { assertAbsent(t, filepath.Join(filepath.Dir(w.root), "escape")) }},
		{name: "dot-dot inside refused", path: "a/../token", mode: "0400", wantErr: "not a clean absolute path"},
		{name: "trailing slash refused", path: "token/", mode: "0400", wantErr: "not a clean absolute path"},
		{name: "relative path refused", path: "/token", mode: "0400", wantErr: "not a clean absolute path"},
		{name: "mode without leading zero refused", path: "token", mode: "400", wantErr: "leading zero"},
		{name: "mode over 0777 refused", path: "token", mode: "04755", wantErr: "over 0777"},
		{name: "mode not octal refused", path: "token", mode: "0800", wantErr: "leading zero"},
		{name: "unreadable mode refused", path: "token", mode: "0200", wantErr: "owner read"},
		{name: "content over 1 MiB refused", path: "token", mode: "0400", content: strings.Repeat("x", maxFileBytes+1),
			wantErr: "over 1048576 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			w := world{root: filepath.Join(base, "secrets"), outside: filepath.Join(base, "workspace")}
			for _, d := range []string{w.root, w.outside} {
				if err := os.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			if tt.setup != nil {
				tt.setup(t, w)
			}
			p := tt.path
			switch {
			case p == "/token":
				p = "token" // relative
			case p == "":
				p = w.root
			case !strings.HasPrefix(p, "/"):
				p = w.root + "/" + p
			}
			content := fileContent
			switch tt.content {
			case "":
			case "-":
				content = ""
			default:
				content = tt.content
			}
			err := putFile(w.root, []string{p, tt.mode}, strings.NewReader(content))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("putFile(%q, %s) = %v, want an error with %q", p, tt.mode, err, tt.wantErr)
				}
				if strings.Contains(err.Error(), fileContent) {
					t.Errorf("error %q quotes the content", err)
				}
				assertOnlyTree(t, w.root) // the content was written nowhere
			} else {
				if err != nil {
					t.Fatalf("putFile(%q, %s): %v", p, tt.mode, err)
				}
				assertContent(t, p, content)
				want, _ := parseFileMode(tt.mode)
				assertMode(t, p, fs.FileMode(want))
			}
			if tt.check != nil {
				tt.check(t, w)
			}
		})
	}
}

func TestPutFileArgs(t *testing.T) {
	root := t.TempDir()
	for _, args := range [][]string{nil, {root + "/a"}, {root + "/a", "0400", "extra"}} {
		if err := putFile(root, args, strings.NewReader("x")); err == nil || !strings.Contains(err.Error(), "usage") {
			t.Errorf("putFile(%q) = %v, want a usage error", args, err)
		}
	}
}

func TestRmFile(t *testing.T) {
	base := t.TempDir()
	root, outside := filepath.Join(base, "secrets"), filepath.Join(base, "workspace")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"a", "npm/rc", "keep/one", "keep/two"} {
		if err := putFile(root, []string{root + "/" + p, "0400"}, strings.NewReader(fileContent)); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(outside, "victim"), "untouched", 0o600)
	symlink(t, outside, filepath.Join(root, "link"))

	// Missing files and missing directories are fine; the emptied npm/ goes, keep/ stays for keep/two.
	err := rmFiles(root, []string{root + "/a", root + "/npm/rc", root + "/keep/one", root + "/missing", root + "/gone/x"})
	if err != nil {
		t.Fatalf("rmFiles: %v", err)
	}
	assertAbsent(t, filepath.Join(root, "a"))
	assertAbsent(t, filepath.Join(root, "npm"))
	assertAbsent(t, filepath.Join(root, "keep", "one"))
	assertContent(t, filepath.Join(root, "keep", "two"), fileContent)

	// A symlinked parent is not followed (nothing of ours can be behind it): nothing outside the root is removed.
	// A root that is a symlink, or missing, is an error.
	if err := rmFiles(root, []string{root + "/link/victim", root + "/keep/two", root + "/a/x"}); err != nil {
		t.Fatalf("rmFiles through a symlinked parent: %v", err)
	}
	assertContent(t, filepath.Join(outside, "victim"), "untouched")
	assertAbsent(t, filepath.Join(root, "keep"))

	// A symlink named as the path is removed itself; its target stays.
	if err := rmFiles(root, []string{root + "/link"}); err != nil {
		t.Fatal(err)
	}
	assertContent(t, filepath.Join(outside, "victim"), "untouched")
	assertOnlyTree(t, root)

	for _, bad := range []string{filepath.Join(outside, "victim"), root + "/../workspace/victim", root, "victim"} {
		if err := rmFiles(root, []string{bad}); err == nil {
			t.Errorf("rmFiles(%q) succeeded, want refused", bad)
		}
	}
	assertContent(t, filepath.Join(outside, "victim"), "untouched")
	rootLink := filepath.Join(base, "rootlink")
	symlink(t, outside, rootLink)
	if err := rmFiles(rootLink, []string{rootLink + "/victim"}); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("rmFiles under a symlinked root = %v, want refused", err)
	}
	if err := rmFiles(filepath.Join(base, "nowhere"), []string{filepath.Join(base, "nowhere", "x")}); err == nil {
		t.Error("rmFiles under a missing root succeeded, want an error (the tmpfs is not there)")
	}
	assertContent(t, filepath.Join(outside, "victim"), "untouched")
	if err := rmFiles(root, nil); err == nil {
		t.Error("rmFiles() with no path succeeded, want a usage error")
	}
}

// TestFileBuiltinsIgnoreOverridesInProduction runs the shipped binary: it works under /run/secrets only, whatever
// its environment says, exits 1 with one line on stderr, and never echoes the content.
func TestFileBuiltinsIgnoreOverridesInProduction(t *testing.T) {
	if secretsDir != spec.SecretsDir {
		t.Fatalf("agent secretsDir %q != spec.SecretsDir %q", secretsDir, spec.SecretsDir)
	}
	dir := t.TempDir()
	target := filepath.Join(dir, "token")
	env := append(os.Environ(), "SANDKEEP_SECRETS_ROOT="+dir, "SANDKEEP_AGENT_SECRETS_ROOT="+dir, "SECRETS_ROOT="+dir)
	for _, args := range [][]string{
		{"put-file", target, "0400"},
		{"put-file", "/run/secrets/../.." + target, "0400"},
		{"rm-file", target},
	} {
		if args[0] == "rm-file" {
			write(t, target, "keep", 0o600)
		}
		cmd := exec.Command(agentBin, args...)
		cmd.Env = env
		cmd.Stdin = strings.NewReader(fileContent)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if code := cmd.ProcessState.ExitCode(); code != 1 {
			t.Errorf("%q: exit %d (%v), want 1", args, code, err)
		}
		msg := stderr.String()
		if strings.Count(msg, "\n") != 1 || !strings.HasSuffix(msg, "\n") || !strings.Contains(msg, "not under /run/secrets") &&
			!strings.Contains(msg, "not a clean") {
			t.Errorf("%q: stderr %q, want one line saying the path is refused", args, msg)
		}
		if strings.Contains(msg+stdout.String(), fileContent) {
			t.Errorf("%q: output echoes the content", args)
		}
		if args[0] == "rm-file" {
			assertContent(t, target, "keep")
		} else {
			assertAbsent(t, target)
		}
	}
}

func write(t *testing.T, p, content string, mode fs.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func assertContent(t *testing.T, p, want string) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() {
		t.Fatalf("%s is %v, want a regular file", p, fi.Mode())
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s holds %q, want %q", p, got, want)
	}
}

func assertMode(t *testing.T, p string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (fs.ModeType | fs.ModePerm); got != want {
		t.Errorf("%s has mode %v, want %v", p, got, want)
	}
}

func assertAbsent(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !os.IsNotExist(err) {
		t.Errorf("%s exists (%v), want absent", p, err)
	}
}

// assertOnly checks that dir holds exactly the named entries (no temporary file left behind).
func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Errorf("%s holds %q, want %q", dir, got, names)
	}
}

// assertOnlyTree checks that no regular file under dir holds the test content.
func assertOnlyTree(t *testing.T, dir string) {
	t.Helper()
	_ = filepath.WalkDir(filepath.Dir(dir), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(fileContent)) {
				t.Errorf("%s holds the content", p)
			}
		}
		return nil
	})
}
