package main

import (
	"github.com/sandkeep/sandkeep/internal/testutil"

	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDoctorCorpus runs `sandkeep doctor --strict --json` on every devcontainer.json of the corpus of real
// files (internal/devcontainer/testdata/TestCorpus, sources in its SOURCES.md), each in a repository of its
// own beside a sandkeep.yaml that names no image. A file resolves when nothing fails but, offline, the image's
// presence (its registry is unreachable here); drops are warnings and never fail --strict. At least 90% of the
// files must resolve (a compose-based one with its compose file, where the corpus keeps it), none may crash
// doctor, and a file that drops something must show it in the "devcontainer drops" check.
func TestDoctorCorpus(t *testing.T) {
	c := newCLI(t)
	dirs, err := filepath.Glob("../../internal/devcontainer/testdata/TestCorpus/*/.devcontainer/devcontainer.json")
	if err != nil || len(dirs) < 40 {
		t.Fatalf("corpus: %d files, %v", len(dirs), err)
	}
	resolved, compose, withDrops := 0, 0, 0
	for _, file := range dirs {
		name := filepath.Base(filepath.Dir(filepath.Dir(file)))
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		repo := t.TempDir()
		os.MkdirAll(filepath.Join(repo, ".devcontainer"), 0o755)
		kept, _ := os.ReadDir(filepath.Dir(file)) // devcontainer.json, and the compose file of some
		for _, k := range kept {
			b, err := os.ReadFile(filepath.Join(filepath.Dir(file), k.Name()))
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(repo, ".devcontainer", k.Name()), b, 0o644)
		}
		spec := filepath.Join(repo, "sandkeep.yaml")
		os.WriteFile(spec, []byte("sandbox:\n  mode: auto\n"), 0o644)
		r := c.run(t, "doctor", "--strict", "--json", "--spec", spec)
		if r.code != 0 && r.code != 1 {
			t.Errorf("%s: doctor exited %d: %s", name, r.code, r.stderr)
			continue
		}
		var doc struct {
			Checks []struct{ Name, Status, Detail string }
		}
		if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
			t.Errorf("%s: doctor --json: %v\n%s", name, err, r.stdout)
			continue
		}
		var failed []string
		for _, ch := range doc.Checks {
			switch {
			case ch.Name == "devcontainer drops" && ch.Status == "warn":
				withDrops++
			case ch.Status == "fail" && ch.Name == "image present without pulling":
			case ch.Status == "fail" || ch.Status == "skip":
				failed = append(failed, ch.Name+": "+ch.Detail)
			}
		}
		if len(failed) > 0 {
			if strings.Contains(string(data), "dockerComposeFile") {
				compose++
			}
			t.Logf("not runnable: %s: %s", name, strings.Join(failed, "; "))
			continue
		}
		resolved++
	}
	t.Logf("doctor --strict: %d of %d files resolve (%d compose-based ones do not); %d show dropped items", resolved, len(dirs), compose, withDrops)
	if resolved*10 < len(dirs)*9 {
		t.Errorf("%d of %d files pass doctor --strict, want at least 90%%", resolved, len(dirs))
	}
	if withDrops < 10 {
		t.Errorf("only %d files show dropped items; the corpus has more", withDrops)
	}
}

// TestExecPrintsDrops: `sandkeep exec` on a repository whose devcontainer.json asks for --privileged and a
// capability runs the command hardened and prints one line naming what was dropped.
func TestExecPrintsDrops(t *testing.T) {
	c := newCLI(t)
	repo := t.TempDir()
	os.MkdirAll(filepath.Join(repo, ".devcontainer"), 0o755)
	os.WriteFile(filepath.Join(repo, ".devcontainer", "devcontainer.json"), []byte(`{"image": "`+testutil.TestImage(t)+`",
		"runArgs": ["--privileged", "--cap-add=SYS_PTRACE"]}`), 0o644)
	spec := filepath.Join(repo, "sandkeep.yaml")
	os.WriteFile(spec, []byte("sandbox:\n  mode: inline\n"), 0o644)
	r := c.run(t, "exec", "--spec", spec, "--tenant", c.ten("acme"), "--user", "drops", "--", "grep", "CapEff", "/proc/self/status").want(t, 0)
	if !strings.Contains(r.stdout, "CapEff:\t0000000000000000") {
		t.Errorf("stdout = %q, want CapEff 0", r.stdout)
	}
	var lines []string
	for _, l := range strings.Split(r.stderr, "\n") {
		if strings.Contains(l, "dropped") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "--privileged") || !strings.Contains(lines[0], "--cap-add=SYS_PTRACE") {
		t.Errorf("stderr has %d dropped lines, want one naming both:\n%s", len(lines), r.stderr)
	}
}
