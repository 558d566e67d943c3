// Package drivers offers sandkeep's container drivers to a library Manager (sandkeep.Config.Drivers). It is a
// package of its own so that a program links the Docker client only when it offers a Docker driver; the
// kubernetes driver is in drivers/kubernetes, for the same reason (client-go).
package drivers

import (
	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/engine"
)

// Docker offers the Docker engine that DOCKER_HOST (or the default socket) names.
func Docker() sandkeep.DriverOption {
	return engine.DriverOption{Name: sandkeep.DriverDocker, New: func(env engine.DriverEnv) (engine.Driver, error) {
		return docker.New(docker.Options{PullTimeout: env.PullTimeout})
	}}
}

// Podman offers podman through its Docker-API socket (PodmanSocket).
func Podman() sandkeep.DriverOption {
	return engine.DriverOption{Name: sandkeep.DriverPodman, New: func(env engine.DriverEnv) (engine.Driver, error) {
		sock, err := PodmanSocket()
		if err != nil {
			return nil, err
		}
		return docker.New(docker.Options{PullTimeout: env.PullTimeout, Host: "unix://" + sock, Name: sandkeep.DriverPodman})
	}}
}

// PodmanSocket finds podman's Docker-API socket: $XDG_RUNTIME_DIR/podman/podman.sock, else
// /run/podman/podman.sock.
func PodmanSocket() (string, error) { return engine.PodmanSocket() }

// Local is what a workstation or VM offers: Docker, then podman, then the host passthrough (used only where
// policy allows running unsandboxed). The host kind's preference order decides among them.
func Local() []sandkeep.DriverOption {
	return []sandkeep.DriverOption{Docker(), Podman(), sandkeep.HostDriver()}
}
