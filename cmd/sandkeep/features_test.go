package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/testutil"
	"github.com/sandkeep/sandkeep/internal/testutil/ocireg"
)

// featureInstall is an install.sh that installs a tool (a shell script) the way a real feature installs a
// binary: as root, into /usr/local/bin, shaped by its options. It writes a nonce into the tool so an image left
// by an earlier run is never a cache hit here.
func featureInstall(nonce string) string {
	return `#!/bin/sh
set -e
[ "$(id -u)" = 0 ] || { echo "install.sh is not root" >&2; exit 1; }
mkdir -p /usr/local/bin
printf '#!/bin/sh\necho "%s from %s for %s (` + nonce + `)"\n' "$GREETING" "$FLAVOUR" "$_REMOTE_USER" > /usr/local/bin/hello
chmod 755 /usr/local/bin/hello
`
}

const featureMeta = `{"id": "hello", "version": "1.2.0",
  "options": {"greeting": {"type": "string", "default": "hi"}, "flavour": {"type": "string", "default": "vanilla"}},
  "containerEnv": {"HELLO_HOME": "/opt/hello", "LD_PRELOAD": "/evil.so"},
  "privileged": true, "capAdd": ["SYS_PTRACE"]}`

// writeRepo writes files under a new repository and returns it with the spec's path.
func writeRepo(t *testing.T, files map[string]string) (repo, spec string) {
	t.Helper()
	repo = t.TempDir()
	files["sandkeep.yaml"] = "sandbox:\n  mode: inline\n"
	for name, body := range files {
		p := filepath.Join(repo, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	return repo, filepath.Join(repo, "sandkeep.yaml")
}

// featuresEvent returns the run's sandbox_features_installed payload.
func featuresEvent(t *testing.T, c *cli) (image string, payload string) {
	t.Helper()
	_, evs := c.lastRun(t)
	for _, e := range evs {
		if e.Name == "sandbox_features_installed" {
			var p struct{ Image string }
			json.Unmarshal(e.Payload, &p)
			return p.Image, string(e.Payload)
		}
	}
	t.Fatalf("no sandbox_features_installed event: %v", names(evs))
	return "", ""
}

// TestLocalFeature: a local feature ("./hello" beside devcontainer.json) is installed into a derived image by
// running its install.sh as root at build time with its options as environment; a command then runs the tool
// it installed. Its containerEnv reaches the sandbox except the deny class; its privileged and capAdd are
// dropped and reported; the derived image is reused for the same inputs.
func TestLocalFeature(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	nonce := fmt.Sprint(time.Now().UnixNano())
	_, spec := writeRepo(t, map[string]string{
		".devcontainer/devcontainer.json": `{
  "image": "` + testutil.TestImage(t) + `",
  // a tool from a feature of the repository's own
  "features": {"./hello": {"greeting": "hello"}},
}`,
		".devcontainer/hello/devcontainer-feature.json": featureMeta,
		".devcontainer/hello/install.sh":                featureInstall(nonce),
	})
	r := c.run(t, "exec", "--spec", spec, "--tenant", c.ten("acme"), "--user", "dev", "--",
		"sh", "-c", `/usr/local/bin/hello; echo "home=$HELLO_HOME preload=${LD_PRELOAD:-unset}"; grep CapEff /proc/self/status`).want(t, 0)
	want := "hello from vanilla for root (" + nonce + ")\nhome=/opt/hello preload=unset\nCapEff:\t0000000000000000\n"
	if r.stdout != want {
		t.Fatalf("stdout %q, want %q (stderr %q)", r.stdout, want, r.stderr)
	}
	image, payload := featuresEvent(t, c)
	t.Cleanup(func() { testutil.RemoveImage(t, image) })
	for _, s := range []string{`"./hello"`, `"1.2.0"`, "privileged", "SYS_PTRACE", "LD_PRELOAD"} {
		if !strings.Contains(payload, s) {
			t.Errorf("sandbox_features_installed lacks %s: %s", s, payload)
		}
	}
	if !strings.Contains(r.stderr, "privileged") {
		t.Errorf("the dropped privileged is not reported on stderr: %q", r.stderr)
	}

	// The same base, feature and options: the same image, no second build.
	c.run(t, "rm", "--tenant", c.ten("acme"), "--user", "dev").want(t, 0)
	r = c.run(t, "exec", "--spec", spec, "--tenant", c.ten("acme"), "--user", "dev", "--", "/usr/local/bin/hello").want(t, 0)
	if again, _ := featuresEvent(t, c); again != image || !strings.Contains(r.stderr, "already built") {
		t.Errorf("second install: image %s (first %s), stderr %q: want the cached image", again, image, r.stderr)
	}
}

// TestOCIFeature: a feature pushed to a registry on 127.0.0.1 (distribution, in this test process) and named
// by devcontainer.json is fetched, installed, and its tool runs; a registry that is not there fails the run as
// FEATURE_UNAVAILABLE naming the feature and the registry.
func TestOCIFeature(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	host := ocireg.Registry(t)
	// The registry is on loopback, which a repository's feature may name only when the operator allowlists it
	// (feature_registries: issue 22, finding 6); the operator's config is read in-process, not by the daemon.
	operator := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
	if err := os.WriteFile(operator, []byte("feature_registries: ["+host+", \"127.0.0.1:1\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.env = append(c.env, "SANDKEEP_DAEMON=off", "SANDKEEP_CONFIG="+operator)
	nonce := fmt.Sprint(time.Now().UnixNano())
	id := host + "/devcontainers/features/hello:1"
	ocireg.PushFeature(t, id, map[string]string{
		"devcontainer-feature.json": featureMeta,
		"install.sh":                featureInstall(nonce),
	})
	_, spec := writeRepo(t, map[string]string{
		".devcontainer/devcontainer.json": `{"image": "` + testutil.TestImage(t) + `",
  "features": {"` + id + `": {"flavour": "oci"}}}`,
	})
	r := c.run(t, "exec", "--spec", spec, "--tenant", c.ten("acme"), "--user", "oci", "--", "/usr/local/bin/hello").want(t, 0)
	if want := "hi from oci for root (" + nonce + ")\n"; r.stdout != want {
		t.Fatalf("stdout %q, want %q (stderr %q)", r.stdout, want, r.stderr)
	}
	image, payload := featuresEvent(t, c)
	t.Cleanup(func() { testutil.RemoveImage(t, image) })
	if !strings.Contains(payload, `"digest":"sha256:`) {
		t.Errorf("no manifest digest recorded: %s", payload)
	}

	_, gone := writeRepo(t, map[string]string{
		".devcontainer/devcontainer.json": `{"image": "` + testutil.TestImage(t) + `", "features": {"127.0.0.1:1/features/go:1": {}}}`,
	})
	r = c.run(t, "exec", "--spec", gone, "--tenant", c.ten("acme"), "--user", "gone", "--", "true").wantFailure(t, "FEATURE_UNAVAILABLE")
	if !strings.Contains(r.stderr, "127.0.0.1:1/features/go:1") || !strings.Contains(r.stderr, "registry 127.0.0.1:1") {
		t.Errorf("the failure does not name the feature and the registry: %q", r.stderr)
	}

	// A loopback registry the operator did not list is refused before it is dialled.
	_, unlisted := writeRepo(t, map[string]string{
		".devcontainer/devcontainer.json": `{"image": "` + testutil.TestImage(t) + `", "features": {"127.0.0.1:2/features/go:1": {}}}`,
	})
	r = c.run(t, "exec", "--spec", unlisted, "--tenant", c.ten("acme"), "--user", "gone", "--", "true").wantFailure(t, "FEATURE_UNAVAILABLE")
	if !strings.Contains(r.stderr, "does not connect to") || !strings.Contains(r.stderr, "feature_registries") {
		t.Errorf("an unlisted loopback registry: %q", r.stderr)
	}
}
