package sandkeep_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// operatorHome makes an operator's home with a git identity and a Go module cache (npm's cache missing) and
// returns it with the identity's email.
func operatorHome(t *testing.T) (home, email string) {
	t.Helper()
	home = filepath.Join(t.TempDir(), "home", "dev")
	email = "dev-" + filepath.Base(filepath.Dir(filepath.Dir(home))) + "@example.test"
	if err := os.MkdirAll(filepath.Join(home, "go", "pkg", "mod", "cache"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(home, "go", "pkg", "mod", "cache", "operator-module-marker"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(home, ".gitconfig"), []byte("[user]\n\tname = Dev Eloper\n\temail = "+email+"\n"), 0o644)
	return home, email
}

// TestHostState: host_state auto gives a command the operator's git identity and Go module cache (git config
// user.email and go env GOMODCACHE read from inside, with the host's own git and go binaries bound in for the
// test), under a tmpfs HOME at the operator's home path owned by the sandbox's user; sandbox_host_state_mounted
// lists what was bound (the identity read-only) and skipped (npm's cache: missing). host_state none gives the four
// GIT_* variables and binds nothing. On kubernetes auto is refused (no host file system).
func TestHostState(t *testing.T) {
	t.Parallel()
	home, email := operatorHome(t)
	cfg := baseConfig(t)
	cfg.HostStateHome = home
	cfg = withStore(t, cfg, filepath.Join(t.TempDir(), "runs.db"))
	if !onKube {
		// The test's tools: the host's static go, and its git through the host's loader and libraries.
		cfg.Mounts = append(cfg.Mounts, "type=bind,source="+runtime.GOROOT()+",target=/opt/go,readonly",
			"type=bind,source=/usr/lib/x86_64-linux-gnu,target=/opt/hostlib,readonly",
			"type=bind,source=/usr/bin/git,target=/opt/git,readonly")
	}
	m, err := sandkeep.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !onKube {
		testutil.Cleanup(t, m.Installation())
	}
	key := sandkeep.Key{Tenant: "acme", User: "hoststate"}
	if onKube {
		_, err := m.Admit(t.Context(), sandkeep.RunRequest{Key: key, HostState: "auto"})
		if sandkeep.CodeOf(err) != "SPEC_UNSUPPORTED" {
			t.Fatalf("host_state auto on kubernetes: %v, want SPEC_UNSUPPORTED", err)
		}
		return
	}
	git := "/opt/hostlib/ld-linux-x86-64.so.2 --library-path /opt/hostlib /opt/git"
	run, err := m.Admit(t.Context(), sandkeep.RunRequest{Key: key, HostState: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := run.Exec(t.Context(), sandkeep.ExecRequest{Argv: []string{"sh", "-c",
		`echo "$HOME"; ` + git + ` config user.email; /opt/go/bin/go env GOMODCACHE; ls "$(/opt/go/bin/go env GOMODCACHE)/cache"; stat -c %u "$HOME"; id -u; touch "$HOME/scratch" && echo home-writable`}})
	run.Finish(err)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
	want := []string{home, email, filepath.Join(home, "go", "pkg", "mod"), "operator-module-marker"}
	if len(lines) != 7 || lines[0] != want[0] || lines[1] != want[1] || lines[2] != want[2] || lines[3] != want[3] || lines[4] != lines[5] || lines[6] != "home-writable" {
		t.Fatalf("inside the sandbox: %q (stderr %q); want HOME, email, GOMODCACHE, the marker, HOME owned by the sandbox user", lines, res.Stderr)
	}
	t.Logf("host_state auto, inside: %q", lines)
	evs, _ := cfg.Store.ListEvents(t.Context(), store.EventFilter{RunID: run.ID})
	hs := decodeOne[events.HostStateMounted](t, evs, events.NameHostStateMounted)
	bound := map[string]bool{}
	for _, b := range hs.Bound {
		bound[b.Path] = b.ReadOnly
	}
	skipped := map[string]string{}
	for _, s := range hs.Skipped {
		skipped[s.Path] = s.Why
	}
	if hs.Mode != "auto" || hs.Home != home || bound[filepath.Join(home, ".gitconfig")] != true ||
		!hasKey(bound, filepath.Join(home, "go", "pkg", "mod")) || bound[filepath.Join(home, "go", "pkg", "mod")] ||
		skipped[filepath.Join(home, ".npm")] != "missing on the host" {
		t.Errorf("sandbox_host_state_mounted = %+v", hs)
	}

	// none: the identity as variables, nothing bound, HOME is the sandbox's own.
	run, err = m.Admit(t.Context(), sandkeep.RunRequest{Key: key, HostState: "none"})
	if err != nil {
		t.Fatal(err)
	}
	res, err = run.Exec(t.Context(), sandkeep.ExecRequest{Argv: []string{"sh", "-c",
		`echo "$GIT_AUTHOR_NAME|$GIT_AUTHOR_EMAIL|$GIT_COMMITTER_NAME|$GIT_COMMITTER_EMAIL"; test -e "` + home + `" && echo bound || echo not-bound`}})
	run.Finish(err)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(res.Stdout)); got != "Dev Eloper|"+email+"|Dev Eloper|"+email+"\nnot-bound" {
		t.Errorf("host_state none: %q", got)
	}
}

func hasKey[V any](m map[string]V, k string) bool { _, ok := m[k]; return ok }
