package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// Processes: a command that outlives its call (a dev server), started with StartProcess and then listed,
// attached to, written to and signalled by pid or tag. The agent keeps it (agentproto's process.go): its output
// in a bounded ring buffer per stream, its tree under a supervisor of its own, its lifetime bound enforced like a
// command's deadline. It runs beside the key's commands: starting one takes the key's gate shared, like a
// concurrent command, and nothing after that holds the gate. It dies with its tree when its lifetime bound
// passes, when a caller kills it, when its sandbox stops, is removed or recycled, and when the process serving
// the sandbox's channel (serve, the daemon) goes away; each end is a process_ended event in the run that
// started it.
//
// Processes need the sandbox's agent channel served by this process (processChannel): Docker (under runc, or
// under gVisor and with the exec transport through a relay), or the kubernetes driver with its channel on, the
// transport auto or agent. Elsewhere (the kubernetes driver with the exec transport or without a channel
// address, the host passthrough) they are refused with PROCESS_UNAVAILABLE, saying why.

// Bounds of a process's lifetime.
const (
	DefaultLifetime = time.Hour
	MaxLifetime     = MaxTimeout
)

// StartRequest starts one process in a key's sandbox.
type StartRequest struct {
	Argv     []string
	Workdir  string   // relative to /workspace, or absolute under it; "" is /workspace
	Env      []string // "K=V"
	Lifetime time.Duration
	// Stdin keeps the process's stdin open for SendInput (else it reads /dev/null).
	Stdin bool
	TTY   *agentproto.WindowSize
	Tag   string // optional; unique among the sandbox's running processes
	Ring  int64  // output ring buffer per stream, in bytes; 0: agentproto.DefaultRing
	// OnEvent receives the process's events: process_started now, process_ended whenever it ends.
	OnEvent Sink
	Shape   *Shape
	// Network and NetworkBlock are as for ExecRequest: the process is a session of the key's egress proxy of its
	// own for as long as it runs (egresssession.go).
	Network      *egress.Policy
	NetworkBlock bool
}

// Process describes one process of a sandbox.
type Process struct {
	agentproto.ProcessInfo
	Sandbox string `json:"sandbox"`
}

// StartProcess starts req in key's sandbox (ensuring it, as a command would) and returns as soon as the process
// runs, with its pid. A command that cannot start (not found, not executable) is not an error: the Process comes
// back already exited, with the exit status a command would have (127, 126) and Exit.StartError.
func (m *Manager) StartProcess(ctx context.Context, key identity.Key, req StartRequest) (*Process, error) {
	lifetime := req.Lifetime
	if lifetime == 0 {
		lifetime = DefaultLifetime
	}
	preq, err := m.agentRequest(ExecRequest{Argv: req.Argv, Workdir: req.Workdir, Env: req.Env, Timeout: lifetime,
		TTY: req.TTY, Shape: req.Shape})
	if err != nil {
		return nil, err
	}
	if err := agentproto.CheckTag(req.Tag); err != nil {
		return nil, fault.New(fault.InvalidArgument, "use a tag of printable text, at most 128 bytes", "invalid process tag %q", req.Tag)
	}
	if req.Ring < 0 || req.Ring > agentproto.MaxRing {
		return nil, fault.New(fault.InvalidArgument, "use a ring buffer between 1 byte and 16 MiB (0: 1 MiB)",
			"ring buffer of %d bytes is out of range", req.Ring)
	}
	if err := m.processChannel(key); err != nil {
		return nil, err
	}
	if !m.sessionOK(key, req.Network) {
		return nil, fault.New(fault.ProcessUnavailable, "run it as a command, or give the template inspect: off",
			"a process whose network inspects TLS needs the sandbox's channel directory for its CA bundle, which the %s driver has not", m.drv.Name())
	}
	preq.Stdin = req.Stdin
	preq.Detach = &agentproto.Detach{Tag: req.Tag, Ring: req.Ring}
	ctx = withSink(ctx, req.OnEvent)
	sink := sinkOf(ctx, m)
	baseEnv := preq.Env
	for attempt := 0; ; attempt++ {
		release, sb, err := m.holdShared(ctx, key, req.Shape)
		if err != nil {
			return nil, err
		}
		netEnv, endSession, err := m.egressSession(ctx, key, sb, req.Network, req.NetworkBlock, sink)
		if err != nil {
			release()
			return nil, err
		}
		preq.Env = append(slices.Clip(baseEnv), netEnv...)
		res, err := m.startOn(ctx, key, sb, preq)
		release()
		if err != nil || res.PID == 0 {
			endSession()
		}
		if errors.Is(err, errNotStarted) && attempt == 0 {
			continue
		}
		if err != nil {
			return nil, err
		}
		p := &Process{Sandbox: sb.Name, ProcessInfo: agentproto.ProcessInfo{PID: res.PID, Tag: req.Tag,
			Argv: agentproto.ClipArgv(req.Argv), Workdir: preq.Workdir, TTY: req.TTY != nil, Stdin: req.Stdin,
			StartedMS: time.Now().UnixMilli(), Running: res.PID > 0}}
		if res.PID == 0 {
			p.Stdin = false
			p.Exit = &res
			return p, nil
		}
		sink(events.NameProcessStarted, events.ProcessStarted{Sandbox: sb.Name, PID: res.PID, Tag: req.Tag,
			Command: events.Command(req.Argv), LifetimeMS: lifetime.Milliseconds(), TTY: req.TTY != nil})
		m.watchProcess(key, sb.Name, p.ProcessInfo, sink, endSession)
		return p, nil
	}
}

// sinkOf is where ctx's events go (emit's choice), as a Sink that outlives ctx.
func sinkOf(ctx context.Context, m *Manager) Sink {
	if s, ok := ctx.Value(sinkKey{}).(Sink); ok {
		return s
	}
	return func(name string, payload any) {
		if m.cfg.OnEvent != nil {
			m.cfg.OnEvent(name, payload)
		}
	}
}

// startOn sends the start request on key's channel; the caller holds the gate shared.
func (m *Manager) startOn(ctx context.Context, key identity.Key, sb *driver.Sandbox, preq agentproto.Request) (agentproto.Result, error) {
	l, mux, err := m.channelShared(ctx, key, sb, waitLong)
	if fault.Is(err, fault.SandboxNotRunning) {
		return agentproto.Result{}, errNotStarted
	}
	if err != nil {
		return agentproto.Result{}, err
	}
	m.home.Touch(key, m.cfg.Now())
	conn := mux.Route(preq.ID)
	defer conn.Close()
	var stdin io.Reader
	if preq.Stdin {
		stdin = strings.NewReader("") // the start request's own stdin: the process's is written by SendInput
	}
	var diag bytes.Buffer
	res, err := agentproto.RunWith(ctx, conn, preq, nil, &diag, stdin, agentproto.RunOptions{AcceptWait: acceptWait})
	switch {
	case err == nil:
		if res.PID == 0 && res.StartError == "" {
			res.StartError = strings.TrimSpace(diag.String())
		}
		return res, nil
	case errors.Is(err, agentproto.ErrProtocol):
		l.Broken(mux)
		if !m.awaitClean(ctx, key, sb, l, mux) {
			m.recycle(ctx, key, sb, err)
		}
		return agentproto.Result{}, fault.Wrap(err, fault.AgentProtocol, "start it again; files in /workspace are kept",
			"the agent channel of sandbox %s broke while the process started", sb.Name)
	}
	return agentproto.Result{}, coded(ctx, err, key)
}

// ProcessRef names a process: by PID, or by Tag when PID is 0.
type ProcessRef struct {
	PID int
	Tag string
}

// ListProcesses returns key's processes, running and recently exited. A key without a running sandbox has none.
func (m *Manager) ListProcesses(ctx context.Context, key identity.Key) ([]Process, error) {
	rep, sb, err := m.processOp(ctx, key, agentproto.ProcessOp{Op: agentproto.OpList}, nil, nil)
	if err != nil || sb == nil {
		return []Process{}, err
	}
	out := make([]Process, 0, len(rep.Processes))
	for _, in := range rep.Processes {
		out = append(out, Process{ProcessInfo: in, Sandbox: sb.Name})
	}
	return out, nil
}

// AttachOptions say what an attach streams.
type AttachOptions struct {
	Stdout, Stderr io.Writer // nil: discarded
	Replay         bool      // the ring buffer's bytes first, then live output
	Snapshot       bool      // the ring buffer's bytes, then return at once (the process may run on)
}

// AttachProcess streams ref's output to opts' writers until it ends, and returns it with its exit. When ctx is
// done first, the attach ends (the process runs on) and the Process, still running, comes back with ctx's
// error. Any number of attaches may follow one process at once.
func (m *Manager) AttachProcess(ctx context.Context, key identity.Key, ref ProcessRef, opts AttachOptions) (*Process, error) {
	rep, sb, err := m.processOp(ctx, key, agentproto.ProcessOp{Op: agentproto.OpAttach, PID: ref.PID, Tag: ref.Tag,
		Replay: opts.Replay, Snapshot: opts.Snapshot}, opts.Stdout, opts.Stderr)
	if sb == nil || len(rep.Processes) != 1 {
		if err == nil {
			err = errNoProcess(key, ref)
		}
		return nil, err
	}
	return &Process{ProcessInfo: rep.Processes[0], Sandbox: sb.Name}, err
}

// SendInput writes data to ref's stdin (started with Stdin).
func (m *Manager) SendInput(ctx context.Context, key identity.Key, ref ProcessRef, data []byte) error {
	for len(data) > 0 {
		n := min(len(data), agentproto.MaxInput)
		if err := m.control(ctx, key, agentproto.ProcessOp{Op: agentproto.OpInput, PID: ref.PID, Tag: ref.Tag, Data: data[:n]}); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// CloseStdin closes ref's stdin: it reads EOF.
func (m *Manager) CloseStdin(ctx context.Context, key identity.Key, ref ProcessRef) error {
	return m.control(ctx, key, agentproto.ProcessOp{Op: agentproto.OpCloseStdin, PID: ref.PID, Tag: ref.Tag})
}

// SignalProcess sends sig to ref's process group.
func (m *Manager) SignalProcess(ctx context.Context, key identity.Key, ref ProcessRef, sig syscall.Signal) error {
	if sig < 1 || sig > 64 {
		return fault.New(fault.InvalidArgument, "use a signal such as TERM, KILL, INT or HUP", "signal %d is out of range", int(sig))
	}
	return m.control(ctx, key, agentproto.ProcessOp{Op: agentproto.OpSignal, PID: ref.PID, Tag: ref.Tag, Signal: int(sig)})
}

// ResizeProcess sets a TTY process's window size.
func (m *Manager) ResizeProcess(ctx context.Context, key identity.Key, ref ProcessRef, ws agentproto.WindowSize) error {
	if err := ws.Check(); err != nil {
		return fault.New(fault.InvalidArgument, "pass a terminal size between 1x1 and 1000x1000",
			"terminal size %dx%d is out of range", ws.Rows, ws.Cols)
	}
	return m.control(ctx, key, agentproto.ProcessOp{Op: agentproto.OpResize, PID: ref.PID, Tag: ref.Tag, Size: &ws})
}

// KillProcess kills ref's whole tree (SIGTERM, the grace, SIGKILL), as its lifetime bound would.
func (m *Manager) KillProcess(ctx context.Context, key identity.Key, ref ProcessRef) error {
	return m.control(ctx, key, agentproto.ProcessOp{Op: agentproto.OpKill, PID: ref.PID, Tag: ref.Tag})
}

func (m *Manager) control(ctx context.Context, key identity.Key, op agentproto.ProcessOp) error {
	_, sb, err := m.processOp(ctx, key, op, nil, nil)
	if err == nil && sb == nil {
		err = errNoProcess(key, ProcessRef{PID: op.PID, Tag: op.Tag})
	}
	return err
}

func errNoProcess(key identity.Key, ref ProcessRef) error {
	what := "pid " + strconv.Itoa(ref.PID)
	if ref.PID == 0 {
		what = "tag " + strconv.Quote(ref.Tag)
	}
	return fault.New(fault.ProcessNotFound, "`sandkeep proc ls` lists the sandbox's processes",
		"no process with %s in the sandbox for %s", what, key)
}

// processOp sends op on key's channel, without the gate (a process lives beside commands). A key whose sandbox
// is not running has no process: sb is then nil and err nil. Reply codes become PROCESS_NOT_FOUND,
// PROCESS_EXITED or INVALID_ARGUMENT.
func (m *Manager) processOp(ctx context.Context, key identity.Key, op agentproto.ProcessOp, stdout, stderr io.Writer) (agentproto.ProcessReply, *driver.Sandbox, error) {
	if err := m.processChannel(key); err != nil {
		return agentproto.ProcessReply{}, nil, err
	}
	op.Version, op.ID = agentproto.Version, m.nextID.Add(1)
	if err := op.Validate(); err != nil {
		return agentproto.ProcessReply{}, nil, fault.Wrap(err, fault.InvalidArgument, "name the process by pid or tag", "%v", err)
	}
	sb := m.cached(key)
	if sb == nil {
		// Not ensured by this process (yet): only a running sandbox can have processes, and only its channel
		// can say which.
		got, err := m.owned(ctx, key)
		if fault.Is(err, fault.NotFound) {
			return agentproto.ProcessReply{}, nil, nil
		}
		if err != nil {
			return agentproto.ProcessReply{}, nil, coded(ctx, err, key)
		}
		if got.State != driver.StateRunning {
			return agentproto.ProcessReply{}, nil, nil
		}
		sb = got
	}
	_, mux, err := m.channelShared(ctx, key, sb, waitShort)
	if fault.Is(err, fault.SandboxNotRunning) {
		return agentproto.ProcessReply{}, nil, nil
	}
	if err != nil {
		return agentproto.ProcessReply{}, nil, err
	}
	conn := mux.Route(op.ID)
	defer conn.Close()
	rep, err := agentproto.ProcessCall(ctx, conn, op, stdout, stderr)
	if err != nil {
		if errors.Is(err, agentproto.ErrProtocol) && ctx.Err() == nil {
			return rep, sb, fault.Wrap(err, fault.AgentProtocol, "try again; the sandbox's processes may have ended with its channel",
				"the agent channel of sandbox %s broke during a process operation", sb.Name)
		}
		return rep, sb, err
	}
	switch rep.Code {
	case agentproto.ReplyNotFound:
		return rep, sb, fault.New(fault.ProcessNotFound, "`sandkeep proc ls` lists the sandbox's processes", "%s in sandbox %s", rep.Error, sb.Name)
	case agentproto.ReplyExited:
		return rep, sb, fault.New(fault.ProcessExited, "start it again; `sandkeep proc ls` shows how it ended", "%s", rep.Error)
	case agentproto.ReplyInvalid:
		return rep, sb, fault.New(fault.InvalidArgument, "start the process with stdin (or a TTY) to write or resize it", "%s", rep.Error)
	}
	return rep, sb, nil
}

// watchEvery is how often a process's watcher renews its attach, and marks the key used: a sandbox whose
// process runs is not idle (the sweeper would stop it, and the process with it).
const watchEvery = 30 * time.Second

// procWatch owns the goroutines that follow each process this Manager started until it ends, for its
// process_ended event.
type procWatch struct {
	once   sync.Once
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	gone   map[string]time.Time // key hex -> when this Manager last forgot its sandbox (stop, remove, recycle)
}

func (w *procWatch) init() {
	w.once.Do(func() {
		w.ctx, w.cancel = context.WithCancel(context.Background())
		w.gone = map[string]time.Time{}
	})
}

// sandboxGone notes that key's sandbox is being stopped, removed or recycled: its processes end with it.
func (w *procWatch) sandboxGone(key identity.Key) {
	w.init()
	w.mu.Lock()
	w.gone[key.Hex()] = time.Now()
	w.mu.Unlock()
}

func (w *procWatch) goneSince(key identity.Key, t time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	g, ok := w.gone[key.Hex()]
	return ok && !g.Before(t)
}

func (w *procWatch) close() {
	w.init()
	w.cancel()
	w.wg.Wait()
}

// watchProcess follows p until it ends and then records process_ended in sink.
func (m *Manager) watchProcess(key identity.Key, sandbox string, p agentproto.ProcessInfo, sink Sink, endSession func()) {
	w := &m.procs
	w.init()
	started := time.Now()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		ended := events.ProcessEnded{Sandbox: sandbox, PID: p.PID, Tag: p.Tag}
		for {
			ctx, cancel := context.WithTimeout(w.ctx, watchEvery)
			rep, sb, err := m.processOp(ctx, key, agentproto.ProcessOp{Op: agentproto.OpAttach, PID: p.PID, Quiet: true}, nil, nil)
			timedOut := ctx.Err() != nil
			cancel()
			switch {
			case w.ctx.Err() != nil:
				endSession()
				return // this Manager closes: its channels end, and the processes with them; nobody records it
			case err == nil && sb != nil && len(rep.Processes) == 1 && rep.Processes[0].Exit != nil:
				ex := rep.Processes[0].Exit
				ended.ExitCode, ended.Signal = ex.ExitCode, ex.Signal
				ended.Reason = events.ProcessExitedItself
				switch {
				case ex.TimedOut:
					ended.Reason = events.ProcessLifetime
				case ex.Cancelled:
					ended.Reason = events.ProcessKilled
				}
			case timedOut && sb != nil && rep.Detached:
				m.home.Touch(key, m.cfg.Now())
				continue
			case fault.Is(err, fault.ProcessNotFound) || (err == nil && sb == nil) || w.goneSince(key, started):
				ended.Reason = events.ProcessSandboxEnded
				if !w.goneSince(key, started) && err != nil {
					ended.Reason = events.ProcessChannelEnded // a new agent session: the old one took it along
				}
			default:
				ended.Reason = events.ProcessChannelEnded
			}
			ended.DurationMS = time.Since(started).Milliseconds()
			endSession() // the process's egress session lasts as long as it does: its repeats come before its end
			sink(events.NameProcessEnded, ended)
			return
		}
	}()
}
