package api

import (
	"context"
	"time"

	"github.com/sandkeep/sandkeep"
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
func (g *guarded) Exec(ctx context.Context, key sandkeep.Key, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
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
	obs := &execObserver{m: s.metrics, next: req.OnEvent}
	req.OnEvent = obs.event
	s.metrics.execsInFlight.Inc()
	start := time.Now()
	res, err := g.Backend.Exec(ctx, key, req)
	s.metrics.execsInFlight.Dec()
	s.metrics.observeExec(ctx, res, err, time.Since(start))
	release(err == nil)
	return res, err
}

// Remove removes key's sandbox and forgets it for the sandbox bound.
func (g *guarded) Remove(ctx context.Context, key sandkeep.Key) error {
	err := g.Backend.Remove(ctx, key)
	g.s.limits.forget(key)
	return err
}
