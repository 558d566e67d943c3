package api

import (
	"context"
	"net/http"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/snapshots"
	"github.com/sandkeep/sandkeep/wire"
)

// SnapshotBody is the JSON of POST /v1/sandboxes/{user}/snapshots.
type SnapshotBody = wire.SnapshotCreate

// RestoreBody is the JSON of POST /v1/snapshots/{name}/restore: the new user of the token's tenant.
type RestoreBody = wire.SnapshotRestore

// SnapshotList is the answer of GET /v1/snapshots.
type SnapshotList = wire.SnapshotList

func (s *Server) snapshotter() (service.Snapshotter, error) {
	sn, ok := s.backend.(service.Snapshotter)
	if !ok {
		return nil, service.ErrNoSnapshots()
	}
	return sn, nil
}

func (s *Server) handleCreateSnapshot(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var b SnapshotBody
	if err := decodeStrict(http.MaxBytesReader(w, r.Body, s.maxBody), &b, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	sn, err := s.snapshotter()
	if err == nil {
		var out snapshots.Snapshot
		if out, err = sn.CreateSnapshot(r.Context(), key, b.Name, infoOf(r).id); err == nil {
			writeJSON(w, http.StatusCreated, out)
			return
		}
	}
	s.writeError(w, r, err)
}

func (s *Server) handleSnapshots(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r.URL.Query()); err != nil {
		s.writeError(w, r, err)
		return
	}
	sn, err := s.snapshotter()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	list, err := sn.Snapshots(r.Context(), tenantOf(r))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if list == nil {
		list = []snapshots.Snapshot{}
	}
	writeJSON(w, http.StatusOK, SnapshotList{Snapshots: wireSnapshots(list)})
}

func (s *Server) handleDeleteSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.snapshotter()
	if err == nil {
		err = sn.DeleteSnapshot(r.Context(), tenantOf(r), r.PathValue("name"), infoOf(r).id)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleRestoreSnapshot(w http.ResponseWriter, r *http.Request) {
	var b RestoreBody
	if err := decodeStrict(http.MaxBytesReader(w, r.Body, s.maxBody), &b, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if b.User == "" {
		s.writeError(w, r, fault.New(fault.InvalidArgument, `send {"user": "<user>"}: the new user to restore into`, "user is required"))
		return
	}
	to, err := sandkeep.NewKey(tenantOf(r), b.User)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sn, err := s.snapshotter()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := sn.RestoreSnapshot(r.Context(), r.PathValue("name"), to, service.AdmitRequest{Trust: b.Trust, RequestID: infoOf(r).id},
		service.RestoreOptions{Replace: b.Replace})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, sb)
}

var _ service.Snapshotter = (*guarded)(nil)

func (g *guarded) inner() (service.Snapshotter, error) {
	sn, ok := g.Backend.(service.Snapshotter)
	if !ok {
		return nil, service.ErrNoSnapshots()
	}
	return sn, nil
}

// CreateSnapshot is the backend's.
func (g *guarded) CreateSnapshot(ctx context.Context, key sandkeep.Key, name, requestID string) (snapshots.Snapshot, error) {
	sn, err := g.inner()
	if err != nil {
		return snapshots.Snapshot{}, err
	}
	return sn.CreateSnapshot(ctx, key, name, requestID)
}

// Snapshots is the backend's.
func (g *guarded) Snapshots(ctx context.Context, tenant string) ([]snapshots.Snapshot, error) {
	sn, err := g.inner()
	if err != nil {
		return nil, err
	}
	return sn.Snapshots(ctx, tenant)
}

// DeleteSnapshot is the backend's.
func (g *guarded) DeleteSnapshot(ctx context.Context, tenant, name, requestID string) error {
	sn, err := g.inner()
	if err != nil {
		return err
	}
	return sn.DeleteSnapshot(ctx, tenant, name, requestID)
}

// RestoreSnapshot restores within the server's rules: draining, and the tenant's sandbox bound, as a fork.
func (g *guarded) RestoreSnapshot(ctx context.Context, name string, to sandkeep.Key, ar service.AdmitRequest, opts service.RestoreOptions) (sandkeep.Sandbox, error) {
	sn, err := g.inner()
	if err != nil {
		return sandkeep.Sandbox{}, err
	}
	var sb sandkeep.Sandbox
	err = g.newSandbox(ctx, to, func() error {
		sb, err = sn.RestoreSnapshot(ctx, name, to, ar, opts)
		return err
	})
	return sb, err
}
