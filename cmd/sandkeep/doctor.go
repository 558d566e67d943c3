package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	units "github.com/docker/go-units"
	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/doctor"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/guard"
	"github.com/sandkeep/sandkeep/internal/policy"
	"github.com/sandkeep/sandkeep/internal/spec"
)

// doctor's exit status for bad usage; 0 and 1 come from doctor.ExitCode.
const exitUsage = 2

func newDoctor(g *globals) *cobra.Command {
	var (
		strict  bool
		asJSON  bool
		seccomp bool
		install string
		pf      policyFlags
		timeout = doctor.DefaultTimeout
	)
	cmd := &cobra.Command{
		Use:   "doctor [--strict] [--spec FILE] [--json]",
		Short: "Say what sandkeep would do on this machine, and with --strict whether a spec can be honoured here",
		Long: "doctor prints the host kind, the drivers found (with versions), the one that would be chosen and its\n" +
			"capabilities, and the default mode and where it comes from. With --strict it runs, on the exact resolved\n" +
			"spec, every check with pass/warn/fail and a fix line. Exit status: 0 all passed, 1 a check failed, 2 bad usage.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if install != "" {
				return installSeccomp(g, install)
			}
			if seccomp {
				// For the daemon's own default (its builds cannot be given one): "build limits" below.
				_, err := fmt.Fprintln(g.stdout, driver.SeccompProfile())
				return err
			}
			if timeout <= 0 {
				printError(g.stderr, fault.New(fault.InvalidArgument, "use a positive duration", "--timeout must be positive"))
				return exitError{exitUsage}
			}
			res := doctor.Run(cmd.Context(), doctorChecks(g, pf, strict), timeout)
			if asJSON {
				if err := doctor.PrintJSON(g.stdout, res); err != nil {
					return err
				}
			} else if err := doctor.Print(g.stdout, res); err != nil {
				return err
			}
			if code := doctor.ExitCode(res); code != 0 {
				return exitError{code}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&strict, "strict", false, "also check the resolved spec: validity, mounts, image present, network rules, driver capabilities")
	f.BoolVar(&asJSON, "json", false, "print one JSON document")
	f.StringVar(&install, "seccomp-install", "", "write sandkeep's seccomp profile under DIR (a node's kubelet seccomp directory) where SANDKEEP_KUBE_SECCOMP=localhost pods find it, and exit")
	f.BoolVar(&seccomp, "seccomp-profile", false, "print sandkeep's seccomp profile (to make it the engine's default, which builds run under) and exit")
	f.StringVar(&pf.spec, "spec", "", "the project's sandkeep.yaml (default $SANDKEEP_SPEC)")
	f.StringVar(&pf.sandbox, "sandbox", "", "the mode a run would be given with --sandbox")
	f.StringVar(&pf.driver, "driver", "", "the driver a run would be given with --driver")
	f.DurationVar(&timeout, "timeout", doctor.DefaultTimeout, "bound on each probe")
	return cmd
}

// doctorState carries what earlier checks found to later ones.
type doctorState struct {
	m      *sandkeep.Manager // opened by the first check; nil when the operator's config is refused
	plan   *doctor.Plan      // what admission would decide
	docker *docker.Driver
}

// doctorChecks are doctor's checks. They ask the library's admission (doctor.Views.Plan) what a run would get, so
// that doctor and every entry point agree by construction.
func doctorChecks(g *globals, pf policyFlags, strict bool) []doctor.Check {
	st := &doctorState{}
	checks := []doctor.Check{
		{Name: "host kind", Run: func(ctx context.Context) doctor.Result {
			m, _, err := g.open(ctx) // left open: doctor's process ends, and a daemon's is shared
			if err != nil {
				return fail(err)
			}
			st.m = m
			return doctor.Result{Status: doctor.Pass, Detail: doctor.ViewsOf(m).HostKind()}
		}},
		{Name: "spec resolves", Needs: []string{"host kind"}, Run: func(ctx context.Context) doctor.Result { return st.planRun(ctx, pf) }},
		{Name: "devcontainer drops", Needs: []string{"spec resolves"}, Run: func(context.Context) doctor.Result {
			if d := st.plan.Dropped; len(d) > 0 {
				return doctor.Result{Status: doctor.Warn, Detail: fmt.Sprintf("%d item(s) of devcontainer.json would weaken the sandbox and are dropped: %s", len(d), strings.Join(d, "; ")),
					Fix: "nothing to do: the sandbox runs hardened without them; remove them from devcontainer.json to silence this"}
			}
			return doctor.Result{Status: doctor.Pass, Detail: "nothing dropped"}
		}},
		{Name: "forward ports", Needs: []string{"spec resolves"}, Run: func(context.Context) doctor.Result { return forwardPortsResult(doctor.ForwardPorts(st.plan), true) }},
		{Name: "forward ports not forwarded", Needs: []string{"spec resolves"}, Run: func(context.Context) doctor.Result { return forwardPortsResult(doctor.ForwardPorts(st.plan), false) }},
		{Name: "mode", Needs: []string{"spec resolves"}, Run: func(context.Context) doctor.Result {
			p := st.plan
			return doctor.Result{Status: doctor.Pass, Detail: fmt.Sprintf("%s, from %s (%s)", p.Mode, p.Source, p.ModeNote)}
		}},
		{Name: "docker", Run: func(ctx context.Context) doctor.Result { return st.probeDocker(ctx, g) }},
		{Name: "drivers", Needs: []string{"host kind"}, Run: func(ctx context.Context) doctor.Result { return st.listDrivers(ctx) }},
		{Name: "driver", Needs: []string{"mode"}, Run: func(context.Context) doctor.Result { return st.chooseDriver() }},
		{Name: "network policy", Needs: []string{"driver"}, Timeout: 2 * time.Minute, Run: st.networkPolicy},
		{Name: "capacity", Needs: []string{"driver"}, Run: st.capacity},
	}
	// On the kubernetes driver: the pods' seccomp profile and the nodes' pods limit (SK411, SK412).
	var kubeRes []doctor.Result
	var kubeOnce sync.Once
	for i, name := range []string{"kube seccomp", "kube pids"} {
		checks = append(checks, doctor.Check{Name: name, Needs: []string{"driver"}, Run: func(ctx context.Context) doctor.Result {
			if st.plan == nil || st.plan.Driver != policy.DriverKubernetes {
				return doctor.Result{Status: doctor.Pass, Detail: "not the kubernetes driver"}
			}
			kubeOnce.Do(func() { kubeRes = kubeHardening(ctx) })
			return kubeRes[i]
		}})
	}
	// The engine's version, runtimes and user namespaces against the sandboxes' runtime and identity (SK4xx).
	checks = append(checks, doctor.HardeningChecks([]string{"docker"}, func(ctx context.Context) (doctor.Engine, doctor.Sandboxes, error) {
		return st.hardening(ctx, g)
	})...)
	if !strict {
		return checks
	}
	return append(checks,
		doctor.Check{Name: "mounts pass the guard", Needs: []string{"spec resolves"}, Run: func(context.Context) doctor.Result {
			for _, m := range st.plan.Spec.Mounts {
				if _, err := guard.ParseMount(m); err != nil {
					return fail(err)
				}
			}
			return doctor.Result{Status: doctor.Pass, Detail: fmt.Sprintf("%d mount(s)", len(st.plan.Spec.Mounts))}
		}},
		doctor.Check{Name: "network rules parse", Needs: []string{"spec resolves"}, Run: func(context.Context) doctor.Result {
			n := st.plan.Spec.Network
			if n == nil {
				return doctor.Result{Status: doctor.Pass, Detail: "no network block: no network at all"}
			}
			if _, errs := egress.ParseRules(n.Rules); len(errs) > 0 {
				return doctor.Result{Status: doctor.Fail, Detail: errs[0].Error(), Fix: errs[0].Hint}
			}
			return doctor.Result{Status: doctor.Pass, Detail: fmt.Sprintf("%d rule(s)", len(n.Rules))}
		}},
		doctor.Check{Name: "image present without pulling", Needs: []string{"docker", "spec resolves"}, Run: func(ctx context.Context) doctor.Result {
			return st.checkImage(ctx, g)
		}},
		doctor.Check{Name: "capabilities cover the spec", Needs: []string{"network policy", "spec resolves"}, Run: func(context.Context) doctor.Result {
			return st.checkCapabilities()
		}},
	)
}

// planRun asks admission what a run with these flags would get.
func (st *doctorState) planRun(ctx context.Context, pf policyFlags) doctor.Result {
	key, _ := sandkeep.NewKey("doctor", "doctor")
	p, err := doctor.ViewsOf(st.m).Plan(ctx, pf.request(key, io.Discard))
	if err != nil {
		return fail(err)
	}
	st.plan = p
	detail := "no spec (--spec or SANDKEEP_SPEC): defaults apply"
	if p.Root != "" {
		detail = "the repository at " + p.Root
	}
	if len(p.Warnings) > 0 {
		return doctor.Result{Status: doctor.Warn, Detail: fmt.Sprintf("%s (%d warning(s): %s)", detail, len(p.Warnings), strings.Join(p.Warnings, "; "))}
	}
	return doctor.Result{Status: doctor.Pass, Detail: detail}
}

// forwardPortsResult is what `sandkeep port-forward` with no port does with devcontainer.json's forwardPorts:
// the entries it forwards (an information line), or those it does not, with why (a warning).
func forwardPortsResult(fps []sandkeep.ForwardPort, forwarded bool) doctor.Result {
	var lines []string
	for _, fp := range fps {
		if fp.Forwarded == forwarded {
			lines = append(lines, fp.String())
		}
	}
	switch {
	case len(fps) == 0 && forwarded:
		return doctor.Result{Status: doctor.Pass, Detail: "devcontainer.json has no forwardPorts: port-forward needs a port"}
	case len(lines) == 0 && forwarded:
		return doctor.Result{Status: doctor.Pass, Detail: "none of devcontainer.json's forwardPorts can be forwarded"}
	case len(lines) == 0:
		return doctor.Result{Status: doctor.Pass, Detail: "nothing: every forwardPorts entry is forwarded"}
	case forwarded:
		return doctor.Result{Status: doctor.Pass, Detail: fmt.Sprintf("port-forward with no port forwards %d: %s", len(lines), strings.Join(lines, "; "))}
	}
	return doctor.Result{Status: doctor.Warn, Detail: fmt.Sprintf("%d of devcontainer.json's forwardPorts: %s", len(lines), strings.Join(lines, "; ")),
		Fix: `forward a port on the sandbox's loopback (3000, "localhost:3000") or on a compose companion ("db:5432"); the sandbox has no route to another host`}
}

func fail(err error) doctor.Result {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return doctor.Result{Status: doctor.Fail, Detail: string(fe.Code) + ": " + fe.Message, Fix: fe.Hint}
	}
	return doctor.Result{Status: doctor.Fail, Detail: err.Error()}
}

func (st *doctorState) probeDocker(ctx context.Context, g *globals) doctor.Result {
	d, err := g.docker()
	if err != nil {
		return fail(err)
	}
	if err := d.Ping(ctx); err != nil {
		return fail(err)
	}
	st.docker = d
	v, err := d.Version(ctx)
	if err != nil {
		return doctor.Result{Status: doctor.Warn, Detail: "reachable; version unknown: " + err.Error()}
	}
	return doctor.Result{Status: doctor.Pass, Detail: v}
}

// hardening is what HardeningChecks judge: the engine's facts and how the operator's config runs sandboxes there.
func (st *doctorState) hardening(ctx context.Context, g *globals) (doctor.Engine, doctor.Sandboxes, error) {
	e, err := st.docker.Engine(ctx)
	if err != nil {
		return doctor.Engine{}, doctor.Sandboxes{}, err
	}
	c, err := g.config()
	if err != nil {
		return doctor.Engine{}, doctor.Sandboxes{}, err
	}
	sbs, err := doctor.SandboxesOf(c.Runtime, c.SandboxUIDs, c.User)
	if err != nil {
		return doctor.Engine{}, doctor.Sandboxes{}, err
	}
	bl := st.docker.BuildLimits(ctx)
	return doctor.Engine{Version: e.Version, Runtimes: e.Runtimes, DefaultRuntime: e.DefaultRuntime, SecurityOptions: e.SecurityOptions,
			BuildPids: bl.Pids, BuildPidsOff: bl.PidsOff, BuildSeccomp: bl.Seccomp},
		sbs, nil
}

func (st *doctorState) chooseDriver() doctor.Result {
	p := st.plan
	switch {
	case p.Mode == spec.ModeNone && p.Refusal == nil:
		return doctor.Result{Status: doctor.Pass, Detail: "mode none: commands run on the host (no driver)"}
	case p.Refusal != nil:
		r := fail(p.Refusal)
		r.Detail = fmt.Sprintf("mode %s refuses every run here: %s", p.Mode, r.Detail)
		return r
	case !p.Sandboxed:
		return doctor.Result{Status: doctor.Warn, Detail: "no sandboxing driver; mode auto would run commands on the HOST",
			Fix: "start a container engine (scripts/docker-up.sh), or use --sandbox inline to refuse instead"}
	}
	return doctor.Result{Status: doctor.Pass, Detail: fmt.Sprintf("%s; capabilities: %s", p.Driver, capabilities(p.Capabilities))}
}

// installSeccomp writes sandkeep's profile to dir/kube.SeccompLocalhostProfile(), whole or not at all (a pod
// started meanwhile must not read half a profile): deploy/kubernetes/seccomp-profile.yaml's DaemonSet runs it.
func installSeccomp(g *globals, dir string) error {
	p := filepath.Join(dir, kube.SeccompLocalhostProfile())
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".profile-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(driver.SeccompProfile()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return err
	}
	_, err = fmt.Fprintln(g.stdout, p)
	return err
}

// kubeHardening asks the kubernetes driver (configured from the environment, as runs get it) what its pods run
// under.
func kubeHardening(ctx context.Context) []doctor.Result {
	d, err := kube.New(kube.FromEnv())
	if err != nil {
		r := fail(err)
		return []doctor.Result{r, r}
	}
	h := d.Hardening(ctx)
	return doctor.KubeChecks(doctor.Kube{Seccomp: h.Seccomp, PodPidsLimit: h.PodPidsLimit, PidsErr: h.PidsErr})
}

// networkPolicy reports what the driver's NetworkPolicy probe found (the kubernetes driver's probe pod). Where
// it is not enforced, a sandbox's network none is not what it says (the pod has the cluster's pod network) and
// every command with a network block is refused (NETWORK_UNENFORCED): a warning, which --strict's capability
// check turns into a failure for a spec that asks for a network.
func (st *doctorState) networkPolicy(ctx context.Context) doctor.Result {
	p := st.plan
	switch {
	case !p.Sandboxed:
		return doctor.Result{Status: doctor.Pass, Detail: "no sandboxing driver: nothing to confine"}
	case !p.NetworkProbe:
		return doctor.Result{Status: doctor.Pass, Detail: fmt.Sprintf("the %s driver confines each sandbox's network itself", p.Driver)}
	}
	enforced, detail, _ := doctor.ViewsOf(st.m).ProbeNetworkPolicy(ctx, p.Driver)
	p.Capabilities.NetworkPolicy = enforced // what the capability check below reads
	if enforced {
		return doctor.Result{Status: doctor.Pass, Detail: detail}
	}
	return doctor.Result{Status: doctor.Warn,
		Detail: fmt.Sprintf("%s: sandboxes of the %s driver are NOT network-isolated (network none is not enforced; they have the cluster's pod network), and commands with a network block, none included, are refused (%s; %s=1 accepts none)",
			detail, p.Driver, fault.NetworkUnenforced, kube.EnvAllowUnenforcedNone),
		Fix: "use a network plugin that enforces NetworkPolicy (Calico, Cilium, kube-router) and set SANDKEEP_KUBE_CHANNEL_LISTEN; see docs/KUBERNETES.md"}
}

// capacity says how many sandboxes of each shape (the Config's, each template's) the chosen driver's room holds,
// by what each reserves (a template's requests, else its limits). A shape of which not one fits is a warning:
// its first sandbox would wait for room that never comes (SANDBOX_CAPACITY).
func (st *doctorState) capacity(ctx context.Context) doctor.Result {
	p := st.plan
	if !p.Sandboxed {
		return doctor.Result{Status: doctor.Pass, Detail: "no sandboxing driver: nothing reserved"}
	}
	c, err := doctor.ViewsOf(st.m).Capacity(ctx, p.Driver)
	if err != nil {
		return doctor.Result{Status: doctor.Warn, Detail: fmt.Sprintf("the %s driver cannot say: %v", p.Driver, err),
			Fix: "check the driver's credentials (doctor's other checks say more)"}
	}
	if c == nil {
		return doctor.Result{Status: doctor.Pass, Detail: fmt.Sprintf("the %s driver reserves nothing", p.Driver)}
	}
	room := fmt.Sprintf("%s: %g CPUs, %s", c.Source, c.CPUs, units.BytesSize(float64(c.MemoryBytes)))
	if c.Nodes > 0 {
		room = fmt.Sprintf("%d node(s), %s", c.Nodes, room)
	}
	var shapes []string
	var none []string
	for _, s := range c.Shapes {
		name := s.Template
		if name == "" {
			name = "(default)"
		}
		fits := "unknown"
		if s.Fits >= 0 {
			fits = strconv.FormatInt(s.Fits, 10)
		}
		shapes = append(shapes, fmt.Sprintf("%s %s sandboxes (each reserves %g CPU, %s)", name, fits, s.CPUs, units.BytesSize(float64(s.MemoryBytes))))
		if s.Fits == 0 {
			none = append(none, name)
		}
	}
	detail := room + "; " + strings.Join(shapes, "; ")
	if len(none) > 0 {
		return doctor.Result{Status: doctor.Warn, Detail: detail,
			Fix: fmt.Sprintf("not one sandbox of %s fits: lower its cpus/memory or give it requests (`requests: {cpus: 0.05, memory: 128m}` on a template), or add nodes", strings.Join(none, ", "))}
	}
	return doctor.Result{Status: doctor.Pass, Detail: detail}
}

// capabilities says what a driver's Capabilities offer, in words.
func capabilities(c doctor.DriverCapabilities) string {
	var have []string
	for _, f := range []struct {
		ok   bool
		what string
	}{{c.Build, "build"}, {c.HostBinds, "host binds"}, {c.NetworkPolicy, "network policy"},
		{c.Persistent, "persistent sandboxes"}, {c.Channel, "agent channel"}} {
		if f.ok {
			have = append(have, f.what)
		}
	}
	if len(have) == 0 {
		return "none (no isolation)"
	}
	return strings.Join(have, ", ")
}

func (st *doctorState) checkImage(ctx context.Context, g *globals) doctor.Result {
	c, err := g.config()
	if err != nil {
		return fail(err)
	}
	if b := st.plan.Spec.Build; b != nil {
		return doctor.Result{Status: doctor.Pass, Detail: fmt.Sprintf("built from %s when a run needs it (the context is checked then)", b.Dockerfile)}
	}
	image := st.plan.Spec.Image
	if image == "" {
		image = c.Image
	}
	if image == "" {
		image = sandkeep.DefaultImage
	}
	id, err := st.docker.LocalImage(ctx, image)
	if cerrdefs.IsNotFound(err) {
		return doctor.Result{Status: doctor.Fail, Detail: fmt.Sprintf("%s is not present locally", image),
			Fix: "build it (`make image` builds the default) or pull it; sandkeep pulls only when a run needs it"}
	}
	if err != nil {
		return fail(err)
	}
	return doctor.Result{Status: doctor.Pass, Detail: fmt.Sprintf("%s (%s)", image, id[:min(len(id), 19)])}
}

// checkCapabilities reads the chosen driver's Capabilities against what the spec asks for.
func (st *doctorState) checkCapabilities() doctor.Result {
	p, sb := st.plan, st.plan.Spec
	if !p.Sandboxed {
		if len(sb.SecretFiles) > 0 {
			return doctor.Result{Status: doctor.Fail, Detail: "the spec has secret files; the host passthrough cannot deliver them",
				Fix: "make a sandboxing driver available"}
		}
		return doctor.Result{Status: doctor.Pass, Detail: "nothing to check without a sandboxing driver"}
	}
	c := p.Capabilities
	var missing []string
	if n := sb.Network; n != nil && n.Mode != "" && n.Mode != "none" && !c.NetworkPolicy {
		missing = append(missing, "network mode "+n.Mode+" needs network policy")
	}
	if sb.Build != nil && !c.Build {
		missing = append(missing, "build: needs a driver that builds images")
	}
	if len(sb.Mounts) > 0 && !c.HostBinds {
		missing = append(missing, "mounts need host binds")
	}
	if len(missing) > 0 {
		return doctor.Result{Status: doctor.Fail, Detail: fmt.Sprintf("the %s driver cannot: %s", p.Driver, strings.Join(missing, "; ")),
			Fix: "use a driver that can (--driver), or remove those fields"}
	}
	return doctor.Result{Status: doctor.Pass, Detail: fmt.Sprintf("the %s driver covers the spec", p.Driver)}
}

// preflight runs doctor's strict battery before a command (SANDKEEP_PREFLIGHT) and refuses on any failure (and,
// with SANDKEEP_PREFLIGHT=strict, on a check that could not run); its warnings are printed on stderr.
func preflight(ctx context.Context, g *globals, pf policyFlags, pre doctor.Preflight) error {
	failed, warnings := pre.Verdict(doctor.Run(ctx, doctorChecks(g, pf, true), doctor.DefaultTimeout))
	for _, r := range warnings {
		fmt.Fprintf(g.stderr, "sandkeep: preflight: %s\n", r.Line())
	}
	if len(failed) == 0 {
		return nil
	}
	lines := make([]string, 0, len(failed))
	for _, r := range failed {
		lines = append(lines, fmt.Sprintf("%s: %s", r.Name, r.Detail))
	}
	return fault.New(fault.PreflightFailed, "run `sandkeep doctor --strict` for the fix lines, or unset SANDKEEP_PREFLIGHT",
		"preflight checks failed: %s", strings.Join(lines, "; "))
}

// listDrivers probes every offered driver of the host kind's preference order and says which answer.
func (st *doctorState) listDrivers(ctx context.Context) doctor.Result {
	var parts []string
	for _, d := range doctor.ViewsOf(st.m).Drivers(ctx) {
		if d.Err != nil {
			parts = append(parts, d.Name+": unavailable ("+firstLine(d.Err)+")")
			continue
		}
		parts = append(parts, d.Name+": available")
	}
	return doctor.Result{Status: doctor.Pass, Detail: strings.Join(parts, "; ")}
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return s
}
