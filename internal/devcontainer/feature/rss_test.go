package feature

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// rssChildEnv names the repository a child process of TestResolveRSS resolves.
const rssChildEnv = "SANDKEEP_TEST_RESOLVE_RSS_REPO"

// TestResolveRSS: resolving two local features of 100 MiB (sparse) files raises a process's peak RSS by far less
// than their size, measured by the kernel (getrusage's ru_maxrss of a child process that does only that). Issue
// 22 (finding 7) found 32 such features taking `sandkeep exec` to 1.8 GB of RSS: the old code read every file
// into memory, which makes the peak at least 200 MiB here. It runs in -short too (tier 1): this package's tests use no engine,
// so CI runs them only there.
func TestResolveRSS(t *testing.T) {
	if repo := os.Getenv(rssChildEnv); repo != "" {
		resolveForRSS(t, repo)
		return
	}
	repo := t.TempDir()
	for _, name := range []string{"a", "b"} {
		dir := filepath.Join(repo, ".devcontainer", name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, MetadataFile), []byte(`{"id": "`+name+`", "version": "1.0.0"}`), 0o644)
		os.WriteFile(filepath.Join(dir, InstallScript), []byte("#!/bin/sh\n"), 0o755)
		f, err := os.Create(filepath.Join(dir, "blob"))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(100 << 20); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestResolveRSS$", "-test.v")
	cmd.Env = append(os.Environ(), rssChildEnv+"="+repo, "TMPDIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the resolving child: %v\n%s", err, out)
	}
	peak := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10 // KiB on Linux
	t.Logf("peak RSS of a process resolving 200 MiB of feature files: %d MiB", peak>>20)
	if peak > 120<<20 {
		t.Errorf("resolving 200 MiB of feature files took the process to %d MiB of RSS\n%s", peak>>20, out)
	}
}

// resolveForRSS is the child's part: resolve ./a and ./b of repo, spooled to a temporary directory.
func resolveForRSS(t *testing.T, repo string) {
	root, err := os.OpenRoot(repo)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	fs, err := Resolve(t.Context(), Source{Repo: root, DcDir: ".devcontainer", Spool: &Spool{Dir: t.TempDir()}},
		[]Requested{{ID: "./a"}, {ID: "./b"}})
	if err != nil || len(fs) != 2 {
		t.Fatalf("Resolve: %d features, %v", len(fs), err)
	}
}
