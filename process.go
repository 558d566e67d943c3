package sandkeep

import (
	"context"
	"syscall"

	"github.com/sandkeep/sandkeep/internal/engine"
)

// A process is a command that outlives the call that started it (a dev server): addressable by pid or tag,
// its output kept in a bounded buffer, killed with its tree when its sandbox stops or recycles.
type (
	StartRequest  = engine.StartRequest  // what to start, and the run it belongs to
	Process       = engine.Process       // one process as the agent reports it
	ProcessRef    = engine.ProcessRef    // a process by pid or tag
	AttachOptions = engine.AttachOptions // where an attach's output goes, and whether it replays the buffer
)

// StartProcess starts req in key's sandbox and returns once it runs (or could not start), in a run of its own
// or req.RunID's. Processes need an agent channel this Manager serves: elsewhere PROCESS_UNAVAILABLE.
func (m *Manager) StartProcess(ctx context.Context, key Key, req StartRequest) (*Process, error) {
	return m.e.StartProcess(ctx, key, req)
}

// StartProcess starts a process in the run's sandbox (see Manager.StartProcess).
func (r *Run) StartProcess(ctx context.Context, req StartRequest) (*Process, error) {
	if r.r == nil {
		return nil, errNotAdmitted(r.ID)
	}
	return r.r.StartProcess(ctx, req)
}

// Processes lists key's processes, running and recently exited.
func (m *Manager) Processes(ctx context.Context, key Key) ([]Process, error) {
	return m.e.Processes(ctx, key)
}

// AttachProcess streams a process's output to opts' writers until it exits or ctx ends.
func (m *Manager) AttachProcess(ctx context.Context, key Key, ref ProcessRef, opts AttachOptions) (*Process, error) {
	return m.e.AttachProcess(ctx, key, ref, opts)
}

// SendInput writes data to a process's stdin; CloseStdin closes it.
func (m *Manager) SendInput(ctx context.Context, key Key, ref ProcessRef, data []byte) error {
	return m.e.SendInput(ctx, key, ref, data)
}

// CloseStdin closes a process's stdin.
func (m *Manager) CloseStdin(ctx context.Context, key Key, ref ProcessRef) error {
	return m.e.CloseStdin(ctx, key, ref)
}

// SignalProcess sends sig to a process's tree; KillProcess kills it.
func (m *Manager) SignalProcess(ctx context.Context, key Key, ref ProcessRef, sig syscall.Signal) error {
	return m.e.SignalProcess(ctx, key, ref, sig)
}

// KillProcess kills a process's tree.
func (m *Manager) KillProcess(ctx context.Context, key Key, ref ProcessRef) error {
	return m.e.KillProcess(ctx, key, ref)
}

// ResizeProcess changes a TTY process's terminal size.
func (m *Manager) ResizeProcess(ctx context.Context, key Key, ref ProcessRef, ws WindowSize) error {
	return m.e.ResizeProcess(ctx, key, ref, ws)
}

// ParseSignal reads a signal as kill(1) takes it: a name with or without SIG, in any case, or a number 1..64.
func ParseSignal(s string) (syscall.Signal, error) { return engine.ParseSignal(s) }
