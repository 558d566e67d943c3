// Package testutil holds helpers for tests that need the real Docker engine and the sandkeep agent binary:
// a shared Engine API client, locally built FROM-scratch busybox images (no registry is ever contacted),
// binaries built once per test process, and cleanup of the containers a test leaves behind.
//
// It is for tests only; nothing outside _test.go files may import it.
//
// When SANDKEEP_REQUIRE_DOCKER=1 (scripts/test.sh sets it), a missing engine fails the test; otherwise the test
// is skipped. Under go test -short (the short tier) every test that needs the engine skips, whether or not one
// answers. Run scripts/docker-up.sh to get an engine and busybox-static.
package testutil

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/driver"
)

// EnvRequireDocker names the variable that turns a missing Docker engine from a skip into a failure.
const EnvRequireDocker = "SANDKEEP_REQUIRE_DOCKER"

var docker struct {
	once sync.Once
	cli  *client.Client
	err  error
}

// Docker returns a client for the Docker engine named by the environment (DOCKER_HOST etc.), with API version
// negotiation, after a ping with a 5 s timeout. The client is shared by the whole test process (it is safe for
// concurrent use); tests must not close it. If the engine does not answer, the test fails when
// SANDKEEP_REQUIRE_DOCKER=1 and is skipped otherwise.
func Docker(t testing.TB) *client.Client {
	t.Helper()
	if testing.Short() {
		// The short tier (go test -short, scripts/test.sh --short) runs no Docker test, even where an engine
		// answers: it is what runs anywhere, in minutes. A run that also demands Docker is a mistake, not a skip.
		if os.Getenv(EnvRequireDocker) == "1" {
			t.Fatalf("-short runs no Docker test, but %s=1 demands them: drop one of the two", EnvRequireDocker)
		}
		t.Skip("needs the Docker engine: not under -short (the Docker tier, scripts/test.sh, runs it)")
	}
	docker.once.Do(func() {
		cli, err := client.New(client.FromEnv)
		if err != nil {
			docker.err = fmt.Errorf("docker client: %w", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
			_ = cli.Close()
			docker.err = fmt.Errorf("ping docker engine at %s: %w", cli.DaemonHost(), err)
			return
		}
		docker.cli = cli
	})
	if docker.err != nil {
		if os.Getenv(EnvRequireDocker) == "1" {
			t.Fatalf("Docker engine required (%s=1) but unavailable: %v; run scripts/docker-up.sh", EnvRequireDocker, docker.err)
		}
		t.Skipf("Docker engine unavailable (set %s=1 to fail instead): %v", EnvRequireDocker, docker.err)
	}
	return docker.cli
}

// Cleanup registers a t.Cleanup that force-removes (with their anonymous volumes) every container labelled
// driver.LabelInstallation=installation, so a failing test leaves nothing behind. Use a unique installation id
// per test.
func Cleanup(t testing.TB, installation string) {
	t.Helper()
	if installation == "" {
		t.Fatal("testutil.Cleanup: empty installation id would match nothing useful")
	}
	cli := Docker(t)
	t.Cleanup(func() {
		// t.Context() is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		list, err := cli.ContainerList(ctx, client.ContainerListOptions{
			All:     true,
			Filters: client.Filters{}.Add("label", driver.LabelInstallation+"="+installation),
		})
		if err != nil {
			t.Errorf("cleanup: list containers of installation %s: %v", installation, err)
			return
		}
		for _, c := range list.Items {
			_, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
			if err != nil && !cerrdefs.IsNotFound(err) {
				t.Errorf("cleanup: remove container %s (%v): %v", c.ID, c.Names, err)
			}
		}
	})
}
