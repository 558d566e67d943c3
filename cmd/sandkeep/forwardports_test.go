package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"

	sdk "github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// freePort is a local TCP port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// forwardRepo writes a repository whose devcontainer.json has the probe image and forwardPorts, and returns its
// sandkeep.yaml.
func forwardRepo(t *testing.T, image, forwardPorts string) string {
	t.Helper()
	repo := t.TempDir()
	if err := os.MkdirAll(filepath.Join(repo, ".devcontainer"), 0o755); err != nil {
		t.Fatal(err)
	}
	dc := `{"image": "` + image + `"` // a comment and a trailing comma, as real files write them
	if forwardPorts != "" {
		dc += ",\n  // the app's dev server\n  \"forwardPorts\": " + forwardPorts + ",\n"
	}
	if err := os.WriteFile(filepath.Join(repo, ".devcontainer", "devcontainer.json"), []byte(dc+"}"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(repo, "sandkeep.yaml")
	if err := os.WriteFile(spec, []byte("sandbox:\n  mode: inline\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return spec
}

// TestPortForwardDevcontainer: `sandkeep port-forward` with no port forwards devcontainer.json's forwardPorts,
// each on its own local port on 127.0.0.1, printing one kubectl-style line each; our HTTP server, started by a
// command inside the sandbox on that port, is reached from the host; an entry naming another host is not
// forwarded and says why; the sandbox still has no route out. A busy local port is LOCAL_PORT_IN_USE with a
// LOCAL:PORT hint and nothing forwarded; a file with no forwardPorts is a usage error saying so.
func TestPortForwardDevcontainer(t *testing.T) {
	c := newCLI(t)
	image := testutil.ProbeImage(t)
	c.env = append(c.env, "SANDKEEP_IMAGE="+image)
	if _, err := c.exec(t.Context(), nil, nil, "daemon", "stop"); err != nil { // as in TestPortForward: the probe image's daemon
		t.Fatal(err)
	}
	tenant := c.ten("fwdports")
	n := freePort(t)
	spec := forwardRepo(t, image, fmt.Sprintf(`[%d, "api.example.com:443"]`, n))
	who := []string{"--tenant", tenant, "--user", "u", "--spec", spec}

	server := c.start(t, append(append([]string{"exec"}, who...), "--timeout", "5m", "--",
		testutil.ProbePath, "serve", fmt.Sprintf("127.0.0.1:%d", n), "hello-forwardPorts")...)
	server.line(t, fmt.Sprintf("listening 127.0.0.1:%d", n))

	fwd := c.start(t, append([]string{"port-forward"}, who...)...)
	if got, want := fwd.line(t, "Forwarding from "), fmt.Sprintf("Forwarding from 127.0.0.1:%d -> %d", n, n); got != want {
		t.Fatalf("port-forward printed %q, want %q", got, want)
	}
	body, err := get(t, fmt.Sprintf("http://127.0.0.1:%d/from-the-host", n))
	if err != nil || body != "hello-forwardPorts /from-the-host" {
		t.Fatalf("through the forwardPorts forward: %q %v; stderr: %s", body, err, fwd.stderr())
	}
	if e := fwd.stderr(); !strings.Contains(e, `forwardPorts "api.example.com:443" not forwarded: api.example.com is neither the sandbox nor one of its compose companions`) {
		t.Fatalf("port-forward does not say why api.example.com:443 is not forwarded: %s", e)
	}

	// The same forwardPorts again: its local port is the first forward's. Refused with a code and a hint,
	// nothing listens, nothing printed on stdout.
	busy := c.run(t, append([]string{"port-forward"}, who...)...).wantFailure(t, "LOCAL_PORT_IN_USE")
	if !strings.Contains(busy.stderr, fmt.Sprintf(":%d for a free one", n)) || !strings.Contains(busy.stderr, "LOCAL:PORT") {
		t.Fatalf("the busy port's hint names no other local port: %s", busy.stderr)
	}
	// Two ports, the second busy: the first is not left listening.
	m := freePort(t)
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	two := forwardRepo(t, image, fmt.Sprintf(`[%d, %d]`, m, held.Addr().(*net.TCPAddr).Port))
	c.run(t, "port-forward", "--tenant", tenant, "--user", "u", "--spec", two).wantFailure(t, "LOCAL_PORT_IN_USE")
	if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", m)); err != nil {
		t.Fatalf("port %d, before the busy one, was left open: %v", m, err)
	} else {
		ln.Close()
	}

	// The sandbox still has no way out (read, never dialled).
	ins, err := testutil.Docker(t).ContainerInspect(t.Context(), keyOf(t, tenant, "u").ContainerName(), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if mode := string(ins.Container.HostConfig.NetworkMode); mode != "none" {
		t.Fatalf("network mode %q, want none", mode)
	}

	// No forwardPorts and no port: a usage error saying so, before anything listens.
	none := forwardRepo(t, image, "")
	r := c.run(t, "port-forward", "--tenant", tenant, "--user", "u", "--spec", none).wantFailure(t, "INVALID_ARGUMENT")
	if !strings.Contains(r.stderr, "has no forwardPorts") {
		t.Fatalf("the usage error does not say there are no forwardPorts: %s", r.stderr)
	}
	// Nothing in forwardPorts can be forwarded: each line says why, and it is a usage error.
	other := forwardRepo(t, image, `["db:5432"]`)
	r = c.run(t, "port-forward", "--tenant", tenant, "--user", "u", "--spec", other).wantFailure(t, "INVALID_ARGUMENT")
	if !strings.Contains(r.stderr, `forwardPorts "db:5432" not forwarded`) {
		t.Fatalf("no line says why db:5432 is not forwarded: %s", r.stderr)
	}

	// stop waits for the running command (the user's gate): end the server first, as TestPortForward does.
	if err := server.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	server.wait(t, time.Minute)
	c.run(t, "stop", "--tenant", tenant, "--user", "u").want(t, 0)
	if code := fwd.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("port-forward exit %d after the sandbox stopped; stderr: %s", code, fwd.stderr())
	}
	if !strings.Contains(fwd.stderr(), "stopped; port-forward ends") {
		t.Fatalf("port-forward did not say why it ended: %s", fwd.stderr())
	}
}

// TestServeSDKForwardPorts: the server lists its repository's forwardPorts, each decided, through the Go SDK,
// and a forwarded one reaches our HTTP server in the sandbox through the port-forward route.
func TestServeSDKForwardPorts(t *testing.T) {
	c := newCLI(t)
	image := testutil.ProbeImage(t)
	n := freePort(t)
	spec := forwardRepo(t, image, fmt.Sprintf(`[%d, "localhost:%d", "db:5432"]`, n, n))
	s := c.startServerEnv(t, []string{"SANDKEEP_IMAGE=" + image, "SANDKEEP_SPEC=" + spec})
	tenant := c.ten("fpapi")
	cl := s.client(t, c.createToken(t, tenant, "sdk", "exec,read").Token)

	ports, err := cl.ForwardPorts(bounded(t), "alice")
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 3 || !ports[0].Forwarded || ports[0].Port != n || ports[1].Forwarded || !strings.Contains(ports[1].Why, "already forwarded") ||
		ports[2].Forwarded || ports[2].Port != 5432 || !strings.Contains(ports[2].Why, "neither the sandbox nor one of its compose companions") {
		t.Fatalf("forward ports %+v", ports)
	}

	served := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ready := newScreen()
	go func() {
		_, err := cl.ExecStream(ctx, "alice", sdk.ExecRequest{Argv: []string{testutil.ProbePath, "serve", fmt.Sprintf("127.0.0.1:%d", ports[0].Port), "via-forwardPorts"},
			Timeout: 5 * time.Minute}, ready, nil)
		served <- err
	}()
	ready.wait(t, "listening")
	conn, err := cl.DialPort(bounded(t), "alice", ports[0].Port)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET /listed HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	conn.Close()
	if string(body) != "via-forwardPorts /listed" {
		t.Fatalf("body %q", body)
	}
	cancel()
	<-served
}

// TestPortForwardCompanion: a compose-based devcontainer.json's forwardPorts "echo:N" names a companion, which
// shares the sandbox's network namespace: `sandkeep port-forward` with no port reaches our TCP echo server in it
// from the host, as commands reach it at localhost; "unused:N" names a service that does not run with the
// sandbox and is not forwarded, with why.
func TestPortForwardCompanion(t *testing.T) {
	c := newCLI(t)
	data, err := os.ReadFile(testutil.BuildBinary(t, "./test/echoserver", "echoserver", false))
	if err != nil {
		t.Fatal(err)
	}
	image := testutil.ImageWithFiles(t, testutil.TestImage(t), map[string]testutil.ImageFile{"/bin/echoserver": {Data: data, Mode: 0o755}})
	n := freePort(t)
	_, spec := writeRepo(t, map[string]string{
		".devcontainer/devcontainer.json": fmt.Sprintf(`{"dockerComposeFile": "docker-compose.yml", "service": "app",
  "runServices": ["echo"], "forwardPorts": ["echo:%d", "unused:%d"]}`, n, n+1),
		".devcontainer/docker-compose.yml": fmt.Sprintf(`services:
  app:
    image: %s
  echo:
    image: %s
    command: ["/bin/echoserver", "serve", "127.0.0.1:%d"]
    healthcheck:
      test: ["CMD", "/bin/echoserver", "ask", "127.0.0.1:%d", "health"]
      interval: 500ms
      retries: 20
  unused:
    image: %s
`, image, image, n, n, image),
	})
	tenant := c.ten("fwdcompanion")
	who := []string{"--tenant", tenant, "--user", "u", "--spec", spec}
	c.run(t, append(append([]string{"exec"}, who...), "--", "/bin/echoserver", "ask", fmt.Sprintf("localhost:%d", n), "from-a-command")...).want(t, 0)

	fwd := c.start(t, append([]string{"port-forward"}, who...)...)
	if got, want := fwd.line(t, "Forwarding from "), fmt.Sprintf("Forwarding from 127.0.0.1:%d -> %d", n, n); got != want {
		t.Fatalf("port-forward printed %q, want %q", got, want)
	}
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Minute))
	fmt.Fprintf(conn, "from-the-host\n")
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || line != "echo: from-the-host\n" {
		t.Fatalf("through the companion's forward: %q %v; stderr: %s", line, err, fwd.stderr())
	}
	if e := fwd.stderr(); !strings.Contains(e, fmt.Sprintf(`forwardPorts "unused:%d" not forwarded: unused is neither the sandbox nor one of its compose companions`, n+1)) {
		t.Fatalf("port-forward does not say why unused:%d is not forwarded: %s", n+1, e)
	}
	c.run(t, "rm", "--tenant", tenant, "--user", "u").want(t, 0)
}
