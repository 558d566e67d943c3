package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExecHostState: `sandkeep exec --host-state auto` binds the operator's (this process's $HOME) git identity
// and Go module cache under a HOME at the same path; --host-state none passes the identity as GIT_* variables;
// a repository's host_state stays TIER_REFUSED (TestSpecPolicy); a bad value is refused before anything runs.
func TestExecHostState(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	home := filepath.Join(t.TempDir(), "home", "dev")
	email := "cli-" + c.suffix + "@example.test"
	if err := os.MkdirAll(filepath.Join(home, "go", "pkg", "mod", "cache"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(home, "go", "pkg", "mod", "cache", "marker-"+c.suffix), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(home, ".gitconfig"), []byte("[user]\n\tname = Cli Dev\n\temail = "+email+"\n"), 0o644)
	env := []string{"HOME=" + home}
	ten := c.ten("acme")
	r := c.runWith(t, nil, env, "exec", "--host-state", "auto", "--tenant", ten, "--user", "hs", "--",
		"sh", "-c", `echo "$HOME"; grep -c "`+email+`" "$HOME/.gitconfig"; ls "$HOME/go/pkg/mod/cache"`).want(t, 0)
	if want := home + "\n1\nmarker-" + c.suffix + "\n"; r.stdout != want {
		t.Errorf("--host-state auto: %q, want %q", r.stdout, want)
	}
	_, evs := c.lastRun(t)
	if !strings.Contains(strings.Join(names(evs), " "), "sandbox_host_state_mounted") {
		t.Errorf("events: %v", names(evs))
	}
	r = c.runWith(t, nil, env, "exec", "--host-state", "none", "--tenant", ten, "--user", "hs", "--",
		"sh", "-c", `echo "$GIT_AUTHOR_EMAIL $GIT_COMMITTER_NAME"`).want(t, 0)
	if r.stdout != email+" Cli Dev\n" {
		t.Errorf("--host-state none: %q", r.stdout)
	}
	c.runWith(t, nil, env, "exec", "--host-state", "some", "--tenant", ten, "--user", "hs", "--", "true").wantFailure(t, "INVALID_ARGUMENT")
}
