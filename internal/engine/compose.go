package engine

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/sandkeep/sandkeep/internal/build"
	"github.com/sandkeep/sandkeep/internal/compose"
	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// takeCompose reads a compose-based devcontainer.json's files: the service becomes the sandbox's image or
// build and environment (devcontainer.json's own env wins per key); runServices become companions. What the
// files set that is not applied is one warning each.
func (r *repository) takeCompose(dc *devcontainer.Config) error {
	if dc == nil || dc.Compose == nil {
		return nil
	}
	root, err := os.OpenRoot(r.root)
	if err != nil {
		return fault.Wrap(err, fault.ComposeInvalid, "run from the repository", "open the repository to read its compose files: %v", err)
	}
	defer root.Close()
	p, err := compose.Load(context.Background(), root, dc.Compose.Files, dc.Compose.Service, dc.Compose.RunServices)
	if err != nil {
		return err
	}
	sb := p.Sandbox
	if r.sb.Image == "" && r.sb.Build == nil {
		r.sb.Image, r.sb.Build = sb.Image, sb.Build
	}
	for _, k := range slices.Sorted(maps.Keys(sb.Env)) {
		if class := devcontainer.DenyClass(k); class != "" {
			if _, set := r.sb.Env[k]; !set {
				r.warnings = append(r.warnings, fmt.Sprintf("compose service %q environment %s: dropped (the %s deny class)", sb.Name, k, class))
			}
			continue
		}
		if _, own := r.containerEnv[k]; !own { // devcontainer.json's containerEnv is over the service's environment
			r.setContainerEnv(k, sb.Env[k]) // the container has it, whatever remoteEnv gives the commands
		}
		if _, set := r.sb.Env[k]; set {
			continue
		}
		if r.sb.Env == nil {
			r.sb.Env = map[string]string{}
		}
		r.sb.Env[k] = sb.Env[k]
	}
	// What the files set that is not applied joins devcontainer.json's own drops: one sandbox_devcontainer_dropped
	// event, the one printed line and doctor's warnings.
	r.composeUser = sb.User
	if sb.User != "" {
		r.drop(dc, "compose service "+sb.Name, "user", "the sandbox's uid is the operator's")
	}
	if sb.Command != nil {
		r.drop(dc, "compose service "+sb.Name, "command", "the sandbox runs sandkeep's agent")
	}
	for _, d := range p.Dropped {
		r.drop(dc, "compose service "+d.Service, d.Field, d.Why)
	}
	r.companions, r.service = p.Companions, sb.Name
	return nil
}

// drop records one item the repository asked for that is not applied, in the run's dropped event.
func (r *repository) drop(dc *devcontainer.Config, field, item, why string) {
	if r.dropped == nil {
		r.dropped = &events.DevcontainerDropped{Origin: filepath.Base(dc.Path)}
	}
	r.dropped.Items = append(r.dropped.Items, events.DevcontainerItem{Field: field, Item: item, Why: why})
}

// companions makes the repository's compose companions ready to run: a companion with a build is built on the
// run's driver (the same build path as the sandbox's: no network in RUN).
func (m *Manager) companions(ctx context.Context, lc *lifecycle.Manager, repo *repository, progress io.Writer) ([]driver.Companion, error) {
	var out []driver.Companion
	for _, s := range repo.companions {
		c := driver.Companion{Service: s.Name, Image: s.Image, Command: s.Command, Volumes: s.Volumes, Healthcheck: s.Healthcheck, DependsOn: s.DependsOn}
		for _, k := range slices.Sorted(maps.Keys(s.Env)) {
			if devcontainer.DenyClass(k) != "" {
				continue
			}
			c.Env = append(c.Env, k+"="+s.Env[k])
		}
		if s.Build != nil {
			bd, ok := lc.Driver().(imageBuilder)
			if !ok || !lc.Driver().Capabilities().Build {
				return nil, fault.New(fault.SpecUnsupported, "give the service an image", "compose service %q needs a build, and %s does not build images", s.Name, lc.Driver().Name())
			}
			ref, _, err := bd.Build(ctx, build.Request{Root: repo.root, Dockerfile: s.Build.Dockerfile, Context: s.Build.Context, Args: s.Build.Args, Base: m.baseCheck(lc.Driver())}, progress)
			if err != nil {
				return nil, fmt.Errorf("compose service %s: %w", s.Name, err)
			}
			c.Image = ref
		}
		out = append(out, c)
	}
	return out, nil
}
