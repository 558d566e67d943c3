package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/testutil"
)

// TestComposeCompanion: a compose-based devcontainer.json whose service is the sandbox and whose runServices
// names our static TCP echo server: the sandbox reaches the companion at localhost; seen from the host the
// companion publishes no port (the file's ports: is dropped and reported) and has no network of its own; rm
// removes it with the sandbox.
func TestComposeCompanion(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	data, err := os.ReadFile(testutil.BuildBinary(t, "./test/echoserver", "echoserver", false))
	if err != nil {
		t.Fatal(err)
	}
	image := testutil.ImageWithFiles(t, testutil.TestImage(t), map[string]testutil.ImageFile{"/bin/echoserver": {Data: data, Mode: 0o755}})
	repo, spec := writeRepo(t, map[string]string{
		".devcontainer/devcontainer.json": `{"name": "app with an echo service",
  "dockerComposeFile": ["docker-compose.yml"], "service": "app", "runServices": ["echo"]}`,
		".devcontainer/docker-compose.yml": `services:
  app:
    image: ` + image + `
    command: sleep infinity
    environment: {FROM_COMPOSE: "yes"}
  echo:
    image: ` + image + `
    command: ["/bin/echoserver", "serve", "127.0.0.1:7777"]
    ports: ["7777:7777"]
    privileged: true
    healthcheck:
      test: ["CMD", "/bin/echoserver", "ask", "127.0.0.1:7777", "health"]
      interval: 500ms
      retries: 20
  unused:
    image: ` + image + `
`,
	})
	r := c.run(t, "exec", "--json", "--spec", spec, "--tenant", c.ten("acme"), "--user", "compose", "--",
		"sh", "-c", `/bin/echoserver ask localhost:7777 hello; echo "from compose: $FROM_COMPOSE"`).want(t, 0)
	var res jsonResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("exec --json: %v: %q", err, r.stdout)
	}
	if res.Stdout != "echo: hello\nfrom compose: yes\n" {
		t.Fatalf("sandbox stdout %q (stderr %q, cli stderr %q)", res.Stdout, res.Stderr, r.stderr)
	}
	for _, s := range []string{"ports", "privileged"} {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("the dropped %s is not reported: %q", s, r.stderr)
		}
	}

	cli := testutil.Docker(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := res.Sandbox.Name + "-c-echo"
	in, err := cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatalf("companion %s: %v", name, err)
	}
	hc, ns := in.Container.HostConfig, in.Container.NetworkSettings
	if string(hc.NetworkMode) != "container:"+res.Sandbox.ID || len(hc.PortBindings) != 0 || hc.Privileged ||
		(ns != nil && (len(ns.Ports) != 0 || len(ns.Networks) != 0)) {
		t.Errorf("companion: network %q, port bindings %v, privileged %v, settings %+v: want the sandbox's namespace only", hc.NetworkMode, hc.PortBindings, hc.Privileged, ns)
	}
	if _, err := cli.ContainerInspect(ctx, res.Sandbox.Name+"-c-unused", client.ContainerInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Errorf("a service not in runServices runs: %v", err)
	}

	// A changed companion is a changed posture: the sandbox is recycled, and the companion made again as the file
	// now says (another port).
	compose := ".devcontainer/docker-compose.yml"
	old, err := os.ReadFile(repo + "/" + compose)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(repo+"/"+compose, []byte(strings.ReplaceAll(string(old), "127.0.0.1:7777", "127.0.0.1:7778")), 0o644); err != nil {
		t.Fatal(err)
	}
	r = c.run(t, "exec", "--json", "--spec", spec, "--tenant", c.ten("acme"), "--user", "compose", "--",
		"/bin/echoserver", "ask", "localhost:7778", "again").want(t, 0)
	var res2 jsonResult
	if err := json.Unmarshal([]byte(r.stdout), &res2); err != nil {
		t.Fatalf("exec --json: %v: %q", err, r.stdout)
	}
	if res2.Stdout != "echo: again\n" || res2.Sandbox.ID == res.Sandbox.ID {
		t.Errorf("after the compose change: stdout %q, sandbox %s (was %s): want the companion on 7778 and a recycled sandbox (stderr %q)",
			res2.Stdout, res2.Sandbox.ID, res.Sandbox.ID, r.stderr)
	}

	c.run(t, "rm", "--tenant", c.ten("acme"), "--user", "compose").want(t, 0)
	if _, err := cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Errorf("companion after rm: %v, want removed", err)
	}
}
