package spec

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/diag"
)

// wantLine is an expectation in a testdata file: "# want: SK101 3" (a diagnostic with that code on line 3).
var wantLine = regexp.MustCompile(`(?m)^# want: (SK\d{3}) (\d+)$`)

// TestParse parses every file under testdata/TestParse: the files in good/ have no errors, those in bad/ at
// least one; in both, the diagnostics are exactly the "# want:" lines of the file (code and line), and each
// has a message, a hint and the file's name.
func TestParse(t *testing.T) {
	files, err := filepath.Glob("testdata/TestParse/*/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	codes := map[diag.Code]bool{}
	for _, file := range files {
		t.Run(strings.TrimPrefix(file, "testdata/TestParse/"), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, m := range wantLine.FindAllStringSubmatch(string(data), -1) {
				want = append(want, m[1]+" "+m[2])
			}
			f, list := Parse(file, data)
			var got []string
			for _, d := range list {
				got = append(got, fmt.Sprintf("%s %d", d.Code, d.Line))
				codes[d.Code] = true
				if d.Message == "" || d.Hint == "" || d.File != file || d.Column < 0 {
					t.Errorf("diagnostic lacks a message, hint or file: %+v", d)
				}
			}
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("diagnostics (code line) = %v; want %v\n%s", got, want, diag.ListError(list).Error())
			}
			bad := strings.Contains(file, "/bad/")
			if list.HasErrors() != bad || (f == nil) != bad {
				t.Errorf("HasErrors = %v, file %v; want errors %v\n%s", list.HasErrors(), f != nil, bad, diag.ListError(list).Error())
			}
			if !bad {
				if errs := f.Sandbox.Validate(); errs.HasErrors() {
					t.Errorf("Validate of the parsed spec: %v", diag.ListError(errs))
				}
			}
		})
	}
	// Every code the parser can report appears in at least one file.
	for _, c := range []diag.Code{
		diag.SpecFile, diag.SpecMode, diag.SpecNetworkModeMisuse, diag.SpecImageAndBuild, diag.SpecBuildDockerfile,
		diag.SpecWorkspaceFolder, diag.SpecControlChar, diag.SpecUnknownField, diag.SpecWrongType, diag.SpecDuplicateKey,
		diag.SpecUser, diag.SpecEnv, diag.SpecMount, diag.SpecTmpfs, diag.SpecResources, diag.SpecHostState,
		diag.SpecSecretFile, diag.SpecNetwork, diag.SpecBuildPath, diag.SpecPostCreate,
		diag.RuleEmpty, diag.RuleWildcard, diag.RulePort, diag.RuleCIDR, diag.RuleHost, diag.RuleWildcardIP,
	} {
		if !codes[c] {
			t.Errorf("no testdata file exercises %s", c)
		}
	}
}

// TestParseFullExample checks that the issue's example (with image only) reads into exactly this struct.
func TestParseFullExample(t *testing.T) {
	f, list := Load("testdata/TestParse/good/full.yaml")
	if list.HasErrors() || len(list) != 0 {
		t.Fatalf("Load: %v", diag.ListError(list))
	}
	want := Sandbox{
		Mode:            ModeAuto,
		Image:           "debian:12",
		User:            "1000:1000",
		Env:             map[string]string{"K": "V", "PORT": "8080", "VERSION": "1.10"},
		Mounts:          []string{"type=bind,source=/usr/share,target=/workspace/share,readonly"},
		Tmpfs:           []string{"/cache:size=64m"},
		Resources:       &Resources{CPUs: 1, Memory: "2g", Pids: 512},
		PostCreate:      "make deps",
		WorkspaceFolder: "/workspace",
		HostState:       "none",
		SecretFiles:     []SecretFile{{Name: "npmrc", Path: "/run/secrets/npmrc", FromEnv: "NPM_RC"}},
		Network: &Network{
			Mode: "allowlist", Preset: "default", Rules: []string{"**.github.com", "!gist.github.com"}, Inherit: "append",
		},
	}
	if !reflect.DeepEqual(f.Sandbox, want) {
		t.Errorf("Sandbox =\n%#v\nwant\n%#v", f.Sandbox, want)
	}
	root, _ := filepath.Abs("testdata/TestParse/good")
	if f.Path != "testdata/TestParse/good/full.yaml" || f.Root != root {
		t.Errorf("Path, Root = %q, %q; want the path as given and %q", f.Path, f.Root, root)
	}
}

// TestParseIssueExampleVerbatim: the issue's example as written sets both image and build, and its mount has
// placeholder paths; those are the only two problems.
func TestParseIssueExampleVerbatim(t *testing.T) {
	const example = `sandbox:
  mode: auto            # "" (inherit) | none | auto | inline
  image: debian:12      # xor build:
  build: {dockerfile: .devcontainer/Dockerfile, context: ., args: {K: V}}
  user: "1000:1000"
  env: {K: V}
  mounts: ["type=bind,source=...,target=..."]
  tmpfs: ["/cache:size=64m"]
  resources: {cpus: 1, memory: 2g, pids: 512}
  post_create: "make deps"
  workspace_folder: /workspace
  host_state: none      # auto | none (which host state dirs, if any, are bound in)
  secret_files: [{name: npmrc, path: /run/secrets/npmrc, from_env: NPM_RC}]
  network: {mode: allowlist, preset: default, rules: ["**.github.com", "!gist.github.com"], inherit: append}
`
	f, list := Parse("sandkeep.yaml", []byte(example))
	var got []string
	for _, d := range list {
		got = append(got, fmt.Sprintf("%s %d:%d", d.Code, d.Line, d.Column))
	}
	want := []string{"SK103 4:10", "SK112 7:12"}
	if f != nil || !slices.Equal(got, want) {
		t.Fatalf("diagnostics = %v; want %v\n%s", got, want, diag.ListError(list).Error())
	}
	if !strings.HasPrefix(list[0].String(), "sandkeep.yaml:4:10: SK103 error: image and build are both set") {
		t.Errorf("String() = %q", list[0].String())
	}
}

// TestParseMessages pins the sentences the issue and the brief name.
func TestParseNetworkCredentials(t *testing.T) {
	f, list := Parse("s.yaml", []byte("sandbox:\n  network:\n    mode: allowlist\n    inspect: on\n    credentials:\n      - {name: GITHUB_TOKEN, from_env: GH_TOKEN, hosts: [api.github.com, \"**.githubusercontent.com\"]}\n"))
	if list.HasErrors() {
		t.Fatal(list)
	}
	n := f.Sandbox.Network
	if n.Inspect != "on" || len(n.Credentials) != 1 || n.Credentials[0].Name != "GITHUB_TOKEN" || n.Credentials[0].FromEnv != "GH_TOKEN" ||
		len(n.Credentials[0].Hosts) != 2 {
		t.Errorf("network = %+v", n)
	}
}

func TestParseMessages(t *testing.T) {
	tests := []struct {
		yaml, want, hint string
	}{
		{"sandbox: {mode: x}", `invalid mode "x": want "", none, auto or inline`, ""},
		{"sandbox: {mode: allowlist}", "allowlist is a network mode: write it under sandbox.network.mode", "network: {mode: allowlist"},
		{"sandbox: {mode: open}", "open is a network mode: write it under sandbox.network.mode", ""},
		{"sandbox: {imagee: debian}", `unknown field "imagee" in sandbox: want one of mode, image, build, user, env, mounts, tmpfs, resources, post_create, workspace_folder, host_state, secret_files, network`, `did you mean "image"?`},
		{"sandbox: {rules: []}", `unknown field "rules" in sandbox`, "rules belongs under sandbox.network"},
		{"sandbox: {image: 12}", "sandbox.image must be a string, not a number", `quote it: "12"`},
		{"sandbox: {build: [a]}", "sandbox.build must be a mapping, not a list", "build: {dockerfile:"},
		{"sandbox:\n  network:\n    rules:\n      - !x.com\n", "sandbox.network.rules[0] must be a string, not a value tagged \"!x.com\"", `quote a value that starts with '!': "!x.com"`},
		{"sandbox: {env: {TOKEN: \"s3cret\\x01\"}}", "sandbox.env.TOKEN contains the control character U+0001", ""},
		{"sandbox: {network: {mode: auto}}", "auto is a sandbox mode: write it under sandbox.mode", ""},
		{"sandbox: {network: {mode: open, inspect: maybe}}", `invalid TLS inspection setting "maybe"`, "inspect: auto"},
		{"sandbox: {network: {mode: allowlist, credentials: [{name: A-B, from_env: X, hosts: [a.com]}]}}", `sandbox.network.credentials[0].name "A-B" is not an environment variable name`, "GITHUB_TOKEN"},
		{"sandbox: {network: {mode: allowlist, credentials: [{name: T, from_env: X}]}}", "sandbox.network.credentials[0] names no host", "hosts: [api.github.com]"},
		{"sandbox: {network: {mode: allowlist, credentials: [{name: T, from_env: X, hosts: [\"!a.com\"]}]}}", `sandbox.network.credentials[0].hosts[0] "!a.com" is negated`, ""},
		{"sandbox: {network: {credentials: [{name: T, from_env: X, hosts: [a.com]}]}}", "credentials need a network", "mode: allowlist"},
		{"sandbox: {network: {mode: allowlist, credentials: [{name: T, from_env: X, hosts: [a.com], value: v}]}}", `unknown field "value"`, ""},
	}
	for _, tt := range tests {
		_, list := Parse("s.yaml", []byte(tt.yaml))
		if len(list) == 0 || !strings.HasPrefix(list[0].Message, tt.want) || !strings.Contains(list[0].Hint, tt.hint) {
			t.Errorf("Parse(%q) = %v; want a message starting %q with a hint containing %q", tt.yaml, list, tt.want, tt.hint)
		}
		for _, d := range list {
			if strings.Contains(d.Message, "s3cret") || strings.Contains(d.Hint, "s3cret") {
				t.Errorf("a diagnostic quotes an env value: %v", d)
			}
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sandkeep.yaml")
	if err := os.WriteFile(p, []byte("sandbox: {mode: inline, image: debian:12}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, list := Load(p)
	if list.HasErrors() || f.Root != dir || f.Sandbox.Mode != ModeInline {
		t.Fatalf("Load = %+v, %v", f, list)
	}
	for _, p := range []string{filepath.Join(dir, "missing.yaml"), dir} {
		f, list = Load(p)
		if f != nil || len(list) != 1 || list[0].Code != diag.SpecFile || list[0].File != p {
			t.Errorf("Load(%q) = %+v, %v; want one SK100", p, f, list)
		}
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte("sandbox: {}\n"+strings.Repeat("#", MaxFileSize)), 0o600); err != nil {
		t.Fatal(err)
	}
	if f, list = Load(big); f != nil || len(list) != 1 || list[0].Code != diag.SpecFile {
		t.Errorf("Load(big) = %+v, %v; want one SK100", f, list)
	}
}

// TestValidate runs the value checks on specs that did not come from a file: no positions, the field named.
func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		s     Sandbox
		codes []diag.Code
	}{
		{name: "zero", s: Sandbox{}},
		{name: "good", s: Sandbox{Mode: ModeAuto, Image: "debian:12", User: "dev", Env: map[string]string{"A": "multi\nline"},
			Resources: &Resources{CPUs: 2, Memory: "1g", Pids: 100}, Network: &Network{Mode: "open"}}},
		{name: "mode", s: Sandbox{Mode: "on"}, codes: []diag.Code{diag.SpecMode}},
		{name: "network mode", s: Sandbox{Mode: "denylist"}, codes: []diag.Code{diag.SpecNetworkModeMisuse}},
		{name: "image and build", s: Sandbox{Image: "x", Build: &Build{Dockerfile: "Dockerfile"}}, codes: []diag.Code{diag.SpecImageAndBuild}},
		{name: "build no dockerfile", s: Sandbox{Build: &Build{}}, codes: []diag.Code{diag.SpecBuildDockerfile}},
		{name: "build escapes", s: Sandbox{Build: &Build{Dockerfile: "a/../../b", Context: "/"}}, codes: []diag.Code{diag.SpecBuildPath, diag.SpecBuildPath}},
		{name: "workspace", s: Sandbox{WorkspaceFolder: "/a//b"}, codes: []diag.Code{diag.SpecWorkspaceFolder}},
		{name: "control", s: Sandbox{Image: "a\x00b"}, codes: []diag.Code{diag.SpecControlChar}},
		{name: "invalid utf-8", s: Sandbox{Image: "a\xffb"}, codes: []diag.Code{diag.SpecControlChar}},
		{name: "user", s: Sandbox{User: "-x"}, codes: []diag.Code{diag.SpecUser}},
		{name: "user uid too big", s: Sandbox{User: "4294967295"}, codes: []diag.Code{diag.SpecUser}},
		{name: "user leading zero", s: Sandbox{User: "01000:1000"}, codes: []diag.Code{diag.SpecUser}},
		{name: "env", s: Sandbox{Env: map[string]string{"": "x"}}, codes: []diag.Code{diag.SpecEnv}},
		{name: "env nul value", s: Sandbox{Env: map[string]string{"A": "x\x00"}}, codes: []diag.Code{diag.SpecControlChar}},
		{name: "mount", s: Sandbox{Mounts: []string{"type=volume,source=a,target=/b"}}, codes: []diag.Code{diag.SpecMount}},
		{name: "tmpfs", s: Sandbox{Tmpfs: []string{"/x:size=1q"}}, codes: []diag.Code{diag.SpecTmpfs}},
		{name: "tmpfs secrets dir", s: Sandbox{Tmpfs: []string{SecretsDir}}, codes: []diag.Code{diag.SpecTmpfs}},
		{name: "tmpfs over mount", s: Sandbox{Mounts: []string{"source=/usr/share,target=/opt/x"}, Tmpfs: []string{"/opt/x"}}, codes: []diag.Code{diag.SpecTmpfs}},
		{name: "resources", s: Sandbox{Resources: &Resources{CPUs: -1, Memory: "2 g", Pids: -1}}, codes: []diag.Code{diag.SpecResources, diag.SpecResources, diag.SpecResources}},
		{name: "cpus too small", s: Sandbox{Resources: &Resources{CPUs: 1e-12}}, codes: []diag.Code{diag.SpecResources}},
		{name: "post_create", s: Sandbox{PostCreate: "a\u202eb"}, codes: []diag.Code{diag.SpecPostCreate}},
		{name: "host_state", s: Sandbox{HostState: "None"}, codes: []diag.Code{diag.SpecHostState}},
		{name: "secret", s: Sandbox{SecretFiles: []SecretFile{{Name: "a", Path: "/run/secrets", FromFile: "rel"}}}, codes: []diag.Code{diag.SpecSecretFile, diag.SpecSecretFile}},
		{name: "secret nested path", s: Sandbox{SecretFiles: []SecretFile{{Name: "a", Path: "/run/secrets/a", FromEnv: "A"}, {Name: "b", Path: "/run/secrets/a/b", FromEnv: "B"}}}, codes: []diag.Code{diag.SpecSecretFile}},
		{name: "secret mode decimal", s: Sandbox{SecretFiles: []SecretFile{{Name: "a", Path: "/run/secrets/a", FromEnv: "A", Mode: "400"}}}, codes: []diag.Code{diag.SpecSecretFile}},
		{name: "network", s: Sandbox{Network: &Network{Mode: "allow", Rules: []string{"a.*.b"}}}, codes: []diag.Code{diag.SpecNetwork, diag.RuleWildcard}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			list := tt.s.Validate()
			var got []diag.Code
			for _, d := range list {
				got = append(got, d.Code)
				if d.Line != 0 || d.File != "" || d.Message == "" || d.Hint == "" {
					t.Errorf("diagnostic %+v: want no position, a message and a hint", d)
				}
			}
			if !slices.Equal(got, tt.codes) {
				t.Errorf("Validate() codes = %v; want %v\n%v", got, tt.codes, diag.ListError(list))
			}
		})
	}
}

func TestParseSecretMode(t *testing.T) {
	for in, want := range map[string]os.FileMode{"": 0o400, "0400": 0o400, "0o440": 0o440, "0600": 0o600, "0777": 0o777, "00400": 0o400} {
		if got, err := ParseSecretMode(in); err != nil || got != want {
			t.Errorf("ParseSecretMode(%q) = %o, %v; want %o", in, got, err, want)
		}
	}
	for _, in := range []string{"400", "0200", "01777", "0x1ff", "0o", "08"} {
		if got, err := ParseSecretMode(in); err == nil {
			t.Errorf("ParseSecretMode(%q) = %o; want an error", in, got)
		}
	}
}

// TestFilePos: a parsed File says where each field was written, falling back to the enclosing field.
func TestFilePos(t *testing.T) {
	data := []byte("sandbox:\n  user: \"1000\"\n  mounts:\n    - type=bind,source=/nonexistent-sk,target=/opt/x\n  network:\n    mode: allowlist\n    credentials:\n      - {name: A}\n")
	f, list := Parse("sandkeep.yaml", data)
	if f == nil {
		t.Fatalf("parse: %v", diag.ListError(list))
	}
	for _, tc := range []struct {
		name      string
		field     string
		line, col int
	}{
		{"scalar", "sandbox.user", 2, 9},
		{"list item", "sandbox.mounts[0]", 4, 7},
		{"nested", "sandbox.network.mode", 6, 11},
		{"item of nested list", "sandbox.network.credentials[0]", 8, 9},
		{"unset field falls back to its block", "sandbox.network.credentials[0].hosts", 8, 9},
		{"unset top-level field falls back to the sandbox block", "sandbox.image", 2, 3},
		{"not a field", "nothing", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if l, c := f.Pos(tc.field); l != tc.line || c != tc.col {
				t.Errorf("Pos(%q) = %d:%d; want %d:%d", tc.field, l, c, tc.line, tc.col)
			}
		})
	}
	if l, c := (&File{}).Pos("sandbox.user"); l != 0 || c != 0 {
		t.Errorf("a File made by hand has a position: %d:%d", l, c)
	}
}
