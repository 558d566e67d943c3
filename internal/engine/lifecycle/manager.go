// Package lifecycle owns sandboxes: one per key, reused across commands and processes. It takes the key's
// gate, ensures the sandbox (reuse, start, recreate on drift, create, adopt after a name conflict), runs the
// command through the driver, recycles a sandbox whose channel broke, and sweeps idle ones.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/channel"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/guard"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Bounds on a command's deadline and output.
const (
	MinTimeout     = time.Second
	MaxTimeout     = 24 * time.Hour
	DefaultTimeout = 120 * time.Second
)

// Manager runs commands in per-key sandboxes. It is safe for concurrent use.
type Manager struct {
	cfg      Config
	uid, gid int
	home     *Home
	drv      driver.Driver
	gates    *gates
	agentDir string
	images   *images
	def      *Shape         // the shape of cfg itself: what a command without a Shape of its own gets
	uids     *keyCache[int] // the key's host uid from Config.UIDs (see idOf), at most MaxKeys
	comps    sync.Map       // key hex -> companionsSeen, the companions this process last ensured (companions.go)

	mu        sync.Mutex                   // guards known, listeners and egress
	known     map[string]*driver.Sandbox   // key hex -> sandbox last ensured by this process; a hint, never trusted alone
	listeners map[string]*channel.Listener // key hex -> this process's agent channel listener for that key
	egress    map[string]*keyEgress        // key hex -> the key's egress proxy, served by this process (egress.go)
	egressNew sync.Mutex                   // held while a key's proxy is started: shared-gate holders may race there
	pools     *pools                       // the warm pools this process keeps (pool.go); nil: none
	services  sync.Map                     // key hex -> *keyServices, the key's host services served by this process (services.go)
	relays    sync.Map                     // key hex -> *relaySlot, the key's channel carried by a relay (relay.go)

	nextID atomic.Uint32
	procs  procWatch // the watchers of the processes this Manager started (process.go)
}

// New validates cfg, prepares the home (installation id, agent copy) and returns a Manager over drv.
func New(home *Home, drv driver.Driver, cfg Config) (*Manager, error) {
	cfg.UIDs = cfg.effectiveUIDs(drv.Name()) // before setDefaults: an unnamed User lets the default range in
	cfg.setDefaults()
	uid, gid, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	if cfg.AgentPath == "" {
		return nil, fault.New(fault.AgentMissing, "build it with `make build` and set SANDKEEP_AGENT to its path",
			"the sandkeep-agent binary was not found")
	}
	agentDir, err := home.InstallAgent(cfg.AgentPath)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg: cfg, uid: uid, gid: gid, home: home, drv: drv, gates: newGates(home, cfg.MaxKeys), agentDir: agentDir, uids: newKeyCache[int](cfg.MaxKeys),
		known: map[string]*driver.Sandbox{}, listeners: map[string]*channel.Listener{}, egress: map[string]*keyEgress{},
		images: newImages(drv, cfg.Logger),
	}
	m.def = &Shape{cfg: cfg, uid: uid, gid: gid, postures: newKeyCache[keyPosture](cfg.MaxKeys)}
	return m, nil
}

// Home is the manager's state home.
func (m *Manager) Home() *Home { return m.home }

// Driver is the driver the manager runs on.
func (m *Manager) Driver() driver.Driver { return m.drv }

// ExecRequest is one command for one key.
type ExecRequest struct {
	Argv        []string
	Workdir     string   // relative to /workspace, or absolute under it; "" is /workspace
	Env         []string // "K=V"
	Timeout     time.Duration
	StdoutLimit int64
	StderrLimit int64
	Stdin       io.Reader // nil: /dev/null
	Stdout      io.Writer // streamed as produced; nil discards
	Stderr      io.Writer
	// TTY, when set, runs the command on a pseudo-terminal of this size (agentproto.Request.TTY): one output
	// stream (Stdout), and Resize carries its size changes.
	TTY     *agentproto.WindowSize
	Resize  <-chan agentproto.WindowSize
	OnEvent Sink // receives this command's events (ensure decisions, exec started/finished); may be nil
	// OnLog receives the lines of the run log this command adds: what the driver did to provide its sandbox
	// and the output of the sandbox's setup commands (post_create, postStart); may be nil.
	OnLog LogSink
	// OnStarted, when set, is told each time the command goes out to its sandbox's agent (after exec_started).
	OnStarted func()
	Secrets   []Secret // files placed under /run/secrets for this command only (secrets.go)
	// Network is where the command may connect to (ResolveNetwork); nil or mode none: nowhere.
	Network *egress.Policy
	// NetworkBlock: Network comes from a block the command or its run named (the Config's, a template's, the
	// repository's, the request's), not the default. A mode none named so is a promise the driver must keep:
	// where it cannot prove the sandbox has no network (driver.NoNetworkChecker), the command is refused.
	NetworkBlock bool
	// Shape is the sandbox the command runs in (NewShape); nil is the Manager's own Config. A key's sandbox made
	// for another shape has drifted and is recycled.
	Shape *Shape
	// Concurrent asks to run beside the key's other concurrent commands and processes rather than one at a time
	// (concurrent.go); a command with secrets or a network, or a sandbox without a channel, runs alone anyway.
	Concurrent bool
	// Services opens these host services (Config.HostServices) for the command, under its run's token
	// (services.go); a command with services runs alone.
	Services []ServiceGrant
}

// ExecResult is the outcome of one command.
type ExecResult struct {
	agentproto.Result
	Sandbox   *driver.Sandbox
	Transport Transport // how the command reached the agent: TransportAgent or TransportExec
}

// Exec resolves req's workdir, takes key's gate, ensures the sandbox and runs the command. A caller that cancels ctx
// gets its answer only once the command's process tree is gone: the gate is held until then.
func (m *Manager) Exec(ctx context.Context, key identity.Key, req ExecRequest) (*ExecResult, error) {
	preq, err := m.agentRequest(req)
	if err != nil {
		return nil, err
	}
	if err := checkSecrets(req.Secrets); err != nil { // secrets: refused before anything runs
		return nil, err
	}
	if m.concurrentOK(key, req) {
		return m.execShared(ctx, key, req, preq)
	}
	waitStart := time.Now()
	release, err := m.gates.acquire(ctx, key, m.cfg.GateWait)
	if err != nil {
		return nil, err
	}
	defer release()
	gateWait := time.Since(waitStart).Milliseconds()

	ctx = withLog(withSink(ctx, req.OnEvent), req.OnLog)
	// Secrets: placed after the ensure and before the command; removed after it, whatever its outcome (the
	// deferred remove runs before release, so within this gate hold). A failed placement runs no command.
	if len(req.Secrets) > 0 {
		remove, err := m.placeSecrets(ctx, key, req.Secrets, req.Shape)
		defer remove()
		if err != nil {
			return nil, err
		}
	}
	started := func(sb *driver.Sandbox, t Transport) {
		m.emit(ctx, events.NameExecStarted, events.ExecStarted{Sandbox: sb.Name, Command: events.Command(req.Argv),
			Workdir: preq.Workdir, TimeoutMS: preq.TimeoutMS, Transport: string(t), GateWaitMS: gateWait})
		if req.OnStarted != nil {
			req.OnStarted()
		}
	}
	res, err := m.exec(ctx, key, req, preq, started)
	if res != nil {
		truncated := res.StdoutTruncated || res.StderrTruncated
		m.emit(ctx, events.NameExecFinished, events.ExecFinished{ExitCode: res.ExitCode, TimedOut: res.TimedOut,
			DurationMS: res.DurationMS, Transport: string(res.Transport), Truncated: truncated})
	}
	return res, err
}

// exec runs preq in key's sandbox, over the channel when it is up, else the driver's exec. started, when set,
// is told each time the command goes out and how (the user's command reports exec_started; sandkeep's own helper
// commands pass nil). The caller holds key's gate.
func (m *Manager) exec(ctx context.Context, key identity.Key, req ExecRequest, preq agentproto.Request,
	started func(*driver.Sandbox, Transport)) (*ExecResult, error) {
	out := driver.Output{Stdout: req.Stdout, Stderr: req.Stderr, Stdin: req.Stdin, Resize: req.Resize}
	if started == nil {
		started = func(*driver.Sandbox, Transport) {}
	}
	// The listener exists before the sandbox starts, so a starting agent finds it at once; a key that may claim a
	// pool member gets the member's (its agent connected already) or, if it does not, its own from provide.
	var l *channel.Slot
	fresh := m.mayClaim(key, m.shapeOf(req.Shape))
	if !fresh {
		l, fresh = m.listenerFor(key)
	}
	baseEnv := preq.Env
	for attempt := 0; ; attempt++ {
		sb, decision, err := m.ensure(ctx, key, m.shapeOf(req.Shape))
		if err != nil {
			return nil, coded(ctx, err, key)
		}
		if decision != DecisionReuse || l == nil {
			got, made := m.channelFor(key, sb)
			l, fresh = got, fresh || made
		}
		m.home.Touch(key, m.cfg.Now())
		// The proxy is up, with this command's policy, before the command can use it (after the ensure: the
		// CA bundle keeps the sandbox's image roots); its refusals until the command ends belong to its run.
		netEnv, releaseNet, err := m.egressFor(ctx, key, sb, req.Network, req.NetworkBlock)
		if err != nil {
			return nil, err
		}
		defer releaseNet()
		svcEnv, releaseSvc, err := m.servicesFor(ctx, key, req.Services)
		if err != nil {
			return nil, err
		}
		defer releaseSvc()
		preq.Env = append(append(slices.Clip(baseEnv), netEnv...), svcEnv...)
		conn, err := m.takeChannel(ctx, l, fresh || decision != DecisionReuse)
		if err != nil {
			return nil, err
		}
		if conn != nil {
			started(sb, TransportAgent)
			res, err := m.execChannel(ctx, key, sb, l, conn, preq, out)
			m.home.Touch(key, m.cfg.Now())
			if errors.Is(err, errNotStarted) && attempt == 0 {
				continue
			}
			if errors.Is(err, errNotStarted) {
				return nil, fault.New(fault.SandboxFailed, "check `docker ps` and the daemon; the command did not run",
					"the agent of sandbox %s did not accept the command twice in a row", sb.Name)
			}
			return res, err
		}
		transport := TransportExec
		started(sb, TransportExec)
		res, err := m.drv.Exec(ctx, sb, preq, out)
		m.home.Touch(key, m.cfg.Now())
		switch {
		case err == nil:
			return &ExecResult{Result: res, Sandbox: sb.Clone(), Transport: transport}, nil
		case attempt == 0 && ctx.Err() == nil && (cerrdefs.IsNotFound(err) || cerrdefs.IsConflict(err)):
			// Stopped or removed behind our back (the sweeper, another process): the exec never started.
			m.forget(key)
			continue
		case errors.Is(err, agentproto.ErrProtocol):
			m.recycle(ctx, key, sb, err)
			return nil, fault.Wrap(err, fault.AgentProtocol,
				"the sandbox was recycled; run the command again (files in /workspace are kept)",
				"the agent in sandbox %s stopped answering correctly", sb.Name)
		case ctx.Err() != nil:
			return &ExecResult{Result: res, Sandbox: sb.Clone(), Transport: transport}, err
		default:
			return nil, coded(ctx, err, key)
		}
	}
}

// coded gives an engine error that carries no failure code one (SANDBOX_FAILED), so that every failure a
// caller sees has a code and a hint. Cancellation stays what it is.
func coded(ctx context.Context, err error, key identity.Key) error {
	if fault.CodeOf(err) != "" || ctx.Err() != nil {
		return err
	}
	return fault.Wrap(err, fault.SandboxFailed, "check `docker info` and the daemon log; the command did not run",
		"the sandbox for %s could not be provided: %v", key, err)
}

// agentRequest is req as the agent takes it: defaults applied, the workdir resolved in the shape's workspace
// folder. What a user's command may be (argv, bounds, env, terminal) was checked once, by the engine, before its
// run was admitted (sandkeep's checkExec); here only the wire's invariants are (agentproto.Request.Validate), for
// the lifecycle's own commands too.
func (m *Manager) agentRequest(req ExecRequest) (agentproto.Request, error) {
	workdir, err := guard.WorkdirIn(m.shapeOf(req.Shape).cfg.WorkspaceFolder, req.Workdir)
	if err != nil {
		return agentproto.Request{}, err
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	for _, l := range [2]*int64{&req.StdoutLimit, &req.StderrLimit} {
		if *l == 0 {
			*l = agentproto.DefaultLimit
		}
	}
	preq := agentproto.Request{
		Version: agentproto.Version, ID: m.nextID.Add(1), Argv: req.Argv, Workdir: workdir, Env: req.Env,
		TimeoutMS: timeout.Milliseconds(), GraceMS: m.cfg.Grace.Milliseconds(),
		StdoutLimit: req.StdoutLimit, StderrLimit: req.StderrLimit, Stdin: req.Stdin != nil, TTY: req.TTY,
	}
	// The wire's own invariants, before any gate: a request the agent would refuse never leaves.
	if err := preq.Validate(); err != nil {
		return agentproto.Request{}, fault.Wrap(err, fault.InvalidArgument, "check the command's argv, env and bounds", "%v", err)
	}
	return preq, nil
}

// recycle removes a sandbox whose channel broke, before the gate is released: whatever ran in it is over.
func (m *Manager) recycle(ctx context.Context, key identity.Key, sb *driver.Sandbox, cause error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	m.forget(key)
	m.emit(ctx, events.NameSandboxRecycled, events.SandboxRecycled{Sandbox: sb.Name, Reason: events.RecycleExecFailure})
	m.cfg.Logger.Warn("recycling sandbox after a broken channel", "key", key.Short(), "sandbox", sb.Name, "err", cause)
	if err := m.drv.Remove(ctx, sb); err != nil {
		m.cfg.Logger.Error("recycle failed", "sandbox", sb.Name, "err", err)
	}
}

func (m *Manager) remember(key identity.Key, sb *driver.Sandbox) {
	m.mu.Lock()
	m.known[key.Hex()] = sb
	m.mu.Unlock()
}

// forget drops what this Manager knows of key's running sandbox (it is stopping, going, or was found gone):
// its cached record, and its relayed session, whose processes end with that run.
func (m *Manager) forget(key identity.Key) {
	m.procs.sandboxGone(key)
	m.dropRelay(key)
	m.mu.Lock()
	delete(m.known, key.Hex())
	m.mu.Unlock()
	m.comps.Delete(key.Hex())
}

func (m *Manager) cached(key identity.Key) *driver.Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.known[key.Hex()]
}

// Stop stops key's sandbox under its gate. A key without a sandbox is SANDBOX_NOT_FOUND.
func (m *Manager) Stop(ctx context.Context, key identity.Key) error {
	release, err := m.gates.acquire(ctx, key, m.cfg.GateWait)
	if err != nil {
		return err
	}
	defer release()
	sb, err := m.owned(ctx, key)
	if err != nil {
		return err
	}
	m.forget(key)
	m.dropEgress(key)
	m.dropServices(key)
	return m.drv.Stop(ctx, sb, m.cfg.StopGrace)
}

// Remove deletes key's sandbox under its gate, and its workspace unless keepWorkspace.
func (m *Manager) Remove(ctx context.Context, key identity.Key, keepWorkspace bool) error {
	release, err := m.gates.acquire(ctx, key, m.cfg.GateWait)
	if err != nil {
		return err
	}
	defer release()
	return m.removeHeld(ctx, key, keepWorkspace)
}

// removeHeld is Remove's body, for a caller that holds key's gate.
func (m *Manager) removeHeld(ctx context.Context, key identity.Key, keepWorkspace bool) error {
	sb, err := m.owned(ctx, key)
	notFound := fault.Is(err, fault.NotFound)
	if err != nil && !notFound {
		return err
	}
	// No container: still remove a workspace kept by an earlier rm or a suspend, but a key with neither is not
	// found.
	_, suspended := m.home.suspendedAt(key)
	if notFound && (keepWorkspace || !(m.home.HasWorkspace(key) || suspended)) {
		return err
	}
	m.forget(key)
	if sb != nil {
		if err := m.drv.Remove(ctx, sb); err != nil {
			return err
		}
	}
	m.home.ForgetKey(key)
	m.dropListener(key)
	if sb != nil {
		m.emit(ctx, events.NameSandboxRemoved, events.SandboxRemoved{Sandbox: sb.Name, Reason: "request"})
	}
	if !keepWorkspace {
		m.home.clearSuspended(key) // its workspace goes: the next sandbox is new, not resumed
		return m.removeWorkspace(ctx, key, sb)
	}
	return nil
}

// removeWorkspace deletes key's workspace: the claim of a driver that keeps it (sb's, a claimed pool member's
// keeping the member's name; sb nil when key has no sandbox any more), then the home's directory and claim record.
func (m *Manager) removeWorkspace(ctx context.Context, key identity.Key, sb *driver.Sandbox) error {
	if wr, ok := m.drv.(driver.WorkspaceRemover); ok { // a workspace the driver keeps (a Kubernetes claim)
		name := key.ContainerName()
		if sb != nil {
			name = sb.Name // a claimed pool member's keeps the member's name
		} else if mk := m.home.phys(key); mk != key {
			name = mk.MemberName()
		}
		if err := wr.RemoveWorkspace(ctx, name); err != nil {
			return err
		}
	}
	return m.home.RemoveWorkspace(key)
}

// Sandbox is key's sandbox as the engine reports it now (a claimed pool member's under its own name);
// SANDBOX_NOT_FOUND when it has none, FOREIGN_CONTAINER when its name is taken by what is not ours.
func (m *Manager) Sandbox(ctx context.Context, key identity.Key) (*driver.Sandbox, error) {
	return m.owned(ctx, key)
}

// owned inspects key's container and checks that it is ours.
func (m *Manager) owned(ctx context.Context, key identity.Key) (*driver.Sandbox, error) {
	sb, err := m.inspectKey(ctx, key)
	if cerrdefs.IsNotFound(err) {
		return nil, errNoSandbox(key)
	}
	if err != nil {
		return nil, err
	}
	if err := m.checkOurs(key, sb); err != nil {
		return nil, err
	}
	return sb, nil
}

func errNoSandbox(key identity.Key) error {
	return fault.New(fault.NotFound, "`sandkeep ps` lists the sandboxes that exist", "no sandbox for %s", key)
}

func (m *Manager) checkOurs(key identity.Key, sb *driver.Sandbox) error {
	if sb.Labels[driver.LabelInstallation] == m.home.Installation &&
		(sb.Labels[driver.LabelKey] == key.Hex() || sb.Labels[driver.LabelKey] == m.home.phys(key).Hex()) {
		return nil // the key's own, or the pool member it claimed (claims.go)
	}
	return fault.New(fault.ForeignContainer,
		fmt.Sprintf("sandkeep never adopts or deletes it; rename or remove it yourself (docker rm %s) if it is not needed, or use another SANDKEEP_HOME's sandkeep", sb.Name),
		"container %s exists but was not created by this sandkeep installation", sb.Name)
}

// Close closes the agent channel listeners. Sandboxes keep running; they are persistent by design, and their
// agents reconnect to the next process that serves them.
func (m *Manager) Close() error {
	m.procs.close()
	m.stopPools() // pool.go: members stay, for the next process to adopt
	m.images.close()
	m.closeEgress()
	m.closeServices()
	m.closeRelays()
	m.mu.Lock()
	ls := m.listeners
	m.listeners = map[string]*channel.Listener{}
	m.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	return nil
}
