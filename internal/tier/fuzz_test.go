package tier

import (
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// FuzzRepository parses spec bytes and checks what Repository says about them (corpus in
// testdata/fuzz/FuzzRepository): every diagnostic names the repository tier, a field and a hint, with a SK5xx
// code; a block without errors is inside the operator's envelope (no mode none, no user, no sources, no
// undefined names, no open network, no IP rules, only read-only mounts); and a second check of the returned
// block finds nothing to make read-only.
func FuzzRepository(f *testing.F) {
	for _, s := range []string{
		"sandbox: {image: debian:12}\n",
		"sandbox: {mode: none, user: \"0:0\", host_state: auto}\n",
		"sandbox:\n  mounts: [\"type=bind,source=/etc/ssl,target=/opt/ssl\"]\n",
		"sandbox:\n  secret_files: [{name: npmrc, path: /run/secrets/npmrc}, {name: x, path: /run/secrets/x, from_env: HOME}]\n",
		"sandbox:\n  network: {mode: allowlist, rules: [\"**\", \"10.0.0.0/8\", \"!1.2.3.4\"], credentials: [{name: GITHUB_TOKEN}, {name: B, from_env: B, hosts: [b.example]}]}\n",
	} {
		f.Add([]byte(s))
	}
	root := f.TempDir()
	op := Operator{
		Secrets:     map[string]SecretSource{"npmrc": {FromEnv: "NPM_RC"}},
		Credentials: map[string]CredentialSource{"GITHUB_TOKEN": {FromEnv: "GH_TOKEN", Hosts: []string{"api.github.com"}}},
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, _ := spec.Parse(root+"/sandkeep.yaml", data)
		if file == nil {
			return
		}
		sb := file.Sandbox
		list := RepositoryFrom(&sb, root, op, Sources{Spec: file})
		for _, d := range list {
			if !strings.HasPrefix(string(d.Code), "SK5") || d.Tier != NameRepository || d.Field == "" || d.Hint == "" || d.Message == "" {
				t.Fatalf("incomplete diagnostic: %+v", d)
			}
			if d.Severity == diag.Warning && d.Code != diag.TierMountWritable {
				t.Fatalf("only SK503 is a warning: %+v", d)
			}
		}
		if !list.HasErrors() {
			envelope(t, sb, op)
		}
		for _, d := range RepositoryFrom(&sb, root, op, Sources{}) {
			if d.Code == diag.TierMountWritable {
				t.Fatalf("a mount is still writable after Repository: %s", d)
			}
		}
	})
}

// envelope fails when sb, which Repository passed, holds something the repository tier may not set.
func envelope(t *testing.T, sb spec.Sandbox, op Operator) {
	t.Helper()
	if sb.Mode == spec.ModeNone || sb.User != "" || sb.HostState == "auto" {
		t.Fatalf("passed mode %q, user %q, host_state %q", sb.Mode, sb.User, sb.HostState)
	}
	for _, m := range sb.Mounts {
		if mp, ok := parseMount(m); !ok || !mp.readOnly {
			t.Fatalf("passed a mount that is not read-only: %q", m)
		}
	}
	for _, s := range sb.SecretFiles {
		if _, ok := op.Secrets[s.Name]; !ok || s.FromEnv != "" || s.FromFile != "" {
			t.Fatalf("passed secret %+v", s)
		}
	}
	if n := sb.Network; n != nil {
		if n.Mode == "open" || n.Mode == "denylist" {
			t.Fatalf("passed network mode %s", n.Mode)
		}
		for _, c := range n.Credentials {
			if _, ok := op.Credentials[c.Name]; !ok || c.FromEnv != "" || c.Hosts != nil {
				t.Fatalf("passed credential %+v", c)
			}
		}
		for _, r := range n.Rules {
			if r == "**" || strings.HasPrefix(r, "**:") {
				t.Fatalf("passed rule %q", r)
			}
		}
	}
}

// FuzzOperator decodes operator settings (corpus in testdata/fuzz/FuzzOperator): decoding never panics,
// every diagnostic names the operator tier, a field and a hint, and settings without errors give each secret
// exactly one source and each credential a variable and hosts.
func FuzzOperator(f *testing.F) {
	for _, s := range []string{
		"secrets: {npmrc: {from_env: NPM_RC}}\n",
		"credentials: {GITHUB_TOKEN: {from_env: GH, hosts: [api.github.com]}}\nhost_paths: [/srv]\n",
		"local_env: [A, GITHUB_TOKEN]\nrepo_network_open: true\n",
		"secrets: {a: {from_file: /etc/shadow}}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		op, list, err := ParseOperator(data)
		if err != nil {
			return
		}
		for _, d := range list {
			if d.Code != diag.TierOperatorInvalid || d.Tier != NameOperator || d.Field == "" || d.Hint == "" {
				t.Fatalf("incomplete diagnostic: %+v", d)
			}
		}
		if list.HasErrors() {
			return
		}
		for name, s := range op.Secrets {
			if (s.FromEnv == "") == (s.FromFile == "") || !spec.ValidSecretName(name) {
				t.Fatalf("passed secret %q: %+v", name, s)
			}
		}
		for name, c := range op.Credentials {
			if !spec.ValidCredentialName(name) || !spec.ValidCredentialName(c.FromEnv) || len(c.Hosts) == 0 {
				t.Fatalf("passed credential %q: %+v", name, c)
			}
		}
	})
}
