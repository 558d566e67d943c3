package docker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/driver"
)

// Engine is what the engine says about itself that decides how hard its sandboxes are: doctor reads it
// (internal/doctor, EngineChecks).
type Engine struct {
	Version        string   // the server's version, e.g. "20.10.24+dfsg1"
	APIVersion     string   // e.g. "1.41"
	Runtimes       []string // the OCI runtimes registered with the engine (runc, runsc, ...), sorted
	DefaultRuntime string   // the runtime a container gets when it names none
	// SecurityOptions are the engine's security features by name: seccomp, apparmor, selinux, userns (the
	// daemon remaps user namespaces), rootless, cgroupns, no-new-privileges.
	SecurityOptions []string
}

// Engine asks the engine for its version, runtimes and security options.
func (d *Driver) Engine(ctx context.Context) (Engine, error) {
	api, ok := d.api.(interface {
		ServerVersion(ctx context.Context, opts client.ServerVersionOptions) (client.ServerVersionResult, error)
		Info(ctx context.Context, opts client.InfoOptions) (client.SystemInfoResult, error)
	})
	if !ok {
		return Engine{}, errors.New("the engine client cannot report its version and info")
	}
	v, err := api.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		return Engine{}, fmt.Errorf("engine version: %w", err)
	}
	res, err := api.Info(ctx, client.InfoOptions{})
	if err != nil {
		return Engine{}, fmt.Errorf("engine info: %w", err)
	}
	e := Engine{Version: v.Version, APIVersion: v.APIVersion, DefaultRuntime: res.Info.DefaultRuntime}
	for name := range res.Info.Runtimes {
		e.Runtimes = append(e.Runtimes, name)
	}
	slices.Sort(e.Runtimes)
	for _, opt := range res.Info.SecurityOptions {
		e.SecurityOptions = append(e.SecurityOptions, securityOptionName(opt))
	}
	return e, nil
}

// securityOptionName is the name of one of the engine's security options, which it writes as
// "name=seccomp,profile=default" (API 1.30 and later) or as a bare name (older engines).
func securityOptionName(opt string) string {
	for _, kv := range strings.Split(opt, ",") {
		if name, ok := strings.CutPrefix(kv, "name="); ok {
			return name
		}
	}
	return opt
}

// Capacity is the engine host's CPUs and memory: Docker schedules nothing, so every sandbox's reservation shares
// them (driver.CapacityReporter).
func (d *Driver) Capacity(ctx context.Context) (driver.Capacity, error) {
	api, ok := d.api.(interface {
		Info(ctx context.Context, opts client.InfoOptions) (client.SystemInfoResult, error)
	})
	if !ok {
		return driver.Capacity{}, errors.New("the engine client cannot report its info")
	}
	res, err := api.Info(ctx, client.InfoOptions{})
	if err != nil {
		return driver.Capacity{}, fmt.Errorf("engine info: %w", err)
	}
	return driver.Capacity{Nodes: 1, MilliCPUs: int64(res.Info.NCPU) * 1000, MemoryBytes: res.Info.MemTotal,
		Source: "the Docker engine's host"}, nil
}
