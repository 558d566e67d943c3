package service

import (
	"context"
	"syscall"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/processes"
)

// ProcessBackend is the process model over the Backend (an optional capability, found by type assertion, as
// PortDialer is): processes that outlive their call, each started through the same caller-tier admission as
// Exec. The caller checks the key's tenant; a pid or tag never reaches outside key's sandbox.
type ProcessBackend interface {
	StartProcess(ctx context.Context, key sandkeep.Key, req processes.StartRequest) (*processes.Process, error)
	Processes(ctx context.Context, key sandkeep.Key) ([]processes.Process, error)
	AttachProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref, opts processes.AttachOptions) (*processes.Process, error)
	SendInput(ctx context.Context, key sandkeep.Key, ref processes.Ref, data []byte) error
	CloseStdin(ctx context.Context, key sandkeep.Key, ref processes.Ref) error
	SignalProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref, sig syscall.Signal) error
	KillProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref) error
	ResizeProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref, ws sandkeep.WindowSize) error
}

var _ ProcessBackend = (*Service)(nil)

// StartProcess admits the start's run as the caller tier (or attaches it to req.RunID), with req.Network as the
// caller's block over its network (as an exec's), and starts the process; the run is finished when the start
// returns, and the process's end is recorded in it later.
func (s *Service) StartProcess(ctx context.Context, key sandkeep.Key, req processes.StartRequest) (*processes.Process, error) {
	run, err := s.Admit(ctx, key, AdmitRequest{RunID: req.RunID, Template: req.Template, Trust: req.Trust, RequestID: req.RequestID,
		Network: req.Network})
	if err != nil {
		return nil, err
	}
	req.Network = nil // admitted with the run: the process has the run's network
	p, err := processes.StartIn(ctx, run, req)
	run.Finish(err)
	return p, err
}

// Processes lists key's processes.
func (s *Service) Processes(ctx context.Context, key sandkeep.Key) ([]processes.Process, error) {
	return processes.List(ctx, s.m, key)
}

// AttachProcess streams ref's output until it ends or ctx is done.
func (s *Service) AttachProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref, opts processes.AttachOptions) (*processes.Process, error) {
	return processes.Attach(ctx, s.m, key, ref, opts)
}

// SendInput writes to ref's stdin.
func (s *Service) SendInput(ctx context.Context, key sandkeep.Key, ref processes.Ref, data []byte) error {
	return processes.SendInput(ctx, s.m, key, ref, data)
}

// CloseStdin closes ref's stdin.
func (s *Service) CloseStdin(ctx context.Context, key sandkeep.Key, ref processes.Ref) error {
	return processes.CloseStdin(ctx, s.m, key, ref)
}

// SignalProcess sends sig to ref's process group.
func (s *Service) SignalProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref, sig syscall.Signal) error {
	return processes.Signal(ctx, s.m, key, ref, sig)
}

// KillProcess kills ref's tree.
func (s *Service) KillProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref) error {
	return processes.Kill(ctx, s.m, key, ref)
}

// ResizeProcess sets a TTY process's window size.
func (s *Service) ResizeProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref, ws sandkeep.WindowSize) error {
	return processes.Resize(ctx, s.m, key, ref, ws)
}
