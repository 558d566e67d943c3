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

// TestExtraTmpfs: a spec tmpfs is owned by the sandbox user unless it says otherwise, its options are stable
// (they are hashed into the posture), and sandkeep's own targets are refused.
func TestExtraTmpfs(t *testing.T) {
	got := extraTmpfs("size=8m", 1000, 1000)
	if got != "rw,nosuid,nodev,size=8m,mode=0755,uid=1000,gid=1000" {
		t.Fatalf("extraTmpfs = %q", got)
	}
	// Sizes the kernel's tmpfs cannot read (the Kubernetes and docker spellings the spec accepts) reach it in bytes.
	for _, in := range []string{"64MiB", "64Mi", "64mb", "0.0625g"} {
		if got := extraTmpfs("size="+in, 1000, 1000); got != "rw,nosuid,nodev,size=67108864,mode=0755,uid=1000,gid=1000" {
			t.Errorf("extraTmpfs(size=%s) = %q", in, got)
		}
	}
	cfg := Config{Image: "x", AgentPath: "/a", Tmpfs: map[string]string{"/cache": "", "/build": "mode=0700"}}
	cfg.setDefaults()
	a := cfg.posture("/ws", "/vol", "/agent", "", 1000, 1000).Hash()
	for range 20 {
		if b := cfg.posture("/ws", "/vol", "/agent", "", 1000, 1000).Hash(); a != b {
			t.Fatal("the posture hash of the same tmpfs config changed")
		}
	}
	bad := Config{Image: "x", User: "1000:1000", Tmpfs: map[string]string{"/run/secrets": ""}}
	bad.setDefaults()
	if _, _, err := bad.validate(); fault.CodeOf(err) != fault.InvalidMount {
		t.Fatalf("validate = %v, want INVALID_MOUNT", err)
	}
}
