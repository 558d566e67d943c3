// Package snapshots keeps copies of a Manager's workspaces: a snapshot is a workspace archived under a name of
// its tenant (content-addressed in the state home), restored later into a new user's sandbox; a fork is the two
// in one step, a live copy of one user's workspace into a new user's sandbox.
//
// A restore and a fork are admitted as the new key's first command would be (package sandkeep's
// Manager.Admit): the same mode, trust, driver and template checks, recorded as a run. A failed one leaves
// nothing of the new key.
package snapshots

import (
	"context"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/engine"
)

// Snapshot is one snapshot of a workspace: its name (unique per tenant), the user it was taken from, the
// template and image of that user's sandbox, and its archive's digest (sha256:<hex>) and size.
type Snapshot struct {
	Name      string    `json:"name"`
	Tenant    string    `json:"tenant"`
	User      string    `json:"user"` // the user whose workspace it was taken from
	Template  string    `json:"template,omitempty"`
	Image     string    `json:"image,omitempty"`
	Digest    string    `json:"digest"` // sha256:<hex> of the archive
	Bytes     int64     `json:"bytes"`  // the archive's size
	CreatedAt time.Time `json:"created_at"`
}

// Events says where the events of a create or delete, which belong to no run, also go (besides the store and
// Config.OnEvent), and the request id to record on them.
type Events struct {
	RequestID string
	OnEvent   sandkeep.EventFunc
}

func (ev Events) engine() engine.SnapshotEvents {
	return engine.SnapshotEvents{RequestID: ev.RequestID, OnEvent: engine.EventFunc(ev.OnEvent)}
}

// Create archives key's workspace as a snapshot of key's tenant called name ("" for a fresh one), with the
// template and image of key's sandbox; no command of key runs while it reads. A key without a sandbox is
// SANDBOX_NOT_FOUND, a name the tenant has SNAPSHOT_EXISTS, a snapshot past the tenant's quota
// (Config.SnapshotQuota) QUOTA_EXCEEDED, and nothing is kept then. snapshot_created is recorded with no run.
func Create(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key, name string, ev Events) (Snapshot, error) {
	sn, err := engine.Facade.Manager(m).CreateSnapshot(ctx, key, name, ev.engine())
	return Snapshot(sn), err
}

// List lists tenant's snapshots, sorted by name.
func List(m *sandkeep.Manager, tenant string) ([]Snapshot, error) {
	in, err := engine.Facade.Manager(m).Snapshots(tenant)
	if in == nil {
		return nil, err
	}
	out := make([]Snapshot, 0, len(in))
	for _, sn := range in {
		out = append(out, Snapshot(sn))
	}
	return out, err
}

// Delete removes tenant's snapshot called name (SNAPSHOT_NOT_FOUND when there is none) and its archive unless
// another snapshot shares it; snapshot_deleted is recorded with no run.
func Delete(ctx context.Context, m *sandkeep.Manager, tenant, name string, ev Events) error {
	return engine.Facade.Manager(m).DeleteSnapshot(ctx, tenant, name, ev.engine())
}

// Restore makes rr.Key, a new key of the snapshot's tenant, a sandbox whose workspace holds the snapshot called
// name, in the snapshot's template; the user it was taken from need not exist any more. It is recorded as a run
// with snapshot_restored among its events. An unknown name is SNAPSHOT_NOT_FOUND, a key that has a sandbox or a
// workspace SANDBOX_EXISTS.
func Restore(ctx context.Context, m *sandkeep.Manager, name string, rr sandkeep.RunRequest) (sandkeep.Sandbox, error) {
	sb, err := engine.Facade.Manager(m).RestoreSnapshot(ctx, name, engine.Facade.RunRequest(rr))
	if err != nil {
		return sandkeep.Sandbox{}, err
	}
	return engine.Facade.Sandbox(sb).(sandkeep.Sandbox), nil
}

// Replace is Restore onto rr.Key whether or not it exists: an existing key's sandbox is stopped and its workspace
// replaced whole by the snapshot's, once the archive is extracted beside it (a failure before that leaves the key
// as it was), then started again. A workspace on its own quota file system (resources.disk) is refused.
func Replace(ctx context.Context, m *sandkeep.Manager, name string, rr sandkeep.RunRequest) (sandkeep.Sandbox, error) {
	sb, err := engine.Facade.Manager(m).ReplaceFromSnapshot(ctx, name, engine.Facade.RunRequest(rr))
	if err != nil {
		return sandkeep.Sandbox{}, err
	}
	return engine.Facade.Sandbox(sb).(sandkeep.Sandbox), nil
}

// ForkLimits bound what a fork may copy: regular files' bytes and entries in all (zero: no bound of its own;
// the new key's template's workspace quota, resources.disk, bounds it anyway).
type ForkLimits struct {
	Bytes  int64
	Inodes int64
}

// Fork makes rr.Key a new sandbox holding a copy of from's workspace (reflinked where the file system can, a
// copy where it cannot) in from's template, and leaves from running; later changes on either side stay apart.
// The run it is recorded as ends with the fork, with sandbox_forked among its events. rr.Template must be "" or
// from's own. A source without a sandbox is SANDBOX_NOT_FOUND, a target with a sandbox or a workspace
// SANDBOX_EXISTS, a copy past lim or the template's quota QUOTA_EXCEEDED.
func Fork(ctx context.Context, m *sandkeep.Manager, from sandkeep.Key, rr sandkeep.RunRequest, lim ForkLimits) (sandkeep.Sandbox, error) {
	sb, err := engine.Facade.Manager(m).Fork(ctx, from, engine.Facade.RunRequest(rr), engine.ForkLimits(lim))
	if err != nil {
		return sandkeep.Sandbox{}, err
	}
	return engine.Facade.Sandbox(sb).(sandkeep.Sandbox), nil
}
