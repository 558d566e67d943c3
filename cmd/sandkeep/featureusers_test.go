package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestFeatureUsers: install.sh gets _REMOTE_USER, _CONTAINER_USER and their homes as the devcontainers CLI sets
// them: _CONTAINER_USER is containerUser, else the base image's USER; _REMOTE_USER is remoteUser, else
// _CONTAINER_USER; each home is the user's passwd entry in the base image.
func TestFeatureUsers(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	nonce := fmt.Sprint(time.Now().UnixNano())
	_, spec := writeRepo(t, map[string]string{
		".devcontainer/Dockerfile": "FROM " + testutil.TestImage(t) + "\n" +
			"RUN echo 'vscode:x:1000:1000::/home/vscode:/bin/sh' >> /etc/passwd && echo 'builder:x:1001:1001::/srv/builder:/bin/sh' >> /etc/passwd\n" +
			"USER builder\n",
		".devcontainer/devcontainer.json": `{
  "build": {"dockerfile": "Dockerfile"},
  "remoteUser": "vscode",
  "features": {"./who": {}}
}`,
		".devcontainer/who/devcontainer-feature.json": `{"id": "who", "version": "1.0.0"}`,
		".devcontainer/who/install.sh": "#!/bin/sh\nset -e\necho " + nonce + " > /dev/null\n" +
			`printf 'remote=%s home=%s\ncontainer=%s home=%s\n' "$_REMOTE_USER" "$_REMOTE_USER_HOME" "$_CONTAINER_USER" "$_CONTAINER_USER_HOME" > /etc/feature-users` + "\n",
	})
	r := c.run(t, "exec", "--spec", spec, "--tenant", c.ten("acme"), "--user", "who", "--", "cat", "/etc/feature-users").want(t, 0)
	image, _ := featuresEvent(t, c)
	t.Cleanup(func() { testutil.RemoveImage(t, image) })
	if want := "remote=vscode home=/home/vscode\ncontainer=builder home=/srv/builder\n"; r.stdout != want {
		t.Fatalf("install.sh saw %q, want %q (stderr %q)", r.stdout, want, r.stderr)
	}
	if strings.Contains(r.stderr, "SK2") && strings.Contains(r.stderr, "error") {
		t.Errorf("stderr %q", r.stderr)
	}
}
