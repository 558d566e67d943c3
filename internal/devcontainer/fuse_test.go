package devcontainer

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/spec"
)

func TestDenyClass(t *testing.T) {
	tests := []struct{ name, class string }{
		{"HTTP_PROXY", ClassProxy}, {"https_proxy", ClassProxy}, {"NO_PROXY", ClassProxy}, {"no_proxy", ClassProxy},
		{"ALL_PROXY", ClassProxy}, {"all_proxy", ClassProxy}, {"FTP_PROXY", ClassProxy}, {"Http_Proxy", ClassProxy},
		{"LD_PRELOAD", ClassLoader}, {"LD_LIBRARY_PATH", ClassLoader}, {"LD_AUDIT", ClassLoader}, {"ld_preload", ClassLoader},
		{"DYLD_INSERT_LIBRARIES", ClassLoader},
		{"BASH_ENV", ClassStartup}, {"ENV", ClassStartup}, {"PROMPT_COMMAND", ClassStartup}, {"PYTHONSTARTUP", ClassStartup},
		{"NODE_OPTIONS", ClassStartup},
		{"GITHUB_TOKEN", ClassCredential}, {"GH_TOKEN", ClassCredential}, {"NPM_TOKEN", ClassCredential},
		{"VAULT_TOKEN", ClassCredential}, {"CLIENT_SECRET", ClassCredential}, {"DB_PASSWORD", ClassCredential},
		{"OPENAI_API_KEY", ClassCredential}, {"STRIPE_SECRET_KEY", ClassCredential}, {"AWS_ACCESS_KEY_ID", ClassCredential},
		{"AWS_REGION", ClassCredential}, {"aws_profile", ClassCredential}, {"TOKEN", ClassCredential}, {"API_KEY", ClassCredential},
		{"GOOGLE_APPLICATION_CREDENTIALS", ClassCredential}, {"SSH_AUTH_SOCK", ClassCredential}, {"github_token", ClassCredential},
		{"SSH_PUBLIC_KEY", ""}, {"DEPLOY_PUBLIC_KEY", ""},
		{"PATH", ""}, {"HOME", ""}, {"GOFLAGS", ""}, {"NODE_ENV", ""}, {"PYTHONPATH", ""}, {"LDFLAGS", ""}, {"KEYBOARD", ""},
		{"TOKENIZER", ""}, {"PROXY_PASS_HEADER", ""}, {"ENVIRONMENT", ""}, {"MY_ENV", ""},
	}
	for _, tt := range tests {
		if got := DenyClass(tt.name); got != tt.class {
			t.Errorf("DenyClass(%q) = %q, want %q", tt.name, got, tt.class)
		}
	}
}

func TestFuseEnvDenied(t *testing.T) {
	dc := &Config{Path: "/repo/.devcontainer/devcontainer.json", Image: "debian:12", Env: map[string]string{
		"A": "repo", "B": "repo", "GITHUB_TOKEN": sentinel, "http_proxy": "http://evil:3128/" + sentinel,
		"LD_PRELOAD": "/tmp/" + sentinel + ".so", "NODE_OPTIONS": "--require /tmp/" + sentinel, "AWS_REGION": sentinel,
		"DEPLOY_PUBLIC_KEY": "ssh-ed25519 AAAA", "BASH_ENV": sentinel,
	}}
	sp := &spec.Sandbox{Env: map[string]string{"B": "spec", "GITHUB_TOKEN": "from-the-spec", "HTTPS_PROXY": "http://corp:3128"}}
	ov := &spec.Sandbox{Env: map[string]string{"LD_LIBRARY_PATH": "/opt/operator/lib"}}
	got, events := Fuse(dc, sp, ov)

	wantEnv := map[string]string{
		"A": "repo", "B": "spec", "DEPLOY_PUBLIC_KEY": "ssh-ed25519 AAAA",
		"GITHUB_TOKEN": "from-the-spec", "HTTPS_PROXY": "http://corp:3128", // the spec's own are not stripped
		"LD_LIBRARY_PATH": "/opt/operator/lib", // nor the overlay's
	}
	if !reflect.DeepEqual(got.Env, wantEnv) {
		t.Errorf("env = %v\nwant  %v", got.Env, wantEnv)
	}
	wantEvents := []Event{
		{EventEnvDenied, "AWS_REGION", ClassCredential, SourceDevcontainer, dc.Path},
		{EventEnvDenied, "BASH_ENV", ClassStartup, SourceDevcontainer, dc.Path},
		{EventEnvDenied, "GITHUB_TOKEN", ClassCredential, SourceDevcontainer, dc.Path},
		{EventEnvDenied, "LD_PRELOAD", ClassLoader, SourceDevcontainer, dc.Path},
		{EventEnvDenied, "NODE_OPTIONS", ClassStartup, SourceDevcontainer, dc.Path},
		{EventEnvDenied, "http_proxy", ClassProxy, SourceDevcontainer, dc.Path},
	}
	if !reflect.DeepEqual(events, wantEvents) {
		t.Errorf("events = %+v\nwant     %+v", events, wantEvents)
	}
	b, err := json.Marshal(events)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), sentinel) || strings.Contains(fmt.Sprint(got), sentinel) {
		t.Errorf("a denied value leaked: events %s, sandbox %+v", b, got)
	}
}

// TestFuseRealWorld fuses a real-world file: the credential and proxy its containerEnv asked for never reach
// the sandbox, and the events say so.
func TestFuseRealWorld(t *testing.T) {
	root, err := filepath.Abs("testdata/TestRealWorld/dockerfile-args")
	if err != nil {
		t.Fatal(err)
	}
	dc, list, _ := Load(root, hostEnv("", defaultVars))
	if list.HasErrors() {
		t.Fatal(list)
	}
	got, events := Fuse(dc, &spec.Sandbox{Mode: spec.ModeAuto, User: "1000:1000"}, nil)
	var keys []string
	for _, e := range events {
		keys = append(keys, e.Key)
	}
	if !slices.Equal(keys, []string{"GITHUB_TOKEN", "HTTP_PROXY", "LD_PRELOAD"}) {
		t.Errorf("denied keys = %v", keys)
	}
	if got.User != "1000:1000" || got.Build == nil || got.Build.Dockerfile != ".devcontainer/Dockerfile" || got.Mode != spec.ModeAuto {
		t.Errorf("sandbox = %+v", got)
	}
	if _, ok := got.Env["APP_ENV"]; !ok || len(got.Env) != 3 {
		t.Errorf("env = %v, want APP_ENV, REPO, SSH_PUBLIC_KEY", got.Env)
	}
	if want := "( make deps\n) || exit $?\n( bash -c 'pip install -e '\\''.[dev]'\\'' && npm ci'\n) || exit $?"; got.PostCreate != want {
		t.Errorf("postCreate = %q, want updateContentCommand then postCreateCommand:\n%q", got.PostCreate, want)
	}
}

func TestFuseContainerFields(t *testing.T) {
	specImage := &spec.Sandbox{Image: "debian:12", User: "1000:1000"}
	specBuild := &spec.Sandbox{Build: &spec.Build{Dockerfile: "Dockerfile", Context: "."}}
	repoBuild := &spec.Build{Dockerfile: ".devcontainer/Dockerfile", Context: ".", Args: map[string]string{"V": "1"}}
	tests := []struct {
		name  string
		dc    *Config
		sp    *spec.Sandbox
		image string
		build *spec.Build
		user  string
	}{
		{"repo image over spec image", &Config{Image: "node:20"}, specImage, "node:20", nil, "1000:1000"},
		{"repo image over spec build", &Config{Image: "node:20"}, specBuild, "node:20", nil, ""},
		{"repo build over spec image", &Config{Build: repoBuild}, specImage, "", repoBuild, "1000:1000"},
		{"repo user over spec user", &Config{User: "vscode"}, specImage, "debian:12", nil, "vscode"},
		{"repo sets nothing", &Config{}, specBuild, "", specBuild.Build, ""},
		{"no spec", &Config{Image: "node:20", User: "node"}, nil, "node:20", nil, "node"},
		{"no repo", nil, specImage, "debian:12", nil, "1000:1000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, events := Fuse(tt.dc, tt.sp, nil)
			if got.Image != tt.image || !reflect.DeepEqual(got.Build, tt.build) || got.User != tt.user || len(events) != 0 {
				t.Errorf("got image %q build %+v user %q events %v; want %q %+v %q", got.Image, got.Build, got.User, events, tt.image, tt.build, tt.user)
			}
		})
	}
}

func TestFuseOtherFields(t *testing.T) {
	dc := &Config{Image: "x", PostCreate: "repo-cmd", WorkspaceFolder: "/workspaces/repo",
		Mounts: []string{"type=bind,source=/srv/a,target=/opt/a", "type=bind,source=/srv/b,target=/opt/b"}}
	t.Run("spec wins when set", func(t *testing.T) {
		sp := &spec.Sandbox{PostCreate: "spec-cmd", WorkspaceFolder: "/workspace", Mounts: []string{"type=bind,src=/data,dst=/opt/a"}}
		got, _ := Fuse(dc, sp, nil)
		if got.PostCreate != "spec-cmd" || got.WorkspaceFolder != "/workspace" {
			t.Errorf("got %+v", got)
		}
		want := []string{"type=bind,src=/data,dst=/opt/a", "type=bind,source=/srv/b,target=/opt/b"}
		if !slices.Equal(got.Mounts, want) {
			t.Errorf("mounts = %q, want %q (the spec wins on /opt/a)", got.Mounts, want)
		}
	})
	t.Run("repository fills in", func(t *testing.T) {
		got, _ := Fuse(dc, &spec.Sandbox{}, nil)
		if got.PostCreate != "repo-cmd" || got.WorkspaceFolder != "/workspaces/repo" || !slices.Equal(got.Mounts, dc.Mounts) {
			t.Errorf("got %+v", got)
		}
	})
}

func TestFuseOverlay(t *testing.T) {
	dc := &Config{Image: "repo:1", User: "vscode", Env: map[string]string{"A": "repo", "B": "repo"}, PostCreate: "repo",
		Mounts: []string{"type=bind,source=/srv/a,target=/opt/a"}}
	sp := &spec.Sandbox{Mode: spec.ModeAuto, Env: map[string]string{"B": "spec", "C": "spec"}, Tmpfs: []string{"/cache"},
		Resources: &spec.Resources{CPUs: 2, Memory: "2g", Pids: 512}, HostState: "auto",
		Network:     &spec.Network{Mode: "allowlist", Preset: "default", Rules: []string{"**.github.com"}, Inherit: "append"},
		SecretFiles: []spec.SecretFile{{Name: "npmrc", Path: "/run/secrets/npmrc", FromEnv: "NPM_RC"}}}

	t.Run("empty overlay changes nothing", func(t *testing.T) {
		a, _ := Fuse(dc, sp, nil)
		b, _ := Fuse(dc, sp, &spec.Sandbox{})
		if !reflect.DeepEqual(a, b) {
			t.Errorf("nil overlay %+v\nempty overlay %+v", a, b)
		}
	})
	ov := &spec.Sandbox{Mode: spec.ModeInline, Image: "operator:1", User: "1000:1000", Env: map[string]string{"A": "op", "C": "op"},
		Mounts: []string{}, Resources: &spec.Resources{Memory: "1g"}, PostCreate: "op", WorkspaceFolder: "/op", HostState: "none",
		Network: &spec.Network{Mode: "none"}}
	got, _ := Fuse(dc, sp, ov)
	want := spec.Sandbox{
		Mode: spec.ModeInline, Image: "operator:1", User: "1000:1000",
		Env:    map[string]string{"A": "op", "B": "spec", "C": "op"},
		Mounts: []string{}, Tmpfs: []string{"/cache"},
		Resources:  &spec.Resources{CPUs: 2, Memory: "1g", Pids: 512},
		PostCreate: "op", WorkspaceFolder: "/op", HostState: "none",
		SecretFiles: sp.SecretFiles,
		Network:     &spec.Network{Mode: "none", Preset: "default", Rules: []string{"**.github.com"}, Inherit: "append"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	t.Run("overlay build replaces image", func(t *testing.T) {
		got, _ := Fuse(dc, sp, &spec.Sandbox{Build: &spec.Build{Dockerfile: "ops/Dockerfile", Context: "."}})
		if got.Image != "" || got.Build == nil || got.Build.Dockerfile != "ops/Dockerfile" {
			t.Errorf("got image %q build %+v", got.Image, got.Build)
		}
	})
	t.Run("overlay onto nothing", func(t *testing.T) {
		got, _ := Fuse(nil, nil, &spec.Sandbox{Resources: &spec.Resources{Pids: 64}, Network: &spec.Network{Rules: []string{"a.example"}}})
		if got.Resources == nil || got.Resources.Pids != 64 || got.Network == nil || got.Network.Rules[0] != "a.example" {
			t.Errorf("got %+v", got)
		}
	})
}

// TestFuseDoesNotAlias changes everything Fuse returned and checks its inputs did not move.
func TestFuseDoesNotAlias(t *testing.T) {
	dc := &Config{Build: &spec.Build{Dockerfile: "D", Args: map[string]string{"K": "v"}}, Env: map[string]string{"A": "1"},
		Mounts: []string{"type=bind,source=/a,target=/a"}}
	sp := &spec.Sandbox{Env: map[string]string{"B": "2"}, Mounts: []string{"type=bind,source=/b,target=/b"}, Tmpfs: []string{"/t"},
		Resources: &spec.Resources{CPUs: 1}, Network: &spec.Network{Rules: []string{"r"}}, SecretFiles: []spec.SecretFile{{Name: "s"}}}
	ov := &spec.Sandbox{Env: map[string]string{"C": "3"}, Tmpfs: []string{"/o"}}
	before := fmt.Sprintf("%+v %+v %+v %+v %+v %+v %+v", *dc, *dc.Build, *sp, *sp.Resources, *sp.Network, *ov, ov.Env)

	got, _ := Fuse(dc, sp, ov)
	got.Build.Args["K"] = "changed"
	got.Build.Dockerfile = "changed"
	got.Env["A"], got.Env["B"], got.Env["C"] = "x", "x", "x"
	got.Mounts[0], got.Mounts[1] = "x", "x"
	got.Tmpfs[0] = "x"
	got.Resources.CPUs = 9
	got.Network.Rules[0] = "x"
	got.SecretFiles[0].Name = "x"

	after := fmt.Sprintf("%+v %+v %+v %+v %+v %+v %+v", *dc, *dc.Build, *sp, *sp.Resources, *sp.Network, *ov, ov.Env)
	if before != after || sp.Mounts[0] != "type=bind,source=/b,target=/b" || sp.SecretFiles[0].Name != "s" || dc.Build.Args["K"] != "v" {
		t.Errorf("inputs changed:\nbefore %s\nafter  %s", before, after)
	}
}
