package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/drivers"
	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/policy"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// policyFlags are exec's and runs start's admission inputs: the operator tier's, on the command line.
type policyFlags struct {
	spec    string // --spec, else $SANDKEEP_SPEC
	sandbox string // --sandbox: "" | none | auto | inline
	trust   string // --trust: trusted | untrusted
	driver  string // --driver: an explicit driver, which must be available
	run     string // --run: a running run to attach to; "" for an implicit run of this command alone
}

// candidates are the drivers this build can offer, each with a real probe.
func candidates(g *globals) map[string]policy.Candidate {
	return map[string]policy.Candidate{
		sandkeep.DriverDocker: {Name: sandkeep.DriverDocker, Probe: func(ctx context.Context) error {
			d, err := g.docker()
			if err != nil {
				return err
			}
			return d.Ping(ctx)
		}},
		sandkeep.DriverPodman: {Name: sandkeep.DriverPodman, Probe: func(ctx context.Context) error {
			sock, err := sandkeep.PodmanSocket()
			if err != nil {
				return err
			}
			d, err := docker.New(docker.Options{Host: "unix://" + sock, Name: sandkeep.DriverPodman})
			if err != nil {
				return err
			}
			return d.Ping(ctx)
		}},
		"kubernetes": {Name: "kubernetes", Probe: func(context.Context) error {
			return errors.New("the kubernetes driver is not built yet")
		}},
		sandkeep.DriverHost: {Name: sandkeep.DriverHost, Probe: func(context.Context) error {
			c, err := g.config()
			if err != nil {
				return err
			}
			return sandkeep.CheckAgent(c.AgentPath)
		}},
	}
}

// loadSpec reads the spec named by flag or $SANDKEEP_SPEC, fuses devcontainer.json when the spec names no image
// and no build, and refuses what this build cannot honour yet (fail closed: nothing is silently ignored).
func loadSpec(stderr io.Writer, flag string) (spec.Sandbox, string, []devcontainer.Event, error) {
	path := flag
	if path == "" {
		path = os.Getenv("SANDKEEP_SPEC")
	}
	if path == "" {
		return spec.Sandbox{}, "", nil, nil
	}
	f, list := spec.Load(path)
	if err := report(stderr, list, path); err != nil {
		return spec.Sandbox{}, "", nil, err
	}
	sb := f.Sandbox
	var denied []devcontainer.Event
	if sb.Image == "" && sb.Build == nil {
		dc, list, found := devcontainer.Load(f.Root, devcontainer.Env{Lookup: os.LookupEnv})
		if found {
			if err := report(stderr, list, "devcontainer.json"); err != nil {
				return spec.Sandbox{}, "", nil, err
			}
			sb, denied = devcontainer.Fuse(dc, &sb, nil)
		}
	}
	return sb, f.Root, denied, unsupported(sb)
}

// report prints warnings and turns errors into one SPEC_INVALID failure that lists them all.
func report(stderr io.Writer, list diag.List, what string) error {
	for _, d := range list {
		if d.Severity != diag.Error {
			fmt.Fprintf(stderr, "sandkeep: %s\n", d)
		}
	}
	if !list.HasErrors() {
		return nil
	}
	var lines []string
	for _, d := range list {
		if d.Severity == diag.Error {
			lines = append(lines, "  "+d.String())
		}
	}
	return fault.New(fault.SpecInvalid, "fix the lines above; `sandkeep doctor --strict --spec FILE` checks a spec",
		"%s is not valid:\n%s\n", what, strings.Join(lines, "\n"))
}

// unsupported refuses spec fields this build does not apply yet, rather than running without them.
func unsupported(sb spec.Sandbox) error {
	var fields []string
	add := func(cond bool, field string) {
		if cond {
			fields = append(fields, field)
		}
	}
	add(sb.WorkspaceFolder != "" && sb.WorkspaceFolder != "/workspace", "workspace_folder")
	add(sb.HostState == "auto", "host_state: auto")
	if len(fields) == 0 {
		return nil
	}
	return fault.New(fault.SpecUnsupported, "remove them from the spec, or run a sandkeep that supports them",
		"the spec uses %s, which this sandkeep cannot apply yet; refusing rather than running without them",
		strings.Join(fields, ", "))
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
		BuildOutput: prefixed{w: stderr, prefix: "build: "}}
}

// envHostPassthrough is the operator's switch for the host passthrough: allow (the default) or deny, which
// leaves the host driver out so that nothing ever runs unsandboxed (mode none and auto's degrade are refused).
const envHostPassthrough = "SANDKEEP_HOST_PASSTHROUGH"

// offeredDrivers are the drivers this build offers admission: Docker, podman, and the host passthrough unless
// the operator denies it.
func offeredDrivers() ([]sandkeep.DriverOption, error) {
	switch v := os.Getenv(envHostPassthrough); v {
	case "", "allow":
		return drivers.Local(), nil
	case "deny":
		return []sandkeep.DriverOption{drivers.Docker(), drivers.Podman()}, nil
	default:
		return nil, fault.New(fault.InvalidArgument, "set "+envHostPassthrough+" to allow or deny",
			"%s=%q is not allow or deny", envHostPassthrough, v)
	}
}
