package engine

import (
	"context"
	"fmt"
	"maps"
	"strings"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// imageEnver is the optional driver capability of reading a local image's configured environment.
type imageEnver interface {
	ImageEnv(ctx context.Context, ref string) ([]string, error)
}

// expandContainerEnv gives devcontainer.json's fields that refer to ${containerEnv:...} (remoteEnv, the
// lifecycle commands) their values, as the devcontainers CLI substitutes them from the created container's
// environment: the image's ENV (a derived image's includes its features' containerEnv) with what the repository
// sets on the container over it. The file is read once more with that environment, so each value is still
// expanded in one pass; only the environment and the lifecycle commands are taken from that reading. On a
// driver that cannot read an image's environment the references see the repository's own variables only, and
// the run says so.
func (r *Run) expandContainerEnv(ctx context.Context, repo *repository, image string) error {
	env := map[string]string{}
	if ie, ok := r.lc.Driver().(imageEnver); ok {
		if _, err := r.lc.Driver().ResolveImage(ctx, image); err != nil {
			return err
		}
		lines, err := ie.ImageEnv(ctx, image)
		if err != nil {
			return fault.Wrap(err, fault.ImageUnavailable, "check that the image is present: docker image inspect IMAGE",
				"read the environment of image %q for devcontainer.json's ${containerEnv:...}: %v", image, err)
		}
		for _, l := range lines {
			if k, v, ok := strings.Cut(l, "="); ok {
				env[k] = v
			}
		}
	} else {
		r.Warnings = append(r.Warnings, fmt.Sprintf("devcontainer.json: %s refer to ${containerEnv:...}, and the %s driver cannot read the image's environment: they see containerEnv only",
			strings.Join(repo.containerRefs, ", "), r.lc.Driver().Name()))
	}
	maps.Copy(env, repo.containerEnv)
	again, err := r.m.loadRepositoryIn(repo.path, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		return err
	}
	repo.sb.Env, repo.sb.PostCreate, repo.sb.PostStart, repo.sb.PostAttach = again.sb.Env, again.sb.PostCreate, again.sb.PostStart, again.sb.PostAttach
	repo.containerRefs = nil
	return nil
}
