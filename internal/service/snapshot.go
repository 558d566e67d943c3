package service

import (
	"context"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/snapshots"
)

// Snapshotter is optional: a Backend that keeps workspace snapshots (package snapshots). The API
// and MCP find it with a type assertion; without it their snapshot calls answer SPEC_UNSUPPORTED (ErrNoSnapshots).
// Every name is the caller's tenant's: the caller forms the keys and passes the tenant.
type Snapshotter interface {
	CreateSnapshot(ctx context.Context, key sandkeep.Key, name, requestID string) (snapshots.Snapshot, error)
	Snapshots(ctx context.Context, tenant string) ([]snapshots.Snapshot, error)
	DeleteSnapshot(ctx context.Context, tenant, name, requestID string) error
	// RestoreSnapshot makes to a new sandbox from to's tenant's snapshot called name, admitted for a caller as
	// Admit does (ar.Template must be "" or the snapshot's); with opts.Replace to may exist (snapshots.Replace).
	RestoreSnapshot(ctx context.Context, name string, to sandkeep.Key, ar AdmitRequest, opts RestoreOptions) (sandkeep.Sandbox, error)
}

// RestoreOptions are what a restore asks besides admission: Replace restores onto a key that has a sandbox
// (stopped, its workspace replaced whole once the archive is whole), which is SANDBOX_EXISTS without it.
type RestoreOptions struct {
	Replace bool
}

// ErrNoSnapshots is the answer of an entry point whose Backend is no Snapshotter.
func ErrNoSnapshots() error {
	return fault.New(fault.SpecUnsupported, "run sandkeep serve over a sandkeep Manager, which keeps snapshots",
		"this server's backend keeps no snapshots")
}

var _ Snapshotter = (*Service)(nil)

// CreateSnapshot is snapshots.Create.
func (s *Service) CreateSnapshot(ctx context.Context, key sandkeep.Key, name, requestID string) (snapshots.Snapshot, error) {
	return snapshots.Create(ctx, s.m, key, name, snapshots.Events{RequestID: requestID})
}

// Snapshots is snapshots.List.
func (s *Service) Snapshots(_ context.Context, tenant string) ([]snapshots.Snapshot, error) {
	return snapshots.List(s.m, tenant)
}

// DeleteSnapshot is snapshots.Delete.
func (s *Service) DeleteSnapshot(ctx context.Context, tenant, name, requestID string) error {
	return snapshots.Delete(ctx, s.m, tenant, name, snapshots.Events{RequestID: requestID})
}

// RestoreSnapshot is snapshots.Restore for a caller: the operator's mode and driver, the lower
// trust, the caller tier.
func (s *Service) RestoreSnapshot(ctx context.Context, name string, to sandkeep.Key, ar AdmitRequest, opts RestoreOptions) (sandkeep.Sandbox, error) {
	rr, err := s.runRequest(to, ar)
	if err != nil {
		return sandkeep.Sandbox{}, err
	}
	if opts.Replace {
		return snapshots.Replace(ctx, s.m, name, rr)
	}
	return snapshots.Restore(ctx, s.m, name, rr)
}
