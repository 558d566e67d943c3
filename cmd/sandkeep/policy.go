package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/build"
	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/guard"
	"github.com/sandkeep/sandkeep/internal/policy"
	"github.com/sandkeep/sandkeep/internal/record"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// policyFlags are exec's policy inputs.
type policyFlags struct {
	spec    string // --spec, else $SANDKEEP_SPEC
	sandbox string // --sandbox: "" | none | auto | inline
	trust   string // --trust: trusted | untrusted
	driver  string // --driver: an explicit driver, which must be available
	run     string // --run: a running run to attach to; "" for an implicit run of this command alone
}

// plan is what policy decided for one exec, before anything runs.
type plan struct {
	mode     policy.Resolution
	trust    policy.Trust
	decision policy.Decision
	sandbox  spec.Sandbox // the effective sandbox block (spec fused with devcontainer.json)
	root     string       // the repository root (the spec's directory); "" without a spec
	denied   []devcontainer.Event
}

// decide loads the spec, resolves the mode, selects a driver and decides degrade-or-refuse. It runs nothing.
// Diagnostics that are only warnings go to stderr; errors fail with SPEC_INVALID.
func decide(ctx context.Context, g *globals, f policyFlags) (*plan, error) {
	p := &plan{}
	sb, root, denied, err := loadSpec(g.stderr, f.spec)
	if err != nil {
		return nil, err
	}
	p.sandbox, p.root, p.denied = sb, root, denied
	if p.trust, err = policy.ParseTrust(f.trust); err != nil {
		return nil, err
	}
	p.mode, err = policy.ResolveMode(policy.ModeInputs{
		CLI: f.sandbox, Spec: sb.Mode, SpecNamesImage: sb.Image != "" || sb.Build != nil,
		Env: os.Getenv("SANDKEEP_SANDBOX_DEFAULT"),
	})
	if err != nil {
		return nil, err
	}
	in := policy.DecideInputs{Mode: p.mode, Trust: p.trust, SpecHasSecretFiles: len(sb.SecretFiles) > 0}
	if p.mode.Mode != spec.ModeNone {
		kind, err := policy.HostKind(os.Getenv)
		if err != nil {
			return nil, err
		}
		in.Selected, in.Obstacle = policy.Shared().Select(ctx, kind, f.driver, candidates(g))
	}
	p.decision = policy.Decide(in)
	return p, nil
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

// apply puts the effective sandbox block into the library's Config.
func apply(c *sandkeep.Config, sb spec.Sandbox) error {
	if sb.Image != "" {
		c.Image = sb.Image
	}
	if sb.User != "" {
		c.User = sb.User
	}
	keys := make([]string, 0, len(sb.Env))
	for k := range sb.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		c.Env = append(c.Env, k+"="+sb.Env[k])
	}
	c.Mounts = append(c.Mounts, sb.Mounts...)
	if err := applyNetwork(c, sb.Network); err != nil {
		return err
	}
	c.PostCreate = sb.PostCreate
	c.Tmpfs = append(c.Tmpfs, sb.Tmpfs...)
	if r := sb.Resources; r != nil {
		c.CPUs, c.PidsLimit = r.CPUs, r.Pids
		if r.Memory != "" {
			n, err := spec.ParseSize(r.Memory)
			if err != nil {
				return fault.Wrap(err, fault.SpecInvalid, "write a size such as 2g or 512m", "resources.memory %q", r.Memory)
			}
			c.MemoryBytes = n
		}
	}
	return nil
}

// applyNetwork puts the spec's network block into c, reading each credential's value from sandkeep's own
// environment. The value goes to the egress proxy only; the sandbox sees a placeholder.
func applyNetwork(c *sandkeep.Config, n *spec.Network) error {
	if n == nil {
		return nil
	}
	nw := &sandkeep.Network{Mode: n.Mode, Preset: n.Preset, Rules: n.Rules, Inspect: n.Inspect}
	for _, cr := range n.Credentials {
		v := os.Getenv(cr.FromEnv)
		if v == "" {
			return fault.New(fault.SecretUnavailable, "export "+cr.FromEnv+" in sandkeep's environment",
				"credential %s: $%s is not set", cr.Name, cr.FromEnv)
		}
		nw.Credentials = append(nw.Credentials, sandkeep.Credential{Name: cr.Name, Value: v, Hosts: cr.Hosts,
			Header: cr.Header, Scheme: cr.Scheme, Fields: cr.Fields, AllowPlaintext: cr.AllowPlaintext})
	}
	c.Network = nw
	return nil
}

// deniedEvent is the one sandbox_env_denied event for the repository's stripped variables (names only).
func deniedEvent(denied []devcontainer.Event) (events.SandboxEnvDenied, bool) {
	if len(denied) == 0 {
		return events.SandboxEnvDenied{}, false
	}
	ev := events.SandboxEnvDenied{Origin: filepath.Base(denied[0].File)}
	for _, d := range denied {
		ev.Keys = append(ev.Keys, d.Key)
	}
	return ev, true
}

// buildImage builds the spec's image through the engine when the run goes to Docker (a run on the host has no
// image), recording sandbox_build_* events; progress goes to stderr. It returns the image to use.
func buildImage(ctx context.Context, g *globals, p *plan, rec *record.Recorder) (string, error) {
	b := p.sandbox.Build
	switch {
	case b == nil || p.decision.Driver == sandkeep.DriverHost: // a run on the host has no image
		return "", nil
	case p.decision.Driver != sandkeep.DriverDocker:
		return "", fault.New(fault.SpecUnsupported, "build the image ahead of time and name it with image:, or use the docker driver",
			"the spec's build: is not wired for the %s driver yet; refusing rather than running another image", p.decision.Driver)
	}
	d, err := g.docker()
	if err != nil {
		return "", err
	}
	rec.Event(events.NameSandboxBuildStarted, events.SandboxBuildStarted{Dockerfile: b.Dockerfile, Context: b.Context})
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, buildBound)
	defer cancel()
	ref, _, err := d.Build(ctx, build.Request{Root: p.root, Dockerfile: b.Dockerfile, Context: b.Context, Args: b.Args},
		prefixed{w: g.stderr, prefix: "build: "})
	took := time.Since(start).Milliseconds()
	if err != nil {
		// The event names the failure's code, never the daemon's line: it may quote a RUN with secrets.
		rec.Event(events.NameSandboxBuildFailed, events.SandboxBuildFailed{Error: string(failureCode(err)), DurationMS: took})
		return "", err
	}
	rec.Event(events.NameSandboxBuildFinished, events.SandboxBuildFinished{Image: ref, DurationMS: took})
	return ref, nil
}

// buildBound bounds an image build; past it the run fails as SANDBOX_SETUP_TIMEOUT.
const buildBound = 30 * time.Minute

func failureCode(err error) fault.Code {
	if c := fault.CodeOf(err); c != "" {
		return c
	}
	return fault.BuildFailed
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

// maxSecretFile bounds a secret read from a host file.
const maxSecretFile = 1 << 20

// secrets reads the values of the spec's secret files. from_env reads this process's environment; from_file
// reads a host file, which must pass the mount guard's source rules (a repository's spec may be a stranger's:
// it must not be able to name ~/.ssh/id_rsa). Values are never put into errors.
func secrets(sb spec.Sandbox) ([]sandkeep.Secret, error) {
	var out []sandkeep.Secret
	for _, sf := range sb.SecretFiles {
		mode, err := spec.ParseSecretMode(sf.Mode)
		if err != nil {
			return nil, fault.Wrap(err, fault.SpecInvalid, "write the mode in octal, e.g. \"0400\"", "secret %q: mode", sf.Name)
		}
		var value []byte
		switch {
		case sf.FromEnv != "":
			v, ok := os.LookupEnv(sf.FromEnv)
			if !ok {
				return nil, fault.New(fault.SecretUnavailable, "set "+sf.FromEnv+" in sandkeep's environment",
					"secret %q: the environment variable %s is not set", sf.Name, sf.FromEnv)
			}
			value = []byte(v)
		case sf.FromFile != "":
			if value, err = readSecretFile(sf); err != nil {
				return nil, err
			}
		}
		out = append(out, sandkeep.Secret{Name: sf.Name, Path: sf.Path, Mode: mode, Value: value})
	}
	return out, nil
}

func readSecretFile(sf spec.SecretFile) ([]byte, error) {
	if err := guard.CheckMount(driver.Mount{Source: sf.FromFile, Target: "/run/secrets-source", ReadOnly: true}); err != nil {
		return nil, fault.Wrap(err, fault.SecretUnavailable,
			"name a file outside credential directories, or pass the value with from_env",
			"secret %q: its source file is refused (%s)", sf.Name, fault.CodeOf(err))
	}
	f, err := os.Open(sf.FromFile)
	if err != nil {
		return nil, fault.Wrap(err, fault.SecretUnavailable, "check the path and its permissions", "secret %q: cannot read its file", sf.Name)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil || len(b) > maxSecretFile {
		return nil, fault.New(fault.SecretUnavailable, "keep secret files under 1 MiB", "secret %q: cannot read its file, or it is over 1 MiB", sf.Name)
	}
	return b, nil
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
