package engine

import (
	"context"
	"io"
	"time"

	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/record"
	"github.com/sandkeep/sandkeep/internal/snapshot"
)

// Snapshot is one snapshot of a workspace: its name (per tenant), the user it was taken from, the template and
// image of that user's sandbox, and its archive's digest and size.
type Snapshot = snapshot.Snapshot

// SnapshotQuota bounds one tenant's snapshots: how many, and their archives' bytes. In a Config a zero field
// takes DefaultSnapshotQuota's and a negative one lifts the bound.
type SnapshotQuota struct {
	Count int
	Bytes int64
}

// SnapshotStore names an S3-compatible bucket for snapshot archives (snapshot.S3Config).
type SnapshotStore = snapshot.S3Config

// DefaultSnapshotQuota is what each tenant may keep unless the operator says otherwise.
var DefaultSnapshotQuota = SnapshotQuota{Count: 100, Bytes: 10 << 30}

func (q SnapshotQuota) resolve() snapshot.Quota {
	pick := func(v, d int64) int64 {
		switch {
		case v == 0:
			return d
		case v < 0:
			return 0
		}
		return v
	}
	return snapshot.Quota{Count: int(pick(int64(q.Count), int64(DefaultSnapshotQuota.Count))),
		Bytes: pick(q.Bytes, DefaultSnapshotQuota.Bytes)}
}

// SnapshotEvents says where the events of a snapshot operation that belongs to no run (create, delete) go,
// besides the store (with no run) and Config.OnEvent.
type SnapshotEvents struct {
	RequestID string
	OnEvent   EventFunc
}

// noRunSink records an event that belongs to no run and passes it on.
func (m *Manager) noRunSink(se SnapshotEvents) func(name string, payload any) {
	var rec *record.Recorder
	if m.st != nil {
		rec = &record.Recorder{Store: m.st, RequestID: se.RequestID}
	}
	return func(name string, payload any) {
		if rec != nil {
			rec.Event(name, payload)
		}
		if se.OnEvent != nil {
			se.OnEvent(name, payload)
		}
		if m.cfg.OnEvent != nil {
			m.cfg.OnEvent(name, payload)
		}
	}
}

// CreateSnapshot archives key's workspace as a snapshot of key's tenant called name ("" for a fresh name), with
// the template and image of key's sandbox, holding the key's gate while it reads. A key without a sandbox is
// SANDBOX_NOT_FOUND, a name the tenant has SNAPSHOT_EXISTS, one past the tenant's quota QUOTA_EXCEEDED; nothing
// is kept then. snapshot_created is recorded (with no run).
func (m *Manager) CreateSnapshot(ctx context.Context, key Key, name string, se SnapshotEvents) (Snapshot, error) {
	src, err := m.Sandbox(ctx, key)
	if err != nil {
		return Snapshot{}, err
	}
	lc, err := m.primary(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	start := time.Now()
	sn, err := m.snaps.Create(ctx, Snapshot{Name: name, Tenant: key.Tenant, User: key.User, Template: src.Template, Image: src.Image},
		func(w io.Writer) error { return lc.ArchiveWorkspace(ctx, key, w, files.Limits{}) })
	if err != nil {
		return Snapshot{}, err
	}
	m.noRunSink(se)(events.NameSnapshotCreated, events.SnapshotCreated{Snapshot: sn.Name, Sandbox: src.Name,
		Digest: sn.Digest, Bytes: sn.Bytes, DurationMS: time.Since(start).Milliseconds()})
	return sn, nil
}

// Snapshots lists tenant's snapshots, sorted by name.
func (m *Manager) Snapshots(tenant string) ([]Snapshot, error) { return m.snaps.List(tenant) }

// DeleteSnapshot removes tenant's snapshot called name (SNAPSHOT_NOT_FOUND when there is none), and its archive
// unless another snapshot shares it; snapshot_deleted is recorded (with no run).
func (m *Manager) DeleteSnapshot(ctx context.Context, tenant, name string, se SnapshotEvents) error {
	sn, gone, err := m.snaps.Delete(ctx, tenant, name)
	if err != nil {
		return err
	}
	m.noRunSink(se)(events.NameSnapshotDeleted, events.SnapshotDeleted{Snapshot: sn.Name, Digest: sn.Digest, ArchiveRemoved: gone})
	return nil
}

// RestoreSnapshot makes rr.Key a new sandbox whose workspace holds rr.Key's tenant's snapshot called name, in the
// snapshot's template. It is admitted as rr.Key's first command would be (recorded as a run that ends with the
// restore, with snapshot_restored among its events); rr.Template must be "" or the snapshot's. An unknown name is
// SNAPSHOT_NOT_FOUND, a key that has a sandbox or a workspace SANDBOX_EXISTS; a failed restore leaves nothing.
// The snapshot's source need not exist any more.
func (m *Manager) RestoreSnapshot(ctx context.Context, name string, rr RunRequest) (Sandbox, error) {
	return m.restoreSnapshot(ctx, name, rr, false)
}

// ReplaceFromSnapshot is RestoreSnapshot onto rr.Key whether or not it exists: an existing key's sandbox is
// stopped and its workspace replaced whole by the snapshot's, once the archive is extracted beside it (a failure
// before that leaves the key as it was); a new key is restored as RestoreSnapshot does.
func (m *Manager) ReplaceFromSnapshot(ctx context.Context, name string, rr RunRequest) (Sandbox, error) {
	return m.restoreSnapshot(ctx, name, rr, true)
}

func (m *Manager) restoreSnapshot(ctx context.Context, name string, rr RunRequest, replace bool) (Sandbox, error) {
	if rr.RunID != "" {
		return Sandbox{}, fault.New(fault.InvalidArgument, "restore without a run id: a restore is a run of the new user's own",
			"a restore cannot attach to run %s", rr.RunID)
	}
	sn, err := m.snaps.Get(rr.Key.Tenant, name)
	if err != nil {
		return Sandbox{}, err
	}
	switch {
	case rr.Template == "":
		rr.Template = sn.Template
	case rr.Template != sn.Template:
		return Sandbox{}, fault.New(fault.InvalidArgument, "leave the template out: a restore runs in its snapshot's template",
			"snapshot %s was taken in template %q, not %q", name, sn.Template, rr.Template)
	}
	primary, err := m.primary(ctx)
	if err != nil {
		return Sandbox{}, err
	}
	run, err := m.Admit(ctx, rr)
	if err != nil {
		return Sandbox{}, err
	}
	if run.lc != primary {
		err = fault.New(fault.SpecUnsupported, "restore on the sandboxing driver (drop --driver, or mode none)",
			"snapshots are restored on %s and the restore was admitted to %s", primary.Driver().Name(), run.Driver)
		run.Finish(err)
		return Sandbox{}, err
	}
	start := time.Now()
	name, err = m.restore(ctx, run, sn, replace)
	if err == nil {
		run.event(events.NameSnapshotRestored, events.SnapshotRestored{Snapshot: sn.Name, Sandbox: name,
			Digest: sn.Digest, Bytes: sn.Bytes, DurationMS: time.Since(start).Milliseconds()})
	}
	run.Finish(err)
	if err != nil {
		return Sandbox{}, err
	}
	return m.Sandbox(ctx, rr.Key)
}

// restore extracts sn's archive into run's new key and makes its sandbox, whose name it returns.
func (m *Manager) restore(ctx context.Context, run *Run, sn Snapshot, replace bool) (string, error) {
	rc, err := m.snaps.Open(ctx, sn)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	sb, err := run.lc.Restore(ctx, run.key, run.shape, rc, lifecycle.RestoreOptions{OnEvent: run.sink, Replace: replace})
	if err != nil {
		return "", err
	}
	return sb.Name, nil
}
