package main

import (
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestContainerEnvExpanded: devcontainer.json's remoteEnv "PATH": "${containerEnv:PATH}:/extra" gets the PATH the
// image's ENV sets (read from the image the run built), and a lifecycle command's ${containerEnv:...} sees
// containerEnv over the image's ENV, as the devcontainers CLI substitutes them from the created container.
func TestContainerEnvExpanded(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	_, spec := writeRepo(t, map[string]string{
		".devcontainer/Dockerfile": "FROM " + testutil.TestImage(t) + "\nENV PATH=/opt/tool/bin:/usr/bin:/bin GREETING=image SHADE=image\n",
		".devcontainer/devcontainer.json": `{
  "build": {"dockerfile": "Dockerfile"},
  "containerEnv": {"SHADE": "file"},
  "remoteEnv": {"PATH": "${containerEnv:PATH}:/extra", "SEEN": "${containerEnv:GREETING}/${containerEnv:SHADE}/${containerEnv:NOPE:none}"},
  "postCreateCommand": ["sh", "-c", "echo \"$0\" > /tmp/post", "${containerEnv:PATH}"]
}`,
	})
	r := c.run(t, "exec", "--spec", spec, "--tenant", c.ten("acme"), "--user", "cenv", "--",
		"sh", "-c", `echo "$PATH"; echo "$SEEN"; cat /tmp/post`).want(t, 0)
	want := "/opt/tool/bin:/usr/bin:/bin:/extra\nimage/file/none\n/opt/tool/bin:/usr/bin:/bin\n"
	if r.stdout != want {
		t.Fatalf("stdout %q, want %q (stderr %q)", r.stdout, want, r.stderr)
	}
	if strings.Contains(r.stderr, "SK204") {
		t.Errorf("a ${containerEnv:...} warning for an expanded reference: %q", r.stderr)
	}
}
