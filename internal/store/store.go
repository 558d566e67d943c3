// Package store is sandkeep's memory: the contract for recording runs and their events (and keeping the
// service's API tokens), and the validation every implementation shares. Implementations live in sqlite/ (the
// embedded default) and postgres/; storetest/ is the conformance suite both pass. Only cmd/ chooses one.
//
// Errors are classified with github.com/containerd/errdefs: ErrNotFound (no such run or token),
// ErrAlreadyExists (a run id reused, a token id, hash or live name reused), ErrFailedPrecondition (a finished
// run cannot change again; a write under a lost lease, ErrLeaseLost), ErrConflict (a lease another owner holds,
// ErrLeaseHeld), ErrInvalidArgument (a value outside its enumeration, a missing field).
package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/uuid"

	"github.com/sandkeep/sandkeep/internal/events"
)

// Event is the record a store keeps; see package events for names and payloads.
type Event = events.Event

// Store records runs, events and API tokens. It is safe for concurrent use by several goroutines, and an implementation
// backed by a shared database is safe for several processes writing at once: nothing is lost.
type Store interface {
	// CreateRun records a new run, committed when it returns (an admission verdict is durable before anything
	// runs). r.ID must be set (NewRunID); a zero CreatedAt is set to now; an empty Status means running. A run created in a finished status gets FinishedAt = CreatedAt when zero.
	CreateRun(ctx context.Context, r Run) error
	// UpdateRun finishes run id: running -> succeeded, failed or failed_resumable. A finished run cannot be
	// reopened or finished again (ErrFailedPrecondition); an absent one is ErrNotFound.
	UpdateRun(ctx context.Context, id string, upd RunUpdate) error
	// GetRun returns run id, or ErrNotFound.
	GetRun(ctx context.Context, id string) (Run, error)
	// ListRuns returns the runs matching f, newest first.
	ListRuns(ctx context.Context, f RunFilter) ([]Run, error)
	// AppendEvent records e and returns its sequence number. Sequence numbers are assigned by the store and
	// strictly increase in the order events become visible, so a reader polling with EventFilter.AfterSeq
	// misses none; they need not be contiguous. e.Seq is ignored; a zero e.Time is set to now. A non-empty
	// e.RunID must name an existing run (ErrNotFound otherwise).
	AppendEvent(ctx context.Context, e Event) (int64, error)
	// ListEvents returns the events matching f in ascending sequence order.
	ListEvents(ctx context.Context, f EventFilter) ([]Event, error)
	// EnqueueEvent records e as AppendEvent does, without waiting for it: the store commits it within a few
	// milliseconds (DefaultFlushDelay), together with the writes around it, in the order of the calls, and then
	// calls done (when not nil; it must not block) with its sequence number or error. It is how a command's
	// events reach the store without a transaction each on the command's path.
	EnqueueEvent(e Event, done func(seq int64, err error))
	// EnqueueUpdate finishes run id as UpdateRun does, without waiting, after every write enqueued before it;
	// done as for EnqueueEvent.
	EnqueueUpdate(id string, upd RunUpdate, done func(err error))
	// Flush returns once every write enqueued before it is committed (or has failed). The reads of runs and
	// events (GetRun, ListRuns, ListEvents, the dashboard's) flush first, so a process reads what it wrote;
	// another process sees an enqueued write once it is committed. Close flushes: a clean shutdown loses nothing.
	Flush(ctx context.Context) error
	// TokenStore keeps the service's API tokens in the same database as the runs.
	TokenStore
	// Dashboard is the read-only queries of the operator dashboard.
	Dashboard
	// LeaseStore keeps the leases of a fleet's replicas (owners of keys, the reaper's leader).
	LeaseStore
	// RunLogStore keeps what the driver did and the setup steps printed for each run, bounded per run.
	RunLogStore
	// SnapshotStore keeps the records of workspace snapshots (their archives are package snapshot's).
	SnapshotStore
	// E2BStore keeps the E2B front's sandbox records, so every replica serves every E2B sandbox.
	E2BStore
	// Fenced returns the run and event writes made under fence f (Group.Fenced): each is refused with
	// ErrLeaseLost once f no longer holds.
	Fenced(f Fence) RunWriter
	// Close commits every enqueued write and releases the store's resources.
	Close() error
}

// Run statuses. running is the only status a run can leave.
const (
	StatusRunning         = "running"
	StatusSucceeded       = "succeeded"
	StatusFailed          = "failed"
	StatusFailedResumable = "failed_resumable"
)

// Dispositions say whether retrying a failed run can help.
const (
	DispositionNone           = ""
	DispositionDeterministic  = "deterministic"  // retrying will not help
	DispositionInfrastructure = "infrastructure" // retrying may help
)

// Admission verdicts.
const (
	AdmissionAdmitted = "admitted"
	AdmissionRefused  = "refused"
)

// Trust levels of a run's caller.
const (
	TrustTrusted   = "trusted"
	TrustUntrusted = "untrusted"
)

// Run is one admitted (or refused) unit of work against a key. Mode, source and driver values belong to the
// policy and driver packages and are stored as given; the enumerations above are checked. Times are UTC with
// millisecond precision; FinishedAt is zero while the run is running.
type Run struct {
	ID            string    `json:"id"` // a UUIDv7 (NewRunID), so ids sort by creation time
	Tenant        string    `json:"tenant"`
	User          string    `json:"user"`
	Trust         string    `json:"trust"`          // trusted | untrusted
	RequestedMode string    `json:"requested_mode"` // as asked, before resolution ("" inherits)
	ResolvedMode  string    `json:"resolved_mode"`
	Source        string    `json:"source"` // cli | spec | env | default: which tier decided the mode
	Driver        string    `json:"driver"` // empty when none was chosen (e.g. refused)
	Admission     string    `json:"admission"`
	Status        string    `json:"status"`
	FailureCode   string    `json:"failure_code,omitempty"`
	Disposition   string    `json:"disposition,omitempty"`
	CreatedAt     time.Time `json:"created_at"`
	FinishedAt    time.Time `json:"finished_at,omitzero"`
}

// RunUpdate finishes a run. A zero FinishedAt is set to now.
type RunUpdate struct {
	Status      string
	FailureCode string // empty for succeeded
	Disposition string // empty for succeeded
	FinishedAt  time.Time
}

// RunFilter selects runs; zero fields match everything.
type RunFilter struct {
	Tenant string
	User   string
	Status string
	Limit  int       // at most this many; 0 means no limit
	Before time.Time // only runs created strictly before Before: the CreatedAt of the last run of a page
}

// EventFilter selects events; zero fields match everything.
type EventFilter struct {
	RunID    string // only this run's events
	AfterSeq int64  // only events with Seq > AfterSeq
	Limit    int    // at most this many; 0 means no limit
}

// NewRunID returns a fresh run id: a UUIDv7, so ids sort by creation time.
func NewRunID() (string, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("new run id: %w", err)
	}
	return id.String(), nil
}

// Finished reports whether status is a final status.
func Finished(status string) bool {
	switch status {
	case StatusSucceeded, StatusFailed, StatusFailedResumable:
		return true
	}
	return false
}

// PrepareRun validates r and fills its defaults (status running, CreatedAt now, FinishedAt of a run created
// finished), normalising times to UTC milliseconds. Implementations call it in CreateRun.
func PrepareRun(r Run) (Run, error) {
	if r.ID == "" {
		return r, invalid("create run: empty id")
	}
	if err := oneOf("create run "+r.ID+": trust", r.Trust, TrustTrusted, TrustUntrusted); err != nil {
		return r, err
	}
	if err := oneOf("create run "+r.ID+": admission", r.Admission, AdmissionAdmitted, AdmissionRefused); err != nil {
		return r, err
	}
	if r.Status == "" {
		r.Status = StatusRunning
	}
	if err := oneOf("create run "+r.ID+": status", r.Status, StatusRunning, StatusSucceeded, StatusFailed, StatusFailedResumable); err != nil {
		return r, err
	}
	if err := checkOutcome("create run "+r.ID, r.Status, r.FailureCode, r.Disposition); err != nil {
		return r, err
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = events.Now()
	}
	r.CreatedAt = events.Truncate(r.CreatedAt)
	switch {
	case r.Status == StatusRunning && !r.FinishedAt.IsZero():
		return r, invalid("create run %s: a running run has no finished time", r.ID)
	case Finished(r.Status) && r.FinishedAt.IsZero():
		r.FinishedAt = r.CreatedAt
	}
	if !r.FinishedAt.IsZero() {
		r.FinishedAt = events.Truncate(r.FinishedAt)
	}
	return r, nil
}

// PrepareUpdate validates upd for run id and fills its defaults (FinishedAt now). It does not know the run's
// current status; implementations check that it is running in the same transaction as the update.
func PrepareUpdate(id string, upd RunUpdate) (RunUpdate, error) {
	if id == "" {
		return upd, invalid("update run: empty id")
	}
	if !Finished(upd.Status) {
		return upd, invalid("update run %s: status %q: want %s, %s or %s", id, upd.Status,
			StatusSucceeded, StatusFailed, StatusFailedResumable)
	}
	if err := checkOutcome("update run "+id, upd.Status, upd.FailureCode, upd.Disposition); err != nil {
		return upd, err
	}
	if upd.FinishedAt.IsZero() {
		upd.FinishedAt = events.Now()
	}
	upd.FinishedAt = events.Truncate(upd.FinishedAt)
	return upd, nil
}

// ErrFinished returns the error for an update of run id, which already has status.
func ErrFinished(id, status string) error {
	return fmt.Errorf("update run %s: run is already %s and cannot change: %w", id, status, errdefs.ErrFailedPrecondition)
}

// ErrRunNotFound returns the error for an absent run id.
func ErrRunNotFound(op, id string) error {
	return fmt.Errorf("%s: run %s: %w", op, id, errdefs.ErrNotFound)
}

// PrepareEvent validates e and fills its defaults (Time now), normalising the time to UTC milliseconds and the
// payload to compact JSON ("{}" when empty).
func PrepareEvent(e Event) (Event, error) {
	if e.Name == "" {
		return e, invalid("append event: empty name")
	}
	if e.Time.IsZero() {
		e.Time = events.Now()
	}
	e.Time = events.Truncate(e.Time)
	if len(e.Payload) == 0 {
		e.Payload = []byte("{}")
	}
	compact, err := compactJSON(e.Payload)
	if err != nil {
		return e, invalid("append event %s: payload is not JSON: %v", e.Name, err)
	}
	e.Payload = compact
	e.Seq = 0
	return e, nil
}

// CheckLimit validates the limit of a filter for op: negative limits are errors.
func CheckLimit(op string, limit int) error {
	if limit < 0 {
		return invalid("%s: negative limit %d", op, limit)
	}
	return nil
}

func checkOutcome(op, status, code, disposition string) error {
	if err := oneOf(op+": disposition", disposition, DispositionNone, DispositionDeterministic, DispositionInfrastructure); err != nil {
		return err
	}
	if status == StatusSucceeded || status == StatusRunning {
		if code != "" || disposition != "" {
			return invalid("%s: a %s run has no failure code or disposition", op, status)
		}
	}
	return nil
}

func oneOf(what, v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return invalid("%s %q: want one of %q", what, v, allowed)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

func compactJSON(raw []byte) ([]byte, error) {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Token is an API token of one tenant, as the store keeps it: never the token itself, only its SHA-256 (Hash,
// lower-case hex). The service (sandkeep serve) looks a presented token up by that hash on every request, so
// revocation and expiry take effect on the next request.
type Token struct {
	ID        string    `json:"id"`     // public, stable: "tok_" + 16 hex; what list shows and revoke takes
	Tenant    string    `json:"tenant"` // every request made with the token is scoped to this tenant
	Name      string    `json:"name"`   // the operator's label, e.g. "ci"; unique among a tenant's live tokens
	Scopes    []string  `json:"scopes"` // exec, files, read, admin (admin implies the others)
	Hash      string    `json:"-"`      // hex SHA-256 of the token
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at,omitzero"` // zero: never
	RevokedAt time.Time `json:"revoked_at,omitzero"` // zero: live
}

// TokenStore keeps API tokens. Errors: ErrNotFound (no such token), ErrAlreadyExists (an id, hash, or a live
// token's (tenant, name) reused), ErrInvalidArgument (missing field, unknown scope).
// Implemented by every Store (sqlite, postgres); storetest checks it.
type TokenStore interface {
	// CreateToken records t. A zero CreatedAt is set to now.
	CreateToken(ctx context.Context, t Token) error
	// TokenByHash returns the token whose Hash is hash, revoked or expired ones included (the caller decides),
	// or ErrNotFound.
	TokenByHash(ctx context.Context, hash string) (Token, error)
	// ListTokens returns the tokens of tenant ("" for every tenant), oldest first.
	ListTokens(ctx context.Context, tenant string) ([]Token, error)
	// RevokeToken marks token id revoked now; revoking a revoked token is not an error. Absent: ErrNotFound.
	RevokeToken(ctx context.Context, id string) error
}

// Token scopes: what a token may do. ScopeAdmin implies the others; package auth decides what each allows.
const (
	ScopeExec  = "exec"  // run commands
	ScopeFiles = "files" // read and write files in sandboxes
	ScopeRead  = "read"  // list and inspect sandboxes, runs and events
	ScopeAdmin = "admin" // everything, including stopping and removing sandboxes
)

// ValidScope reports whether s is one of the scopes above.
func ValidScope(s string) bool {
	switch s {
	case ScopeExec, ScopeFiles, ScopeRead, ScopeAdmin:
		return true
	}
	return false
}

// TokenIDPrefix starts every token id; 16 lower-case hex digits follow.
const TokenIDPrefix = "tok_"

// ValidTokenID reports whether id has the form of a token id: TokenIDPrefix and 16 lower-case hex digits.
func ValidTokenID(id string) bool {
	rest, ok := strings.CutPrefix(id, TokenIDPrefix)
	return ok && len(rest) == 16 && lowerHex(rest)
}

// PrepareToken validates t and fills its defaults (CreatedAt now), normalising times to UTC milliseconds and
// copying Scopes, so the caller's slice is never shared with the store. A new token is live: a set RevokedAt is
// refused. Implementations call it in CreateToken.
func PrepareToken(t Token) (Token, error) {
	if !ValidTokenID(t.ID) {
		return t, invalid("create token: id %q: want %s and 16 lower-case hex digits", t.ID, TokenIDPrefix)
	}
	op := "create token " + t.ID
	switch {
	case t.Tenant == "":
		return t, invalid("%s: empty tenant", op)
	case t.Name == "":
		return t, invalid("%s: empty name", op)
	case len(t.Hash) != 64 || !lowerHex(t.Hash):
		return t, invalid("%s: hash: want 64 lower-case hex digits (the SHA-256 of the token)", op)
	case len(t.Scopes) == 0:
		return t, invalid("%s: no scopes", op)
	case !t.RevokedAt.IsZero():
		return t, invalid("%s: a new token cannot be revoked already", op)
	}
	for i, sc := range t.Scopes {
		if !ValidScope(sc) {
			return t, invalid("%s: unknown scope %q: want one of %q", op, sc,
				[]string{ScopeExec, ScopeFiles, ScopeRead, ScopeAdmin})
		}
		if slices.Contains(t.Scopes[:i], sc) {
			return t, invalid("%s: scope %q given twice", op, sc)
		}
	}
	t.Scopes = slices.Clone(t.Scopes)
	if t.CreatedAt.IsZero() {
		t.CreatedAt = events.Now()
	}
	t.CreatedAt = events.Truncate(t.CreatedAt)
	if !t.ExpiresAt.IsZero() {
		t.ExpiresAt = events.Truncate(t.ExpiresAt)
	}
	return t, nil
}

// ErrTokenNotFound returns the error for an absent token; what names it (an id, or "with that hash": a hash is
// half a secret and is never put in an error).
func ErrTokenNotFound(op, what string) error {
	return fmt.Errorf("%s: token %s: %w", op, what, errdefs.ErrNotFound)
}

// ErrTokenExists returns the error for a token that collides with a stored one: its id, its hash, or the name of
// a live token of the same tenant.
func ErrTokenExists(t Token, what string) error {
	return fmt.Errorf("create token %s: %s: %w", t.ID, what, errdefs.ErrAlreadyExists)
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
