package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// psRow mirrors one element of `ps --json`.
type psRow struct {
	Tenant    string    `json:"tenant"`
	User      string    `json:"user"`
	Key       string    `json:"key"`
	Name      string    `json:"name"`
	ID        string    `json:"id"`
	State     string    `json:"state"`
	Image     string    `json:"image"`
	CreatedAt time.Time `json:"created_at"`
	LastUsed  time.Time `json:"last_used"`
	IdleFor   string    `json:"idle_for"`
}

func (c *cli) ps(t *testing.T) []psRow {
	t.Helper()
	r := c.run(t, "ps", "--json").want(t, 0)
	var rows []psRow
	decodeJSON(t, r.stdout, &rows)
	return rows
}

func (c *cli) execID(t *testing.T, tenant, user string) string {
	t.Helper()
	r := c.run(t, "exec", "--tenant", tenant, "--user", user, "--json", "--", "true").want(t, 0)
	var res jsonResult
	decodeOne(t, r.stdout, &res, jsonResultFields)
	return res.Sandbox.ID
}

func TestPsStopRm(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	image := envValue(c.env, "SANDKEEP_IMAGE")

	if rows := c.ps(t); len(rows) != 0 {
		t.Fatalf("fresh home: ps %+v", rows)
	}
	c.run(t, "exec", "--tenant", c.ten("acme"), "--user", "alice", "--", "sh", "-c", "echo kept > /workspace/kept").want(t, 0)
	id := c.execID(t, c.ten("acme"), "alice")
	bobID := c.execID(t, c.ten("beta"), "bob")
	key := keyOf(t, c.ten("acme"), "alice")

	// ps --json: one row per sandbox, sorted by tenant and user.
	rows := c.ps(t)
	if len(rows) != 2 || rows[0].User != "alice" || rows[1].User != "bob" {
		t.Fatalf("ps: %+v", rows)
	}
	a := rows[0]
	if a.Tenant != c.ten("acme") || a.Key != key.Hex() || a.Name != key.ContainerName() || a.ID != id ||
		a.State != "running" || a.Image != image || a.CreatedAt.IsZero() || a.LastUsed.IsZero() ||
		a.LastUsed.Before(a.CreatedAt.Add(-time.Second)) {
		t.Errorf("ps row %+v", a)
	}
	if d, err := time.ParseDuration(a.IdleFor); err != nil || d < 0 {
		t.Errorf("idle_for %q: %v", a.IdleFor, err)
	}

	// ps: a table with the documented columns.
	r := c.run(t, "ps").want(t, 0)
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if len(lines) != 3 || !regexp.MustCompile(`^TENANT\s+USER\s+KEY\s+STATE\s+IMAGE\s+CREATED\s+LAST USED\s+IDLE FOR\s+DISK$`).MatchString(lines[0]) {
		t.Fatalf("ps table:\n%s", r.stdout)
	}
	row := regexp.MustCompile(`^` + c.ten("acme") + `\s+alice\s+` + key.Hex()[:24] + `\s+running\s+` + regexp.QuoteMeta(image) +
		`\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+\S+\s+-$`)
	if !row.MatchString(lines[1]) || !strings.HasPrefix(lines[2], c.ten("beta")) {
		t.Errorf("ps table rows:\n%s", r.stdout)
	}

	// stop: the sandbox is kept, stopped; the next exec starts the same container.
	r = c.run(t, "stop", "--tenant", c.ten("acme"), "--user", "alice").want(t, 0)
	if r.stdout != key.ContainerName()+"\n" {
		t.Errorf("stop printed %q", r.stdout)
	}
	if rows := c.ps(t); len(rows) != 2 || rows[0].State != "stopped" || rows[0].ID != id || rows[1].State != "running" {
		t.Fatalf("ps after stop: %+v", rows)
	}
	if got := c.execID(t, c.ten("acme"), "alice"); got != id {
		t.Errorf("exec after stop ran in %s, want the same container %s", got, id)
	}
	if rows := c.ps(t); rows[0].State != "running" {
		t.Errorf("ps after restart: %+v", rows[0])
	}

	// rm --keep-workspace: the container goes, the workspace stays, and a new sandbox sees it.
	ws := c.workspace(t, c.ten("acme"), "alice")
	r = c.run(t, "rm", "--tenant", c.ten("acme"), "--user", "alice", "--keep-workspace").want(t, 0)
	if r.stdout != key.ContainerName()+"\n" {
		t.Errorf("rm printed %q", r.stdout)
	}
	if rows := c.ps(t); len(rows) != 1 || rows[0].User != "bob" {
		t.Fatalf("ps after rm: %+v", rows)
	}
	if got, err := os.ReadFile(filepath.Join(ws, "kept")); err != nil || string(got) != "kept\n" {
		t.Fatalf("workspace after rm --keep-workspace: %q, %v", got, err)
	}
	r = c.run(t, "exec", "--tenant", c.ten("acme"), "--user", "alice", "--json", "--", "cat", "/workspace/kept").want(t, 0)
	var res jsonResult
	decodeOne(t, r.stdout, &res, jsonResultFields)
	if res.Sandbox.ID == id || res.Stdout != "kept\n" {
		t.Errorf("exec after rm --keep-workspace: %+v", res)
	}

	// rm: container and workspace go.
	c.run(t, "rm", "--tenant", c.ten("acme"), "--user", "alice").want(t, 0)
	if _, err := os.Stat(ws); !os.IsNotExist(err) {
		t.Errorf("workspace after rm: %v", err)
	}
	if ids := c.containers(t); len(ids) != 1 || ids[0] != bobID {
		t.Errorf("containers after rm: %v, want only bob's %s", ids, bobID)
	}

	// Unknown sandboxes.
	c.run(t, "stop", "--tenant", c.ten("acme"), "--user", "alice").wantFailure(t, "SANDBOX_NOT_FOUND")
	c.run(t, "stop", "--tenant", c.ten("default"), "--user", "nobody").wantFailure(t, "SANDBOX_NOT_FOUND")
	c.run(t, "rm", "--tenant", c.ten("default"), "--user", "nobody", "--keep-workspace").wantFailure(t, "SANDBOX_NOT_FOUND")
}

// TestRmUnknown: removing a sandbox that never existed is SANDBOX_NOT_FOUND, like `docker rm` of an unknown
// name, with or without --keep-workspace; removing one whose container is gone but whose workspace was kept
// deletes that workspace.
func TestRmUnknown(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	tenant := c.ten("default")
	c.run(t, "rm", "--tenant", tenant, "--user", "nobody", "--keep-workspace").wantFailure(t, "SANDBOX_NOT_FOUND")
	c.run(t, "rm", "--tenant", tenant, "--user", "nobody").wantFailure(t, "SANDBOX_NOT_FOUND")

	c.run(t, "exec", "--tenant", tenant, "--user", "kept", "--", "touch", "/workspace/f").want(t, 0)
	c.run(t, "rm", "--tenant", tenant, "--user", "kept", "--keep-workspace").want(t, 0)
	c.run(t, "rm", "--tenant", tenant, "--user", "kept").want(t, 0)
	if _, err := os.Stat(c.workspace(t, tenant, "kept")); !os.IsNotExist(err) {
		t.Errorf("kept workspace after rm: %v", err)
	}
}

func envValue(env []string, name string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}
