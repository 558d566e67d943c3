package store

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
)

// SnapshotRecord is one workspace snapshot's record (package snapshot keeps the archive it names): kept in the
// store so that every replica of a fleet lists and restores every snapshot, whichever took it.
type SnapshotRecord struct {
	Name      string    `json:"name"`
	Tenant    string    `json:"tenant"`
	User      string    `json:"user"` // the user whose workspace it was taken from
	Template  string    `json:"template,omitempty"`
	Image     string    `json:"image,omitempty"`
	Digest    string    `json:"digest"` // sha256:<hex> of the archive
	Bytes     int64     `json:"bytes"`  // the archive's size
	CreatedAt time.Time `json:"created_at"`
}

// SnapshotQuota bounds one tenant's snapshots; a zero field is no bound.
type SnapshotQuota struct {
	Count int   // snapshots
	Bytes int64 // their archives' bytes, counted per snapshot (a shared archive counts for each)
}

// SnapshotStore keeps snapshot records. Implemented by every Store (sqlite, postgres); storetest checks it.
type SnapshotStore interface {
	// CreateSnapshot records r unless r.Tenant has a snapshot named r.Name (ErrAlreadyExists) or r would take the
	// tenant past q (ErrSnapshotQuota, an errdefs.ErrResourceExhausted): both checked in the insert's
	// transaction, so two replicas creating at once never pass the quota or share a name together.
	CreateSnapshot(ctx context.Context, r SnapshotRecord, q SnapshotQuota) error
	// GetSnapshot returns tenant's snapshot name, or ErrNotFound.
	GetSnapshot(ctx context.Context, tenant, name string) (SnapshotRecord, error)
	// ListSnapshots returns tenant's snapshots sorted by name.
	ListSnapshots(ctx context.Context, tenant string) ([]SnapshotRecord, error)
	// DeleteSnapshot removes tenant's snapshot name (ErrNotFound when there is none) and reports whether it was
	// the last record, of any tenant, naming its digest (its archive may then go).
	DeleteSnapshot(ctx context.Context, tenant, name string) (r SnapshotRecord, last bool, err error)
}

// SnapshotQuotaError is CreateSnapshot's refusal of a record past the tenant's quota.
type SnapshotQuotaError struct {
	Tenant string
	What   string // "snapshots" or "bytes"
	Limit  int64
}

func (e *SnapshotQuotaError) Error() string {
	return fmt.Sprintf("tenant %s would pass its snapshot quota of %d %s", e.Tenant, e.Limit, e.What)
}

func (e *SnapshotQuotaError) Unwrap() error { return errdefs.ErrResourceExhausted }

// CheckSnapshot validates a record for CreateSnapshot and returns it with CreatedAt set (UTC, milliseconds).
// Implementations call it first.
func CheckSnapshot(r SnapshotRecord) (SnapshotRecord, error) {
	switch {
	case r.Name == "" || len(r.Name) > 64:
		return r, invalid("create snapshot %q: the name must have 1 to 64 bytes", r.Name)
	case r.Tenant == "":
		return r, invalid("create snapshot %s: empty tenant", r.Name)
	case r.Digest == "":
		return r, invalid("create snapshot %s: empty digest", r.Name)
	case r.Bytes < 0:
		return r, invalid("create snapshot %s: negative size", r.Name)
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = time.Now()
	}
	r.CreatedAt = r.CreatedAt.UTC().Truncate(time.Millisecond)
	return r, nil
}

// SnapshotRoom checks that a tenant with count snapshots of used bytes may add one of size bytes under q.
func SnapshotRoom(tenant string, count int, used, size int64, q SnapshotQuota) error {
	if q.Count > 0 && count >= q.Count {
		return &SnapshotQuotaError{Tenant: tenant, What: "snapshots", Limit: int64(q.Count)}
	}
	if q.Bytes > 0 && used+size > q.Bytes {
		return &SnapshotQuotaError{Tenant: tenant, What: "bytes", Limit: q.Bytes}
	}
	return nil
}

// ErrSnapshotExists is CreateSnapshot's refusal of a name the tenant has.
func ErrSnapshotExists(tenant, name string) error {
	return fmt.Errorf("create snapshot: tenant %s already has a snapshot %q: %w", tenant, name, errdefs.ErrAlreadyExists)
}

// ErrSnapshotNotFound is the error of a snapshot the tenant does not have.
func ErrSnapshotNotFound(op, tenant, name string) error {
	return fmt.Errorf("%s: tenant %s has no snapshot %q: %w", op, tenant, name, errdefs.ErrNotFound)
}
