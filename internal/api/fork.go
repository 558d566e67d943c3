package api

import (
	"context"
	"net/http"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/wire"
)

// ForkBody is the JSON of POST /v1/sandboxes/{user}/fork: the user of the token's tenant to fork into.
type ForkBody = wire.ForkRequest

// handleFork makes body.to a new sandbox with a copy of {user}'s workspace and template: the same admission as
// that user's first exec, and the tenant's sandbox bound.
func (s *Server) handleFork(w http.ResponseWriter, r *http.Request) {
	from, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var b ForkBody
	if err := decodeStrict(http.MaxBytesReader(w, r.Body, s.maxBody), &b, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if b.To == "" {
		s.writeError(w, r, fault.New(fault.InvalidArgument, `send {"to": "<user>"}: the user to fork into`, "to is required"))
		return
	}
	to, err := sandkeep.NewKey(from.Tenant, b.To)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.backend.(service.Forker).Fork(r.Context(), from, to, service.AdmitRequest{Trust: b.Trust, RequestID: infoOf(r).id})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, sb)
}

var _ service.Forker = (*guarded)(nil)

// Fork forks within the server's rules (newSandbox).
func (g *guarded) Fork(ctx context.Context, from, to sandkeep.Key, ar service.AdmitRequest) (sandkeep.Sandbox, error) {
	f, ok := g.Backend.(service.Forker)
	if !ok {
		return sandkeep.Sandbox{}, service.ErrNoFork()
	}
	if ar.RequestID == "" {
		ar.RequestID = requestIDFrom(ctx)
	}
	var sb sandkeep.Sandbox
	err := g.newSandbox(ctx, to, func() error {
		var err error
		sb, err = f.Fork(ctx, from, to, ar)
		return err
	})
	return sb, err
}

// newSandbox runs create, which makes key's sandbox (a fork, a restore), within the server's rules: draining, and
// the tenant's sandbox bound (key counts as one of its sandboxes from then on). Past the bound it is
// QUOTA_EXCEEDED: waiting does not make room, removing does.
func (g *guarded) newSandbox(ctx context.Context, key sandkeep.Key, create func() error) error {
	s := g.s
	if !s.drain.enter() {
		return errShuttingDown()
	}
	defer s.drain.leave()
	done, err := s.limits.admitWorkspace(ctx, g.Backend, key)
	if err != nil {
		if fault.CodeOf(err) == fault.RateLimited {
			s.metrics.limited.WithLabelValues("sandboxes").Inc()
			return fault.Wrap(err, fault.QuotaExceeded,
				"remove one of the tenant's sandboxes (DELETE /v1/sandboxes/{user}), or ask the operator to raise max_sandboxes",
				"tenant %s is at its limit of sandboxes and this would make one more; nothing was made", key.Tenant)
		}
		return err
	}
	err = create()
	done(err == nil)
	return err
}
