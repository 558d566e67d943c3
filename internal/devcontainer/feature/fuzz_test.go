package feature

import (
	"archive/tar"
	"bytes"
	"slices"
	"strings"
	"testing"
)

// FuzzParseMetadata: any bytes give a Metadata or a FEATURE_INVALID error, never a panic; a parsed one has
// options whose environment names are usable.
func FuzzParseMetadata(f *testing.F) {
	f.Add([]byte(`{"id": "go", "version": "1.3.0", "options": {"version": {"type": "string", "default": "latest", "proposals": ["1.22"]}}, "containerEnv": {"PATH": "/usr/local/go/bin:${PATH}"}, "installsAfter": ["ghcr.io/devcontainers/features/common-utils"]}`))
	f.Add([]byte(`{"id": "docker-in-docker", "version": "2", "privileged": true, "entrypoint": "/x", "mounts": [{"source": "v", "target": "/var/lib/docker", "type": "volume"}]}`))
	f.Add([]byte(`{"id": "a", "version": "1", "options": {"b": {"type": "boolean", "default": true}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseMetadata("fuzz", data)
		if err != nil {
			return
		}
		for name := range m.Options {
			if n := EnvName(name); n == "" || strings.ContainsAny(n, "= \n") {
				t.Fatalf("option %q gives env name %q", name, n)
			}
		}
		_ = Screen([]*Feature{{Ref: Ref{ID: "fuzz"}, Meta: m}}, Scope{})
	})
}

// FuzzParseRef: a parsed local feature stays inside the devcontainer folder; an OCI one has a registry and a
// tag or a digest.
func FuzzParseRef(f *testing.F) {
	for _, s := range []string{"./a", "../a", "ghcr.io/devcontainers/features/go:1", "localhost:5000/a/b@sha256:" + strings.Repeat("0", 64), "a/b", "./a/../../b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		r, err := ParseRef(id, ".devcontainer")
		if err != nil {
			return
		}
		if r.IsLocal() {
			if !strings.HasPrefix(r.Local, ".devcontainer/") || slices.Contains(strings.Split(r.Local, "/"), "..") {
				t.Fatalf("%q resolved to %q", id, r.Local)
			}
			return
		}
		if r.Registry == "" || r.Repository == "" || (r.Tag == "") == (r.Digest == "") {
			t.Fatalf("%q parsed to %+v", id, r)
		}
	})
}

// FuzzUntar: whatever the layer, files come back with clean, local names.
func FuzzUntar(f *testing.F) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "./install.sh", Mode: 0o755, Size: 2, Typeflag: tar.TypeReg})
	tw.Write([]byte("#!"))
	tw.WriteHeader(&tar.Header{Name: "../../etc/passwd", Mode: 0o644, Size: 0, Typeflag: tar.TypeReg})
	tw.Close()
	f.Add(b.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		files, err := untar(bytes.NewReader(data), nil)
		if err != nil {
			return
		}
		for _, fl := range files {
			if fl.Path == "" || strings.HasPrefix(fl.Path, "/") || strings.Contains("/"+fl.Path+"/", "/../") {
				t.Fatalf("untar gave %q", fl.Path)
			}
		}
	})
}
