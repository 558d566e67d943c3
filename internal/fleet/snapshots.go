package fleet

import (
	"context"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/snapshots"
)

// Snapshots and forks on a replica. What reads or makes a key's sandbox goes to that key's owner like any key
// operation (Backend.call: claimed again when the owner was never reached): a snapshot to its source's owner, a
// restore to the new key's, a fork to its source's (which claims the new key too). Lists and deletes are served
// here. Records are in the store every replica shares; archives are shared only when the replicas read the same
// ones (ShareSnapshots: an S3-compatible bucket, snapshot_store, or fleet.sandbox_dir on one host). Otherwise a
// snapshot's archive would be in one replica's home alone, and every snapshot call answers SPEC_UNSUPPORTED rather
// than list what another replica cannot restore.

var (
	_ service.Snapshotter = (*Backend)(nil)
	_ service.Forker      = (*Backend)(nil)
)

// ShareSnapshots says that every replica reads the same snapshot archives (the records are in the store), so
// snapshots are served through the fleet.
func (b *Backend) ShareSnapshots() { b.sharedSnapshots = true }

func (b *Backend) snapshotsHere() error {
	if b.sharedSnapshots {
		return nil
	}
	return fault.New(fault.SpecUnsupported,
		"set snapshot_store to an S3-compatible bucket every replica reads (replicas on one host may share fleet.sandbox_dir instead)",
		"this fleet's replicas keep snapshot archives in homes of their own, so a snapshot taken through one could not be restored through the others")
}

// CreateSnapshot implements service.Snapshotter on the key's owner.
func (b *Backend) CreateSnapshot(ctx context.Context, key sandkeep.Key, name, requestID string) (snapshots.Snapshot, error) {
	if err := b.snapshotsHere(); err != nil {
		return snapshots.Snapshot{}, err
	}
	c := callOf(key, service.AdmitRequest{RequestID: requestID})
	c.Snapshot = name
	var sn snapshots.Snapshot
	err := b.call(ctx, key, func() (err error) {
		sn, err = b.local.CreateSnapshot(ctx, key, name, requestID)
		return err
	}, func(to leaseAddr) error { return b.forward(ctx, key, to, "snapshot", c, nil, &sn) })
	return sn, err
}

// Snapshots implements service.Snapshotter from the shared records.
func (b *Backend) Snapshots(ctx context.Context, tenant string) ([]snapshots.Snapshot, error) {
	if err := b.snapshotsHere(); err != nil {
		return nil, err
	}
	return b.local.Snapshots(ctx, tenant)
}

// DeleteSnapshot implements service.Snapshotter on the shared records.
func (b *Backend) DeleteSnapshot(ctx context.Context, tenant, name, requestID string) error {
	if err := b.snapshotsHere(); err != nil {
		return err
	}
	return b.local.DeleteSnapshot(ctx, tenant, name, requestID)
}

// RestoreSnapshot implements service.Snapshotter on the owner of the new key.
func (b *Backend) RestoreSnapshot(ctx context.Context, name string, key sandkeep.Key, ar service.AdmitRequest, opts service.RestoreOptions) (sandkeep.Sandbox, error) {
	if err := b.snapshotsHere(); err != nil {
		return sandkeep.Sandbox{}, err
	}
	c := callOf(key, ar)
	c.Snapshot, c.Replace = name, opts.Replace
	var sb sandkeep.Sandbox
	err := b.call(ctx, key, func() (err error) {
		sb, err = b.local.RestoreSnapshot(ctx, name, key, ar, opts)
		return err
	}, func(to leaseAddr) error { return b.forward(ctx, key, to, "restore", c, nil, &sb) })
	return sb, err
}

// Fork implements service.Forker on the owner of the source, which claims the new key as well.
func (b *Backend) Fork(ctx context.Context, from, key sandkeep.Key, ar service.AdmitRequest) (sandkeep.Sandbox, error) {
	c := callOf(from, ar)
	c.ForkTo = key.User
	var sb sandkeep.Sandbox
	err := b.call(ctx, from, func() (err error) {
		sb, err = b.forkHere(ctx, from, key, ar)
		return err
	}, func(to leaseAddr) error { return b.forward(ctx, from, to, "fork", c, nil, &sb) })
	return sb, err
}

// forkHere forks on this replica, the source's owner, once it holds the new key too.
func (b *Backend) forkHere(ctx context.Context, from, key sandkeep.Key, ar service.AdmitRequest) (sandkeep.Sandbox, error) {
	if from.Tenant != key.Tenant {
		return sandkeep.Sandbox{}, fault.New(fault.InvalidArgument, "", "a fork stays in its tenant")
	}
	if err := b.mine(ctx, key); err != nil {
		return sandkeep.Sandbox{}, err
	}
	return b.local.Fork(ctx, from, key, ar)
}
