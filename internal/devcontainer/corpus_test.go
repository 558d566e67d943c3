package devcontainer_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/spec"
	"github.com/sandkeep/sandkeep/internal/tier"
)

// corpusRepo copies the corpus entry dir into a fresh repository with a sandkeep.yaml that names no image (so
// devcontainer.json is fused, as admission does) and returns the repository root.
func corpusRepo(t *testing.T, dir string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, ".devcontainer", "devcontainer.json"))
	if err != nil {
		t.Fatal(err)
	}
	repo := t.TempDir()
	if err := os.MkdirAll(filepath.Join(repo, ".devcontainer"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, ".devcontainer", "devcontainer.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "sandkeep.yaml"), []byte("sandbox:\n  mode: auto\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return repo
}

// TestCorpus runs every devcontainer.json of testdata/TestCorpus (real files of public repositories, sources
// in SOURCES.md) through Load, Fuse, the repository tier and the spec's validation, as admission does with an
// operator that allows nothing extra. At least 90% must resolve to a runnable spec (the corpus keeps only each
// repository's devcontainer.json, not the compose files a compose-based one names, so those are resolved by
// internal/compose and tested end to end by TestComposeCompanion: the bar is held on the others); none may panic; every dropped item must be reported as a
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
	resolved, dropped, compose := 0, 0, 0
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
			if tl := tier.RepositoryFrom(&sb, repo, op, tier.Sources{Spec: f, Devcontainer: dc}); tl.HasErrors() {
				failures = append(failures, name+": "+diag.ListError(tl).Error())
				return
			}
			if vl := sb.Validate(); vl.HasErrors() {
				failures = append(failures, name+": "+diag.ListError(vl).Error())
				return
			}
			if dc.Compose != nil {
				compose++
				failures = append(failures, name+": compose-based (its compose files are not in the corpus)")
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
		resolved, len(entries), 100*resolved/len(entries), compose, dropped)
	for _, f := range failures {
		t.Logf("not runnable: %s", f)
	}
	// The compose-based files need the compose files they name, which the corpus does not keep: the bar is held
	// on the others here.
	if single := len(entries) - compose; resolved*10 < single*9 {
		t.Errorf("%d of %d single-container files resolve (%d%%), want at least 90%%", resolved, single, 100*resolved/single)
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
