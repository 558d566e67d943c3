package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
)

// E2BSandbox is the record of one sandbox of the E2B front (internal/e2b): what E2B's API adds to a sandbox (its
// template, metadata, env vars, timeout, auto-pause, envd access token, network). It lives in the run store, so
// every replica of a fleet serves every E2B sandbox, and a sandbox outlives the replica that made it. The store
// reads the fields it selects on (tenant, times, paused); Record is the front's, kept as given.
type E2BSandbox struct {
	ID        string          `json:"id"` // the E2B sandbox id
	Tenant    string          `json:"tenant"`
	StartedAt time.Time       `json:"started_at"`
	EndAt     time.Time       `json:"end_at"` // its timeout: the front's sweeper ends it then
	Paused    bool            `json:"paused"`
	Record    json.RawMessage `json:"record"` // a JSON object
	// Version is set by the store: 1 when created, one more at each update. An update names the version it read,
	// so two replicas changing one sandbox at once never lose a write.
	Version int64 `json:"version"`
}

// E2BStore keeps E2B sandbox records. Implemented by every Store (sqlite, postgres); storetest checks it.
type E2BStore interface {
	// CreateE2BSandbox records s (its Version is set to 1); ErrAlreadyExists when its id is taken.
	CreateE2BSandbox(ctx context.Context, s E2BSandbox) error
	// GetE2BSandbox returns sandbox id, or ErrNotFound.
	GetE2BSandbox(ctx context.Context, id string) (E2BSandbox, error)
	// UpdateE2BSandbox replaces sandbox s.ID by s when it is still at s.Version, and returns its new version:
	// ErrConflict when another write came first (read it again), ErrNotFound when it is gone.
	UpdateE2BSandbox(ctx context.Context, s E2BSandbox) (int64, error)
	// DeleteE2BSandbox removes sandbox id; ErrNotFound when there is none.
	DeleteE2BSandbox(ctx context.Context, id string) error
	// ListE2BSandboxes returns tenant's sandboxes ("" for every tenant's), oldest first (StartedAt, then id).
	ListE2BSandboxes(ctx context.Context, tenant string) ([]E2BSandbox, error)
}

// MaxE2BRecord bounds an E2B sandbox's record (metadata and env vars included).
const MaxE2BRecord = 1 << 20

// PrepareE2BSandbox validates s and normalises its times to UTC milliseconds and its record to compact JSON.
// Implementations call it in CreateE2BSandbox and UpdateE2BSandbox.
func PrepareE2BSandbox(s E2BSandbox) (E2BSandbox, error) {
	switch {
	case s.ID == "":
		return s, invalid("e2b sandbox: empty id")
	case s.Tenant == "":
		return s, invalid("e2b sandbox %s: empty tenant", s.ID)
	case len(s.Record) > MaxE2BRecord:
		return s, invalid("e2b sandbox %s: record of %d bytes, over %d", s.ID, len(s.Record), MaxE2BRecord)
	}
	rec, err := compactJSON(s.Record)
	if err != nil || len(rec) == 0 || rec[0] != '{' {
		return s, invalid("e2b sandbox %s: the record is not a JSON object", s.ID)
	}
	s.Record = rec
	s.StartedAt = s.StartedAt.UTC().Truncate(time.Millisecond)
	s.EndAt = s.EndAt.UTC().Truncate(time.Millisecond)
	return s, nil
}

// ErrE2BNotFound returns the error for an E2B sandbox the store does not have.
func ErrE2BNotFound(op, id string) error {
	return fmt.Errorf("%s: e2b sandbox %s: %w", op, id, errdefs.ErrNotFound)
}

// ErrE2BChanged returns the error for an update of an E2B sandbox that another write changed since it was read.
func ErrE2BChanged(id string, version int64) error {
	return fmt.Errorf("update e2b sandbox %s: changed since version %d: %w", id, version, errdefs.ErrConflict)
}
