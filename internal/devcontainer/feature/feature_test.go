package feature

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/fault"
)

func TestParseRef(t *testing.T) {
	tests := []struct {
		name, id  string
		want      Ref
		code      fault.Code
		reference string
	}{
		{name: "oci tag", id: "ghcr.io/devcontainers/features/go:1", want: Ref{Registry: "ghcr.io", Repository: "devcontainers/features/go", Tag: "1"}, reference: "ghcr.io/devcontainers/features/go:1"},
		{name: "oci no tag", id: "ghcr.io/devcontainers/features/node", want: Ref{Registry: "ghcr.io", Repository: "devcontainers/features/node", Tag: "latest"}, reference: "ghcr.io/devcontainers/features/node:latest"},
		{name: "oci port", id: "127.0.0.1:5000/f/hello:1.2", want: Ref{Registry: "127.0.0.1:5000", Repository: "f/hello", Tag: "1.2"}},
		{name: "oci digest", id: "ghcr.io/a/b@sha256:" + strings.Repeat("a", 64), want: Ref{Registry: "ghcr.io", Repository: "a/b", Digest: "sha256:" + strings.Repeat("a", 64)}},
		{name: "local", id: "./hello", want: Ref{Local: ".devcontainer/hello"}},
		{name: "local nested", id: "./features/a/../b", want: Ref{Local: ".devcontainer/features/b"}},
		{name: "local escapes", id: "../hello", code: fault.FeatureInvalid},
		{name: "local dot", id: "./", code: fault.FeatureInvalid},
		{name: "url", id: "https://example.invalid/f.tgz", code: fault.FeatureInvalid},
		{name: "short form", id: "devcontainers/features/go", code: fault.FeatureInvalid},
		{name: "upper repo", id: "ghcr.io/Owner/go:1", code: fault.FeatureInvalid},
		{name: "bad digest", id: "ghcr.io/a/b@sha256:zz", code: fault.FeatureInvalid},
		{name: "space", id: "ghcr.io/a/b :1", code: fault.FeatureInvalid},
		{name: "empty", id: "", code: fault.FeatureInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRef(tt.id, ".devcontainer")
			if tt.code != "" {
				if fault.CodeOf(err) != tt.code {
					t.Fatalf("err = %v, want %s", err, tt.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.want.ID = tt.id
			if got != tt.want {
				t.Errorf("ref = %+v, want %+v", got, tt.want)
			}
			if tt.reference != "" && got.Reference() != tt.reference {
				t.Errorf("reference = %q, want %q", got.Reference(), tt.reference)
			}
		})
	}
}

func TestEnvName(t *testing.T) {
	for in, want := range map[string]string{
		"version": "VERSION", "installTools": "INSTALLTOOLS", "go-version": "GO_VERSION", "1abc": "_ABC",
		"__x": "_X", "a.b": "A_B", "9": "", "é": "_",
	} {
		if got := EnvName(in); got != want && !(want == "_" && got == "") {
			t.Errorf("EnvName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseMetadata(t *testing.T) {
	good := `{"id": "hello", "version": "1.0.0", "options": {"greeting": {"type": "string", "default": "hi"},
		"loud": {"type": "boolean", "default": false}, "flavour": {"type": "string", "enum": ["a", "b"], "default": "a"}}}`
	m, err := ParseMetadata("./hello", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Options) != 3 {
		t.Fatalf("options = %v", m.Options)
	}
	for name, src := range map[string]string{
		"no id":         `{"version": "1"}`,
		"bad id":        `{"id": "a/b", "version": "1"}`,
		"no version":    `{"id": "a"}`,
		"bad type":      `{"id": "a", "version": "1", "options": {"x": {"type": "number"}}}`,
		"bad default":   `{"id": "a", "version": "1", "options": {"x": {"type": "boolean", "default": "yes"}}}`,
		"enum default":  `{"id": "a", "version": "1", "options": {"x": {"type": "string", "enum": ["a"], "default": "b"}}}`,
		"same env name": `{"id": "a", "version": "1", "options": {"a-b": {"type": "string"}, "a_b": {"type": "string"}}}`,
		"trailing":      `{"id": "a", "version": "1"} {}`,
		"not json":      `{"id": `,
	} {
		if _, err := ParseMetadata("./x", []byte(src)); fault.CodeOf(err) != fault.FeatureInvalid {
			t.Errorf("%s: err = %v, want FEATURE_INVALID", name, err)
		}
	}
}

// repoWith writes files under a temporary repository root.
func repoWith(t *testing.T, files map[string]string) *os.Root {
	t.Helper()
	dir := t.TempDir()
	for p, body := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(p, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(full, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return root
}

func meta(id string, extra string) string {
	return `{"id": "` + id + `", "version": "1.0.0"` + extra + `}`
}

func TestResolveLocal(t *testing.T) {
	repo := repoWith(t, map[string]string{
		".devcontainer/a/devcontainer-feature.json": meta("a", `, "options": {"greeting": {"type": "string", "default": "hi"}, "loud": {"type": "boolean", "default": true}}, "installsAfter": ["./b"]`),
		".devcontainer/a/install.sh":                "#!/bin/sh\n",
		".devcontainer/b/devcontainer-feature.json": meta("b", `, "options": {"version": {"type": "string", "default": "latest"}}`),
		".devcontainer/b/install.sh":                "#!/bin/sh\n",
		".devcontainer/b/lib/data.txt":              "x",
	})
	src := Source{Repo: repo, DcDir: ".devcontainer"}
	fs, err := Resolve(context.Background(), src, []Requested{
		{ID: "./a", Options: json.RawMessage(`{"greeting": "hello 'world'"}`)},
		{ID: "./b", Options: json.RawMessage(`"1.22"`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 2 || fs[0].Ref.ID != "./b" || fs[1].Ref.ID != "./a" {
		t.Fatalf("order = %v, want ./b (installsAfter) then ./a", ids(fs))
	}
	if fs[0].Options["VERSION"] != "1.22" {
		t.Errorf("b options = %v, want VERSION=1.22 from the string form", fs[0].Options)
	}
	if want := map[string]string{"GREETING": "hello 'world'", "LOUD": "true"}; !mapsEqual(fs[1].Options, want) {
		t.Errorf("a options = %v, want %v", fs[1].Options, want)
	}
	if !slices.ContainsFunc(fs[0].Files, func(f File) bool { return f.Path == "lib/data.txt" }) {
		t.Errorf("b files = %v", fs[0].Files)
	}
	if got := string(envFile(fs[1].Options)); got != "GREETING='hello '\\''world'\\'''\nLOUD='true'\n" {
		t.Errorf("env file = %q", got)
	}

	for name, req := range map[string]Requested{
		"undeclared option": {ID: "./a", Options: json.RawMessage(`{"colour": "red"}`)},
		"wrong type":        {ID: "./a", Options: json.RawMessage(`{"loud": "maybe"}`)},
		"missing dir":       {ID: "./nope"},
		"array options":     {ID: "./a", Options: json.RawMessage(`[1]`)},
	} {
		if _, err := Resolve(context.Background(), src, []Requested{req}); fault.CodeOf(err) != fault.FeatureInvalid {
			t.Errorf("%s: err = %v, want FEATURE_INVALID", name, err)
		}
	}
	if _, err := Resolve(context.Background(), src, []Requested{{ID: "ghcr.io/devcontainers/features/go:1"}}); fault.CodeOf(err) != fault.FeatureUnavailable ||
		!strings.Contains(err.Error(), "ghcr.io/devcontainers/features/go:1") || !strings.Contains(err.Error(), "ghcr.io") {
		t.Errorf("OCI without a fetcher: err = %v, want FEATURE_UNAVAILABLE naming the feature and the registry", err)
	}
}

func TestResolveRefusesSymlink(t *testing.T) {
	repo := repoWith(t, map[string]string{
		".devcontainer/a/devcontainer-feature.json": meta("a", ""),
		".devcontainer/a/install.sh":                "#!/bin/sh\n",
	})
	if err := os.Symlink("/etc/shadow", filepath.Join(repo.Name(), ".devcontainer/a/secret")); err != nil {
		t.Fatal(err)
	}
	_, err := Resolve(context.Background(), Source{Repo: repo, DcDir: ".devcontainer"}, []Requested{{ID: "./a"}})
	if fault.CodeOf(err) != fault.FeatureInvalid {
		t.Fatalf("err = %v, want FEATURE_INVALID for a symlink", err)
	}
}

func TestOrderCycle(t *testing.T) {
	a := &Feature{Ref: Ref{ID: "./a", Local: "d/a"}, Meta: &Metadata{InstallsAfter: []string{"./b"}}}
	b := &Feature{Ref: Ref{ID: "./b", Local: "d/b"}, Meta: &Metadata{InstallsAfter: []string{"./a"}}}
	if _, err := Order([]*Feature{a, b}, "d"); fault.CodeOf(err) != fault.FeatureInvalid {
		t.Fatalf("err = %v, want FEATURE_INVALID for a cycle", err)
	}
}

func TestScreen(t *testing.T) {
	yes := true
	f := &Feature{Ref: Ref{ID: "ghcr.io/x/dind:1"}, Meta: &Metadata{
		Privileged: &yes, CapAdd: []string{"SYS_PTRACE"}, SecurityOpt: []string{"seccomp=unconfined"}, Entrypoint: "/usr/local/share/docker-init.sh",
		Init:         &yes,
		ContainerEnv: map[string]string{"PATH": "/usr/local/go/bin:${PATH}", "LD_PRELOAD": "/evil.so", "GOPATH": "/go"},
		Mounts: []json.RawMessage{
			json.RawMessage(`{"source": "dind-var-lib-docker", "target": "/var/lib/docker", "type": "volume"}`),
			json.RawMessage(`"source=/var/run/docker.sock,target=/var/run/docker.sock,type=bind"`),
			json.RawMessage(`"source=/tmp,target=/hostdata,type=bind"`),
			json.RawMessage(`"source=cache-${devcontainerId},target=/home/cache,type=volume,volume-driver=nfs"`),
			json.RawMessage(`{"type": "tmpfs", "target": "/scratch"}`),
			json.RawMessage(`"type=volume,source=ws,target=/workspaces/app"`),
		},
		PostCreateCommand: json.RawMessage(`"echo hi"`),
	}}
	p := Screen([]*Feature{f}, Scope{Workspace: "/workspaces/app"})
	fields := make([]string, 0, len(p.Dropped))
	for _, d := range p.Dropped {
		fields = append(fields, d.Field)
		if d.Why == "" || d.Feature != f.Ref.ID {
			t.Errorf("drop %+v has no reason or no feature", d)
		}
	}
	slices.Sort(fields)
	want := []string{"capAdd", "containerEnv.LD_PRELOAD", "entrypoint", "init", "mounts[1]", "mounts[2]", "mounts[3]", "mounts[5]", "postCreateCommand", "privileged", "securityOpt"}
	if !slices.Equal(fields, want) {
		t.Errorf("dropped = %v, want %v", fields, want)
	}
	if p.Env["PATH"] != "/usr/local/go/bin:${PATH}" || p.Env["GOPATH"] != "/go" || p.Env["LD_PRELOAD"] != "" {
		t.Errorf("env = %v", p.Env)
	}
	if len(p.Volumes) != 2 || p.Volumes[0] != (devcontainer.Volume{Name: "dind-var-lib-docker", Target: "/var/lib/docker"}) ||
		!strings.HasPrefix(p.Volumes[1].Name, "cache-") || len(p.Volumes[1].Name) != len("cache-")+26 || p.Volumes[1].Target != "/home/cache" {
		t.Errorf("volumes = %+v, want the dind volume and cache-${devcontainerId} (its driver dropped)", p.Volumes)
	}
	if !slices.Equal(p.Tmpfs, []string{"/scratch"}) {
		t.Errorf("tmpfs = %v", p.Tmpfs)
	}
	for _, d := range p.Dropped {
		if d.Field == "mounts[2]" && !strings.Contains(d.Why, "host path") {
			t.Errorf("a feature's bind that the guard allows is dropped for %q, want: a feature may not bind a host path", d.Why)
		}
	}
	df := Dockerfile(Request{Base: "base:1", BaseID: "sha256:abc"}, p)
	for _, line := range []string{"FROM base:1\n", `LABEL io.sandkeep.feature-base="sha256:abc"`, "USER root\n", "COPY features/0/ /tmp/sandkeep-features/0/\n",
		`ENV GOPATH="/go" PATH="/usr/local/go/bin:${PATH}"`} {
		if !strings.Contains(df, line) {
			t.Errorf("Dockerfile lacks %q:\n%s", line, df)
		}
	}
	if strings.Contains(df, "LD_PRELOAD") {
		t.Errorf("Dockerfile sets a dropped variable:\n%s", df)
	}
}

func ids(fs []*Feature) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Ref.ID)
	}
	return out
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
