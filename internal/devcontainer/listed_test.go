package devcontainer

import (
	"fmt"
	"strings"
	"testing"
)

// TestExpandListed: with Env.Listed set (the operator's local_env), a name it does not list is never looked up
// on the host and expands to its default (or ""), with a SK217 warning that names local_env; a listed name is
// read as before; the deny class stays unread even when listed.
func TestExpandListed(t *testing.T) {
	const hostValue = "host-value-sentinel-5c1f"
	vars := map[string]string{"LISTED": "yes", "PGPASSWORD": hostValue, "DATABASE_URL": hostValue, "GITHUB_TOKEN": hostValue}
	listed := map[string]bool{"LISTED": true, "GITHUB_TOKEN": true}
	tests := []struct {
		name, in, want string
		codes          []string
	}{
		{name: "listed", in: "${localEnv:LISTED}", want: "yes"},
		{name: "unlisted", in: "${localEnv:PGPASSWORD}", want: "", codes: []string{"SK217"}},
		{name: "unlisted with default", in: "${localEnv:DATABASE_URL:sqlite://x}", want: "sqlite://x", codes: []string{"SK217"}},
		{name: "unlisted env alias", in: "${env:PGPASSWORD}", want: "", codes: []string{"SK217"}},
		{name: "listed but deny class", in: "${localEnv:GITHUB_TOKEN}", want: "", codes: []string{"SK213"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var asked []string
			env := hostEnv("/repo", vars)
			lookup := env.Lookup
			env.Lookup = func(k string) (string, bool) { asked = append(asked, k); return lookup(k) }
			env.Listed = func(k string) bool { return listed[k] }
			src := fmt.Sprintf(`{"image": "debian:12", "containerEnv": {"V": %q}}`, tt.in)
			cfg, list := Parse("/repo/.devcontainer/devcontainer.json", []byte(src), env)
			want := tt.codes
			if want == nil {
				want = []string{}
			}
			only(t, list, want...)
			if cfg.Env["V"] != tt.want {
				t.Errorf("expanded to %q, want %q", cfg.Env["V"], tt.want)
			}
			for _, k := range asked {
				if !listed[k] {
					t.Errorf("looked up the unlisted host variable %s", k)
				}
			}
			for _, d := range list {
				if strings.Contains(d.String(), hostValue) {
					t.Errorf("a diagnostic holds the host value: %s", d)
				}
				if d.Code == "SK217" && !strings.Contains(d.Hint, "local_env") {
					t.Errorf("SK217 hint does not name local_env: %s", d)
				}
			}
		})
	}
}

// TestConfigPos: a parsed Config says where its user and each kept mount were written.
func TestConfigPos(t *testing.T) {
	root := t.TempDir()
	src := "{\n  \"image\": \"debian:12\",\n  \"containerUser\": \"1000\",\n  \"mounts\": [\n    \"type=volume,source=v,target=/v\",\n" +
		fmt.Sprintf("    \"type=bind,source=%s,target=/opt/x\"\n  ]\n}\n", root)
	cfg, list := Parse(root+"/.devcontainer/devcontainer.json", []byte(src), Env{WorkspaceFolder: root})
	if cfg == nil {
		t.Fatalf("parse: %v", list)
	}
	for _, tc := range []struct {
		field     string
		line, col int
	}{{"user", 3, 20}, {"containerUser", 3, 20}, {"remoteUser", 0, 0}, {"mounts[0]", 6, 5}, {"mounts[1]", 0, 0}, {"image", 0, 0}} {
		if l, c := cfg.Pos(tc.field); l != tc.line || c != tc.col {
			t.Errorf("Pos(%q) = %d:%d; want %d:%d", tc.field, l, c, tc.line, tc.col)
		}
	}
	if l, c := (&Config{User: "x"}).Pos("user"); l != 0 || c != 0 {
		t.Errorf("a Config made by hand has a position: %d:%d", l, c)
	}
}
