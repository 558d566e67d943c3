package docker

import (
	"context"
	"fmt"
)

// ImageEnv returns the environment of the local image ref's config (its ENV lines, "NAME=value"), without
// pulling: what a container made from it starts with, for devcontainer.json's ${containerEnv:...}.
func (d *Driver) ImageEnv(ctx context.Context, ref string) ([]string, error) {
	img, err := d.api.ImageInspect(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("inspect image %q: %w", ref, err)
	}
	if img.Config == nil {
		return nil, nil
	}
	return img.Config.Env, nil
}

// ImageUser returns the USER of the local image ref's config ("" when it sets none), without pulling: the user
// the devcontainers CLI falls back to for a feature's _CONTAINER_USER.
func (d *Driver) ImageUser(ctx context.Context, ref string) (string, error) {
	img, err := d.api.ImageInspect(ctx, ref)
	if err != nil {
		return "", fmt.Errorf("inspect image %q: %w", ref, err)
	}
	if img.Config == nil {
		return "", nil
	}
	return img.Config.User, nil
}
