package engine

import (
	"context"
	"errors"
	"fmt"

	cerrdefs "github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/tier"
)

// localImager is the optional driver capability of telling whether the engine has an image without pulling
// it: an absent one is errdefs.ErrNotFound.
type localImager interface {
	LocalImage(ctx context.Context, ref string) (string, error)
}

// checkRepoImages refuses, before anything is built, pulled or made, a repository-named image the run's
// engine does not have (the sandbox's image:, a compose companion's) from a registry the operator does not
// list in image_registries.
func (m *Manager) checkRepoImages(ctx context.Context, drv driver.Driver, repo *repository) error {
	if repo.sb.Image != "" && repo.sb.Build == nil {
		if err := m.checkRepoImage(ctx, drv, "image", repo.sb.Image); err != nil {
			return err
		}
	}
	for _, s := range repo.companions {
		if s.Image != "" && s.Build == nil {
			if err := m.checkRepoImage(ctx, drv, "services."+s.Name+".image", s.Image); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkRepoImage refuses ref, an image the repository named at field, when the engine does not have it and
// its registry is not in the operator's image_registries: the engine would pull it from whatever registry the
// name says, a host the repository (maybe a stranger's pull request) chose (issue 22, finding 6). Nothing is
// pulled or dialled to decide. A driver that cannot tell whether it has an image has every such image
// refused. The error is TIER_REFUSED with a SK514 diagnostic naming image_registries.
func (m *Manager) checkRepoImage(ctx context.Context, drv driver.Driver, field, ref string) error {
	registry, allowed := m.cfg.Repository.ImageRegistry(ref)
	if allowed {
		return nil
	}
	if li, ok := drv.(localImager); ok {
		_, err := li.LocalImage(ctx, ref)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("image %q: %w", ref, context.Cause(ctx))
		}
		if !errors.Is(err, cerrdefs.ErrNotFound) {
			return fault.Wrap(err, fault.DriverUnavailable, "check that the engine answers (`sandkeep doctor`)",
				"cannot tell whether the engine has image %q", ref)
		}
	}
	hint := fmt.Sprintf("load the image into the engine ahead of time (docker load, docker pull as the operator), or have the operator list its registry in image_registries (image_registries: [%s])", registry)
	msg := fmt.Sprintf("the repository names image %q, which %s does not have, from registry %s, which the operator's image_registries does not list: it is not pulled", ref, drv.Name(), registry)
	if registry == "" {
		hint = "name the image as registry/name:tag"
		msg = fmt.Sprintf("the repository names %q, which is not an image reference", ref)
	}
	d := diag.Diagnostic{Code: diag.TierImageRefused, Severity: diag.Error, Tier: tier.NameRepository, Field: field, Message: msg, Hint: hint}
	return fault.New(fault.TierRefused, hint, "the repository asks for what only the operator may set:\n  %s", d.String())
}

// baseCheck is a build's check of the images its Dockerfile builds FROM (build.Request.Base).
func (m *Manager) baseCheck(drv driver.Driver) func(ctx context.Context, ref string) error {
	return func(ctx context.Context, ref string) error {
		return m.checkRepoImage(ctx, drv, "build FROM", ref)
	}
}
