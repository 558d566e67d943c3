package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/sqlite"
)

// tokenCLI runs `sandkeep --store <its own SQLite file> ...` in-process: token commands need no engine.
type tokenCLI struct{ store string }

func newTokenCLI(t *testing.T) tokenCLI {
	return tokenCLI{store: filepath.Join(t.TempDir(), "tokens.db")}
}

func (c tokenCLI) run(t *testing.T, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	all := append([]string{"--store", c.store}, args...)
	code := run(t.Context(), all, strings.NewReader(""), &stdout, &stderr)
	return result{args: all, stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// open opens the CLI's store directly, as `sandkeep serve` would.
func (c tokenCLI) open(t *testing.T) store.Store {
	t.Helper()
	st, err := sqlite.Open(t.Context(), c.store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// tokenCreatedFields and tokenRowFields are the documented JSON objects of create and list, exactly.
var (
	tokenCreatedFields = []string{"id", "tenant", "name", "scopes", "expires_at", "token"}
	tokenRowFields     = []string{"id", "tenant", "name", "scopes", "status", "created_at", "expires_at", "revoked_at"}
)

func (c tokenCLI) list(t *testing.T, args ...string) []tokenRow {
	t.Helper()
	r := c.run(t, append([]string{"token", "list", "--json"}, args...)...).want(t, 0)
	var rows []tokenRow
	decodeJSON(t, r.stdout, &rows)
	return rows
}

var secretLine = regexp.MustCompile(`^skt_[A-Za-z0-9_-]{43}\n$`)

func TestTokenCommands(t *testing.T) {
	t.Parallel()
	c := newTokenCLI(t)

	// create: the token alone on stdout, what was made (and that it is shown once) on stderr.
	r := c.run(t, "token", "create", "--tenant", "acme", "--name", "ci").want(t, 0)
	if !secretLine.MatchString(r.stdout) {
		t.Fatalf("token create printed %q on stdout, want the token alone on its line", r.stdout)
	}
	ciSecret := strings.TrimSpace(r.stdout)
	match(t, "stderr", `(?s)created token tok_[0-9a-f]{16} for tenant acme: name ci, scopes exec,files,read, expires never\n.*cannot be shown again\n$`, r.stderr)

	st := c.open(t)
	ci, err := auth.Verify(t.Context(), st, "Bearer "+ciSecret, time.Now())
	if err != nil {
		t.Fatalf("the printed token does not authenticate: %v", err)
	}
	if ci.Tenant != "acme" || ci.Name != "ci" || !slices.Equal(ci.Scopes, []string{"exec", "files", "read"}) || !ci.ExpiresAt.IsZero() {
		t.Errorf("stored token %+v: want acme/ci with the default scopes, never expiring", ci)
	}

	// create --json: one object with the token, the scopes as given, the expiry.
	before := time.Now()
	r = c.run(t, "token", "create", "--tenant", "beta", "--name", "deploy", "--scopes", "admin, read", "--expires", "30d", "--json").want(t, 0)
	var created tokenCreated
	decodeOne(t, r.stdout, &created, tokenCreatedFields)
	if r.stderr != "" {
		t.Errorf("create --json wrote %q on stderr", r.stderr)
	}
	if created.Tenant != "beta" || created.Name != "deploy" || !slices.Equal(created.Scopes, []string{"admin", "read"}) ||
		!secretLine.MatchString(created.Token+"\n") || created.ExpiresAt == nil ||
		created.ExpiresAt.Before(before.Add(30*24*time.Hour-time.Second)) || created.ExpiresAt.After(time.Now().Add(30*24*time.Hour)) {
		t.Errorf("create --json: %+v", created)
	}
	deploy, err := auth.Verify(t.Context(), st, "bearer "+created.Token, time.Now())
	if err != nil || deploy.ID != created.ID || !auth.Allows(deploy, auth.ScopeExec) {
		t.Errorf("the --json token: %+v, %v; want %s, allowed everything (admin)", deploy, err, created.ID)
	}

	// A tenant's live tokens have distinct names; other tenants' do not count.
	c.run(t, "token", "create", "--tenant", "acme", "--name", "ci").wantFailure(t, "INVALID_ARGUMENT")
	r = c.run(t, "token", "create", "--tenant", "acme", "--name", "ci", "--json")
	r.wantJSONError(t, "INVALID_ARGUMENT")
	if !strings.Contains(r.stdout, `already has a live token named \"ci\"`) {
		t.Errorf("duplicate name: %s", r.stdout)
	}
	c.run(t, "token", "create", "--tenant", "beta", "--name", "ci").want(t, 0)

	// list: never the token nor its hash; status, oldest first; --tenant filters.
	rows := c.list(t)
	if len(rows) != 3 || rows[0].ID != ci.ID || rows[1].ID != created.ID || rows[2].Tenant != "beta" || rows[2].Name != "ci" {
		t.Fatalf("token list: %+v", rows)
	}
	for _, row := range rows {
		if row.Status != auth.StatusLive || row.RevokedAt != nil || row.CreatedAt.IsZero() {
			t.Errorf("fresh token listed as %+v", row)
		}
	}
	raw := c.run(t, "token", "list", "--json").want(t, 0).stdout
	var objs []map[string]any
	decodeJSON(t, raw, &objs)
	for _, o := range objs {
		var keys []string
		for k := range o {
			keys = append(keys, k)
		}
		if slices.Sort(keys); !slices.Equal(keys, slices.Sorted(slices.Values(tokenRowFields))) {
			t.Errorf("list --json fields %v, want %v", keys, tokenRowFields)
		}
	}
	human := c.run(t, "token", "list").want(t, 0).stdout
	for _, out := range []string{raw, human} {
		for _, secret := range []string{ciSecret, created.Token} {
			if strings.Contains(out, secret) || strings.Contains(out, auth.Hash(secret)) {
				t.Errorf("token list shows a token or its hash:\n%s", out)
			}
		}
	}
	lines := strings.Split(strings.TrimRight(human, "\n"), "\n")
	if len(lines) != 4 || !regexp.MustCompile(`^ID\s+TENANT\s+NAME\s+SCOPES\s+STATUS\s+CREATED\s+EXPIRES$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^`+ci.ID+`\s+acme\s+ci\s+exec,files,read\s+live\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+never$`).MatchString(lines[1]) ||
		!regexp.MustCompile(`^`+created.ID+`\s+beta\s+deploy\s+admin,read\s+live\s+\S+ \S+\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`).MatchString(lines[2]) {
		t.Errorf("token list table:\n%s", human)
	}
	if got := c.list(t, "--tenant", "beta"); len(got) != 2 || got[0].ID != created.ID || got[1].Tenant != "beta" {
		t.Errorf("token list --tenant beta: %+v", got)
	}
	if got := c.run(t, "token", "list", "--tenant", "nobody", "--json").want(t, 0).stdout; got != "[]\n" {
		t.Errorf("token list of a tenant without tokens: %q, want []", got)
	}

	// revoke: the token stops working at once; a second revoke is fine; the name is free again.
	r = c.run(t, "token", "revoke", ci.ID).want(t, 0)
	if r.stdout != ci.ID+"\n" {
		t.Errorf("revoke printed %q", r.stdout)
	}
	if _, err := auth.Verify(t.Context(), st, "Bearer "+ciSecret, time.Now()); !fault.Is(err, fault.Unauthenticated) {
		t.Errorf("a revoked token still authenticates: %v", err)
	}
	c.run(t, "token", "revoke", ci.ID).want(t, 0)
	rows = c.list(t, "--tenant", "acme")
	if len(rows) != 1 || rows[0].Status != auth.StatusRevoked || rows[0].RevokedAt == nil {
		t.Errorf("list after revoke: %+v", rows)
	}
	c.run(t, "token", "revoke", "tok_0000000000000000").wantFailure(t, "INVALID_ARGUMENT")
	c.run(t, "token", "revoke", "ci").wantFailure(t, "INVALID_ARGUMENT")
	c.run(t, "token", "create", "--tenant", "acme", "--name", "ci").want(t, 0)
	if rows := c.list(t, "--tenant", "acme"); len(rows) != 2 || rows[0].Status != auth.StatusRevoked || rows[1].Status != auth.StatusLive {
		t.Errorf("list after re-creating a revoked name: %+v", rows)
	}

	// A token past its expiry lists as expired.
	old, _, err := auth.Create(t.Context(), st, auth.Spec{Tenant: "gamma", Name: "old", TTL: time.Hour}, time.Now().Add(-2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if rows := c.list(t, "--tenant", "gamma"); len(rows) != 1 || rows[0].ID != old.ID || rows[0].Status != auth.StatusExpired {
		t.Errorf("list of an expired token: %+v", rows)
	}
}

// TestTokenCommandLine: refused input is reported before the store is opened (no file is created).
func TestTokenCommandLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		args       []string
		stderr     string // regexp
		jsonOnFail string
	}{
		{name: "no tenant", args: []string{"token", "create", "--name", "ci"},
			stderr: `^sandkeep: INVALID_ARGUMENT: --tenant is required\nhint: .*--tenant acme.*sandkeep token create --help.*\n$`},
		{name: "no name", args: []string{"token", "create", "--tenant", "acme"},
			stderr: `^sandkeep: INVALID_ARGUMENT: --name is required\nhint: .*--name ci.*\n$`},
		{name: "unknown scope", args: []string{"token", "create", "--tenant", "acme", "--name", "ci", "--scopes", "exec,sudo"},
			stderr: `^sandkeep: INVALID_ARGUMENT: unknown scope "sudo"\nhint: .*exec, files, read, admin.*\n$`},
		{name: "empty scope", args: []string{"token", "create", "--tenant", "acme", "--name", "ci", "--scopes", "exec,"},
			stderr: `^sandkeep: INVALID_ARGUMENT: .*empty entry\nhint: .*\n$`},
		{name: "bad expiry", args: []string{"token", "create", "--tenant", "acme", "--name", "ci", "--expires", "soon"},
			stderr: `^sandkeep: INVALID_ARGUMENT: expiry "soon" is not a duration\nhint: .*30d.*never\n$`},
		{name: "expiry too far", args: []string{"token", "create", "--tenant", "acme", "--name", "ci", "--expires", "3651d"},
			stderr: `^sandkeep: INVALID_ARGUMENT: expiry 3651d is more than 10 years away\nhint: .*\n$`},
		{name: "expiry too short", args: []string{"token", "create", "--tenant", "acme", "--name", "ci", "--expires", "10s"},
			stderr: `^sandkeep: INVALID_ARGUMENT: expiry 10s is shorter than a minute\nhint: .*\n$`},
		{name: "bad tenant", args: []string{"token", "create", "--tenant", "a\x01b", "--name", "ci"},
			stderr: `^sandkeep: INVALID_IDENTITY: .*\nhint: .*\n$`},
		{name: "bad name", args: []string{"token", "create", "--tenant", "acme", "--name", "c\ni"},
			stderr: `^sandkeep: INVALID_ARGUMENT: token name .*control characters\nhint: .*\n$`},
		{name: "json", args: []string{"token", "create", "--tenant", "acme", "--json"}, jsonOnFail: "INVALID_ARGUMENT"},
		{name: "json scope", args: []string{"token", "create", "--tenant", "acme", "--name", "ci", "--scopes", "root", "--json"},
			jsonOnFail: "INVALID_ARGUMENT"},
		{name: "create takes no args", args: []string{"token", "create", "--tenant", "acme", "--name", "ci", "extra"},
			stderr: `^sandkeep: INVALID_ARGUMENT: .*no arguments.*\nhint: see 'sandkeep token create --help'\n$`},
		{name: "revoke without id", args: []string{"token", "revoke"},
			stderr: `^sandkeep: INVALID_ARGUMENT: sandkeep token revoke takes one token id, got 0 arguments\nhint: .*\n$`},
		{name: "revoke malformed id", args: []string{"token", "revoke", "tok_XYZ"},
			stderr: `^sandkeep: INVALID_ARGUMENT: "tok_XYZ" is not a token id .*\nhint: .*sandkeep token list.*\n$`},
		{name: "unknown subcommand", args: []string{"token", "delete"},
			stderr: `^sandkeep: INVALID_ARGUMENT: unknown command "delete" for "sandkeep token"\nhint: see 'sandkeep token --help'\n$`},
		{name: "unknown flag", args: []string{"token", "list", "--all"},
			stderr: `^sandkeep: INVALID_ARGUMENT: unknown flag: --all\nhint: see 'sandkeep token list --help'\n$`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newTokenCLI(t)
			r := c.run(t, tt.args...)
			if tt.jsonOnFail != "" {
				r.wantJSONError(t, tt.jsonOnFail)
				match(t, "stderr", "", r.stderr)
			} else {
				r.want(t, exitFailure)
				match(t, "stdout", "", r.stdout)
				match(t, "stderr", tt.stderr, r.stderr)
			}
			if _, err := os.Stat(c.store); !os.IsNotExist(err) {
				t.Errorf("the store was opened for refused input (stat: %v)", err)
			}
		})
	}
}
