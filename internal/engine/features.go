package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/devcontainer/feature"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/guard"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// takeFeatures records devcontainer.json's features on the repository, with the folder their local names are
// relative to.
func (r *repository) takeFeatures(dc *devcontainer.Config) {
	if dc == nil || len(dc.Features) == 0 {
		return
	}
	r.features = dc.Features
	r.dcUsers = feature.Users{Remote: dc.RemoteUser, Container: dc.ContainerUser} // _REMOTE_USER and _CONTAINER_USER of install.sh
	if rel, err := filepath.Rel(r.root, filepath.Dir(dc.Path)); err == nil {
		r.dcDir = filepath.ToSlash(rel)
	}
}

// installFeatures builds the derived image with the repository's features installed on base, on the run's
// driver (the same build path as a spec's build:, so install.sh has no network), and records
// sandbox_features_installed. The features' screened containerEnv is baked into the image as ENV; their volumes
// and tmpfs mounts join the sandbox's (takeFeatureMounts), their binds are dropped; what their metadata asked
// that weakens the posture is dropped. Each of those is one
// "dropped: ..." line on progress and one entry of the event's dropped list.
func (m *Manager) installFeatures(ctx context.Context, r *Run, lc *lifecycle.Manager, repo *repository, base string, progress io.Writer) (string, error) {
	bd, ok := lc.Driver().(imageBuilder)
	if !ok || !lc.Driver().Capabilities().Build {
		return "", fault.New(fault.SpecUnsupported, "build an image with the features installed and name it with image:",
			"devcontainer.json's features need a driver that builds images, and %s does not", lc.Driver().Name())
	}
	root, err := os.OpenRoot(repo.root)
	if err != nil {
		return "", fault.Wrap(err, fault.FeatureInvalid, "run from the repository", "open the repository to read its features: %v", err)
	}
	defer root.Close()
	req := make([]feature.Requested, len(repo.features))
	for i, f := range repo.features {
		req[i] = feature.Requested{ID: f.ID, Options: json.RawMessage(f.Options)}
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, buildBound)
	defer cancel()
	spool, err := os.MkdirTemp("", "sandkeep-feature-spool-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(spool)
	fs, err := feature.Resolve(ctx, feature.Source{Repo: root, DcDir: repo.dcDir, Fetcher: m.features, Spool: &feature.Spool{Dir: spool}}, req)
	if err != nil {
		return "", err
	}
	plan := feature.Screen(fs, feature.Scope{Workspace: repo.sb.WorkspaceFolder, Env: m.cfg.Repository.DevcontainerEnv(os.LookupEnv, repo.root)})
	var dropped []string
	for _, d := range plan.Dropped {
		dropped = append(dropped, fmt.Sprintf("feature %q %s: %s", d.Feature, d.Field, d.Why))
	}
	dropped = append(dropped, repo.takeFeatureMounts(plan)...)
	if progress != nil {
		for _, line := range dropped {
			fmt.Fprintf(progress, "dropped: %s\n", line)
		}
	}
	baseID, err := lc.Driver().ResolveImage(ctx, base)
	if err != nil {
		return "", err
	}
	users := repo.dcUsers
	users.Compose = repo.composeUser
	if iu, ok := lc.Driver().(imageUserer); ok {
		if users.Image, err = iu.ImageUser(ctx, base); err != nil {
			return "", err
		}
	}
	ref, err := feature.Install(ctx, bd, feature.Request{Base: base, BaseID: baseID, Users: users}, plan, progress)
	took := time.Since(start).Milliseconds()
	if err != nil {
		code := fault.CodeOf(err)
		if code == "" {
			code = fault.BuildFailed
		}
		r.event(events.NameSandboxBuildFailed, events.SandboxBuildFailed{Error: string(code), DurationMS: took})
		return "", err
	}
	ev := events.SandboxFeatures{Image: ref, Dropped: dropped, DurationMS: took}
	for _, f := range fs {
		ev.Features = append(ev.Features, events.Feature{ID: f.Ref.ID, Version: f.Meta.Version, Digest: f.Digest})
	}
	r.event(events.NameSandboxFeatures, ev)
	return ref, nil
}

// takeFeatureMounts adds the features' screened volumes and tmpfs mounts to the repository's sandbox, as
// devcontainer.json's own: the file's (and the spec's) mount of the same target wins, as the devcontainers CLI
// lets the configuration's mounts win over its features'. It returns one line for each mount left out.
func (r *repository) takeFeatureMounts(plan *feature.Plan) []string {
	taken := map[string]bool{}
	for _, v := range r.sb.Volumes {
		taken[v.Target] = true
	}
	for _, t := range r.sb.Tmpfs {
		target, _, _ := strings.Cut(t, ":")
		taken[target] = true
	}
	for _, mnt := range r.sb.Mounts {
		if m, err := guard.ParseMount(mnt); err == nil {
			taken[m.Target] = true
		}
	}
	var out []string
	for _, v := range plan.Volumes {
		if taken[v.Target] {
			out = append(out, fmt.Sprintf("feature volume %q at %s: devcontainer.json's own mount of that target wins", v.Name, v.Target))
			continue
		}
		taken[v.Target] = true
		r.sb.Volumes = append(r.sb.Volumes, spec.Volume{Name: v.Name, Target: v.Target, ReadOnly: v.ReadOnly})
	}
	for _, t := range plan.Tmpfs {
		target, _, _ := strings.Cut(t, ":")
		if taken[target] {
			out = append(out, fmt.Sprintf("feature tmpfs at %s: devcontainer.json's own mount of that target wins", target))
			continue
		}
		taken[target] = true
		r.sb.Tmpfs = append(r.sb.Tmpfs, t)
	}
	return out
}

// imageUserer is the optional driver capability of reading a local image's USER.
type imageUserer interface {
	ImageUser(ctx context.Context, ref string) (string, error)
}

// featureBase is the image features are installed on: the built image, else the repository's, the template's,
// or the operator's default.
func (m *Manager) featureBase(built string, tpl *template, repo *repository) string {
	for _, s := range []string{built, repo.sb.Image} {
		if s != "" {
			return s
		}
	}
	if tpl != nil && tpl.Image != "" {
		return tpl.Image
	}
	return strings.TrimSpace(m.cfg.Image)
}
