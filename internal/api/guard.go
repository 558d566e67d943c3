package api

import (
	"context"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/service"
)

// guarded is the configured Backend with this server's rules around it: draining, the tenant's command and
// sandbox bounds, the request id on the command's events, and the exec metrics. The HTTP routes and the MCP
// handler both call it, so the rules hold whichever way a command arrives.
type guarded struct {
	service.Backend
	s *Server
}

var _ service.Backend = (*guarded)(nil)

// Exec admits the command, runs it, and records its outcome.
func (g *guarded) Exec(ctx context.Context, key sandkeep.Key, ar service.AdmitRequest, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
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
	if ar.RequestID == "" {
		ar.RequestID = requestIDFrom(ctx)
	}
	obs := &execObserver{m: s.metrics, next: ar.Observer}
	ar.Observer = obs.observer() // the one wrap: metrics, then the caller's own
	s.metrics.execsInFlight.Inc()
	start := time.Now()
	res, err := g.Backend.Exec(ctx, key, ar, req)
	s.metrics.execsInFlight.Dec()
	s.metrics.observeExec(ctx, res, err, time.Since(start))
	release(err == nil)
	return res, err
}

// Workspace opens key's workspace within the tenant's bound on open file operations (the place is given back
// when the caller closes it). Creating one counts against the tenant's sandboxes, as an exec would.
func (g *guarded) Workspace(ctx context.Context, key sandkeep.Key, create bool) (*files.FS, error) {
	s := g.s
	release, err := s.limits.admitFiles(key.Tenant)
	if err != nil {
		s.metrics.limited.WithLabelValues("files").Inc()
		return nil, err
	}
	ws, err := g.open(ctx, key, create)
	if err != nil {
		release()
		return nil, err
	}
	ws.OnClose(release)
	return ws, nil
}

func (g *guarded) open(ctx context.Context, key sandkeep.Key, create bool) (*files.FS, error) {
	if !create {
		return g.Backend.Workspace(ctx, key, false)
	}
	// An existing workspace is no new sandbox; a missing one is admitted first.
	ws, err := g.Backend.Workspace(ctx, key, false)
	if err == nil || !(fault.Is(err, fault.FileNotFound) || fault.Is(err, fault.NotFound)) {
		return ws, err
	}
	done, err := g.s.limits.admitWorkspace(ctx, g.Backend, key)
	if err != nil {
		if fault.CodeOf(err) == fault.RateLimited {
			g.s.metrics.limited.WithLabelValues("sandboxes").Inc()
		}
		return nil, err
	}
	ws, err = g.Backend.Workspace(ctx, key, true)
	done(err == nil)
	return ws, err
}

// Remove removes key's sandbox and forgets it for the sandbox bound.
func (g *guarded) Remove(ctx context.Context, key sandkeep.Key) error {
	err := g.Backend.Remove(ctx, key)
	g.s.limits.forget(key)
	return err
}
