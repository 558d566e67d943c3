package main

import (
	"io"
	"os"
	"strings"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/drivers"
	"github.com/sandkeep/sandkeep/drivers/kubernetes"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// policyFlags are exec's and runs start's admission inputs: the operator tier's, on the command line.
type policyFlags struct {
	spec    string // --spec, else $SANDKEEP_SPEC
	sandbox string // --sandbox: "" | none | auto | inline
	trust   string // --trust: trusted | untrusted
	driver  string // --driver: an explicit driver, which must be available
	run     string // --run: a running run to attach to; "" for an implicit run of this command alone
	// hostState is --host-state: auto or none, the operator's host state for this run (exec only).
	hostState string
}

// prefixed writes each line with a prefix (the build's progress, on stderr).
type prefixed struct {
	w      io.Writer
	prefix string
}

func (p prefixed) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line != "" {
			if _, err := io.WriteString(p.w, p.prefix+line); err != nil {
				return 0, err
			}
		}
	}
	return len(b), nil
}

// docker is this process's one client of the Docker engine, for the probe, builds and doctor; made on first use.
// (The Manager that runs the command holds its own: sandkeep.Open owns its driver.)
func (g *globals) docker() (*docker.Driver, error) {
	g.dockerOnce.Do(func() {
		d, err := docker.New(docker.Options{})
		if err != nil {
			g.dockerErr = fault.Wrap(err, fault.DriverUnavailable, "check DOCKER_HOST", "cannot set up the Docker client")
			return
		}
		g.dockerDrv = d
	})
	return g.dockerDrv, g.dockerErr
}

// request is the admission request these flags make for key. The spec flag falls back to $SANDKEEP_SPEC in the
// Config (ConfigFromEnv); a build's progress goes to stderr, each line prefixed.
func (f policyFlags) request(key sandkeep.Key, stderr io.Writer) sandkeep.RunRequest {
	return sandkeep.RunRequest{Key: key, RunID: f.run, Mode: f.sandbox, Trust: f.trust, Driver: f.driver, Spec: f.spec,
		HostState: f.hostState, BuildOutput: prefixed{w: stderr, prefix: "build: "}}
}

// envHostPassthrough is the operator's switch for the host passthrough: allow (the default) or deny, which
// leaves the host driver out so that nothing ever runs unsandboxed (mode none and auto's degrade are refused).
const envHostPassthrough = "SANDKEEP_HOST_PASSTHROUGH"

// offeredDrivers are the drivers this build offers admission: Docker, podman, Kubernetes (the cloud host kind's,
// or --driver kubernetes; the cluster KUBECONFIG or the in-cluster config names, see docs/KUBERNETES.md), and the
// host passthrough unless the operator denies it.
func offeredDrivers() ([]sandkeep.DriverOption, error) {
	kubernetes := kubernetes.FromEnv()
	switch v := os.Getenv(envHostPassthrough); v {
	case "", "allow":
		return append(drivers.Local(), kubernetes), nil
	case "deny":
		return []sandkeep.DriverOption{drivers.Docker(), drivers.Podman(), kubernetes}, nil
	default:
		return nil, fault.New(fault.InvalidArgument, "set "+envHostPassthrough+" to allow or deny",
			"%s=%q is not allow or deny", envHostPassthrough, v)
	}
}
