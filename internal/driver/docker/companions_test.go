package docker_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// echoImage is the test image with test/echoserver (a static TCP echo server and client) at /bin/echoserver.
func echoImage(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(testutil.BuildBinary(t, "./test/echoserver", "echoserver", false))
	if err != nil {
		t.Fatal(err)
	}
	return testutil.ImageWithFiles(t, testutil.TestImage(t), map[string]testutil.ImageFile{"/bin/echoserver": {Data: data, Mode: 0o755}})
}

// TestCompanions: a compose companion (our static echo server) runs in the sandbox's network namespace: the
// sandbox reaches it at localhost; seen from the host it has no network of its own and publishes no port, runs
// as the sandbox's user with every capability dropped and a read-only root; it is removed, with its per-key
// volume, when the sandbox is.
func TestCompanions(t *testing.T) {
	cli := testutil.Docker(t)
	image := echoImage(t)
	agent := testutil.AgentBinary(t)
	installation := fmt.Sprintf("companions-%d", time.Now().UnixNano())
	testutil.Cleanup(t, installation)
	d, err := docker.New(docker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	key, err := identity.New(installation, "compose")
	if err != nil {
		t.Fatal(err)
	}
	spec := specFor(t, key, installation, agent)
	spec.Image = image
	if spec.ImageID, err = d.ResolveImage(ctx, image); err != nil {
		t.Fatal(err)
	}
	sb, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = d.Remove(cctx, sb)
	})
	if err := d.Start(ctx, sb); err != nil {
		t.Fatal(err)
	}
	echo := driver.Companion{
		Service: "echo", Image: image, Command: []string{"/bin/echoserver", "serve", "127.0.0.1:7777"},
		Env:         []string{"ROLE=companion"},
		Volumes:     []driver.CompanionVolume{{Name: "data", Target: "/data"}},
		Healthcheck: &driver.Healthcheck{Test: []string{"CMD", "/bin/echoserver", "ask", "127.0.0.1:7777", "health"}, Interval: 500 * time.Millisecond, Timeout: 2 * time.Second, Retries: 20},
	}
	if err := d.EnsureCompanions(ctx, sb, spec.Posture, []driver.Companion{echo}); err != nil {
		t.Fatal(err)
	}
	// Again: already running, nothing made twice.
	if err := d.EnsureCompanions(ctx, sb, spec.Posture, []driver.Companion{echo}); err != nil {
		t.Fatal(err)
	}

	var stdout, stderr bytes.Buffer
	res, err := d.Exec(ctx, sb, agentproto.Request{Version: agentproto.Version, ID: 1, Argv: []string{"/bin/echoserver", "ask", "localhost:7777", "hello"},
		Workdir: driver.WorkspaceDir, TimeoutMS: 20_000, GraceMS: 500, StdoutLimit: agentproto.DefaultLimit, StderrLimit: agentproto.DefaultLimit},
		driver.Output{Stdout: &stdout, Stderr: &stderr})
	if err != nil || res.ExitCode != 0 || stdout.String() != "echo: hello\n" {
		t.Fatalf("from the sandbox: exit %d err %v stdout %q stderr %q, want the echo", res.ExitCode, err, stdout.String(), stderr.String())
	}

	name := sb.Name + "-c-echo"
	in, err := cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := in.Container
	if got := string(c.HostConfig.NetworkMode); got != "container:"+sb.ID {
		t.Errorf("network mode %q, want the sandbox's namespace", got)
	}
	if len(c.HostConfig.PortBindings) != 0 || (c.NetworkSettings != nil && (len(c.NetworkSettings.Ports) != 0 || len(c.NetworkSettings.Networks) != 0)) {
		t.Errorf("the companion has ports or networks of its own: bindings %v, settings %+v", c.HostConfig.PortBindings, c.NetworkSettings)
	}
	if c.Config.User != spec.Posture.User || !slices.Contains(c.HostConfig.CapDrop, "ALL") || !c.HostConfig.ReadonlyRootfs ||
		!slices.Contains(c.HostConfig.SecurityOpt, "no-new-privileges:true") || c.HostConfig.Memory == 0 || c.HostConfig.PidsLimit == nil || *c.HostConfig.PidsLimit == 0 {
		t.Errorf("companion not hardened like the sandbox: user %q (sandbox %q), capdrop %v, ro %v, secopt %d entries, memory %d",
			c.Config.User, spec.Posture.User, c.HostConfig.CapDrop, c.HostConfig.ReadonlyRootfs, len(c.HostConfig.SecurityOpt), c.HostConfig.Memory)
	}
	if c.Config.Labels[docker.LabelCompanionOf] != sb.Name || c.Config.Labels[driver.LabelInstallation] != "" {
		t.Errorf("labels %v: want companion-of the sandbox and no installation (List must not see it)", c.Config.Labels)
	}
	if list, err := d.List(ctx, installation); err != nil || len(list) != 1 {
		t.Errorf("List = %d sandboxes, %v; want only the sandbox", len(list), err)
	}
	vol := sb.Name + "-v-data"
	if _, err := cli.VolumeInspect(ctx, vol, client.VolumeInspectOptions{}); err != nil {
		t.Errorf("volume %s: %v", vol, err)
	}

	// Stop stops it with the sandbox; Remove removes it and its volume.
	if err := d.Stop(ctx, sb, time.Second); err != nil {
		t.Fatal(err)
	}
	if in, err := cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{}); err != nil || in.Container.State.Running {
		t.Errorf("companion after Stop: err %v running %v", err, err == nil && in.Container.State.Running)
	}
	if err := d.Remove(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Errorf("companion after Remove: %v, want not found", err)
	}
	if _, err := cli.VolumeInspect(ctx, vol, client.VolumeInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Errorf("volume after Remove: %v, want not found", err)
	}
}
