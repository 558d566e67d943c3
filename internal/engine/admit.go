package engine

import (
	"context"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/internal/build"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/policy"
	"github.com/sandkeep/sandkeep/internal/record"
	"github.com/sandkeep/sandkeep/internal/spec"
	"github.com/sandkeep/sandkeep/internal/store"
)

// Trust levels of a run. An untrusted run never runs outside a sandbox.
const (
	TrustTrusted   = "trusted"
	TrustUntrusted = "untrusted"
)

// RunRequest asks admission for a run: the unit of work (a session, a workflow run) that commands attach to.
// The operator tier (the CLI's flags, a server's configuration) fills Mode, Driver and Spec; a caller (an API
// token, an MCP session, a library call) picks a Template, may lower its Trust and narrow its network.
type RunRequest struct {
	Key Key
	// RunID attaches to that running run instead of admitting a new one: the run keeps the mode, trust and
	// driver it was admitted with (Mode, Trust and Driver here are ignored) and stays open when its commands end.
	RunID string
	// Mode is the operator's explicit sandbox mode for the run (the CLI's --sandbox, source cli): none, auto or
	// inline; "" leaves it to the spec, then Config.SandboxDefault, then auto. A repository may raise it, never
	// lower it.
	Mode string
	// Trust is trusted ("", the default) or untrusted.
	Trust string
	// Driver, when set, is the only driver the run may use: unavailable is a refusal, never a fallback.
	Driver string
	// Spec is the repository's sandkeep.yaml; "" is the template's, else Config.Spec (none when both are empty).
	Spec string
	// Template is an operator template by name; "" is the tenant's default (Config.TenantTemplates, then
	// Config.DefaultTemplate), else none. A template the tenant may not use is TEMPLATE_NOT_FOUND, as a missing
	// one is.
	Template string
	// Caller marks a request of the caller tier: a network block on its commands may only narrow the run's.
	Caller bool
	// Network, when set, is a block for the run's commands, over the run's own (Config's, the template's, the
	// repository's): merged with it as its Inherit says (append or replace); for a Caller it may only narrow it
	// (NETWORK_WIDENED) and replaces it.
	Network *Network
	// HostState is the operator's host_state for this run (the CLI's --host-state): auto or none, over the
	// template's and the Config's (hoststate.go). A Caller may not set it (TIER_REFUSED).
	HostState string
	// RequestID, when set, is recorded on the run's events.
	RequestID string
	// BuildOutput receives the progress of an image build the spec asks for (nil: discarded).
	BuildOutput io.Writer
	// Observer is told the run's events as they are recorded and when each of its commands runs.
	Observer Observer
}

// Run is one admitted unit of work. Its fields are the admission verdict as recorded; Exec runs a command in it.
type Run struct {
	ID        string `json:"id,omitempty"` // "" when no store records runs
	Tenant    string `json:"tenant"`
	User      string `json:"user"`
	Mode      string `json:"mode"`   // the resolved mode: none, auto or inline
	Source    string `json:"source"` // the tier that chose it: cli, spec, env or default
	Trust     string `json:"trust"`
	Driver    string `json:"driver,omitempty"` // what its commands run on; "" for a refused run
	Admission string `json:"admission"`        // admitted or refused
	Template  string `json:"template,omitempty"`
	// Warnings are the repository's diagnostics that did not stop the run, one line each.
	Warnings []string `json:"warnings,omitempty"`
	// Notice is the one loud line of a run that degraded to the host ("" otherwise): show it to a person.
	Notice string `json:"notice,omitempty"`
	// Dropped is the one line saying what the repository's devcontainer.json asked that would weaken the
	// sandbox and was dropped ("" when nothing was); the sandbox_devcontainer_dropped event lists each with why.
	Dropped string `json:"dropped,omitempty"`

	m        *Manager
	key      Key
	lc       *lifecycle.Manager
	shape    *lifecycle.Shape
	network  *Network                 // the run's block: Config's, then the template's, then the repository's
	pol      *egress.Policy           // network resolved once, for commands without a block of their own
	secrets  []Secret                 // the repository's and the template's secret files, delivered to every command
	services []lifecycle.ServiceGrant // the template's host services under the run's token (services.go)
	caller   bool
	owned    bool           // admitted here: Finish ends it (an attached run stays open)
	cmdNet   *Network       // RunRequest.Network: the caller's block over the run's
	cmdPol   *egress.Policy // what the commands get: pol, or cmdNet over network, resolved once
	rec      *record.Recorder
	obs      Observer

	postAttach string    // devcontainer.json's postAttachCommand: run before the run's first command
	attachOnce sync.Once // guards attachErr
	attachErr  error     // the postAttachCommand's failure, which every command of the run then returns

	shareMu      sync.Mutex // guards shareSeen and shareAdopted
	shareSeen    bool       // the run's first command went out (or the run provided its sandbox): shared is decided
	shareAdopted bool       // the run adopted the sandbox another process had just made
}

// Admit decides whether and how key's work runs, records the run with that verdict before anything runs, and
// returns it ready for Exec. It alone gathers the tiers' inputs (the operator's Config, the repository's spec and
// devcontainer.json, the caller's template), refuses what a tier may not set, resolves the mode (cli > spec >
// env > default; a repository may raise isolation, never lower it), selects the driver (host kind, preference
// order, one probe each) and decides: sandbox, degrade to the host (auto, trusted: sandbox_skipped and Notice),
// or refuse. A refused run is recorded (admission refused, finished) and returned together with its error.
//
// Input that is not understood (a malformed spec, an unknown template, a bad trust) is an error without a run.
func (m *Manager) Admit(ctx context.Context, rr RunRequest) (*Run, error) {
	// A key may be a literal of the public alias rather than identity.New's: its parts are checked here, once,
	// for every entry point, before anything is decided or recorded.
	if err := rr.Key.Check(); err != nil {
		return nil, err
	}
	if rr.RunID != "" {
		return m.attach(ctx, rr)
	}
	a, err := m.decide(ctx, rr)
	if err != nil {
		return nil, err
	}
	trust, tpl, repo, mode, d := a.trust, a.tpl, a.repo, a.mode, a.d
	r := &Run{Tenant: rr.Key.Tenant, User: rr.Key.User, Mode: mode.Mode, Source: string(mode.Source), Trust: trust,
		Driver: d.Driver, Admission: store.AdmissionAdmitted, Template: tpl.name(), Warnings: repo.warnings,
		Notice: d.CLILine, Dropped: droppedLine(repo.dropped), m: m, key: rr.Key, caller: rr.Caller, owned: true, obs: rr.Observer}
	if d.Action == policy.Refuse {
		r.Admission, r.Driver = store.AdmissionRefused, ""
	}
	if err := r.record(ctx, rr, d); err != nil {
		return nil, err
	}
	if repo.denied != nil {
		r.event(events.NameSandboxEnvDenied, *repo.denied)
	}
	if repo.dropped != nil {
		r.event(events.NameDevcontainerDropped, *repo.dropped)
	}
	if d.Event != nil {
		r.event(events.NameSandboxSkipped, *d.Event)
	}
	if d.Action == policy.Refuse {
		return r, d.Err
	}
	if err := r.prepare(ctx, rr, tpl, repo, d.Action == policy.RunOnHost); err != nil {
		r.Finish(err) // nothing was created for it: the run ends with the failure's code
		return nil, err
	}
	return r, nil
}

// admission is what Admit decided before it records anything.
type admission struct {
	trust string
	tpl   *template
	repo  *repository
	mode  policy.Resolution
	d     policy.Decision
}

// decide gathers the tiers' inputs, resolves the mode, selects the driver and decides. It records and creates
// nothing: Admit and Plan share it.
func (m *Manager) decide(ctx context.Context, rr RunRequest) (*admission, error) {
	trust, err := parseTrust(rr.Trust)
	if err != nil {
		return nil, err
	}
	tpl, repo, err := m.shapeInputs(rr)
	if err != nil {
		return nil, err
	}
	mode, err := policy.ResolveMode(policy.ModeInputs{CLI: rr.Mode, Spec: repo.sb.Mode,
		SpecNamesImage: repo.sb.Image != "" || repo.sb.Build != nil, Env: m.cfg.SandboxDefault})
	if err != nil {
		return nil, err
	}
	in := policy.DecideInputs{Mode: mode, Trust: policy.Trust(trust),
		SpecHasSecretFiles: len(repo.sb.SecretFiles) > 0 || len(tpl.secretFiles()) > 0}
	if mode.Mode != spec.ModeNone {
		in.Selected, in.Obstacle = m.selector.Select(ctx, m.kind, rr.Driver, m.drivers.candidates())
	}
	return &admission{trust: trust, tpl: tpl, repo: repo, mode: mode, d: policy.Decide(in)}, nil
}

// RepositorySpec is a repository's sandbox block as admission sees it: sandkeep.yaml fused with
// devcontainer.json and checked against the operator's RepositoryPolicy.
type RepositorySpec = spec.Sandbox

// DriverCapabilities are the optional things a driver can do (build, host binds, network policy, ...).
type DriverCapabilities = driver.Capabilities

// Plan is what admission would decide for a run, with nothing recorded, created or run: doctor's view.
type Plan struct {
	Mode, Source, ModeNote string
	Trust                  string
	Driver                 string // the driver a run would use; "" when it would be refused
	Sandboxed              bool   // Driver isolates commands (false for the host passthrough)
	Refusal                error  // why the run would be refused; nil when it would run
	Notice                 string // the loud line a degraded run prints
	Capabilities           DriverCapabilities
	Template               string
	Spec                   RepositorySpec // the repository's block, fused and checked
	Root                   string         // the repository root; "" without a spec
	Warnings               []string
	Dropped                []string // what devcontainer.json asked that would weaken the posture, dropped: one line each with why
	// ForwardPorts are devcontainer.json's forwardPorts and what port forwarding does with each (forwardports.go).
	ForwardPorts []ForwardPort
	// NetworkProbe: the driver's network confinement rests on a probe (driver.NetworkPolicyProber: the kubernetes
	// driver's probe pod, see Manager.ProbeNetworkPolicy); false for a driver that confines by itself (Docker).
	NetworkProbe bool
}

// Plan decides as Admit would for rr, and records, creates and runs nothing. An input that is not understood,
// or a repository that asks for what it may not, is its error; a refusal of the verdict is Plan.Refusal.
func (m *Manager) Plan(ctx context.Context, rr RunRequest) (*Plan, error) {
	a, err := m.decide(ctx, rr)
	if err != nil {
		return nil, err
	}
	p := &Plan{Mode: a.mode.Mode, Source: string(a.mode.Source), ModeNote: a.mode.Note, Trust: a.trust,
		Driver: a.d.Driver, Sandboxed: a.d.Action == policy.RunSandboxed, Notice: a.d.CLILine, Template: a.tpl.name(),
		Spec: a.repo.sb, Root: a.repo.root, Warnings: a.repo.warnings, Dropped: droppedItems(a.repo.dropped),
		ForwardPorts: a.repo.forwardPorts()}
	if a.d.Action == policy.Refuse {
		p.Driver, p.Refusal = "", a.d.Err
		return p, nil
	}
	if d, err := m.drivers.get(a.d.Driver); err == nil {
		p.Capabilities = d.Capabilities()
		_, p.NetworkProbe = d.(driver.NetworkPolicyProber)
	}
	return p, nil
}

// ProbeNetworkPolicy runs the network confinement probe of the driver named drv (driver.NetworkPolicyProber:
// the kubernetes driver's probe pod, which takes seconds) and returns its verdict and what it found; ok is false
// for a driver that needs none or is not offered.
func (m *Manager) ProbeNetworkPolicy(ctx context.Context, drv string) (enforced bool, detail string, ok bool) {
	d, err := m.drivers.get(drv)
	if err != nil {
		return false, "", false
	}
	np, ok := d.(driver.NetworkPolicyProber)
	if !ok {
		return false, "", false
	}
	enforced, detail = np.ProbeNetworkPolicy(ctx)
	return enforced, detail, true
}

// DriverStatus is one offered driver and whether it is usable here.
type DriverStatus struct {
	Name string
	Err  error // nil: usable
}

// Drivers probes the offered drivers of this host kind's preference order, best first.
func (m *Manager) Drivers(ctx context.Context) []DriverStatus {
	cands := m.drivers.candidates()
	var out []DriverStatus
	for _, name := range policy.Preference(m.kind) {
		if c, ok := cands[name]; ok {
			out = append(out, DriverStatus{Name: name, Err: c.Probe(ctx)})
		}
	}
	return out
}

// HostKind is the kind of host this Manager chose drivers for: local or cloud.
func (m *Manager) HostKind() string { return string(m.kind) }

// attach opens the running run rr.RunID for more commands: it must be key's, running, and admitted to a driver
// that is still offered. It keeps its recorded mode, trust and driver; the spec and template give its shape.
func (m *Manager) attach(ctx context.Context, rr RunRequest) (*Run, error) {
	if m.st == nil {
		return nil, fault.New(fault.InvalidArgument, "configure a store (Config.Store) to attach commands to runs",
			"run %q cannot be attached: this sandkeep records no runs", rr.RunID)
	}
	row, err := record.Attach(ctx, m.st, rr.RunID, rr.Key.Tenant, rr.Key.User)
	if err != nil {
		return nil, err
	}
	if row.Admission != store.AdmissionAdmitted {
		return nil, fault.New(fault.InvalidArgument, "start a new run", "run %s was not admitted", row.ID)
	}
	if row.Driver == "" { // recorded without one (by another program): choose it now, under its recorded mode and trust
		if row.Driver, err = m.driverFor(ctx, row.ResolvedMode, policy.Source(row.Source), row.Trust); err != nil {
			return nil, err
		}
	}
	tpl, repo, err := m.shapeInputs(rr)
	if err != nil {
		return nil, err
	}
	r := &Run{ID: row.ID, Tenant: row.Tenant, User: row.User, Mode: row.ResolvedMode, Source: row.Source,
		Trust: row.Trust, Driver: row.Driver, Admission: row.Admission, Template: tpl.name(), Warnings: repo.warnings,
		m: m, key: rr.Key, caller: rr.Caller, obs: rr.Observer}
	r.rec = &record.Recorder{Store: m.st, RunID: row.ID, RequestID: rr.RequestID}
	if row.Driver == DriverHost && (row.Trust != TrustTrusted || row.ResolvedMode == spec.ModeInline) {
		// A run recorded on the host must have been admitted there; anything else is a forged or corrupt row.
		return nil, fault.New(fault.UntrustedWithoutSandbox, "start a new run", "run %s may not run on the host", row.ID)
	}
	if err := r.prepare(ctx, rr, tpl, repo, row.Driver == DriverHost); err != nil {
		return nil, err
	}
	return r, nil
}

// driverFor decides the driver of a run whose mode and trust are settled: the same Decide as admission, which may
// refuse but never changes them.
func (m *Manager) driverFor(ctx context.Context, mode string, src policy.Source, trust string) (string, error) {
	in := policy.DecideInputs{Mode: policy.Resolution{Mode: mode, Source: src}, Trust: policy.Trust(trust)}
	if mode != spec.ModeNone {
		in.Selected, in.Obstacle = m.selector.Select(ctx, m.kind, "", m.drivers.candidates())
	}
	d := policy.Decide(in)
	if d.Action == policy.Refuse {
		return "", d.Err
	}
	return d.Driver, nil
}

// record writes the run's row with its verdict (a refusal already finished), when a store records runs.
func (r *Run) record(ctx context.Context, rr RunRequest, d policy.Decision) error {
	if r.m.st == nil {
		return nil
	}
	row := store.Run{Tenant: r.Tenant, User: r.User, Trust: r.Trust, RequestedMode: rr.Mode, ResolvedMode: r.Mode,
		Source: r.Source, Driver: d.Driver, Admission: r.Admission, Status: store.StatusRunning}
	if d.Action == policy.Refuse {
		row.Status, row.FailureCode, row.Disposition = string(d.Status), string(d.FailureCode), string(d.Disposition)
		row.Driver = ""
	}
	row, err := record.Create(ctx, r.m.st, row)
	if err != nil {
		return err
	}
	r.ID = row.ID
	r.rec = &record.Recorder{Store: r.m.st, RunID: row.ID, RequestID: rr.RequestID}
	if d.Action == policy.Refuse {
		r.owned = false // already finished
	}
	return nil
}

// prepare makes what the run's commands need: the lifecycle of its driver, its shape (the template's and the
// repository's image, env, mounts, limits; a built image), its network and its secret files.
func (r *Run) prepare(ctx context.Context, rr RunRequest, tpl *template, repo *repository, onHost bool) error {
	m := r.m
	lc, err := m.lifecycleFor(r.Driver)
	if err != nil {
		return err
	}
	r.lc = lc
	if err := repo.fitsDriver(lc.Driver(), onHost); err != nil {
		return err
	}
	if !onHost {
		if err := m.checkRepoImages(ctx, lc.Driver(), repo); err != nil {
			return err
		}
	}
	image := ""
	if repo.sb.Build != nil && !onHost {
		out, flush := r.logTee(store.LogBuild, rr.BuildOutput) // runlog.go: the build's output is kept with the run
		image, err = m.build(ctx, r, lc, repo, out)
		flush()
		if err != nil {
			r.logLine(store.LogBuild, "build failed: "+err.Error())
			return err
		}
	}
	if len(repo.features) > 0 && !onHost {
		out, flush := r.logTee(store.LogFeatures, rr.BuildOutput)
		image, err = m.installFeatures(ctx, r, lc, repo, m.featureBase(image, tpl, repo), out)
		flush()
		if err != nil {
			r.logLine(store.LogFeatures, "feature install failed: "+err.Error())
			return err
		}
	}
	var companions []driver.Companion
	if len(repo.companions) > 0 && !onHost {
		if companions, err = m.companions(ctx, lc, repo, rr.BuildOutput); err != nil {
			return err
		}
	}
	if len(repo.containerRefs) > 0 && !onHost {
		if err := r.expandContainerEnv(ctx, repo, m.featureBase(image, tpl, repo)); err != nil {
			return err
		}
	}
	r.postAttach = repo.sb.PostAttach
	var hs *hostState
	if !onHost {
		if hs, err = m.resolveHostState(ctx, rr, tpl, lc.Driver(), lc.Home().Workspace(r.key)); err != nil {
			return err
		}
	}
	// A driver that cannot bind host paths gets the shape without them (hostbinds.go), said in one event.
	noBinds := !onHost && !lc.Driver().Capabilities().HostBinds
	var dropped *events.HostBindsDropped
	if tpl != nil || repo.shaped() || image != "" || companions != nil || (noBinds && len(m.cfg.Mounts) > 0) || hs != nil {
		var applyErr error
		r.shape, err = lc.NewShape(tpl.name(), func(c *lifecycle.Config) {
			tpl.apply(c)
			applyErr = repo.apply(c)
			if image != "" {
				c.Image = image
			}
			c.Companions = companions
			if noBinds {
				dropped = dropHostBinds(c, lc.Driver().Name())
			}
			hs.apply(c) // after the drop: auto is refused on a driver without binds
		})
		if err == nil {
			err = applyErr
		}
		if err != nil {
			return err
		}
	}
	if dropped != nil && r.owned { // an attached run said so when it was admitted
		r.event(events.NameHostBindsDropped, *dropped)
	}
	if hs != nil && hs.event != nil && r.owned {
		r.event(events.NameHostStateMounted, *hs.event)
	}
	if len(repo.userMaps) > 0 && !onHost && r.owned {
		uid, gid, err := lc.IdentityOf(r.key, r.shape)
		if err != nil {
			return err
		}
		for _, um := range repo.userMaps {
			um.UID, um.GID = uid, gid
			r.event(events.NameUserRemap, um)
		}
	}
	if r.network, err = lifecycle.MergeNetwork(m.cfg.Network, tpl.network()); err != nil {
		return err
	}
	if r.network, err = repo.mergeNetwork(r.network, m.cfg.Repository); err != nil {
		return err
	}
	r.pol = m.policy
	if r.network != m.cfg.Network {
		pol, err := lifecycle.ResolveNetwork(r.network, m.cfg.NetworkPresets, m.cfg.NetworkSilent)
		if err != nil {
			return err
		}
		r.pol = &pol
	}
	if r.cmdPol, err = r.networkFor(rr.Network); err != nil {
		return err
	}
	r.cmdNet = rr.Network
	if err := r.resolveServices(tpl, onHost); err != nil {
		return err
	}
	if onHost { // the host passthrough cannot deliver secret files; sandbox_skipped said so
		return nil
	}
	r.secrets, err = m.secretFiles(append(slices.Clip(tpl.secretFiles()), repo.sb.SecretFiles...))
	return err
}

// Finish records how an admitted run ended: succeeded when sandkeep ran its commands (whatever their exit
// statuses), else failed with the failure's code. It does nothing for an attached or refused run, or without a
// store. It returns the store's error, which the run's outcome does not depend on.
func (r *Run) Finish(err error) error {
	if !r.owned || r.rec == nil {
		return nil
	}
	r.owned = false
	return record.Finish(r.m.st, r.ID, err)
}

// event records one run-level event and passes it on.
func (r *Run) event(name string, payload any) { r.sink(name, payload) }

// shapeInputs are the caller's template and the repository's files of rr: what a run's sandbox is made from.
func (m *Manager) shapeInputs(rr RunRequest) (*template, *repository, error) {
	tpl, err := m.template(rr.Key.Tenant, rr.Template)
	if err != nil {
		return nil, nil, err
	}
	repo, err := m.loadRepository(m.specFor(rr.Spec, tpl))
	return tpl, repo, err
}

// specFor is the repository spec a run follows: the request's, else its template's, else the Config's.
func (m *Manager) specFor(req string, tpl *template) string {
	switch {
	case req != "":
		return req
	case tpl != nil && tpl.Spec != "":
		return tpl.Spec
	}
	return m.cfg.Spec
}

func parseTrust(s string) (string, error) {
	t, err := policy.ParseTrust(s)
	return string(t), err
}

// imageBuilder is the optional driver capability of building an image from a repository's Dockerfile.
type imageBuilder interface {
	Build(ctx context.Context, req build.Request, progress io.Writer) (imageRef, imageID string, err error)
}

// buildBound bounds an image build; past it the run fails as SANDBOX_SETUP_TIMEOUT.
const buildBound = 30 * time.Minute

// buildGates lets one build of a given context run at a time; later ones wait and then reuse the engine's cache.
var buildGates build.Gates

// build builds the repository's image on the run's driver, recording sandbox_build_* events.
func (m *Manager) build(ctx context.Context, r *Run, lc *lifecycle.Manager, repo *repository, progress io.Writer) (string, error) {
	b := repo.sb.Build
	bd, ok := lc.Driver().(imageBuilder)
	if !ok || !lc.Driver().Capabilities().Build {
		return "", fault.New(fault.SpecUnsupported, "build the image ahead of time and name it with image:",
			"the spec's build: needs a driver that builds images, and %s does not", lc.Driver().Name())
	}
	gateKey := strings.Join([]string{lc.Driver().Name(), repo.root, b.Dockerfile, b.Context}, "\x00")
	defer buildGates.Lock(gateKey)()

	r.event(events.NameSandboxBuildStarted, events.SandboxBuildStarted{Dockerfile: b.Dockerfile, Context: b.Context})
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, buildBound)
	defer cancel()
	ref, _, err := bd.Build(ctx, build.Request{Root: repo.root, Dockerfile: b.Dockerfile, Context: b.Context, Args: b.Args, Target: b.Target, Base: m.baseCheck(lc.Driver())}, progress)
	took := time.Since(start).Milliseconds()
	if err != nil {
		code := fault.CodeOf(err)
		if code == "" {
			code = fault.BuildFailed
		}
		// The event names the failure's code, never the daemon's line: it may quote a RUN with secrets.
		r.event(events.NameSandboxBuildFailed, events.SandboxBuildFailed{Error: string(code), DurationMS: took})
		return "", err
	}
	r.event(events.NameSandboxBuildFinished, events.SandboxBuildFinished{Image: ref, DurationMS: took})
	return ref, nil
}
