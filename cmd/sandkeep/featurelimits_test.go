package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/testutil"
)

// featureLimitsInstall is an install.sh that records, in a file baked into the derived image, what it runs
// under: its nofile and core ulimits, its seccomp mode and no-new-privileges (/proc/self/status), its pids
// cgroup, and how many of 700 long-lived background processes it could start. Then it kills them (kill -1: every
// process but itself and the step's PID 1, a builtin, since nothing can fork at the bound) and waits a moment,
// without forking, for PID 1 to reap them, so the build's next steps can fork again.
func featureLimitsInstall(nonce string) string {
	return `#!/bin/sh
set -e
out=/usr/local/share/limits.txt
mkdir -p /usr/local/share
mkfifo /tmp/wait
{
  echo "nonce=` + nonce + `"
  echo "nofile=$(ulimit -n) core=$(ulimit -c)"
  grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status
  echo "cgroup=$(grep pids /proc/self/cgroup | cut -d: -f3)"
} > $out
( n=0; while [ $n -lt 700 ]; do sleep 120 & n=$((n+1)); done; echo "spawned=$n" ) >> $out 2>&1 || true
kill -9 -1 2>/dev/null || true
read -t 2 x <> /tmp/wait || true
echo "done" >> $out
`
}

// TestFeatureBuildLimits: a repository feature's install.sh runs under the build's limits, read from inside
// it: the sandbox's nofile 8192 and core 0 ulimits, a seccomp filter (mode 2; the engine's default profile,
// since the engine takes no seccomp option for a build: doctor's SK410), inside the build's own pids cgroup
// (sandkeep-build/...), whose bound of 512 stops 700 background processes at "can't fork" (issue 22, finding 3:
// builds ran without a pids limit; the RUN-step side is TestBuildLimits and TestBuildPidsLimited).
func TestFeatureBuildLimits(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	nonce := fmt.Sprint(time.Now().UnixNano())
	_, spec := writeRepo(t, map[string]string{
		".devcontainer/devcontainer.json":                `{"image": "` + testutil.TestImage(t) + `", "features": {"./limits": {}}}`,
		".devcontainer/limits/devcontainer-feature.json": `{"id": "limits", "version": "1.0.0"}`,
		".devcontainer/limits/install.sh":                featureLimitsInstall(nonce),
	})
	r := c.run(t, "exec", "--spec", spec, "--tenant", c.ten("acme"), "--user", "limits", "--", "cat", "/usr/local/share/limits.txt").want(t, 0)
	image, _ := featuresEvent(t, c)
	t.Cleanup(func() { testutil.RemoveImage(t, image) })
	got := r.stdout
	t.Logf("install.sh's record:\n%s", got)
	for _, want := range []string{"nonce=" + nonce + "\n", "nofile=8192 core=0\n", "Seccomp:\t2\n", "\ndone\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("install.sh's limits lack %q:\n%s", want, got)
		}
	}
	if !regexp.MustCompile(`(?m)^cgroup=/sandkeep-build/[0-9a-f]+/`).MatchString(got) {
		t.Errorf("install.sh did not run in the build's pids cgroup:\n%s", got)
	}
	if strings.Contains(got, "spawned=700") || !strings.Contains(got, "can't fork") {
		t.Errorf("install.sh started 700 processes, or stopped for another reason than fork:\n%s", got)
	}
}
