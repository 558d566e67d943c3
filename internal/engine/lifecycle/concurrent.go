package lifecycle

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/channel"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Concurrent commands: a caller that asks (ExecRequest.Concurrent) runs its command beside the key's other
// concurrent commands and processes instead of one at a time. Such a command takes the key's gate shared, so
// lifecycle operations (ensure, recycle, stop, remove), which take it exclusively, still never overlap a
// command; it runs on the sandbox's agent channel under a supervisor of its own in the agent, so its tree is
// killed alone (agentproto.Request.Concurrent).
//
// A concurrent command with a network is a session of the key's egress proxy of its own (egresssession.go),
// beside the other commands' and processes'. A command runs one at a time after all (exclusively, as by default)
// when it carries what belongs to one command at a time in the sandbox: secret files (placed before and removed
// after it, at fixed paths) or host services; when its network inspects TLS and the sandbox has no channel
// directory to hold its CA bundle (the kubernetes driver: the bundle goes onto the secrets tmpfs at a fixed
// path); and where the sandbox has no channel this process serves (the exec transport without a relay, the host).
// Docker's Unix socket channel and the kubernetes driver's pod-network channel are one session side
// (channel.Slot), so both carry concurrent commands and processes.

// concurrentOK reports whether req may run concurrently in key's sandbox.
func (m *Manager) concurrentOK(key identity.Key, req ExecRequest) bool {
	return req.Concurrent && len(req.Secrets) == 0 && len(req.Services) == 0 && m.sessionOK(key, req.Network) && m.processChannel(key) == nil
}

// sessionOK reports whether a command or process with policy pol can have a concurrent session of key's proxy.
func (m *Manager) sessionOK(key identity.Key, pol *egress.Policy) bool {
	return noNetwork(pol) || !pol.Inspects() || m.channelDir(key) != ""
}

func noNetwork(p *egress.Policy) bool { return p == nil || p.Mode == "" || p.Mode == egress.ModeNone }

// processChannel says why key's sandbox cannot carry concurrent commands and processes from this process, or nil.
func (m *Manager) processChannel(key identity.Key) error {
	why := ""
	switch {
	case m.relayer() != nil: // the channel comes through a relay (relay.go), gVisor's too
	case m.cfg.Transport == TransportExec:
		why = "the transport is exec (each command is one engine exec), and the " + m.drv.Name() + " driver has no relay"
	case m.offersChannel():
	case !m.drv.Capabilities().Channel:
		why = "the " + m.drv.Name() + " driver has no agent channel this process serves"
		if _, ok := m.drv.(driver.AgentChannels); ok {
			why = "the " + m.drv.Name() + " driver runs without its agent channel (no channel listen address)"
		}
	case m.channelDir(key) == "":
		why = "the sandbox has no agent channel"
	}
	if why == "" {
		return nil
	}
	return fault.New(fault.ProcessUnavailable,
		"use the docker driver (runc or runsc) or the kubernetes driver with its agent channel, with --transport auto or agent, through `sandkeep serve` or the daemon",
		"processes need the sandbox's agent channel: %s", why)
}

// holdShared takes key's gate shared, with its sandbox running and compatible with sh: when this process's last
// ensure still holds (no engine call), at once; otherwise it ensures the sandbox under the exclusive gate first
// and then takes the gate shared again. release is never nil when err is nil.
func (m *Manager) holdShared(ctx context.Context, key identity.Key, sh *Shape) (release func(), sb *driver.Sandbox, err error) {
	for range 3 {
		release, err := m.gates.acquireMode(ctx, key, m.cfg.GateWait, true)
		if err != nil {
			return nil, nil, err
		}
		sb, err := m.reusable(ctx, key, sh)
		if err != nil {
			release()
			return nil, nil, coded(ctx, err, key)
		}
		if sb != nil {
			return release, sb, nil
		}
		release()
		xrelease, err := m.gates.acquire(ctx, key, m.cfg.GateWait)
		if err != nil {
			return nil, nil, err
		}
		_, _, err = m.ensure(ctx, key, m.shapeOf(sh))
		xrelease()
		if err != nil {
			return nil, nil, coded(ctx, err, key)
		}
	}
	return nil, nil, fault.New(fault.SandboxBusy, "retry; another caller keeps stopping or recycling this sandbox",
		"the sandbox for %s changed three times while a concurrent command waited for it", key)
}

// reusable returns the sandbox this process last ensured for key when it is still compatible with sh (ensure's
// reuse decision, which makes no engine call), or nil. A sandbox with compose companions is never reused this
// way: checking them is ensure's.
func (m *Manager) reusable(ctx context.Context, key identity.Key, sh *Shape) (*driver.Sandbox, error) {
	sh = m.shapeOf(sh)
	if len(sh.cfg.Companions) > 0 {
		return nil, nil
	}
	sb := m.cached(key)
	if sb == nil {
		return nil, nil
	}
	imageID, err := m.images.resolve(ctx, sh.cfg.Image)
	if err != nil {
		return nil, err
	}
	_, hash, err := m.postureOf(key, sh)
	if err != nil {
		return nil, err
	}
	if !compatible(sb, imageID, hash) {
		return nil, nil
	}
	return sb, nil
}

// channelShared returns key's channel for a concurrent command or a process operation, waiting up to wait for
// the agent; a sandbox whose agent does not connect is forgotten, so that the next call ensures it.
func (m *Manager) channelShared(ctx context.Context, key identity.Key, sb *driver.Sandbox, wait channelWait) (*channel.Slot, *agentproto.Mux, error) {
	if err := m.processChannel(key); err != nil {
		return nil, nil, err
	}
	if m.relayer() != nil {
		return m.channelRelayed(ctx, key, sb)
	}
	l, fresh := m.channelFor(key, sb)
	if l == nil && m.offersChannel() {
		return nil, nil, fault.New(fault.SandboxNotRunning, "run a command in it, which starts it",
			"the sandbox for %s is not running", key)
	}
	if l == nil {
		return nil, nil, fault.New(fault.ProcessUnavailable,
			"run it through the process that serves this sandbox (`sandkeep serve`, or the daemon: SANDKEEP_DAEMON=auto)",
			"another process serves the agent channel of the sandbox for %s", key)
	}
	d := channelWaitFresh
	if m.offersChannel() {
		d = channelWaitFreshNet // the pod's agent may still be dialling, or waiting for the informer to see the pod
	}
	if wait == waitLong || fresh {
		d = channelWaitForce
	}
	mux, err := l.Current(ctx, d)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, context.Cause(ctx)
		}
		m.forget(key)
		return nil, nil, fault.Wrap(err, fault.SandboxNotRunning, "run a command in it, which starts it",
			"the agent of the sandbox for %s is not connected (is the sandbox running?)", key)
	}
	return l, mux, nil
}

type channelWait int

const (
	waitShort channelWait = iota
	waitLong
)

// execConcurrent runs preq as a concurrent command (the caller checked concurrentOK). It holds the gate shared.
func (m *Manager) execConcurrent(ctx context.Context, key identity.Key, req ExecRequest, preq agentproto.Request,
	started func(*driver.Sandbox, Transport)) (*ExecResult, error) {
	baseEnv := preq.Env
	for attempt := 0; ; attempt++ {
		release, sb, err := m.holdShared(ctx, key, req.Shape)
		if err != nil {
			return nil, err
		}
		netEnv, endSession, err := m.egressSession(ctx, key, sb, req.Network, req.NetworkBlock, sinkOf(ctx, m))
		if err != nil {
			release()
			return nil, err
		}
		preq.Env = append(slices.Clip(baseEnv), netEnv...)
		res, err := m.runConcurrent(ctx, key, sb, preq, req, started)
		endSession()
		release()
		if errors.Is(err, errNotStarted) && attempt == 0 {
			continue
		}
		return res, err
	}
}

func (m *Manager) runConcurrent(ctx context.Context, key identity.Key, sb *driver.Sandbox, preq agentproto.Request,
	req ExecRequest, started func(*driver.Sandbox, Transport)) (*ExecResult, error) {
	m.home.Touch(key, m.cfg.Now())
	defer func() { m.home.Touch(key, m.cfg.Now()) }()
	l, mux, err := m.channelShared(ctx, key, sb, waitShort)
	if fault.Is(err, fault.SandboxNotRunning) {
		return nil, errNotStarted // stopped behind this process's back: ensure again
	}
	if err != nil {
		return nil, err
	}
	preq.Concurrent = true
	conn := mux.Route(preq.ID)
	defer conn.Close()
	started(sb, TransportAgent)
	res, err := agentproto.RunWith(ctx, conn, preq, req.Stdout, req.Stderr, req.Stdin,
		agentproto.RunOptions{AcceptWait: acceptWait, Resize: req.Resize})
	result := &ExecResult{Result: res, Sandbox: sb.Clone(), Transport: TransportAgent}
	switch {
	case err == nil:
		return result, nil
	case errors.Is(err, agentproto.ErrProtocol):
		// The channel is broken for every command on it: the agent kills each one's tree and reconnects, or the
		// sandbox is recycled (the other concurrent commands learn it from the same broken channel).
		l.Broken(mux)
		if !m.awaitClean(ctx, key, sb, l, mux) {
			m.recycle(ctx, key, sb, err)
		}
		return nil, fault.Wrap(err, fault.AgentProtocol, "run the command again; files in /workspace are kept",
			"the agent channel of sandbox %s broke during the command", sb.Name)
	case ctx.Err() != nil:
		return result, err
	}
	return nil, coded(ctx, err, key)
}

// execShared is Exec for a concurrent command, with the same events.
func (m *Manager) execShared(ctx context.Context, key identity.Key, req ExecRequest, preq agentproto.Request) (*ExecResult, error) {
	ctx = withLog(withSink(ctx, req.OnEvent), req.OnLog)
	waitStart := time.Now()
	started := func(sb *driver.Sandbox, t Transport) {
		m.emit(ctx, events.NameExecStarted, events.ExecStarted{Sandbox: sb.Name, Command: events.Command(req.Argv),
			Workdir: preq.Workdir, TimeoutMS: preq.TimeoutMS, Transport: string(t), GateWaitMS: time.Since(waitStart).Milliseconds()})
		if req.OnStarted != nil { // as for an exclusive command: a streaming caller commits its answer here
			req.OnStarted()
		}
	}
	res, err := m.execConcurrent(ctx, key, req, preq, started)
	if res != nil {
		m.emit(ctx, events.NameExecFinished, events.ExecFinished{ExitCode: res.ExitCode, TimedOut: res.TimedOut,
			DurationMS: res.DurationMS, Transport: string(res.Transport), Truncated: res.StdoutTruncated || res.StderrTruncated})
	}
	return res, err
}
