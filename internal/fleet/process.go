package fleet

import (
	"context"
	"syscall"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/processes"
)

// The process model on a replica: served for keys this replica owns (the HTTP API hands other keys' process
// requests over whole, Proxy); through other entry points another replica's key is PROCESS_UNAVAILABLE.

// owned claims key for a capability served only here: nil when this replica serves it.
func (b *Backend) owned(ctx context.Context, key sandkeep.Key) error {
	to, err := b.route(ctx, key)
	if err != nil || to == nil {
		return err
	}
	return errNotOwner(fault.ProcessUnavailable, "the processes", to)
}

// StartProcess implements service.ProcessBackend for keys this replica owns.
func (b *Backend) StartProcess(ctx context.Context, key sandkeep.Key, req processes.StartRequest) (*processes.Process, error) {
	if err := b.owned(ctx, key); err != nil {
		return nil, err
	}
	return b.local.StartProcess(ctx, key, req)
}

// Processes implements service.ProcessBackend for keys this replica owns.
func (b *Backend) Processes(ctx context.Context, key sandkeep.Key) ([]processes.Process, error) {
	if err := b.owned(ctx, key); err != nil {
		return nil, err
	}
	return b.local.Processes(ctx, key)
}

// AttachProcess implements service.ProcessBackend for keys this replica owns.
func (b *Backend) AttachProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref, opts processes.AttachOptions) (*processes.Process, error) {
	if err := b.owned(ctx, key); err != nil {
		return nil, err
	}
	return b.local.AttachProcess(ctx, key, ref, opts)
}

// SendInput implements service.ProcessBackend for keys this replica owns.
func (b *Backend) SendInput(ctx context.Context, key sandkeep.Key, ref processes.Ref, data []byte) error {
	if err := b.owned(ctx, key); err != nil {
		return err
	}
	return b.local.SendInput(ctx, key, ref, data)
}

// CloseStdin implements service.ProcessBackend for keys this replica owns.
func (b *Backend) CloseStdin(ctx context.Context, key sandkeep.Key, ref processes.Ref) error {
	if err := b.owned(ctx, key); err != nil {
		return err
	}
	return b.local.CloseStdin(ctx, key, ref)
}

// SignalProcess implements service.ProcessBackend for keys this replica owns.
func (b *Backend) SignalProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref, sig syscall.Signal) error {
	if err := b.owned(ctx, key); err != nil {
		return err
	}
	return b.local.SignalProcess(ctx, key, ref, sig)
}

// KillProcess implements service.ProcessBackend for keys this replica owns.
func (b *Backend) KillProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref) error {
	if err := b.owned(ctx, key); err != nil {
		return err
	}
	return b.local.KillProcess(ctx, key, ref)
}

// ResizeProcess implements service.ProcessBackend for keys this replica owns.
func (b *Backend) ResizeProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref, ws sandkeep.WindowSize) error {
	if err := b.owned(ctx, key); err != nil {
		return err
	}
	return b.local.ResizeProcess(ctx, key, ref, ws)
}
