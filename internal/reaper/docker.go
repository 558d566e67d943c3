package reaper

import (
	"context"
	"fmt"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/driver"
)

// dockerAPI is the part of the Docker Engine API the Docker source calls.
type dockerAPI interface {
	ContainerList(ctx context.Context, opts client.ContainerListOptions) (client.ContainerListResult, error)
	ContainerRemove(ctx context.Context, id string, opts client.ContainerRemoveOptions) (client.ContainerRemoveResult, error)
}

// Docker is the Source of a Docker engine's sandbox containers: every container that carries an installation
// label, whichever installation's (Decide keeps the others').
type Docker struct{ API dockerAPI }

var _ Source = Docker{}

// List implements Source.
func (d Docker) List(ctx context.Context) ([]Resource, error) {
	res, err := d.API.ContainerList(ctx, client.ContainerListOptions{All: true,
		Filters: client.Filters{}.Add("label", driver.LabelInstallation)})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	out := make([]Resource, 0, len(res.Items))
	for _, c := range res.Items {
		name := c.ID
		if len(c.Names) > 0 {
			name = strings.TrimPrefix(c.Names[0], "/")
		}
		out = append(out, Resource{Kind: "container", Name: name, ID: c.ID, Labels: c.Labels, State: string(c.State)})
	}
	return out, nil
}

// Remove implements Source: the container and its anonymous volumes.
func (d Docker) Remove(ctx context.Context, r Resource) error {
	_, err := d.API.ContainerRemove(ctx, r.ID, client.ContainerRemoveOptions{RemoveVolumes: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return err
	}
	return nil
}
