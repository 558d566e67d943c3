package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// TestFork: `sandkeep fork` and the API's fork (through the Go SDK) on the real driver. The new user's sandbox
// holds the source's files, later changes stay apart, a target that exists is SANDBOX_EXISTS, and the API counts
// a fork against the tenant's max_sandboxes: one past it is QUOTA_EXCEEDED and makes nothing.
func TestFork(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	ten := c.ten("acme")
	c.run(t, "exec", "--tenant", ten, "--user", "alice", "--", "sh", "-c", "echo one > /workspace/f").want(t, 0)

	r := c.run(t, "fork", "--tenant", ten, "--user", "alice", "--to", "bob").want(t, 0)
	if got, want := strings.TrimSpace(r.stdout), keyOf(t, ten, "bob").ContainerName(); got != want {
		t.Fatalf("fork printed %q, want %q", got, want)
	}
	c.run(t, "exec", "--tenant", ten, "--user", "bob", "--", "sh", "-c", "cat /workspace/f; echo two > /workspace/f").want(t, 0)
	if r := c.run(t, "exec", "--tenant", ten, "--user", "alice", "--", "cat", "/workspace/f").want(t, 0); r.stdout != "one\n" {
		t.Fatalf("the source after a change in the copy: %q", r.stdout)
	}
	c.run(t, "fork", "--tenant", ten, "--user", "alice", "--to", "bob").wantFailure(t, "SANDBOX_EXISTS")
	c.run(t, "fork", "--tenant", ten, "--user", "alice").wantFailure(t, "INVALID_ARGUMENT")
	c.run(t, "fork", "--tenant", ten, "--user", "nobody", "--to", "carol").wantFailure(t, "SANDBOX_NOT_FOUND")

	config := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	if err := os.WriteFile(config, []byte("tenants:\n  "+ten+":\n    max_sandboxes: 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := c.startServer(t, "--config", config)
	cl := s.client(t, c.createToken(t, ten, "sdk", "exec").Token)
	_, err := cl.Fork(bounded(t), "nobody", "erin")
	wantAPIError(t, err, http.StatusNotFound, fault.NotFound)
	sb, err := cl.Fork(bounded(t), "bob", "carol")
	if err != nil || sb.User != "carol" || sb.State != "running" {
		t.Fatalf("SDK fork: %+v, %v", sb, err)
	}
	res, err := cl.Exec(bounded(t), "carol", client.ExecRequest{Command: "cat /workspace/f"})
	if err != nil || res.Stdout != "two\n" {
		t.Fatalf("the SDK fork's copy: %+v, %v", res, err)
	}
	_, err = cl.Fork(bounded(t), "bob", "dave") // alice, bob and carol: the tenant's three
	wantAPIError(t, err, http.StatusInsufficientStorage, fault.QuotaExceeded)
	if _, err := cl.Sandbox(bounded(t), "dave"); err == nil {
		t.Fatal("a fork past max_sandboxes made a sandbox")
	}
	_, err = cl.Fork(bounded(t), "carol", "bob")
	wantAPIError(t, err, http.StatusConflict, fault.SandboxExists)
}
