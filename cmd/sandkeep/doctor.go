package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/devcontainer"
	"github.com/sandkeep/sandkeep/internal/diag"
	"github.com/sandkeep/sandkeep/internal/doctor"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
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
	f.StringVar(&pf.spec, "spec", "", "the project's sandkeep.yaml (default $SANDKEEP_SPEC)")
	f.StringVar(&pf.sandbox, "sandbox", "", "the mode a run would be given with --sandbox")
	f.StringVar(&pf.driver, "driver", "", "the driver a run would be given with --driver")
	f.DurationVar(&timeout, "timeout", doctor.DefaultTimeout, "bound on each probe")
	return cmd
}

// doctorState carries what earlier checks found to later ones.
type doctorState struct {
	sb       spec.Sandbox
	mode     policy.Resolution
	selected policy.Selection
	docker   *docker.Driver
}

func doctorChecks(g *globals, pf policyFlags, strict bool) []doctor.Check {
	st := &doctorState{}
	checks := []doctor.Check{
		{Name: "host kind", Run: func(context.Context) doctor.Result {
			kind, err := policy.HostKind(os.Getenv)
			if err != nil {
				return fail(err)
			}
			return doctor.Result{Status: doctor.Pass, Detail: string(kind)}
		}},
		{Name: "spec resolves", Run: func(context.Context) doctor.Result { return st.loadSpec(g, pf) }},
		{Name: "mode", Needs: []string{"spec resolves"}, Run: func(context.Context) doctor.Result {
			res, err := policy.ResolveMode(policy.ModeInputs{CLI: pf.sandbox, Spec: st.sb.Mode,
				SpecNamesImage: st.sb.Image != "" || st.sb.Build != nil, Env: os.Getenv("SANDKEEP_SANDBOX_DEFAULT")})
			if err != nil {
				return fail(err)
			}
			st.mode = res
			return doctor.Result{Status: doctor.Pass, Detail: fmt.Sprintf("%s, from %s (%s)", res.Mode, res.Source, res.Note)}
		}},
		{Name: "docker", Run: func(ctx context.Context) doctor.Result { return st.probeDocker(ctx, g) }},
		{Name: "drivers", Needs: []string{"host kind"}, Run: func(ctx context.Context) doctor.Result { return listDrivers(ctx, g) }},
		{Name: "driver", Needs: []string{"host kind", "mode"}, Run: func(ctx context.Context) doctor.Result {
			return st.chooseDriver(ctx, g, pf)
		}},
	}
	if !strict {
		return checks
	}
	return append(checks,
		doctor.Check{Name: "spec supported", Needs: []string{"spec resolves"}, Run: func(context.Context) doctor.Result {
			if err := unsupported(st.sb); err != nil {
				return fail(err)
			}
			return doctor.Result{Status: doctor.Pass, Detail: "every field it sets can be applied"}
		}},
		doctor.Check{Name: "mounts pass the guard", Needs: []string{"spec resolves"}, Run: func(context.Context) doctor.Result {
			for _, m := range st.sb.Mounts {
				if _, err := guard.ParseMount(m); err != nil {
					return fail(err)
				}
			}
			return doctor.Result{Status: doctor.Pass, Detail: fmt.Sprintf("%d mount(s)", len(st.sb.Mounts))}
		}},
		doctor.Check{Name: "network rules parse", Needs: []string{"spec resolves"}, Run: func(context.Context) doctor.Result {
			if st.sb.Network == nil {
				return doctor.Result{Status: doctor.Pass, Detail: "no network block: no network at all"}
			}
			if _, errs := egress.ParseRules(st.sb.Network.Rules); len(errs) > 0 {
				return doctor.Result{Status: doctor.Fail, Detail: errs[0].Error(), Fix: errs[0].Hint}
			}
			return doctor.Result{Status: doctor.Pass, Detail: fmt.Sprintf("%d rule(s)", len(st.sb.Network.Rules))}
		}},
		doctor.Check{Name: "image present without pulling", Needs: []string{"docker", "spec resolves"}, Run: func(ctx context.Context) doctor.Result {
			return st.checkImage(ctx, g)
		}},
		doctor.Check{Name: "capabilities cover the spec", Needs: []string{"driver", "spec resolves"}, Run: func(context.Context) doctor.Result {
			return st.checkCapabilities()
		}},
	)
}

func fail(err error) doctor.Result {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return doctor.Result{Status: doctor.Fail, Detail: string(fe.Code) + ": " + fe.Message, Fix: fe.Hint}
	}
	return doctor.Result{Status: doctor.Fail, Detail: err.Error()}
}

func (st *doctorState) loadSpec(g *globals, pf policyFlags) doctor.Result {
	path := pf.spec
	if path == "" {
		path = os.Getenv("SANDKEEP_SPEC")
	}
	if path == "" {
		return doctor.Result{Status: doctor.Pass, Detail: "no spec (--spec or SANDKEEP_SPEC): defaults apply"}
	}
	f, list := spec.Load(path)
	if r, bad := diagResult(list, path); bad {
		return r
	}
	st.sb = f.Sandbox
	detail := path
	if st.sb.Image == "" && st.sb.Build == nil {
		dc, list, found := devcontainer.Load(f.Root, devcontainer.Env{Lookup: os.LookupEnv})
		if found {
			if r, bad := diagResult(list, "devcontainer.json"); bad {
				return r
			}
			st.sb, _ = devcontainer.Fuse(dc, &st.sb, nil)
			detail += " + " + dc.Path
		}
	}
	if warns := countWarnings(list); warns > 0 {
		return doctor.Result{Status: doctor.Warn, Detail: fmt.Sprintf("%s (%d warning(s))", detail, warns)}
	}
	return doctor.Result{Status: doctor.Pass, Detail: detail}
}

func diagResult(list diag.List, what string) (doctor.Result, bool) {
	if !list.HasErrors() {
		return doctor.Result{}, false
	}
	var lines []string
	hint := ""
	for _, d := range list {
		if d.Severity == diag.Error {
			lines = append(lines, d.String())
			if hint == "" {
				hint = d.Hint
			}
		}
	}
	return doctor.Result{Status: doctor.Fail, Detail: what + ": " + strings.Join(lines, "; "), Fix: hint}, true
}

func countWarnings(list diag.List) int {
	n := 0
	for _, d := range list {
		if d.Severity == diag.Warning {
			n++
		}
	}
	return n
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

func (st *doctorState) chooseDriver(ctx context.Context, g *globals, pf policyFlags) doctor.Result {
	if st.mode.Mode == spec.ModeNone {
		return doctor.Result{Status: doctor.Pass, Detail: "mode none: commands run on the host (no driver)"}
	}
	kind, _ := policy.HostKind(os.Getenv)
	sel, obstacle := policy.Shared().Select(ctx, kind, pf.driver, candidates(g))
	st.selected = sel
	switch {
	case obstacle != nil && sel.Driver == "":
		return fail(obstacle)
	case !sel.Sandboxing && st.mode.Mode == spec.ModeInline:
		return doctor.Result{Status: doctor.Fail, Detail: "no sandboxing driver; mode inline refuses every run",
			Fix: "start a container engine (scripts/docker-up.sh)"}
	case !sel.Sandboxing:
		return doctor.Result{Status: doctor.Warn, Detail: "no sandboxing driver; mode auto would run commands on the HOST",
			Fix: "start a container engine (scripts/docker-up.sh), or use --sandbox inline to refuse instead"}
	}
	return doctor.Result{Status: doctor.Pass, Detail: fmt.Sprintf("%s; capabilities: %s", sel.Driver, capabilities(sel.Driver))}
}

func capabilities(name string) string {
	if name == sandkeep.DriverHost {
		return "none (no isolation)"
	}
	return "build, host binds, persistent sandboxes, agent channel; no network policy yet"
}

func (st *doctorState) checkImage(ctx context.Context, g *globals) doctor.Result {
	c, err := g.config()
	if err != nil {
		return fail(err)
	}
	if b := st.sb.Build; b != nil {
		return doctor.Result{Status: doctor.Pass, Detail: fmt.Sprintf("built from %s when a run needs it (the context is checked then)", b.Dockerfile)}
	}
	image := st.sb.Image
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

func (st *doctorState) checkCapabilities() doctor.Result {
	if st.selected.Driver != sandkeep.DriverDocker {
		if len(st.sb.SecretFiles) > 0 {
			return doctor.Result{Status: doctor.Fail, Detail: "the spec has secret files; the host passthrough cannot deliver them",
				Fix: "make a sandboxing driver available"}
		}
		return doctor.Result{Status: doctor.Pass, Detail: "nothing to check without a sandboxing driver"}
	}
	if n := st.sb.Network; n != nil && n.Mode != "" && n.Mode != "none" {
		return doctor.Result{Status: doctor.Fail, Detail: "network mode " + n.Mode + " needs network policy, which the docker driver does not enforce yet",
			Fix: "remove the network block (no network at all)"}
	}
	return doctor.Result{Status: doctor.Pass, Detail: "the docker driver covers the spec"}
}

// preflight runs doctor's strict battery before a command (SANDKEEP_PREFLIGHT=1) and refuses on any failure.
func preflight(ctx context.Context, g *globals, pf policyFlags) error {
	var failed []string
	for _, r := range doctor.Run(ctx, doctorChecks(g, pf, true), doctor.DefaultTimeout) {
		if r.Status == doctor.Fail || r.Status == doctor.Skip {
			failed = append(failed, fmt.Sprintf("%s: %s", r.Name, r.Detail))
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return fault.New(fault.PreflightFailed, "run `sandkeep doctor --strict` for the fix lines, or unset SANDKEEP_PREFLIGHT",
		"preflight checks failed: %s", strings.Join(failed, "; "))
}

// listDrivers probes every driver of the host kind's preference order and says which answer.
func listDrivers(ctx context.Context, g *globals) doctor.Result {
	kind, _ := policy.HostKind(os.Getenv)
	cands := candidates(g)
	var parts []string
	for _, name := range policy.Preference(kind) {
		c, ok := cands[name]
		if !ok {
			continue
		}
		if err := c.Probe(ctx); err != nil {
			parts = append(parts, name+": unavailable ("+firstLine(err)+")")
			continue
		}
		parts = append(parts, name+": available")
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
