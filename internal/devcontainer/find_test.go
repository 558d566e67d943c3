package devcontainer

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/diag"
)

const goodFile = `{"image": "debian:12"} // the repository's`

// write creates name under dir with content, making its directories.
func write(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestFind(t *testing.T) {
	outside := t.TempDir()
	secret := write(t, outside, "devcontainer.json", `{"image": "`+sentinel+`"}`)
	tests := []struct {
		name  string
		setup func(t *testing.T, root string)
		path  string // relative to root; "" when none is found
		ok    bool
	}{
		{"none", func(t *testing.T, root string) {}, "", false},
		{"in .devcontainer", func(t *testing.T, root string) {
			write(t, root, ".devcontainer/devcontainer.json", goodFile)
			write(t, root, ".devcontainer.json", `{"image": "second"}`)
		}, ".devcontainer/devcontainer.json", true},
		{"at the root", func(t *testing.T, root string) {
			write(t, root, ".devcontainer.json", goodFile)
		}, ".devcontainer.json", true},
		{"empty .devcontainer dir falls back", func(t *testing.T, root string) {
			os.Mkdir(filepath.Join(root, ".devcontainer"), 0o755)
			write(t, root, ".devcontainer.json", goodFile)
		}, ".devcontainer.json", true},
		{".devcontainer is a file", func(t *testing.T, root string) {
			write(t, root, ".devcontainer", "not a directory")
			write(t, root, ".devcontainer.json", goodFile)
		}, ".devcontainer.json", true},
		{"symlink inside the root", func(t *testing.T, root string) {
			write(t, root, "config/dev.json", goodFile)
			symlink(t, "../config/dev.json", filepath.Join(root, ".devcontainer/devcontainer.json"))
		}, ".devcontainer/devcontainer.json", true},
		{"absolute symlink out of the root", func(t *testing.T, root string) {
			symlink(t, secret, filepath.Join(root, ".devcontainer/devcontainer.json"))
			write(t, root, ".devcontainer.json", goodFile) // not a fallback: the planted link is refused, not skipped
		}, ".devcontainer/devcontainer.json", false},
		{"relative symlink out of the root", func(t *testing.T, root string) {
			rel, err := filepath.Rel(filepath.Join(root, ".devcontainer"), secret)
			if err != nil {
				t.Fatal(err)
			}
			symlink(t, rel, filepath.Join(root, ".devcontainer/devcontainer.json"))
		}, ".devcontainer/devcontainer.json", false},
		{"directory symlinked out of the root", func(t *testing.T, root string) {
			symlink(t, outside, filepath.Join(root, ".devcontainer"))
		}, ".devcontainer/devcontainer.json", false},
		{"root file symlinked out", func(t *testing.T, root string) {
			symlink(t, secret, filepath.Join(root, ".devcontainer.json"))
		}, ".devcontainer.json", false},
		{"dangling symlink", func(t *testing.T, root string) {
			symlink(t, "nowhere.json", filepath.Join(root, ".devcontainer.json"))
		}, ".devcontainer.json", false},
		{"a directory", func(t *testing.T, root string) {
			os.MkdirAll(filepath.Join(root, ".devcontainer/devcontainer.json"), 0o755)
		}, ".devcontainer/devcontainer.json", false},
		{"a FIFO does not block", func(t *testing.T, root string) {
			os.Mkdir(filepath.Join(root, ".devcontainer"), 0o755)
			if err := syscall.Mkfifo(filepath.Join(root, ".devcontainer/devcontainer.json"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, ".devcontainer/devcontainer.json", false},
		{"too large", func(t *testing.T, root string) {
			write(t, root, ".devcontainer.json", `{"image": "x", "pad": "`+strings.Repeat(" ", MaxSize)+`"}`)
		}, ".devcontainer.json", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			tt.setup(t, root)
			done := make(chan struct{})
			var path string
			var ok bool
			go func() {
				defer close(done)
				path, ok = Find(root)
			}()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Find blocked")
			}
			want := ""
			if tt.path != "" {
				want = filepath.Join(root, tt.path)
			}
			if path != want || ok != tt.ok {
				t.Fatalf("Find = %q, %v; want %q, %v", path, ok, want, tt.ok)
			}

			cfg, list, found := Load(root, Env{})
			if found != (tt.path != "") {
				t.Fatalf("Load found = %v", found)
			}
			switch {
			case !found:
				if cfg != nil || list != nil {
					t.Errorf("Load = %+v, %v for no file", cfg, list)
				}
			case tt.ok:
				if cfg == nil || cfg.Image != "debian:12" || cfg.Path != want || len(list) != 0 {
					t.Errorf("Load = %+v, %v", cfg, list)
				}
			default:
				if cfg != nil || len(list) != 1 || list[0].Code != diag.DevcontainerUnreadable || list[0].Hint == "" {
					t.Errorf("Load = %+v, %v; want one SK215", cfg, list)
				}
				if strings.Contains(list.Err().Error(), sentinel) {
					t.Errorf("the file outside the root was read: %v", list)
				}
			}
		})
	}
}

func TestLoadRootMissing(t *testing.T) {
	path, ok := Find(filepath.Join(t.TempDir(), "gone"))
	if path != "" || ok {
		t.Errorf("Find = %q, %v", path, ok)
	}
	cfg, list, found := Load(filepath.Join(t.TempDir(), "gone"), Env{})
	if cfg != nil || !found || !list.HasErrors() || list[0].Code != diag.DevcontainerUnreadable {
		t.Errorf("Load = %+v, %v, %v; want a SK215 error", cfg, list, found)
	}
}
