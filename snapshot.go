package sandkeep

import (
	"context"

	"github.com/sandkeep/sandkeep/internal/engine"
)

// Snapshot is one snapshot of a workspace: its name (unique per tenant), the user it was taken from, the template
// and image of that user's sandbox, and its archive's digest (sha256:<hex>) and size.
type Snapshot = engine.Snapshot

// SnapshotQuota bounds one tenant's snapshots (Config.SnapshotQuota): how many, and their archives' bytes.
type SnapshotQuota = engine.SnapshotQuota

// SnapshotEvents says where the events of a snapshot create or delete (which belong to no run) also go, and the
// request id to record on them.
type SnapshotEvents = engine.SnapshotEvents

// CreateSnapshot archives key's workspace as a snapshot of key's tenant called name ("" for a fresh one), in the
// state home, content-addressed (snapshots with the same content share one archive), with the template and image
// of key's sandbox; no command of key runs while it reads. A key without a sandbox is SANDBOX_NOT_FOUND, a name
// the tenant has SNAPSHOT_EXISTS, a snapshot past the tenant's quota (Config.SnapshotQuota) QUOTA_EXCEEDED, and
// nothing is kept then. snapshot_created is recorded with no run.
func (m *Manager) CreateSnapshot(ctx context.Context, key Key, name string, se SnapshotEvents) (Snapshot, error) {
	return m.e.CreateSnapshot(ctx, key, name, se)
}

// Snapshots lists tenant's snapshots, sorted by name.
func (m *Manager) Snapshots(tenant string) ([]Snapshot, error) { return m.e.Snapshots(tenant) }

// DeleteSnapshot removes tenant's snapshot called name (SNAPSHOT_NOT_FOUND when there is none) and its archive
// unless another snapshot shares it; snapshot_deleted is recorded with no run.
func (m *Manager) DeleteSnapshot(ctx context.Context, tenant, name string, se SnapshotEvents) error {
	return m.e.DeleteSnapshot(ctx, tenant, name, se)
}

// RestoreSnapshot makes rr.Key, a new key of the snapshot's tenant, a sandbox whose workspace holds the snapshot
// called name, in the snapshot's template; the user it was taken from need not exist any more. It is admitted as
// rr.Key's first command would be, recorded as a run with snapshot_restored among its events. An unknown name is
// SNAPSHOT_NOT_FOUND, a key that has a sandbox or a workspace SANDBOX_EXISTS; a failed restore leaves nothing.
func (m *Manager) RestoreSnapshot(ctx context.Context, name string, rr RunRequest) (Sandbox, error) {
	sb, err := m.e.RestoreSnapshot(ctx, name, rr.engine())
	if err != nil {
		return Sandbox{}, err
	}
	return sandboxOf(sb), nil
}
