package lifecycle

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// TestPostCreate: post_create runs once per new sandbox, before the first command; a failing one fails the run
// with POST_CREATE_FAILED, removes the half-prepared sandbox, and the next run tries again.
func TestPostCreate(t *testing.T) {
	e := newEnv(t)
	m := e.manager(func(c *Config) { c.PostCreate = "echo prepared >> prepared" })
	k := key(t, "acme", "alice")
	var rec recorder
	for range 2 {
		req, _ := sh("cat prepared")
		req.OnEvent = rec.sink
		if _, err := m.Exec(t.Context(), k, req); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(e.home.Workspace(k), "prepared"))
	if err != nil || string(b) != "prepared\n" {
		t.Fatalf("post_create ran %d times (err %v), want once", strings.Count(string(b), "prepared"), err)
	}
	names, _ := rec.take()
	if i := slices.Index(names, events.NameSandboxPostCreate); i < 0 || i > slices.Index(names, events.NameExecStarted) {
		t.Fatalf("events %v: want sandbox_post_create before the first exec_started", names)
	}

	failing := e.manager(func(c *Config) { c.PostCreate = "test -e fixed || exit 3" })
	k2 := key(t, "acme", "bob")
	req, _ := sh("true")
	_, err = failing.Exec(t.Context(), k2, req)
	if fault.CodeOf(err) != fault.PostCreateFailed || !strings.Contains(err.Error(), "exited 3") {
		t.Fatalf("err = %v, want POST_CREATE_FAILED naming the exit status", err)
	}
	e.absent(k2)
	if err := os.WriteFile(filepath.Join(e.home.Workspace(k2), "fixed"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := failing.Exec(t.Context(), k2, req); err != nil {
		t.Fatalf("after the fix, the next run retries post_create: %v", err)
	}
}

// TestSetupTimeout: a setup that stalls past SetupTimeout fails with SANDBOX_SETUP_TIMEOUT, not as a hang or
// an engine error, and the caller's own context is not what ended it.
func TestSetupTimeout(t *testing.T) {
	e := newEnv(t)
	m := e.manager(func(c *Config) { c.PostCreate = "sleep 30"; c.SetupTimeout = 300 * time.Millisecond })
	req, _ := sh("true")
	_, err := m.Exec(t.Context(), key(t, "acme", "slow"), req)
	if fault.CodeOf(err) != fault.SandboxSetupTimeout {
		t.Fatalf("err = %v, want SANDBOX_SETUP_TIMEOUT", err)
	}
}
