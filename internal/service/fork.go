package service

import (
	"context"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/snapshots"
)

// ErrNoFork is the answer of an entry point whose Backend is no Forker.
func ErrNoFork() error {
	return fault.New(fault.SpecUnsupported, "run sandkeep serve over a sandkeep Manager, which forks",
		"this server's backend cannot fork sandboxes")
}

// Forker is optional: a Backend that forks one key's sandbox into a new key (snapshots.Fork). The API and
// MCP find it with a type assertion; without it their fork answers SPEC_UNSUPPORTED (ErrNoFork).
type Forker interface {
	// Fork makes to a new sandbox with a copy of from's workspace in from's template, admitted for a caller as
	// Admit does (ar.Template must be "" or from's own; ar.RunID must be empty). Both keys are of the caller's
	// tenant: the caller forms them.
	Fork(ctx context.Context, from, to sandkeep.Key, ar AdmitRequest) (sandkeep.Sandbox, error)
}

var _ Forker = (*Service)(nil)

// Fork is snapshots.Fork for a caller: the operator's mode and driver, the lower trust, the caller tier.
// Its only bound of its own is the new key's template's workspace quota; the API adds the tenant's sandbox bound.
func (s *Service) Fork(ctx context.Context, from, to sandkeep.Key, ar AdmitRequest) (sandkeep.Sandbox, error) {
	rr, err := s.runRequest(to, ar)
	if err != nil {
		return sandkeep.Sandbox{}, err
	}
	return snapshots.Fork(ctx, s.m, from, rr, snapshots.ForkLimits{})
}
