package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// TestSnapshots: `sandkeep snapshot create/list/restore/rm` and the API's snapshot routes (through the Go SDK) on
// the real driver. A restore into a new user after the source is removed holds the source's files as they were;
// names are per tenant (SNAPSHOT_EXISTS, SNAPSHOT_NOT_FOUND); the server's snapshot_quota holds (QUOTA_EXCEEDED); a
// restore onto an existing user is refused unless asked to replace (--replace, the SDK's ReplaceFromSnapshot).
func TestSnapshots(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	ten := c.ten("acme")
	c.run(t, "exec", "--tenant", ten, "--user", "alice", "--", "sh", "-c", "mkdir -p /workspace/d && echo one > /workspace/d/f").want(t, 0)
	r := c.run(t, "snapshot", "create", "--tenant", ten, "--user", "alice", "--name", "base").want(t, 0)
	if strings.TrimSpace(r.stdout) != "base" {
		t.Fatalf("snapshot create printed %q", r.stdout)
	}
	c.run(t, "snapshot", "create", "--tenant", ten, "--user", "alice", "--name", "base").wantFailure(t, "SNAPSHOT_EXISTS")
	c.run(t, "exec", "--tenant", ten, "--user", "alice", "--", "sh", "-c", "echo two > /workspace/d/f").want(t, 0)
	c.run(t, "rm", "--tenant", ten, "--user", "alice").want(t, 0)

	r = c.run(t, "snapshot", "list", "--tenant", ten, "--json").want(t, 0)
	var list []client.Snapshot
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 1 || list[0].Name != "base" || list[0].User != "alice" {
		t.Fatalf("snapshot list: %q, %v", r.stdout, err)
	}
	r = c.run(t, "snapshot", "restore", "base", "--tenant", ten, "--user", "bob").want(t, 0)
	if got, want := strings.TrimSpace(r.stdout), keyOf(t, ten, "bob").ContainerName(); got != want {
		t.Fatalf("restore printed %q, want %q", got, want)
	}
	if r := c.run(t, "exec", "--tenant", ten, "--user", "bob", "--", "cat", "/workspace/d/f").want(t, 0); r.stdout != "one\n" {
		t.Fatalf("the restored file: %q", r.stdout)
	}
	c.run(t, "snapshot", "restore", "base", "--tenant", ten, "--user", "bob").wantFailure(t, "SANDBOX_EXISTS")
	c.run(t, "exec", "--tenant", ten, "--user", "bob", "--", "sh", "-c", "echo bob > /workspace/d/f; touch /workspace/mine").want(t, 0)
	c.run(t, "snapshot", "restore", "base", "--tenant", ten, "--user", "bob", "--replace").want(t, 0)
	if r := c.run(t, "exec", "--tenant", ten, "--user", "bob", "--", "sh", "-c", "cat /workspace/d/f; ls /workspace").want(t, 0); r.stdout != "one\nd\n" {
		t.Fatalf("the workspace replaced by --replace: %q", r.stdout)
	}
	c.run(t, "snapshot", "restore", "nope", "--tenant", ten, "--user", "carol").wantFailure(t, "SNAPSHOT_NOT_FOUND")
	c.run(t, "snapshot", "rm", "base", "--tenant", ten).want(t, 0)
	c.run(t, "snapshot", "rm", "base", "--tenant", ten).wantFailure(t, "SNAPSHOT_NOT_FOUND")

	config := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	if err := os.WriteFile(config, []byte("snapshot_quota:\n  count: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := c.startServer(t, "--config", config)
	cl := s.client(t, c.createToken(t, ten, "sdk", "exec,read").Token)
	sn, err := cl.CreateSnapshot(bounded(t), "bob", "")
	if err != nil || sn.Name == "" || sn.User != "bob" || !strings.HasPrefix(sn.Digest, "sha256:") {
		t.Fatalf("SDK CreateSnapshot: %+v, %v", sn, err)
	}
	_, err = cl.CreateSnapshot(bounded(t), "bob", "second")
	wantAPIError(t, err, http.StatusInsufficientStorage, fault.QuotaExceeded)
	got, err := cl.Snapshots(bounded(t))
	if err != nil || len(got) != 1 || got[0].Name != sn.Name {
		t.Fatalf("SDK Snapshots: %+v, %v", got, err)
	}
	sb, err := cl.RestoreSnapshot(bounded(t), sn.Name, "carol")
	if err != nil || sb.User != "carol" {
		t.Fatalf("SDK RestoreSnapshot: %+v, %v", sb, err)
	}
	res, err := cl.Exec(bounded(t), "carol", client.ExecRequest{Command: "cat /workspace/d/f"})
	if err != nil || res.Stdout != "one\n" {
		t.Fatalf("the SDK restore's file: %+v, %v", res, err)
	}
	_, err = cl.RestoreSnapshot(bounded(t), "nope", "dave")
	wantAPIError(t, err, http.StatusNotFound, fault.SnapshotNotFound)
	// Onto carol, who exists: refused without replace, her workspace replaced whole with it (through the API).
	if _, err := cl.Exec(bounded(t), "carol", client.ExecRequest{Command: "echo carol > /workspace/d/f; touch /workspace/hers"}); err != nil {
		t.Fatal(err)
	}
	_, err = cl.RestoreSnapshot(bounded(t), sn.Name, "carol")
	wantAPIError(t, err, http.StatusConflict, fault.SandboxExists)
	_, err = cl.ReplaceFromSnapshot(bounded(t), "nope", "carol")
	wantAPIError(t, err, http.StatusNotFound, fault.SnapshotNotFound)
	if sb, err = cl.ReplaceFromSnapshot(bounded(t), sn.Name, "carol"); err != nil || sb.User != "carol" || sb.State != "running" {
		t.Fatalf("SDK ReplaceFromSnapshot: %+v, %v", sb, err)
	}
	res, err = cl.Exec(bounded(t), "carol", client.ExecRequest{Command: "cat /workspace/d/f; ls /workspace"})
	if err != nil || res.Stdout != "one\nd\n" {
		t.Fatalf("carol's workspace after the SDK's replace: %+v, %v", res, err)
	}
	if err := cl.DeleteSnapshot(bounded(t), sn.Name); err != nil {
		t.Fatal(err)
	}
	err = cl.DeleteSnapshot(bounded(t), sn.Name)
	wantAPIError(t, err, http.StatusNotFound, fault.SnapshotNotFound)
}
