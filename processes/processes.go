// Package processes runs commands that outlive the call that started them (a dev server, a watcher) in a
// Manager's sandboxes: each is addressable by pid or tag, keeps its output in a bounded buffer for attaches, and
// is killed with its whole tree when its sandbox stops or recycles.
//
// A start is admitted like a command (package sandkeep's Manager.Admit): in a run of its own, or in the run it
// names. Processes need an agent channel served by a long-lived Manager (a server, the daemon); elsewhere the
// calls are PROCESS_UNAVAILABLE.
package processes

import (
	"context"
	"io"
	"syscall"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/engine"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// StartRequest is one process to start. Argv runs directly, without a shell, as for an ExecRequest.
type StartRequest struct {
	Argv    []string
	Workdir string   // relative to /workspace, or absolute under it; created when missing
	Env     []string // "K=V", added to the sandbox's environment
	// Lifetime bounds the process: past it, its whole tree is killed (process_ended, reason lifetime). Zero means
	// one hour; at most 24h and the operator's MaxTimeout.
	Lifetime time.Duration
	// Stdin keeps the process's stdin open for SendInput and CloseStdin; otherwise it reads /dev/null.
	Stdin bool
	// TTY, when set, runs it on a pseudo-terminal of this size (one output stream: stdout; Resize).
	TTY *sandkeep.WindowSize
	// Tag names it, unique among the sandbox's running processes (printable text, at most 128 bytes).
	Tag string
	// BufferLimit is its output ring buffer per stream (what Attach replays): zero means 1 MiB, at most 16 MiB.
	// Older output is dropped, and an attach that replays says how much.
	BufferLimit int64
	// OnEvent receives process_started, and process_ended whenever the process ends.
	OnEvent sandkeep.EventFunc
	// RunID attaches the start to that running run; otherwise it is admitted in a run of its own with Template
	// and Trust (as a RunRequest's), RequestID recorded on its events.
	RunID     string
	RequestID string
	Template  string
	Trust     string
	// Network is a block over the network of the start's run, carried to its admission as RunRequest.Network is
	// (a caller's may only narrow it: NETWORK_WIDENED): the process has, for its whole life, what a command of
	// that run would. StartIn's run was admitted already, with its own block: a Network there is INVALID_ARGUMENT.
	Network *sandkeep.Network
}

func (req StartRequest) engine() engine.StartRequest {
	return engine.StartRequest{Argv: req.Argv, Workdir: req.Workdir, Env: req.Env, Lifetime: req.Lifetime,
		Stdin: req.Stdin, TTY: req.TTY, Tag: req.Tag, BufferLimit: req.BufferLimit, OnEvent: engine.EventFunc(req.OnEvent),
		RunID: req.RunID, RequestID: req.RequestID, Template: req.Template, Trust: req.Trust,
		Network: engine.Facade.RunRequest(sandkeep.RunRequest{Network: req.Network}).Network}
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

func processOf(p *engine.Process, err error) (*Process, error) {
	if p == nil {
		return nil, err
	}
	out := Process(*p)
	return &out, err
}

// Ref names a process of a sandbox: by PID, or by Tag when PID is 0.
type Ref struct {
	PID int
	Tag string
}

// AttachOptions say what Attach streams: the ring buffer's output first when Replay is set, then what the
// process writes, to Stdout and Stderr (nil: discarded).
type AttachOptions struct {
	Stdout io.Writer
	Stderr io.Writer
	Replay bool
	// Snapshot sends the ring buffer's output and returns at once, the process running on (no error then), as
	// `docker logs` without -f does.
	Snapshot bool
}

// Start starts req in key's sandbox and returns once it runs (or could not start: then the Process comes back
// not running, with exit 127 or 126 and StartError), in a run of its own or in req.RunID's.
func Start(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key, req StartRequest) (*Process, error) {
	return processOf(engine.Facade.Manager(m).StartProcess(ctx, key, req.engine()))
}

// StartIn starts req in run's sandbox, recording its events in run (run's own ID wins over req.RunID).
func StartIn(ctx context.Context, run *sandkeep.Run, req StartRequest) (*Process, error) {
	r := engine.Facade.Run(run)
	if r == nil {
		return nil, fault.New(fault.InvalidArgument, "admit a run with Manager.Admit", "run %q was not admitted by a Manager", run.ID)
	}
	return processOf(r.StartProcess(ctx, req.engine()))
}

// List lists key's processes, running and recently exited.
func List(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key) ([]Process, error) {
	in, err := engine.Facade.Manager(m).Processes(ctx, key)
	if in == nil {
		return nil, err
	}
	out := make([]Process, 0, len(in))
	for _, p := range in {
		out = append(out, Process(p))
	}
	return out, err
}

// Attach streams a process's output to opts' writers until it exits or ctx ends.
func Attach(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key, ref Ref, opts AttachOptions) (*Process, error) {
	return processOf(engine.Facade.Manager(m).AttachProcess(ctx, key, engine.ProcessRef(ref), engine.AttachOptions(opts)))
}

// SendInput writes data to a process's stdin (one started with Stdin).
func SendInput(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key, ref Ref, data []byte) error {
	return engine.Facade.Manager(m).SendInput(ctx, key, engine.ProcessRef(ref), data)
}

// CloseStdin closes a process's stdin.
func CloseStdin(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key, ref Ref) error {
	return engine.Facade.Manager(m).CloseStdin(ctx, key, engine.ProcessRef(ref))
}

// Signal sends sig to a process's tree.
func Signal(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key, ref Ref, sig syscall.Signal) error {
	return engine.Facade.Manager(m).SignalProcess(ctx, key, engine.ProcessRef(ref), sig)
}

// Kill kills a process's tree.
func Kill(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key, ref Ref) error {
	return engine.Facade.Manager(m).KillProcess(ctx, key, engine.ProcessRef(ref))
}

// Resize changes a TTY process's terminal size.
func Resize(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key, ref Ref, ws sandkeep.WindowSize) error {
	return engine.Facade.Manager(m).ResizeProcess(ctx, key, engine.ProcessRef(ref), ws)
}

// ParseSignal reads a signal as kill(1) takes it: a name with or without SIG, in any case, or a number 1..64.
func ParseSignal(s string) (syscall.Signal, error) { return engine.ParseSignal(s) }
