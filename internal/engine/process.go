package engine

import (
	"context"
	"io"
	"syscall"
	"time"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// StartRequest starts a process: a command that outlives the call (a dev server), addressable by its pid or
// tag until it ends. Argv runs directly, without a shell, as for Exec.
type StartRequest struct {
	Argv    []string
	Workdir string   // relative to /workspace, or absolute under it; created when missing
	Env     []string // "K=V", added to the sandbox's environment
	// Lifetime bounds the process: past it, its whole tree is killed (process_ended, reason lifetime). Zero means
	// one hour; at most 24h and the operator's MaxTimeout.
	Lifetime time.Duration
	// Stdin keeps the process's stdin open for SendInput and CloseStdin; otherwise it reads /dev/null.
	Stdin bool
	// TTY, when set, runs it on a pseudo-terminal of this size (one output stream: stdout; ResizeProcess).
	TTY *WindowSize
	// Tag names it, unique among the sandbox's running processes (printable text, at most 128 bytes).
	Tag string
	// BufferLimit is its output ring buffer per stream (what AttachProcess replays): zero means 1 MiB, at most
	// 16 MiB. Older output is dropped, and an attach that replays says how much.
	BufferLimit int64
	// OnEvent receives process_started, and process_ended whenever the process ends.
	OnEvent EventFunc
	// RunID, RequestID, Template and Trust are as for ExecRequest: the start is admitted like a command.
	RunID     string
	RequestID string
	Template  string
	Trust     string
	// Network is a block over the run's network, carried to the start's admission as RunRequest.Network is (a
	// caller's may only narrow it: NETWORK_WIDENED), so the process gets what a command of that run would. A
	// start in a run already admitted (Run.StartProcess) has that run's network, and a block here is refused.
	Network *Network
}

// Process describes one process of a sandbox.
type Process struct {
	PID     int       `json:"pid"`
	Tag     string    `json:"tag,omitempty"`
	Argv    []string  `json:"argv"`
	Workdir string    `json:"workdir,omitempty"`
	TTY     bool      `json:"tty,omitempty"`
	Stdin   bool      `json:"stdin,omitempty"` // its stdin is open for input
	Started time.Time `json:"started"`
	Running bool      `json:"running"`
	// Its end, once Running is false: the exit code (128+signal when a signal killed it), whether its lifetime
	// bound passed (TimedOut) or a caller killed it (Killed), and why it never ran (StartError: exit 126/127).
	ExitCode   int    `json:"exit_code"`
	Signal     int    `json:"signal,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	Killed     bool   `json:"killed,omitempty"`
	StartError string `json:"start_error,omitempty"`
	// StdoutDropped and StderrDropped are the bytes an attach that replayed could no longer get from the ring.
	StdoutDropped int64  `json:"stdout_dropped,omitempty"`
	StderrDropped int64  `json:"stderr_dropped,omitempty"`
	Sandbox       string `json:"sandbox"`
}

// ProcessRef names a process of a sandbox: by PID, or by Tag when PID is 0.
type ProcessRef struct {
	PID int
	Tag string
}

// AttachOptions say what AttachProcess streams: the ring buffer's output first when Replay is set, then what
// the process writes, to Stdout and Stderr (nil: discarded).
type AttachOptions struct {
	Stdout io.Writer
	Stderr io.Writer
	Replay bool
	// Snapshot sends the ring buffer's output and returns at once, the process running on (no error then), as
	// `docker logs` without -f does.
	Snapshot bool
}

func processOf(p *lifecycle.Process) *Process {
	if p == nil {
		return nil
	}
	out := &Process{PID: p.PID, Tag: p.Tag, Argv: p.Argv, Workdir: p.Workdir, TTY: p.TTY, Stdin: p.Stdin,
		Started: time.UnixMilli(p.StartedMS).UTC(), Running: p.Running, StdoutDropped: p.StdoutDropped,
		StderrDropped: p.StderrDropped, Sandbox: p.Sandbox}
	if e := p.Exit; e != nil {
		out.ExitCode, out.Signal, out.TimedOut, out.Killed, out.StartError = e.ExitCode, e.Signal, e.TimedOut, e.Cancelled, e.StartError
	}
	return out
}

// StartProcess starts req in key's sandbox and returns once it runs, with its pid; it does not wait for it.
// Like Exec it is admitted (req.RunID attaches it to a running run, else it gets a run of its own, finished
// when StartProcess returns; process_ended is recorded in it later). It takes the user's gate only to start
// the process: the user's commands run beside it, and stop, rm and recycles end it (with its whole tree). A
// command that cannot start is not an error: the Process comes back not running, with exit 127 or 126 and
// StartError. Processes need the Docker driver's agent channel, served by a long-lived Manager (serve, the
// daemon): elsewhere PROCESS_UNAVAILABLE.
func (m *Manager) StartProcess(ctx context.Context, key Key, req StartRequest) (*Process, error) {
	block := req.Network // the start's admission carries it: the run's commands have it, so the process does
	req.Network = nil
	if req.RunID != "" {
		run, err := m.Admit(ctx, RunRequest{Key: key, RunID: req.RunID, RequestID: req.RequestID, Network: block,
			Observer: Observer{Event: req.OnEvent}})
		if err != nil {
			return nil, err
		}
		return run.StartProcess(ctx, req)
	}
	run, err := m.Admit(ctx, RunRequest{Key: key, Template: req.Template, Trust: req.Trust, RequestID: req.RequestID,
		Network: block, Observer: Observer{Event: req.OnEvent}})
	if err != nil {
		return nil, err
	}
	p, err := run.StartProcess(ctx, req)
	run.Finish(err)
	return p, err
}

// StartProcess starts a process in the run's sandbox (see Manager.StartProcess), recording its events in the
// run. The run's secret files are not placed for it (they belong to one command at a time); it gets the run's
// network (with the block it was admitted with) as a session of the sandbox's egress proxy of its own, from its
// start to its end.
func (r *Run) StartProcess(ctx context.Context, req StartRequest) (*Process, error) {
	if r.lc == nil {
		return nil, fault.New(fault.InvalidArgument, "admit a new run", "run %s was refused and runs nothing", r.ID)
	}
	if req.Network != nil {
		return nil, fault.New(fault.InvalidArgument, "pass the network block when admitting the run (RunRequest.Network)",
			"a process started in run %s has the run's network; a block of its own is not applied there", r.ID)
	}
	if err := r.m.CheckStart(req); err != nil {
		return nil, err
	}
	var tty *agentproto.WindowSize
	if req.TTY != nil {
		tty = (&TTY{Size: *req.TTY}).size() // zero: 24x80
	}
	p, err := r.lc.StartProcess(ctx, r.key, lifecycle.StartRequest{
		Argv: req.Argv, Workdir: req.Workdir, Env: req.Env, Lifetime: req.Lifetime, Stdin: req.Stdin,
		TTY: tty, Tag: req.Tag, Ring: req.BufferLimit, OnEvent: r.sink, Shape: r.shape,
		Network: r.cmdPol, NetworkBlock: r.network != nil || r.cmdNet != nil,
	})
	return processOf(p), err
}

// CheckStart is CheckExec for a process: a command, a lifetime within the operator's bound, a workdir, an
// environment, a tag and a buffer limit within bounds.
func (m *Manager) CheckStart(req StartRequest) error { return CheckStartWithin(req, m.cfg.MaxTimeout) }

// CheckStartWithin is CheckStart with the operator's bound given (0: the library's, 24h), for callers that
// validate before opening a Manager.
func CheckStartWithin(req StartRequest, maxLifetime time.Duration) error {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return fault.New(fault.InvalidArgument, "pass the command to run, e.g. [\"npm\", \"run\", \"dev\"]", "no command given")
	}
	// The command's own checks are the one validator's (argv, lifetime as its timeout, workdir, env).
	if err := checkExec(ExecRequest{Argv: req.Argv, Timeout: req.Lifetime, Workdir: req.Workdir, Env: req.Env}, maxLifetime, 0); err != nil {
		return err
	}
	if err := agentproto.CheckTag(req.Tag); err != nil {
		return fault.New(fault.InvalidArgument, "use a tag of printable text, at most 128 bytes", "invalid process tag %q", req.Tag)
	}
	if req.BufferLimit < 0 || req.BufferLimit > agentproto.MaxRing {
		return fault.New(fault.InvalidArgument, "use a buffer limit between 1 byte and 16 MiB (0: 1 MiB)",
			"buffer limit %d is out of range", req.BufferLimit)
	}
	return nil
}

// Processes lists key's processes, running and recently exited (the agent keeps the last 64). A user without a
// running sandbox has none.
func (m *Manager) Processes(ctx context.Context, key Key) ([]Process, error) {
	lc, err := m.primary(ctx)
	if err != nil {
		return nil, err
	}
	ps, err := lc.ListProcesses(ctx, key)
	if err != nil {
		return nil, err
	}
	out := make([]Process, 0, len(ps))
	for i := range ps {
		out = append(out, *processOf(&ps[i]))
	}
	return out, nil
}

// AttachProcess streams ref's output (see AttachOptions) until it ends, and returns it with its exit. When ctx is
// done first the attach ends, the process runs on, and it comes back (Running) with ctx's error. Several
// attaches may follow one process; none of them holds the user's gate. An unknown pid or tag is
// PROCESS_NOT_FOUND.
func (m *Manager) AttachProcess(ctx context.Context, key Key, ref ProcessRef, opts AttachOptions) (*Process, error) {
	lc, err := m.primary(ctx)
	if err != nil {
		return nil, err
	}
	p, err := lc.AttachProcess(ctx, key, lifecycle.ProcessRef(ref), lifecycle.AttachOptions(opts))
	return processOf(p), err
}

// SendInput writes data to ref's stdin (a process started with Stdin); PROCESS_EXITED once it has ended.
func (m *Manager) SendInput(ctx context.Context, key Key, ref ProcessRef, data []byte) error {
	lc, err := m.primary(ctx)
	if err != nil {
		return err
	}
	return lc.SendInput(ctx, key, lifecycle.ProcessRef(ref), data)
}

// CloseStdin closes ref's stdin: it reads EOF.
func (m *Manager) CloseStdin(ctx context.Context, key Key, ref ProcessRef) error {
	lc, err := m.primary(ctx)
	if err != nil {
		return err
	}
	return lc.CloseStdin(ctx, key, lifecycle.ProcessRef(ref))
}

// SignalProcess sends sig (TERM, KILL, INT, HUP...) to ref's process group.
func (m *Manager) SignalProcess(ctx context.Context, key Key, ref ProcessRef, sig syscall.Signal) error {
	lc, err := m.primary(ctx)
	if err != nil {
		return err
	}
	return lc.SignalProcess(ctx, key, lifecycle.ProcessRef(ref), sig)
}

// KillProcess kills ref's whole tree: SIGTERM, the grace, then SIGKILL (process_ended, reason killed).
func (m *Manager) KillProcess(ctx context.Context, key Key, ref ProcessRef) error {
	lc, err := m.primary(ctx)
	if err != nil {
		return err
	}
	return lc.KillProcess(ctx, key, lifecycle.ProcessRef(ref))
}

// ResizeProcess sets a TTY process's window size.
func (m *Manager) ResizeProcess(ctx context.Context, key Key, ref ProcessRef, ws WindowSize) error {
	lc, err := m.primary(ctx)
	if err != nil {
		return err
	}
	return lc.ResizeProcess(ctx, key, lifecycle.ProcessRef(ref), ws)
}
