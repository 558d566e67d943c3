package docker_test

import (
	"context"
	"fmt"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/policy"
)

// refusingEngine answers create and start with the error an engine gives; nothing else is called.
type refusingEngine struct {
	*client.Client
	err error
}

func (e refusingEngine) ContainerCreate(context.Context, client.ContainerCreateOptions) (client.ContainerCreateResult, error) {
	return client.ContainerCreateResult{}, e.err
}

func (e refusingEngine) ContainerStart(context.Context, string, client.ContainerStartOptions) (client.ContainerStartResult, error) {
	return client.ContainerStartResult{}, e.err
}

// TestCapacity: an engine that cannot create or start a sandbox for lack of memory or space is SANDBOX_CAPACITY,
// which the run records failed_resumable/infrastructure; any other engine failure stays SANDBOX_FAILED. The
// errors are shaped as the Engine API client returns them: a message with an errdefs class of unknown/system.
func TestCapacity(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want fault.Code
	}{
		{"out of memory at start", fmt.Errorf("Error response from daemon: failed to create task for container: OCI runtime create failed: runc create failed: unable to start container process: container init: cannot allocate memory: %w", cerrdefs.ErrUnknown), fault.SandboxCapacity},
		{"no space at create", fmt.Errorf("Error response from daemon: mkdir /var/lib/docker/overlay2/x: no space left on device: %w", cerrdefs.ErrInternal), fault.SandboxCapacity},
		{"quota", fmt.Errorf("Error response from daemon: write /var/lib/docker/containers/x/config.v2.json: disk quota exceeded: %w", cerrdefs.ErrUnknown), fault.SandboxCapacity},
		{"resource exhausted", fmt.Errorf("create: %w", cerrdefs.ErrResourceExhausted), fault.SandboxCapacity},
		{"anything else", fmt.Errorf("Error response from daemon: invalid runtime name: kata: %w", cerrdefs.ErrUnknown), fault.SandboxFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := docker.NewWithEngine(refusingEngine{err: tc.err}, docker.Options{})
			_, cerr := d.Create(t.Context(), &driver.CreateSpec{Name: "sandkeep-u-test"})
			serr := d.Start(t.Context(), &driver.Sandbox{ID: "x", Name: "sandkeep-u-test"})
			for what, err := range map[string]error{"create": cerr, "start": serr} {
				if fault.CodeOf(err) != tc.want {
					t.Errorf("%s: %v, want %s", what, err, tc.want)
				}
				if f := policy.SetupFailure(err); tc.want == fault.SandboxCapacity &&
					(f.Status != policy.StatusFailedResumable || f.Disposition != policy.Infrastructure) {
					t.Errorf("%s: recorded %s/%s", what, f.Status, f.Disposition)
				}
			}
		})
	}
}
