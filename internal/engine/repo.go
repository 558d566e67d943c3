package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sandkeep/sandkeep/internal/bytesize"
	"github.com/sandkeep/sandkeep/internal/compose"
	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/devcontainer/feature"
	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/spec"
	"github.com/sandkeep/sandkeep/internal/tier"
)

// RepositoryPolicy is what the operator lets a repository's files (sandkeep.yaml, devcontainer.json) ask for:
// the secrets and credentials they may name, the host paths they may bind, the host variables ${localEnv:...}
// may read, and how wide their network rules may be. Everything else a repository may not set is refused with
// TIER_REFUSED, a diagnostic naming the field and the setting that would allow it.
type RepositoryPolicy = tier.Operator

// repository is what the repository tier asked for: the spec fused with devcontainer.json, checked against the
// operator's RepositoryPolicy.
type repository struct {
	sb       spec.Sandbox
	root     string                      // the repository root (the spec's directory)
	warnings []string                    // diagnostics that do not stop the run, one line each
	denied   *events.SandboxEnvDenied    // the repository's variables that were stripped (names only), if any
	dropped  *events.DevcontainerDropped // what devcontainer.json asked that would weaken the posture, if any

	features []devcontainer.FeatureRequest // devcontainer.json's features, installed by installFeatures (features.go)
	dcDir    string                        // devcontainer.json's folder relative to root: local features are in it
	dcUsers  feature.Users                 // devcontainer.json's users, for install.sh's _REMOTE_USER and _CONTAINER_USER
	userMaps []events.UserRemap            // the users devcontainer.json names, each mapped onto the sandbox's uid (uid, gid filled at prepare)

	companions  []compose.Service // a compose-based devcontainer's runServices (compose.go)
	service     string            // a compose-based devcontainer's service: the sandbox itself
	composeUser string            // the compose service's user: not the sandbox's, but install.sh's _CONTAINER_USER fallback

	path          string            // the spec file the repository was read from
	containerRefs []string          // devcontainer.json's fields that wait for the container's environment (devcontainer.Config.ContainerRefs)
	containerEnv  map[string]string // what the repository sets on the container (screened containerEnv, the compose service's environment): over the image's ENV, what ${containerEnv:...} sees
}

// loadRepository reads the spec at path ("" is no repository input), fuses devcontainer.json when the spec
// names no image and no build, and refuses what the repository tier may not set. Every error is a *fault.Error
// listing all the diagnostics: SPEC_INVALID for a malformed file, TIER_REFUSED for a field the repository may
// not set, SPEC_UNSUPPORTED for what this build cannot apply.
func (m *Manager) loadRepository(path string) (*repository, error) {
	return m.loadRepositoryIn(path, nil)
}

// loadRepositoryIn is loadRepository with the container's environment for devcontainer.json's
// ${containerEnv:...} (devcontainer.Env.Container); nil leaves those fields in repository.containerRefs.
func (m *Manager) loadRepositoryIn(path string, container func(string) (string, bool)) (*repository, error) {
	r := &repository{path: path}
	if path == "" {
		return r, nil
	}
	f, list := spec.Load(path)
	if err := r.take(list, path); err != nil {
		return nil, err
	}
	r.sb, r.root = f.Sandbox, f.Root
	src := tier.Sources{Spec: f}
	if r.sb.Image == "" && r.sb.Build == nil {
		env := m.cfg.Repository.DevcontainerEnv(os.LookupEnv, f.Root)
		env.Container = container
		dc, list, found := devcontainer.Load(f.Root, env)
		if found {
			if err := r.take(list, "devcontainer.json"); err != nil {
				return nil, err
			}
			var denied []devcontainer.Event
			r.sb, denied = devcontainer.Fuse(dc, &r.sb, nil)
			src.Devcontainer = dc
			r.denied = deniedEvent(denied)
			r.dropped = droppedEvent(dc)
			r.warnings = append(r.warnings, m.hostRequirements(dc)...)
			r.takeFeatures(dc)
			r.userMaps = userMaps(dc)
			r.containerRefs = dc.ContainerRefs
			for k, v := range dc.ContainerEnv {
				if devcontainer.DenyClass(k) == "" {
					r.setContainerEnv(k, v)
				}
			}
			if err := r.takeCompose(dc); err != nil {
				return nil, err
			}
			for _, c := range r.companions {
				if c.Build != nil {
					src.CompanionBuilds = append(src.CompanionBuilds, c.Name)
				}
			}
		}
	}
	if list := tier.RepositoryFrom(&r.sb, r.root, m.cfg.Repository, src); list.HasErrors() {
		return nil, fault.New(fault.TierRefused, "the repository's files may only ask for what the operator allows; see the hints",
			"the repository asks for what only the operator may set:\n%s", lines(list))
	} else if err := r.take(list, path); err != nil {
		return nil, err
	}
	return r, unsupported(r.sb)
}

// fitsDriver refuses, before anything is built or made, what the repository asks that the run's driver cannot
// give: a workspaceFolder other than /workspace is the workspace bound a second time, which needs a driver that
// binds host paths (the kubernetes driver does not).
func (r *repository) fitsDriver(d driver.Driver, onHost bool) error {
	f := r.sb.WorkspaceFolder
	if onHost || f == "" || f == driver.WorkspaceDir || d.Capabilities().HostBinds {
		return nil
	}
	return fault.New(fault.SpecUnsupported,
		"run it on the docker driver (--driver docker), or remove workspaceFolder/workspaceMount from devcontainer.json (and workspace_folder from the spec) so the workspace is /workspace",
		"the workspace folder %s needs a driver that binds the workspace there, and %s does not", f, d.Name())
}

// setContainerEnv records one variable the repository sets on the container.
func (r *repository) setContainerEnv(k, v string) {
	if r.containerEnv == nil {
		r.containerEnv = map[string]string{}
	}
	r.containerEnv[k] = v
}

// take keeps list's warnings and turns its errors into one SPEC_INVALID failure that lists them all.
func (r *repository) take(list diag.List, what string) error {
	for _, d := range list {
		if d.Severity != diag.Error && d.Code != diag.DevcontainerDropped { // drops are reported once, as r.dropped
			r.warnings = append(r.warnings, d.String())
		}
	}
	if !list.HasErrors() {
		return nil
	}
	return fault.New(fault.SpecInvalid, "fix the lines above; `sandkeep doctor --strict --spec FILE` checks a spec",
		"%s is not valid:\n%s", what, lines(list))
}

// lines is list's errors, one indented line each.
func lines(list diag.List) string {
	var out []string
	for _, d := range list {
		if d.Severity == diag.Error {
			out = append(out, "  "+d.String())
		}
	}
	return strings.Join(out, "\n")
}

// unsupported refuses spec fields this build does not apply yet, rather than running without them.
func unsupported(sb spec.Sandbox) error {
	var fields []string
	if sb.HostState == "auto" {
		fields = append(fields, "host_state: auto")
	}
	if len(fields) == 0 {
		return nil
	}
	return fault.New(fault.SpecUnsupported, "remove them from the spec, or run a sandkeep that supports them",
		"the spec uses %s, which this sandkeep cannot apply yet; refusing rather than running without them",
		strings.Join(fields, ", "))
}

// hostRequirements says, one warning each, where the file's hostRequirements ask for more than the operator
// gives a sandbox: the operator's limits are the caps, and the sandbox gets them.
func (m *Manager) hostRequirements(dc *devcontainer.Config) []string {
	hr := dc.HostRequirements
	if hr == nil {
		return nil
	}
	var out []string
	cpus := m.cfg.CPUs
	if cpus == 0 {
		cpus = float64(lifecycle.DefaultNanoCPUs) / 1e9
	}
	if hr.CPUs > cpus {
		out = append(out, fmt.Sprintf("%s: hostRequirements.cpus %g is above the operator's %g; the sandbox gets %g", dc.Path, hr.CPUs, cpus, cpus))
	}
	mem := m.cfg.MemoryBytes
	if mem == 0 {
		mem = lifecycle.DefaultMemory
	}
	if hr.Memory != "" {
		if n, err := bytesize.Parse(hr.Memory); err == nil && n > mem {
			out = append(out, fmt.Sprintf("%s: hostRequirements.memory %s is above the operator's %d MiB; the sandbox gets %d MiB", dc.Path, hr.Memory, mem>>20, mem>>20))
		}
	}
	return out
}

// droppedEvent is the one sandbox_devcontainer_dropped event for what the file asked that would weaken the
// posture, or nil.
func droppedEvent(dc *devcontainer.Config) *events.DevcontainerDropped {
	if len(dc.Dropped) == 0 {
		return nil
	}
	ev := &events.DevcontainerDropped{Origin: filepath.Base(dc.Path)}
	for _, d := range dc.Dropped {
		ev.Items = append(ev.Items, events.DevcontainerItem{Field: d.Field, Item: d.Item, Why: d.Why, Line: d.Line})
	}
	return ev
}

// DroppedLine is the one line a person is shown for a run whose devcontainer.json asked for things that would
// weaken the posture ("" when it asked for none).
func droppedLine(ev *events.DevcontainerDropped) string {
	if ev == nil {
		return ""
	}
	items := make([]string, 0, len(ev.Items))
	for _, it := range ev.Items {
		s := it.Field
		if it.Item != "" && it.Item != it.Field {
			s += " " + it.Item
		}
		items = append(items, s)
	}
	return fmt.Sprintf("sandkeep: %s: dropped %d item(s) that would weaken the sandbox, which runs hardened without them: %s",
		ev.Origin, len(items), strings.Join(items, ", "))
}

// droppedItems is ev's items, one line each with why, for doctor.
func droppedItems(ev *events.DevcontainerDropped) []string {
	if ev == nil {
		return nil
	}
	out := make([]string, 0, len(ev.Items))
	for _, it := range ev.Items {
		d := devcontainer.Drop{Field: it.Field, Item: it.Item, Why: it.Why}
		line := d.String()
		if it.Line > 0 {
			line = fmt.Sprintf("line %d: %s", it.Line, line)
		}
		out = append(out, line)
	}
	return out
}

// deniedEvent is the one sandbox_env_denied event for the repository's stripped variables (names only).
func deniedEvent(denied []devcontainer.Event) *events.SandboxEnvDenied {
	if len(denied) == 0 {
		return nil
	}
	ev := &events.SandboxEnvDenied{Origin: filepath.Base(denied[0].File)}
	for _, d := range denied {
		ev.Keys = append(ev.Keys, d.Key)
	}
	return ev
}

// apply puts the repository's sandbox fields into a shape's Config: image, env, mounts, tmpfs, resources and
// post-create. (User is the operator's: the tier check refused it.)
func (r *repository) apply(c *lifecycle.Config) error {
	sb := r.sb
	if sb.Image != "" {
		c.Image = sb.Image
	}
	for _, k := range sortedKeys(sb.Env) {
		c.Env = append(c.Env, k+"="+sb.Env[k])
	}
	mounts, err := parseMounts(sb.Mounts)
	if err != nil {
		return err
	}
	c.Mounts = append(c.Mounts, mounts...)
	for _, t := range sb.Tmpfs {
		target, opts, _ := strings.Cut(t, ":")
		if c.Tmpfs == nil {
			c.Tmpfs = map[string]string{}
		}
		c.Tmpfs[target] = opts
	}
	if sb.PostCreate != "" {
		c.PostCreate = sb.PostCreate
	}
	if sb.PostStart != "" {
		c.PostStart = sb.PostStart
	}
	if sb.WorkspaceFolder != "" {
		c.WorkspaceFolder = sb.WorkspaceFolder
	}
	for _, v := range sb.Volumes {
		c.Volumes = append(c.Volumes, lifecycle.Volume{Name: v.Name, Target: v.Target, ReadOnly: v.ReadOnly})
	}
	if res := sb.Resources; res != nil {
		if res.CPUs > 0 {
			c.NanoCPUs = int64(res.CPUs * 1e9)
		}
		if res.Pids > 0 {
			c.PidsLimit = res.Pids
		}
		if res.Memory != "" {
			n, err := bytesize.Parse(res.Memory)
			if err != nil {
				return fault.Wrap(err, fault.SpecInvalid, "write a size such as 2g or 512Mi", "resources.memory: %v", err)
			}
			c.MemoryBytes = n
		}
		if res.Disk != "" {
			n, err := bytesize.Parse(res.Disk)
			if err != nil {
				return fault.Wrap(err, fault.SpecInvalid, "write a size such as 1g or 64Mi", "resources.disk: %v", err)
			}
			c.DiskBytes, c.DiskInodes = n, res.Inodes // within the operator's DiskMax*, checked with the shape
		}
	}
	return nil
}

// userMaps are the users devcontainer.json names (remoteUser, containerUser) that sandkeep does not create or
// switch to: the sandbox's uid stands for each (sandbox_user_remap, origin devcontainer.json).
func userMaps(dc *devcontainer.Config) []events.UserRemap {
	var out []events.UserRemap
	for _, u := range []struct{ field, user string }{{"remoteUser", dc.RemoteUser}, {"containerUser", dc.ContainerUser}} {
		if u.user != "" {
			out = append(out, events.UserRemap{Origin: events.RemapDevcontainer, Field: u.field, User: u.user})
		}
	}
	return out
}
