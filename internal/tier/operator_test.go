package tier

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/spec"
)

var wantOp = regexp.MustCompile(`(?m)^# want: (\S+)$`)

// TestParseOperator reads testdata/TestParseOperator: good/ files decode with no error diagnostics; bad/
// files either fail to decode ("# want: decode": unknown fields, aliases, a second document) or give exactly
// the SK511 errors listed by field, each with Tier "operator" and a hint.
func TestParseOperator(t *testing.T) {
	files, _ := filepath.Glob("testdata/TestParseOperator/*/*.yaml")
	if len(files) == 0 {
		t.Fatal("no testdata")
	}
	for _, file := range files {
		t.Run(strings.TrimPrefix(file, "testdata/TestParseOperator/"), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, m := range wantOp.FindAllStringSubmatch(string(data), -1) {
				want = append(want, m[1])
			}
			op, list, err := ParseOperator(data)
			if slices.Equal(want, []string{"decode"}) {
				if err == nil {
					t.Fatalf("decoded: %+v", op)
				}
				return
			}
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			var got []string
			for _, d := range list {
				if d.Code != diag.TierOperatorInvalid || d.Tier != NameOperator || d.Field == "" || d.Hint == "" {
					t.Errorf("diagnostic lacks its code, tier, field or hint: %+v", d)
				}
				if d.Severity == diag.Error {
					got = append(got, d.Field)
				}
			}
			if slices.Equal(want, []string{"ok"}) {
				want = nil
			}
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("error fields = %v\nwant %v\n%s", got, want, diag.ListError(list))
			}
		})
	}
}

// TestOperatorDenyClassLocalEnv: listing a deny-class name in local_env is a warning (it is never read).
func TestOperatorDenyClassLocalEnv(t *testing.T) {
	list := Operator{LocalEnv: []string{"GITHUB_TOKEN"}}.Validate()
	if len(list) != 1 || list[0].Severity != diag.Warning || list[0].Field != "local_env[0]" {
		t.Fatalf("got %v", list)
	}
}

// TestResolveSecrets: the operator's values for the names a repository referenced, from an injected
// environment and from a host file; each failure is SECRET_UNAVAILABLE with a hint, and never holds a value.
func TestResolveSecrets(t *testing.T) {
	dir := t.TempDir()
	hostFile := filepath.Join(dir, "token")
	if err := os.WriteFile(hostFile, []byte(sentinel), 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, MaxSecretFile+1), 0o600); err != nil {
		t.Fatal(err)
	}
	sshDir := filepath.Join(dir, ".ssh")
	if err := os.Mkdir(sshDir, 0o700); err != nil {
		t.Fatal(err)
	}
	sshKey := filepath.Join(sshDir, "id_ed25519")
	if err := os.WriteFile(sshKey, []byte(sentinel), 0o600); err != nil {
		t.Fatal(err)
	}
	plainDir := filepath.Join(dir, "plain")
	if err := os.Mkdir(plainDir, 0o755); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SK_ENV_SECRET": sentinel}
	op := Operator{
		Secrets: map[string]SecretSource{
			"env": {FromEnv: "SK_ENV_SECRET"}, "file": {FromFile: hostFile}, "unset": {FromEnv: "SK_UNSET"},
			"big": {FromFile: big}, "ssh": {FromFile: sshKey}, "missing": {FromFile: filepath.Join(dir, "nope")},
			"dir": {FromFile: plainDir},
		},
		LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
	}
	got, err := op.ResolveSecrets([]spec.SecretFile{
		{Name: "env", Path: "/run/secrets/env"},
		{Name: "file", Path: "/run/secrets/file", Mode: "0440"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || string(got[0].Value) != sentinel || string(got[1].Value) != sentinel || got[0].Mode != spec.DefaultSecretMode || got[1].Mode != 0o440 || got[1].Path != "/run/secrets/file" {
		t.Fatalf("resolved = %v", got)
	}
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("resolved", "secret", got[0], "all", got)
	for _, s := range []string{fmt.Sprint(got), fmt.Sprintf("%v %+v %#v %s", got[0], got[0], got[0], got[0]), logged.String()} {
		if strings.Contains(s, sentinel) {
			t.Errorf("a resolved secret prints its value: %s", s)
		}
	}

	for _, tc := range []struct {
		name string
		sf   spec.SecretFile
		code fault.Code
		hint string
	}{
		{"undefined", spec.SecretFile{Name: "nope", Path: "/run/secrets/nope"}, fault.SecretUnavailable, "secrets:"},
		{"own from_env", spec.SecretFile{Name: "env", Path: "/run/secrets/x", FromEnv: "SK_ENV_SECRET"}, fault.SecretUnavailable, "secrets:"},
		{"own from_file", spec.SecretFile{Name: "file", Path: "/run/secrets/x", FromFile: hostFile}, fault.SecretUnavailable, "secrets:"},
		{"unset variable", spec.SecretFile{Name: "unset", Path: "/run/secrets/x"}, fault.SecretUnavailable, "SK_UNSET"},
		{"too large", spec.SecretFile{Name: "big", Path: "/run/secrets/x"}, fault.SecretUnavailable, "1 MiB"},
		{"credential directory", spec.SecretFile{Name: "ssh", Path: "/run/secrets/x"}, fault.SecretUnavailable, "credential directories"},
		{"missing file", spec.SecretFile{Name: "missing", Path: "/run/secrets/x"}, fault.SecretUnavailable, "path"},
		{"directory", spec.SecretFile{Name: "dir", Path: "/run/secrets/x"}, fault.SecretUnavailable, "regular file"},
		{"bad mode", spec.SecretFile{Name: "env", Path: "/run/secrets/x", Mode: "0200"}, fault.SpecInvalid, "octal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := op.ResolveSecrets([]spec.SecretFile{tc.sf})
			var fe *fault.Error
			if !errors.As(err, &fe) || fe.Code != tc.code || !strings.Contains(fe.Hint, tc.hint) {
				t.Fatalf("got %v, %v; want %s with a hint naming %q", got, err, tc.code, tc.hint)
			}
			if strings.Contains(err.Error(), sentinel) {
				t.Errorf("the error holds the value: %v", err)
			}
		})
	}
}

// TestResolveCredentials: the operator's value and hosts for each name referenced; a source or hosts from
// the reference, an undefined name and an unset variable are SECRET_UNAVAILABLE without the value.
func TestResolveCredentials(t *testing.T) {
	env := map[string]string{"GH_TOKEN": sentinel, "EMPTY": ""}
	op := Operator{
		Credentials: map[string]CredentialSource{
			"GITHUB_TOKEN": {FromEnv: "GH_TOKEN", Hosts: []string{"api.github.com"}},
			"EMPTY_TOKEN":  {FromEnv: "EMPTY", Hosts: []string{"a.example"}},
			"NO_HOSTS":     {FromEnv: "GH_TOKEN"},
		},
		LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
	}
	got, err := op.ResolveCredentials([]spec.NetworkCredential{{Name: "GITHUB_TOKEN"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Value != sentinel || !slices.Equal(got[0].Hosts, []string{"api.github.com"}) {
		t.Fatalf("resolved = %v", got)
	}
	if s := fmt.Sprintf("%v %+v %#v", got[0], got, got[0]); strings.Contains(s, sentinel) {
		t.Errorf("a resolved credential prints its value: %s", s)
	}
	for _, tc := range []struct {
		name string
		ref  spec.NetworkCredential
		hint string
	}{
		{"undefined", spec.NetworkCredential{Name: "AWS_SECRET_ACCESS_KEY"}, "credentials:"},
		{"own from_env", spec.NetworkCredential{Name: "GITHUB_TOKEN", FromEnv: "GH_TOKEN"}, "credentials:"},
		{"own hosts", spec.NetworkCredential{Name: "GITHUB_TOKEN", Hosts: []string{"attacker.example"}}, "credentials:"},
		{"empty variable", spec.NetworkCredential{Name: "EMPTY_TOKEN"}, "EMPTY"},
		{"no hosts", spec.NetworkCredential{Name: "NO_HOSTS"}, "hosts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := op.ResolveCredentials([]spec.NetworkCredential{tc.ref})
			var fe *fault.Error
			if !errors.As(err, &fe) || fe.Code != fault.SecretUnavailable || !strings.Contains(fe.Hint, tc.hint) {
				t.Fatalf("got %v, %v; want SECRET_UNAVAILABLE with a hint naming %q", got, err, tc.hint)
			}
			if strings.Contains(err.Error(), sentinel) {
				t.Errorf("the error holds the value: %v", err)
			}
		})
	}
}

// TestOperatorEmbeds: the lead embeds Operator in the operator's config file; a strict decoder there
// refuses unknown keys inside it too.
func TestOperatorEmbeds(t *testing.T) {
	op, list, err := ParseOperator([]byte("secrets: {npmrc: {from_env: NPM_RC}}\nrepo_mounts_writable: true\n"))
	if err != nil || list.HasErrors() || !op.RepoMountsWritable || op.Secrets["npmrc"].FromEnv != "NPM_RC" {
		t.Fatalf("op = %+v, %v, %v", op, list, err)
	}
	if _, _, err := ParseOperator([]byte("lookup_env: x\n")); err == nil {
		t.Error("the injectable lookup is settable from YAML")
	}
}

// TestDecodeOperatorLines: a config file that embeds Operator (as sandkeep-server.yaml does) is decoded as
// strictly as Operator alone, and each refusal names its line.
func TestDecodeOperatorLines(t *testing.T) {
	type config struct {
		Listen   string `yaml:"listen"`
		Operator `yaml:",inline"`
	}
	for _, tt := range []struct{ body, want string }{
		{"listen: a\nhost_paths: &p [/srv]\nlocal_env: *p\n", `^line 3: YAML alias \*p `},
		{"listen: a\nsecrets:\n  x: {from_env: A}\n  x: {from_env: B}\n", `line 4: mapping key "x" already defined at line 3`},
		{"listen: a\n---\nlisten: b\n", `^line 2: a second YAML document`},
		{"listen: a\n...\n---\n", `^line 3: a second YAML document`},
		{"listen: a\nhost_path: [/srv]\n", `line 2: field host_path not found`},
		{"listen: a\nsecrets: {x: {from_env: A, from_envv: B}}\n", `line 2: field from_envv not found`},
	} {
		var c config
		err := DecodeOperator([]byte(tt.body), &c)
		if err == nil || !regexp.MustCompile(tt.want).MatchString(err.Error()) {
			t.Errorf("%q: %v; want %s", tt.body, err, tt.want)
		}
	}
	var c config
	if err := DecodeOperator([]byte("listen: a\nhost_paths: [/srv]\n"), &c); err != nil || c.Listen != "a" || c.HostPaths[0] != "/srv" {
		t.Errorf("good file: %+v, %v", c, err)
	}
}
