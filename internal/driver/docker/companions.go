package docker

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// Labels of a companion container. A companion carries no LabelInstallation, so List (and the sweeper and the
// reaper, which start from it) never take one for a sandbox; it is found through its sandbox's name.
const (
	LabelCompanionOf      = driver.LabelPrefix + "companion-of"      // the sandbox's container name
	LabelCompanionService = driver.LabelPrefix + "companion-service" // the compose service
)

// companionReady bounds the wait for one companion's healthcheck.
const companionReady = 2 * time.Minute

var serviceName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

var _ driver.CompanionRunner = (*Driver)(nil)

// volumeRemover is the Docker call that removes a companion's named volumes; *client.Client has it.
type volumeRemover interface {
	VolumeRemove(ctx context.Context, volumeID string, opts client.VolumeRemoveOptions) (client.VolumeRemoveResult, error)
}

// companionName is the container name of service next to sandbox sb.
func companionName(sb *driver.Sandbox, service string) string { return sb.Name + "-c-" + service }

// companionVolume is the per-key name of a companion's named volume.
func companionVolume(sb *driver.Sandbox, vol string) string { return sb.Name + "-v-" + vol }

// EnsureCompanions runs cs next to sb: network mode container:<sb> (the sandbox's namespace: localhost from
// the sandbox, no network, ports or DNS of their own), the sandbox's user, dropped capabilities,
// no-new-privileges, seccomp profile, read-only root (with a /tmp tmpfs), memory, CPU and pids bounds, labels
// naming the sandbox. A companion created for an earlier container of the same name (the sandbox was
// recreated) is removed and made again. Companions start in depends_on order; each with a healthcheck is
// waited for until healthy (COMPANION_FAILED when unhealthy, exited, or past companionReady).
func (d *Driver) EnsureCompanions(ctx context.Context, sb *driver.Sandbox, p driver.Posture, cs []driver.Companion) error {
	order, err := companionOrder(cs)
	if err != nil {
		return err
	}
	for _, c := range order {
		if err := d.ensureCompanion(ctx, sb, p, c); err != nil {
			return err
		}
	}
	return nil
}

// companionOrder sorts by depends_on; a cycle or an unknown dependency is COMPOSE_INVALID.
func companionOrder(cs []driver.Companion) ([]driver.Companion, error) {
	byName := map[string]driver.Companion{}
	for _, c := range cs {
		if !serviceName.MatchString(c.Service) {
			return nil, fault.New(fault.ComposeInvalid, "name services with letters, digits, . _ -", "service name %q cannot name a container", c.Service)
		}
		byName[c.Service] = c
	}
	var out []driver.Companion
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name string, from string) error
	visit = func(name, from string) error {
		c, ok := byName[name]
		if !ok {
			return fault.New(fault.ComposeInvalid, "add the service to runServices, or remove it from depends_on", "service %q depends on %q, which is not run", from, name)
		}
		switch state[name] {
		case 1:
			return fault.New(fault.ComposeInvalid, "remove the depends_on cycle", "services depend on each other through %q", name)
		case 2:
			return nil
		}
		state[name] = 1
		for _, dep := range c.DependsOn {
			if err := visit(dep, name); err != nil {
				return err
			}
		}
		state[name] = 2
		out = append(out, c)
		return nil
	}
	for _, c := range cs {
		if err := visit(c.Service, c.Service); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (d *Driver) ensureCompanion(ctx context.Context, sb *driver.Sandbox, p driver.Posture, c driver.Companion) error {
	name := companionName(sb, c.Service)
	netMode := "container:" + sb.ID
	failed := func(err error, format string, args ...any) error {
		return fault.Wrap(err, fault.CompanionFailed, "check `docker logs "+name+"` and the service's image, command and healthcheck",
			"companion %s of sandbox %s: %s", c.Service, sb.Name, fmt.Sprintf(format, args...))
	}
	res, err := d.api.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	switch {
	case err == nil && res.Container.HostConfig != nil && string(res.Container.HostConfig.NetworkMode) == netMode:
		if res.Container.State != nil && res.Container.State.Running {
			return d.waitHealthy(ctx, name, c, failed)
		}
	case err == nil: // made for an earlier container of the sandbox's name: its namespace is gone
		if _, err := d.api.ContainerRemove(ctx, res.Container.ID, client.ContainerRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			return failed(err, "remove the stale container: %v", err)
		}
		err = cerrdefs.ErrNotFound
		fallthrough
	case cerrdefs.IsNotFound(err):
		cfg, host := companionConfig(sb, p, c, netMode)
		if _, err := d.api.ContainerCreate(ctx, client.ContainerCreateOptions{Name: name, Config: cfg, HostConfig: host}); err != nil && !cerrdefs.IsConflict(err) {
			return failed(err, "create: %v", err)
		}
	default:
		return failed(err, "inspect: %v", err)
	}
	if _, err := d.api.ContainerStart(ctx, name, client.ContainerStartOptions{}); err != nil {
		return failed(err, "start: %v", err)
	}
	return d.waitHealthy(ctx, name, c, failed)
}

// companionConfig is the one place a companion's settings become Docker's: the sandbox's posture, less what
// belongs to the sandbox alone (its agent as init, its binds, its network).
func companionConfig(sb *driver.Sandbox, p driver.Posture, c driver.Companion, netMode string) (*container.Config, *container.HostConfig) {
	labels := map[string]string{LabelCompanionOf: sb.Name, LabelCompanionService: c.Service}
	if k := sb.Labels[driver.LabelKey]; k != "" {
		labels[driver.LabelKey+"-of"] = k
	}
	cfg := &container.Config{Image: c.Image, User: p.User, Env: c.Env, Labels: labels, StopSignal: "SIGTERM"}
	if c.Command != nil {
		cfg.Cmd = c.Command
	}
	if h := c.Healthcheck; h != nil {
		cfg.Healthcheck = &container.HealthConfig{Test: h.Test, Interval: h.Interval, Timeout: h.Timeout, Retries: h.Retries}
	}
	pids := p.PidsLimit
	host := &container.HostConfig{
		NetworkMode:    container.NetworkMode(netMode),
		ReadonlyRootfs: true,
		CapDrop:        slices.Clone(p.CapDrop),
		Tmpfs:          map[string]string{"/tmp": "rw,nosuid,nodev,size=64m", "/run": "rw,nosuid,nodev,size=16m"},
		SecurityOpt:    []string{"no-new-privileges:true"},
		RestartPolicy:  container.RestartPolicy{Name: container.RestartPolicyDisabled},
		Runtime:        p.Runtime,
		LogConfig: container.LogConfig{Type: "json-file", Config: map[string]string{
			"max-size": p.LogMaxSize, "max-file": p.LogMaxFiles,
		}},
		Resources: container.Resources{Memory: p.MemoryBytes, MemorySwap: p.MemorySwapBytes, NanoCPUs: p.NanoCPUs, PidsLimit: &pids},
	}
	if len(host.CapDrop) == 0 {
		host.CapDrop = []string{"ALL"}
	}
	if p.Seccomp != "" {
		host.SecurityOpt = append(host.SecurityOpt, "seccomp="+p.Seccomp)
	}
	for _, u := range p.Ulimits { // the sandbox's core and nofile limits (issue 22: companions had none)
		host.Resources.Ulimits = append(host.Resources.Ulimits, &container.Ulimit{Name: u.Name, Soft: u.Soft, Hard: u.Hard})
	}
	for _, v := range c.Volumes {
		host.Mounts = append(host.Mounts, mount.Mount{Type: mount.TypeVolume, Source: companionVolume(sb, v.Name), Target: v.Target,
			VolumeOptions: &mount.VolumeOptions{Labels: labels}})
	}
	return cfg, host
}

// waitHealthy waits until a companion with a healthcheck reports healthy; one without is ready once running.
func (d *Driver) waitHealthy(ctx context.Context, name string, c driver.Companion, failed func(error, string, ...any) error) error {
	ctx, cancel := context.WithTimeout(ctx, companionReady)
	defer cancel()
	for {
		res, err := d.api.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
		if err != nil {
			return failed(err, "inspect: %v", err)
		}
		st := res.Container.State
		if st == nil || !st.Running {
			return failed(nil, "it is not running (exit status %d)", exitOf(st))
		}
		if c.Healthcheck == nil || st.Health == nil || st.Health.Status == container.Healthy {
			return nil
		}
		if st.Health.Status == container.Unhealthy {
			return failed(nil, "its healthcheck reports unhealthy")
		}
		select {
		case <-ctx.Done():
			return failed(ctx.Err(), "not healthy within %v", companionReady)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func exitOf(st *container.State) int {
	if st == nil {
		return -1
	}
	return st.ExitCode
}

// companions lists the companion containers of sb.
func (d *Driver) companions(ctx context.Context, sb *driver.Sandbox) ([]container.Summary, error) {
	res, err := d.api.ContainerList(ctx, client.ContainerListOptions{All: true,
		Filters: client.Filters{}.Add("label", LabelCompanionOf+"="+sb.Name)})
	if err != nil {
		return nil, fmt.Errorf("list companions of %s: %w", sb.Name, err)
	}
	return res.Items, nil
}

// stopCompanions stops sb's companions; called by Stop.
func (d *Driver) stopCompanions(ctx context.Context, sb *driver.Sandbox, secs int) error {
	cs, err := d.companions(ctx, sb)
	if err != nil {
		return err
	}
	for _, c := range cs {
		if _, err := d.api.ContainerStop(ctx, c.ID, client.ContainerStopOptions{Timeout: &secs}); err != nil && !cerrdefs.IsNotFound(err) {
			return fmt.Errorf("stop companion %s: %w", c.ID, err)
		}
	}
	return nil
}

// removeCompanions removes sb's companions and their named volumes; called by Remove.
func (d *Driver) removeCompanions(ctx context.Context, sb *driver.Sandbox) error {
	cs, err := d.companions(ctx, sb)
	if err != nil {
		return err
	}
	var vols []string
	for _, c := range cs {
		for _, m := range c.Mounts {
			if m.Type == mount.TypeVolume && strings.HasPrefix(m.Name, sb.Name+"-v-") {
				vols = append(vols, m.Name)
			}
		}
		if _, err := d.api.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) && !isRemovalInProgress(err) {
			return fmt.Errorf("remove companion %s: %w", c.ID, err)
		}
	}
	if vr, ok := d.api.(volumeRemover); ok {
		for _, v := range vols {
			if _, err := vr.VolumeRemove(ctx, v, client.VolumeRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
				return fmt.Errorf("remove companion volume %s: %w", v, err)
			}
		}
	}
	return nil
}
