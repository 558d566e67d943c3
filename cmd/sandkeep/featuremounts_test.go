package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestFeatureMounts: a local feature's metadata mounts go through devcontainer.json's screening: its named
// volume (with ${devcontainerId}) is a per-key volume the sandbox user writes, kept across `stop` and gone with
// `rm`; its tmpfs is made; its host bind is dropped and reported, never made. Its containerEnv reaches the
// sandbox, and remoteEnv's ${containerEnv:...} sees it (the derived image's ENV).
func TestFeatureMounts(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	nonce := fmt.Sprint(time.Now().UnixNano())
	_, spec := writeRepo(t, map[string]string{
		".devcontainer/devcontainer.json": `{
  "image": "` + testutil.TestImage(t) + `",
  "features": {"./cache": {}},
  "remoteEnv": {"CACHE_SEEN": "${containerEnv:CACHE_DIR}/x"}
}`,
		".devcontainer/cache/devcontainer-feature.json": `{"id": "cache", "version": "0.1.0",
  "containerEnv": {"CACHE_DIR": "/home/cache"},
  "mounts": [
    {"source": "feature-cache-${devcontainerId}", "target": "/home/cache", "type": "volume"},
    "type=tmpfs,target=/scratch",
    "source=/etc,target=/hostetc,type=bind"
  ]}`,
		".devcontainer/cache/install.sh": "#!/bin/sh\necho " + nonce + " > /etc/cache-feature\n",
	})
	exec := func(script string) result {
		return c.run(t, "exec", "--spec", spec, "--tenant", c.ten("acme"), "--user", "fm", "--", "sh", "-c", script)
	}
	r := exec(`echo kept > "$CACHE_DIR/file"; echo "$CACHE_SEEN"; grep -E ' /(home/cache|scratch|hostetc) ' /proc/mounts | cut -d' ' -f2,3 | sort; test -e /hostetc && echo HOSTETC || true`).want(t, 0)
	if !strings.HasPrefix(r.stdout, "/home/cache/x\n") || !strings.Contains(r.stdout, "/home/cache ") ||
		!strings.Contains(r.stdout, "/scratch tmpfs") || strings.Contains(r.stdout, "hostetc") || strings.Contains(r.stdout, "HOSTETC") {
		t.Fatalf("stdout %q: want CACHE_SEEN /home/cache/x, /home/cache and a /scratch tmpfs mounted, no /hostetc (stderr %q)", r.stdout, r.stderr)
	}
	image, payload := featuresEvent(t, c)
	t.Cleanup(func() { testutil.RemoveImage(t, image) })
	if !strings.Contains(payload, "mounts[2]") || !strings.Contains(r.stderr, "mounts[2]") {
		t.Errorf("the feature's bind is not reported as dropped: event %s, stderr %q", payload, r.stderr)
	}

	c.run(t, "stop", "--tenant", c.ten("acme"), "--user", "fm").want(t, 0)
	if r := exec(`cat /home/cache/file`).want(t, 0); r.stdout != "kept\n" {
		t.Errorf("after stop the feature's volume holds %q, want kept", r.stdout)
	}
	c.run(t, "rm", "--tenant", c.ten("acme"), "--user", "fm").want(t, 0)
	if r := exec(`cat /home/cache/file 2>/dev/null || echo gone`).want(t, 0); r.stdout != "gone\n" {
		t.Errorf("after rm the feature's volume holds %q, want it removed with the sandbox", r.stdout)
	}
}
