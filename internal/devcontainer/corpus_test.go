package devcontainer_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/compose"
	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/spec"
	"github.com/sandkeep/sandkeep/internal/tier"
)

// corpusRepo copies the corpus entry dir into a fresh repository with a sandkeep.yaml that names no image (so
// devcontainer.json is fused, as admission does) and returns the repository root.
func corpusRepo(t *testing.T, dir string) string {
	t.Helper()
	repo := t.TempDir()
	if err := os.MkdirAll(filepath.Join(repo, ".devcontainer"), 0o755); err != nil {
		t.Fatal(err)
	}
	files, err := os.ReadDir(filepath.Join(dir, ".devcontainer")) // devcontainer.json, and a compose file for some
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(dir, ".devcontainer", f.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(repo, ".devcontainer", f.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(repo, "sandkeep.yaml"), []byte("sandbox:\n  mode: auto\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return repo
}

// TestCorpus runs every devcontainer.json of testdata/TestCorpus (real files of public repositories, sources
// in SOURCES.md) through Load, Fuse, the repository tier and the spec's validation, as admission does with an
// operator that allows nothing extra. At least 90% must resolve to a runnable spec (a compose-based file through
// internal/compose, when the corpus keeps the compose file it names); none may panic; every dropped item must be reported as a
// SK202 warning with its line, and be named in the fused spec nowhere.
func TestCorpus(t *testing.T) {
	dirs, err := filepath.Glob("testdata/TestCorpus/*")
	if err != nil {
		t.Fatal(err)
	}
	var entries []string
	for _, d := range dirs {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			entries = append(entries, d)
		}
	}
	if len(entries) < 40 {
		t.Fatalf("corpus has %d files, want 40 or more", len(entries))
	}
	resolved, dropped, composed := 0, 0, 0
	var failures []string
	for _, dir := range entries {
		name := filepath.Base(dir)
		t.Run(name, func(t *testing.T) {
			repo := corpusRepo(t, dir)
			f, list := spec.Load(filepath.Join(repo, "sandkeep.yaml"))
			if list.HasErrors() {
				t.Fatal(list)
			}
			op := tier.Operator{}
			dc, dlist, found := devcontainer.Load(repo, op.DevcontainerEnv(func(string) (string, bool) { return "", false }, repo))
			if !found {
				t.Fatal("devcontainer.json not found")
			}
			if dlist.HasErrors() {
				failures = append(failures, name+": "+diag.ListError(dlist).Error())
				return
			}
			// Every drop is reported once, as a SK202 warning at its line.
			var reported []diag.Diagnostic
			for _, d := range dlist {
				if d.Code == diag.DevcontainerDropped {
					reported = append(reported, d)
				}
			}
			if len(reported) != len(dc.Dropped) {
				t.Errorf("%d drops, %d SK202 warnings:\n%v", len(dc.Dropped), len(reported), dlist)
			}
			for i, d := range dc.Dropped {
				if d.Why == "" || d.Line == 0 || i < len(reported) && (reported[i].Line != d.Line || reported[i].Severity != diag.Warning) {
					t.Errorf("drop %+v is not reported at its line: %v", d, reported)
				}
			}
			dropped += len(dc.Dropped)
			sb, _ := devcontainer.Fuse(dc, &f.Sandbox, nil)
			if dc.Compose != nil { // the service's image or build, as admission takes it (takeCompose)
				composed++
				root, err := os.OpenRoot(repo)
				if err != nil {
					t.Fatal(err)
				}
				defer root.Close()
				p, err := compose.Load(context.Background(), root, dc.Compose.Files, dc.Compose.Service, dc.Compose.RunServices)
				if err != nil {
					failures = append(failures, name+": "+err.Error())
					return
				}
				if sb.Image == "" && sb.Build == nil {
					sb.Image, sb.Build = p.Sandbox.Image, p.Sandbox.Build
				}
			}
			if tl := tier.RepositoryFrom(&sb, repo, op, tier.Sources{Spec: f, Devcontainer: dc}); tl.HasErrors() {
				failures = append(failures, name+": "+diag.ListError(tl).Error())
				return
			}
			if vl := sb.Validate(); vl.HasErrors() {
				failures = append(failures, name+": "+diag.ListError(vl).Error())
				return
			}
			for _, m := range sb.Mounts {
				if strings.Contains(m, "docker.sock") {
					t.Errorf("a dropped mount reached the spec: %s", m)
				}
			}
			resolved++
		})
	}
	t.Logf("corpus: %d of %d files resolve to a runnable spec (%d%%); %d of them compose-based; %d items dropped and reported",
		resolved, len(entries), 100*resolved/len(entries), composed, dropped)
	for _, f := range failures {
		t.Logf("not runnable: %s", f)
	}
	if resolved*10 < len(entries)*9 {
		t.Errorf("%d of %d files resolve (%d%%), want at least 90%%", resolved, len(entries), 100*resolved/len(entries))
	}
}

// TestCorpusDrops pins what is dropped for a few well-known files.
func TestCorpusDrops(t *testing.T) {
	tests := []struct {
		name string
		want []string // Field+" "+Item of each drop, in order
	}{
		{"microsoft-vscode", []string{"privileged true"}},
		{"grafana-grafana", []string{"runArgs --cap-add=SYS_PTRACE", "runArgs --security-opt seccomp=unconfined"}},
		{"Azure-azure-sdk-for-python", []string{
			"mounts source=/var/run/docker.sock,target=/var/run/docker-host.sock,type=bind",
			"runArgs --cap-add=SYS_PTRACE", "runArgs --security-opt seccomp=unconfined", "runArgs --privileged"}},
		{"containerd-containerd", []string{"remoteUser root", "runArgs --ipc=host", "runArgs --volume=/dev:/dev", "runArgs --volume=/run/udev:/run/udev", "runArgs --privileged"}},
		{"open-webui-open-webui", []string{"runArgs --network=host"}},
		{"nodejs-node", []string{"initializeCommand "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			repo := corpusRepo(t, filepath.Join("testdata/TestCorpus", tt.name))
			dc, list, _ := devcontainer.Load(repo, devcontainer.Env{WorkspaceFolder: repo})
			if list.HasErrors() {
				t.Fatal(list)
			}
			var got []string
			for _, d := range dc.Dropped {
				got = append(got, d.Field+" "+d.Item)
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("dropped:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}
