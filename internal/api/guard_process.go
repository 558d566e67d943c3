package api

import (
	"context"
	"syscall"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/processes"
)

// The process model through the same rules as Exec: a start is admitted as a command is (draining, the
// tenant's command and sandbox bounds, the request id), and a backend without processes answers
// PROCESS_UNAVAILABLE. The HTTP routes, MCP and the E2B front all reach processes through here.

var _ service.ProcessBackend = (*guarded)(nil)

func (g *guarded) procs() (service.ProcessBackend, error) {
	if pb, ok := g.Backend.(service.ProcessBackend); ok {
		return pb, nil
	}
	return nil, fault.New(fault.ProcessUnavailable, "run sandkeep serve over the library's backend",
		"this server's backend has no processes")
}

// StartProcess admits the start like a command (it counts among the tenant's running commands until the
// process runs, and may create the sandbox) and starts it.
func (g *guarded) StartProcess(ctx context.Context, key sandkeep.Key, req processes.StartRequest) (*processes.Process, error) {
	pb, err := g.procs()
	if err != nil {
		return nil, err
	}
	s := g.s
	if !s.drain.enter() {
		return nil, errShuttingDown()
	}
	defer s.drain.leave()
	release, refused, err := s.limits.admitExec(ctx, g.Backend, key)
	if err != nil {
		if refused != "" {
			s.metrics.limited.WithLabelValues(refused).Inc()
		}
		return nil, err
	}
	if req.RequestID == "" {
		req.RequestID = requestIDFrom(ctx)
	}
	p, err := pb.StartProcess(ctx, key, req)
	release(err == nil)
	return p, err
}

func (g *guarded) Processes(ctx context.Context, key sandkeep.Key) ([]processes.Process, error) {
	pb, err := g.procs()
	if err != nil {
		return nil, err
	}
	return pb.Processes(ctx, key)
}

func (g *guarded) AttachProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref, opts processes.AttachOptions) (*processes.Process, error) {
	pb, err := g.procs()
	if err != nil {
		return nil, err
	}
	return pb.AttachProcess(ctx, key, ref, opts)
}

func (g *guarded) SendInput(ctx context.Context, key sandkeep.Key, ref processes.Ref, data []byte) error {
	pb, err := g.procs()
	if err != nil {
		return err
	}
	return pb.SendInput(ctx, key, ref, data)
}

func (g *guarded) CloseStdin(ctx context.Context, key sandkeep.Key, ref processes.Ref) error {
	pb, err := g.procs()
	if err != nil {
		return err
	}
	return pb.CloseStdin(ctx, key, ref)
}

func (g *guarded) SignalProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref, sig syscall.Signal) error {
	pb, err := g.procs()
	if err != nil {
		return err
	}
	return pb.SignalProcess(ctx, key, ref, sig)
}

func (g *guarded) KillProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref) error {
	pb, err := g.procs()
	if err != nil {
		return err
	}
	return pb.KillProcess(ctx, key, ref)
}

func (g *guarded) ResizeProcess(ctx context.Context, key sandkeep.Key, ref processes.Ref, ws sandkeep.WindowSize) error {
	pb, err := g.procs()
	if err != nil {
		return err
	}
	return pb.ResizeProcess(ctx, key, ref, ws)
}
