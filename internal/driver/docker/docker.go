// Package docker is the sandkeep driver for the Docker Engine API (github.com/moby/moby/client). It turns a
// driver.CreateSpec into a hardened container and runs commands in it through the agent over Docker exec.
package docker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// engine is the part of the Docker API this driver calls; tests can stand in for it to inject failures.
type engine interface {
	Ping(ctx context.Context, opts client.PingOptions) (client.PingResult, error)
	ImageInspect(ctx context.Context, ref string, opts ...client.ImageInspectOption) (client.ImageInspectResult, error)
	ImagePull(ctx context.Context, ref string, opts client.ImagePullOptions) (client.ImagePullResponse, error)
	ContainerInspect(ctx context.Context, id string, opts client.ContainerInspectOptions) (client.ContainerInspectResult, error)
	ContainerStats(ctx context.Context, id string, opts client.ContainerStatsOptions) (client.ContainerStatsResult, error)
	ContainerCreate(ctx context.Context, opts client.ContainerCreateOptions) (client.ContainerCreateResult, error)
	ContainerStart(ctx context.Context, id string, opts client.ContainerStartOptions) (client.ContainerStartResult, error)
	ContainerStop(ctx context.Context, id string, opts client.ContainerStopOptions) (client.ContainerStopResult, error)
	ContainerRemove(ctx context.Context, id string, opts client.ContainerRemoveOptions) (client.ContainerRemoveResult, error)
	ContainerList(ctx context.Context, opts client.ContainerListOptions) (client.ContainerListResult, error)
	ExecCreate(ctx context.Context, id string, opts client.ExecCreateOptions) (client.ExecCreateResult, error)
	ExecAttach(ctx context.Context, execID string, opts client.ExecAttachOptions) (client.ExecAttachResult, error)
	ExecInspect(ctx context.Context, execID string, opts client.ExecInspectOptions) (client.ExecInspectResult, error)
}

var _ engine = (*client.Client)(nil)

// Driver runs sandboxes as Docker containers.
type Driver struct {
	api         engine
	pullTimeout time.Duration
	name        string
	buildState  // what a build's RUN steps get on this engine, found at the first build
}

var _ driver.Driver = (*Driver)(nil)

// Options configure a Driver.
type Options struct {
	// PullTimeout bounds an image pull; zero means 5 minutes.
	PullTimeout time.Duration
	// Host, when set, is the engine's address (e.g. podman's Docker-API socket, unix:///run/podman/podman.sock)
	// instead of the environment's DOCKER_HOST; Name then names the driver ("podman"). Default "docker".
	Host string
	Name string
}

// New connects to the engine named by the environment (DOCKER_HOST etc.), negotiating the API version.
// It does not talk to the engine; call Ping for that.
func New(opts Options) (*Driver, error) {
	clientOpts := []client.Opt{client.FromEnv} // the client negotiates the API version by itself
	if opts.Host != "" {
		clientOpts = append(clientOpts, client.WithHost(opts.Host))
	}
	c, err := client.New(clientOpts...)
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	return NewWithEngine(c, opts), nil
}

// NewWithEngine wraps an existing engine client (a *client.Client, or a stand-in in tests).
func NewWithEngine(api engine, opts Options) *Driver {
	if opts.PullTimeout <= 0 {
		opts.PullTimeout = 5 * time.Minute
	}
	if opts.Name == "" {
		opts.Name = "docker"
	}
	return &Driver{api: api, pullTimeout: opts.PullTimeout, name: opts.Name}
}

// Name is "docker", or the name Options gave (e.g. "podman").
func (d *Driver) Name() string { return d.name }

// Capabilities of the Docker driver.
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{Build: true, HostBinds: true, NetworkPolicy: true, Persistent: true, Channel: true, Pools: true}
}

// Ping asks the daemon whether it is up.
func (d *Driver) Ping(ctx context.Context) error {
	if _, err := d.api.Ping(ctx, client.PingOptions{}); err != nil {
		return fault.Wrap(err, fault.DriverUnavailable, "start the Docker daemon (scripts/docker-up.sh) or set DOCKER_HOST",
			"the Docker daemon did not answer")
	}
	return nil
}

// ResolveImage returns the local ID of ref, pulling it once when it is absent.
func (d *Driver) ResolveImage(ctx context.Context, ref string) (string, error) {
	img, err := d.api.ImageInspect(ctx, ref)
	if err == nil {
		return img.ID, nil
	}
	if !cerrdefs.IsNotFound(err) {
		return "", fmt.Errorf("inspect image %q: %w", ref, err)
	}
	if perr := d.pull(ctx, ref); perr != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("pull image %q: %w", ref, ctx.Err())
		}
		// The engine's words are not repeated: they quote what the registry answered, and a repository may
		// name the image (issue 22, finding 6). They stay in the chain for errors.Is and the operator's logs.
		return "", fault.Wrap(perr, fault.ImageUnavailable, "build it locally or pass --image with an image that is present; `docker pull "+ref+"` on the engine's host says why the pull failed",
			"image %q is not present and the engine could not pull it", ref)
	}
	img, err = d.api.ImageInspect(ctx, ref)
	if err != nil {
		return "", fault.Wrap(err, fault.ImageUnavailable, "build it locally or pass --image with an image that is present",
			"image %q was pulled but cannot be inspected", ref)
	}
	return img.ID, nil
}

func (d *Driver) pull(ctx context.Context, ref string) error {
	ctx, cancel := context.WithTimeout(ctx, d.pullTimeout)
	defer cancel()
	resp, err := d.api.ImagePull(ctx, ref, client.ImagePullOptions{})
	if err != nil {
		return err
	}
	return resp.Wait(ctx)
}

// Inspect returns the container named name; errdefs.ErrNotFound when there is none.
func (d *Driver) Inspect(ctx context.Context, name string) (*driver.Sandbox, error) {
	res, err := d.api.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil, fmt.Errorf("inspect %s: %w", name, cerrdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("inspect %s: %w", name, err)
	}
	return fromInspect(res.Container), nil
}

func fromInspect(c container.InspectResponse) *driver.Sandbox {
	sb := &driver.Sandbox{ID: c.ID, Name: strings.TrimPrefix(c.Name, "/"), ImageID: c.Image}
	if c.Config != nil {
		sb.Labels = c.Config.Labels
	}
	if c.State != nil {
		sb.State = stateOf(c.State.Status)
		sb.Pid = c.State.Pid
		sb.StartedAt = parseTime(c.State.StartedAt)
		sb.FinishedAt = parseTime(c.State.FinishedAt)
	}
	return sb
}

func stateOf(s container.ContainerState) driver.State {
	switch s {
	case container.StateRunning:
		return driver.StateRunning
	case container.StateCreated, container.StateExited:
		return driver.StateStopped
	case container.StatePaused:
		return driver.StatePaused
	case container.StateRestarting:
		return driver.StateRestarting
	case container.StateRemoving:
		return driver.StateRemoving
	default:
		return driver.StateDead
	}
}

// parseTime reads Docker's RFC 3339 times; Docker writes "0001-01-01T00:00:00Z" for never.
func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || t.Year() <= 1 {
		return time.Time{}
	}
	return t
}

// Create makes the container for spec from spec.ImageID, applying spec.Posture field by field.
func (d *Driver) Create(ctx context.Context, spec *driver.CreateSpec) (*driver.Sandbox, error) {
	cfg, host := containerConfig(spec)
	res, err := d.api.ContainerCreate(ctx, client.ContainerCreateOptions{Name: spec.Name, Config: cfg, HostConfig: host})
	if err != nil {
		if cerrdefs.IsConflict(err) {
			return nil, fmt.Errorf("create %s: %w", spec.Name, cerrdefs.ErrConflict)
		}
		if lacksCapacity(err) {
			return nil, fault.Wrap(err, fault.SandboxCapacity, "free memory or disk space on the engine's host, or retry later",
				"the Docker daemon has no room to create sandbox %s", spec.Name)
		}
		return nil, fault.Wrap(err, fault.SandboxFailed, "check `docker info` and the daemon log",
			"the Docker daemon could not create sandbox %s", spec.Name)
	}
	return d.Inspect(ctx, res.ID)
}

// capacityErrnos are what an engine reports when its host has no room for a sandbox: memory, disk, a disk quota.
var capacityErrnos = []syscall.Errno{syscall.ENOMEM, syscall.ENOSPC, syscall.EDQUOT}

// lacksCapacity says whether the engine refused for lack of memory or space. The Engine API carries a create or
// start failure as a message only (its errdefs class is "unknown" or "system", whatever the cause), so this is
// the one place that reads an engine's text, and only for an errno's own description (strerror), which the
// kernel's C library spells the same everywhere: runc and containerd pass it through verbatim.
func lacksCapacity(err error) bool {
	if cerrdefs.IsResourceExhausted(err) {
		return true
	}
	msg := err.Error()
	for _, e := range capacityErrnos {
		if errors.Is(err, e) || strings.Contains(msg, e.Error()) {
			return true
		}
	}
	return false
}

// containerConfig translates the posture; it is the only place a posture field becomes a Docker setting.
func containerConfig(spec *driver.CreateSpec) (*container.Config, *container.HostConfig) {
	p := spec.Posture
	cfg := &container.Config{
		Image:      spec.ImageID,
		User:       p.User,
		Env:        p.Env,
		Entrypoint: p.Init,
		Cmd:        []string{},
		WorkingDir: driver.WorkspaceDir,
		Labels:     spec.Labels,
		Hostname:   "sandbox",
		StopSignal: p.StopSignal,
	}
	pids := p.PidsLimit
	host := &container.HostConfig{
		ReadonlyRootfs: p.ReadOnlyRoot,
		CapDrop:        p.CapDrop,
		Tmpfs:          p.Tmpfs,
		NetworkMode:    container.NetworkMode(p.Network),
		LogConfig: container.LogConfig{Type: "json-file", Config: map[string]string{
			"max-size": p.LogMaxSize, "max-file": p.LogMaxFiles,
		}},
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyDisabled},
		Runtime:       p.Runtime,
		Resources: container.Resources{
			Memory:     p.MemoryBytes,
			MemorySwap: p.MemorySwapBytes,
			NanoCPUs:   p.NanoCPUs,
			PidsLimit:  &pids,
			// Docker schedules nothing: a request is the sandbox's weight under CPU contention (the kubelet's
			// 1024 shares per core) and the memory the kernel reclaims down to under pressure.
			CPUShares:         cpuShares(p.RequestNanoCPUs),
			MemoryReservation: p.RequestMemoryBytes,
		},
	}
	if p.NoNewPrivileges {
		host.SecurityOpt = append(host.SecurityOpt, "no-new-privileges:true")
	}
	if p.Seccomp != "" {
		// The Engine API takes the profile itself (the CLI reads the file and sends its content).
		host.SecurityOpt = append(host.SecurityOpt, "seccomp="+p.Seccomp)
	}
	for _, u := range p.Ulimits {
		host.Resources.Ulimits = append(host.Resources.Ulimits, &container.Ulimit{Name: u.Name, Soft: u.Soft, Hard: u.Hard})
	}
	for _, m := range p.Mounts {
		host.Mounts = append(host.Mounts, mount.Mount{
			Type: mount.TypeBind, Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly,
			BindOptions: &mount.BindOptions{Propagation: mount.PropagationRPrivate},
		})
	}
	return cfg, host
}

// Start starts a created or stopped container.
func (d *Driver) Start(ctx context.Context, sb *driver.Sandbox) error {
	if _, err := d.api.ContainerStart(ctx, sb.ID, client.ContainerStartOptions{}); err != nil {
		if cerrdefs.IsNotFound(err) {
			return fmt.Errorf("start %s: %w", sb.Name, cerrdefs.ErrNotFound)
		}
		if lacksCapacity(err) {
			return fault.Wrap(err, fault.SandboxCapacity, "free memory or disk space on the engine's host, or retry later",
				"the Docker daemon has no room to start sandbox %s", sb.Name)
		}
		return fault.Wrap(err, fault.SandboxFailed, "check `docker logs "+sb.Name+"` and the daemon log",
			"the Docker daemon could not start sandbox %s", sb.Name)
	}
	return nil
}

// Stop stops the container; an absent container is not an error.
func (d *Driver) Stop(ctx context.Context, sb *driver.Sandbox, grace time.Duration) error {
	secs := int(grace.Round(time.Second) / time.Second)
	// SIGKILL: the agent's init ignores every other signal (its commands could send them too).
	_, err := d.api.ContainerStop(ctx, sb.ID, client.ContainerStopOptions{Signal: "SIGKILL", Timeout: &secs})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("stop %s: %w", sb.Name, err)
	}
	return d.stopCompanions(ctx, sb, secs) // compose companions (companions.go) stop with their sandbox
}

// Remove force-removes the container; an absent container is not an error.
func (d *Driver) Remove(ctx context.Context, sb *driver.Sandbox) error {
	if err := d.removeCompanions(ctx, sb); err != nil { // compose companions (companions.go) go with their sandbox
		return err
	}
	for attempt := 1; ; attempt++ {
		_, err := d.api.ContainerRemove(ctx, sb.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		if err == nil || cerrdefs.IsNotFound(err) || isRemovalInProgress(err) {
			return nil
		}
		if attempt >= slowKillAttempts || !isSlowKill(err) {
			return fmt.Errorf("remove %s: %w", sb.Name, err)
		}
		select { // the kill went out; the runtime is slow to report the exit
		case <-ctx.Done():
			return fmt.Errorf("remove %s: %w", sb.Name, err)
		case <-time.After(time.Duration(attempt) * time.Second):
		}
	}
}

// slowKillAttempts bounds the removals tried when the engine killed the container but saw no exit in time.
const slowKillAttempts = 4

// isSlowKill: the engine sent SIGKILL but the runtime did not report the exit within its wait ("tried to kill
// container, but did not receive an exit event"). Seen with runsc on a loaded host, a paused sandbox above all;
// the container exits a moment later, so the removal is tried again. Also "is zombie and can not be killed":
// runsc's process has exited but is not reaped yet (seen once in CI, 2026-12-02).
func isSlowKill(err error) bool {
	return strings.Contains(err.Error(), "did not receive an exit event") ||
		strings.Contains(err.Error(), "is zombie and can not be killed")
}

// isRemovalInProgress: a concurrent remove already owns it. Docker reports this as a conflict.
func isRemovalInProgress(err error) bool { return cerrdefs.IsConflict(err) }

// List returns the containers labelled with installation.
func (d *Driver) List(ctx context.Context, installation string) ([]*driver.Sandbox, error) {
	res, err := d.api.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: client.Filters{}.Add("label", driver.LabelInstallation+"="+installation),
	})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	out := make([]*driver.Sandbox, 0, len(res.Items))
	for _, c := range res.Items {
		name := ""
		if len(c.Names) > 0 {
			name = strings.TrimPrefix(c.Names[0], "/")
		}
		out = append(out, &driver.Sandbox{ID: c.ID, Name: name, State: stateOf(c.State), Labels: c.Labels, ImageID: c.ImageID})
	}
	return out, nil
}

// errNotRunning is what Exec returns for a container that is not running; lifecycle re-ensures on it.
var errNotRunning = errors.New("sandbox is not running")

func notRunning(name string) error {
	return fmt.Errorf("exec in %s: %w: %w", name, errNotRunning, cerrdefs.ErrConflict)
}

var _ driver.ImageWatcher = (*Driver)(nil)

// WatchImages follows the engine's image events from since on.
func (d *Driver) WatchImages(ctx context.Context, since time.Time, changed func()) error {
	w, ok := d.api.(interface {
		Events(ctx context.Context, opts client.EventsListOptions) client.EventsResult
	})
	if !ok {
		return errors.New("watch images: the engine client has no events")
	}
	ev := w.Events(ctx, client.EventsListOptions{
		Since:   strconv.FormatInt(since.Unix(), 10),
		Filters: client.Filters{}.Add("type", string(events.ImageEventType)),
	})
	for {
		select {
		case <-ev.Messages:
			changed()
		case err := <-ev.Err:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("watch images: %w", err)
		case <-ctx.Done():
			return nil
		}
	}
}

// Version is the engine's version and API version, for doctor.
func (d *Driver) Version(ctx context.Context) (string, error) {
	v, ok := d.api.(interface {
		ServerVersion(ctx context.Context, opts client.ServerVersionOptions) (client.ServerVersionResult, error)
	})
	if !ok {
		return "", errors.New("the engine client cannot report its version")
	}
	res, err := v.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		return "", fmt.Errorf("engine version: %w", err)
	}
	return fmt.Sprintf("Docker %s (API %s)", res.Version, res.APIVersion), nil
}

// LocalImage returns the ID of ref when the engine has it, without pulling: doctor's "resolvable without
// pulling" check. An absent image is errdefs.ErrNotFound.
func (d *Driver) LocalImage(ctx context.Context, ref string) (string, error) {
	img, err := d.api.ImageInspect(ctx, ref)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return "", fmt.Errorf("image %q: %w", ref, cerrdefs.ErrNotFound)
		}
		return "", fmt.Errorf("inspect image %q: %w", ref, err)
	}
	return img.ID, nil
}

// cpuShares is a CPU request as cgroup CPU shares, 1024 per core as the kubelet converts them (at least 2, the
// kernel's minimum); 0 (no request) leaves the engine's default weight.
func cpuShares(nanoCPUs int64) int64 {
	if nanoCPUs <= 0 {
		return 0
	}
	return max(nanoCPUs*1024/1_000_000_000, 2)
}
