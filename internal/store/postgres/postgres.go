// Package postgres is the store for fleets: PostgreSQL through pgx (pgxpool), with the same schema semantics as
// the embedded SQLite store.
//
// Tables live in the connection's current schema (the first of search_path), so a DSN with
// search_path=other keeps a store apart from others in one database. Migrations are embedded and applied with
// goose at Open, under a session advisory lock keyed by that schema, so processes opening the store at once
// migrate it once. Event seqs come from a one-row counter updated in the same statement as the insert; its row
// lock makes seqs become visible in increasing order.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/sandkeep/sandkeep/internal/store"
)

//go:embed migrations/*.sql
var migrations embed.FS

// SQLSTATE codes this package classifies.
const (
	codeUniqueViolation     = "23505"
	codeForeignKeyViolation = "23503"
	// A transaction PostgreSQL aborted to break a cycle of waits or a serialization conflict: it did nothing,
	// and the same transaction again is the documented answer.
	codeSerializationFailure = "40001"
	codeDeadlockDetected     = "40P01"
)

// txAttempts bounds how often InTx runs a transaction that PostgreSQL aborted for a conflict.
const txAttempts = 4

// Store is a store.Store over a PostgreSQL database.
type Store struct {
	*store.Group // every write of runs and events, committed in groups by one writer goroutine
	pool         *pgxpool.Pool
}

var _ store.Store = (*Store)(nil)

// Open connects to the database at dsn (a postgres:// URL or key=value string) and brings its schema up to
// date.
func Open(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// The error can quote the DSN, password included: say only that it did not parse.
		return nil, fmt.Errorf("open postgres store: invalid DSN: %w", errdefs.ErrInvalidArgument)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres store %s: %w", where(cfg), err)
	}
	if err := migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open postgres store %s: %w", where(cfg), err)
	}
	s := &Store{pool: pool}
	s.Group = store.NewGroup(s, store.GroupOptions{})
	return s, nil
}

// where names the server and database of cfg, never its password.
func where(cfg *pgxpool.Config) string {
	return fmt.Sprintf("%s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
}

func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	var schema *string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if schema == nil {
		return fmt.Errorf("migrate: no schema of search_path exists: %w", errdefs.ErrFailedPrecondition)
	}
	// One lock per schema: stores in different schemas of one database migrate independently. Probe every
	// second for up to two minutes (goose's default probes every 5 s).
	h := fnv.New64a()
	h.Write([]byte("sandkeep-store:" + *schema))
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(int64(h.Sum64())), lock.WithLockTimeout(1, 120))
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	fsys, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate schema %s: %w", *schema, err)
	}
	return nil
}

// Close commits every enqueued write and closes the pool.
func (s *Store) Close() error {
	err := s.Group.Close()
	s.pool.Close()
	return err
}

const runColumns = `id, tenant, user_name, trust, requested_mode, resolved_mode, source, driver, admission, status,
	failure_code, disposition, created_at, finished_at`

// InTx implements store.Committer: fn runs in one transaction, committed when it returns nil.
//
// A transaction aborted for a deadlock or a serialization conflict (which rolls all of it back) is run again, a
// few times, after a short pause: otherwise a group commit's every write, a run's finish among them, would fail
// for what another transaction did.
func (s *Store) InTx(ctx context.Context, fn func(w store.Writes) error) error {
	var err error
	for attempt := 1; ; attempt++ {
		err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return fn(writes{tx: tx}) })
		if attempt == txAttempts || !(isCode(err, codeDeadlockDetected) || isCode(err, codeSerializationFailure)) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt) * 5 * time.Millisecond):
		}
	}
}

// writes are the store's writes inside transaction tx.
type writes struct{ tx pgx.Tx }

func (w writes) InsertRun(ctx context.Context, r store.Run) error {
	_, err := w.tx.Exec(ctx, `INSERT INTO runs (`+runColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
		r.ID, r.Tenant, r.User, r.Trust, r.RequestedMode, r.ResolvedMode, r.Source, r.Driver, r.Admission,
		r.Status, r.FailureCode, r.Disposition, r.CreatedAt, nullTime(r.FinishedAt))
	if isCode(err, codeUniqueViolation) {
		return fmt.Errorf("create run %s: %w", r.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create run %s: %w", r.ID, err)
	}
	return nil
}

// FinishRun is one conditional statement (only a running run changes); when it changes nothing, a second read
// says whether the run is absent or already finished.
func (w writes) FinishRun(ctx context.Context, id string, upd store.RunUpdate) error {
	tag, err := w.tx.Exec(ctx, `UPDATE runs SET status = $1, failure_code = $2, disposition = $3, finished_at = $4
		WHERE id = $5 AND status = 'running'`, upd.Status, upd.FailureCode, upd.Disposition, upd.FinishedAt, id)
	if err != nil {
		return fmt.Errorf("update run %s: %w", id, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var status string
	err = w.tx.QueryRow(ctx, `SELECT status FROM runs WHERE id = $1`, id).Scan(&status)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ErrRunNotFound("update run", id)
	}
	if err != nil {
		return fmt.Errorf("update run %s: %w", id, err)
	}
	return store.ErrFinished(id, status)
}

func (w writes) InsertEvent(ctx context.Context, e store.Event) (int64, error) {
	var seq int64
	err := w.tx.QueryRow(ctx, `WITH next AS (UPDATE event_seq SET last = last + 1 RETURNING last)
		INSERT INTO events (seq, run_id, time, name, payload, request_id)
		SELECT last, $1, $2, $3, $4::json, $5 FROM next
		RETURNING seq`,
		nullString(e.RunID), e.Time, e.Name, string(e.Payload), e.RequestID).Scan(&seq)
	if isCode(err, codeForeignKeyViolation) {
		return 0, store.ErrRunNotFound("append event "+e.Name, e.RunID)
	}
	if err != nil {
		return 0, fmt.Errorf("append event %s: %w", e.Name, err)
	}
	return seq, nil
}

// GetRun implements store.Store.
func (s *Store) GetRun(ctx context.Context, id string) (store.Run, error) {
	if err := s.Flush(ctx); err != nil {
		return store.Run{}, fmt.Errorf("get run %s: %w", id, err)
	}
	r, err := scanRun(s.pool.QueryRow(ctx, `SELECT `+runColumns+` FROM runs WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Run{}, store.ErrRunNotFound("get run", id)
	}
	if err != nil {
		return store.Run{}, fmt.Errorf("get run %s: %w", id, err)
	}
	return r, nil
}

// ListRuns implements store.Store.
func (s *Store) ListRuns(ctx context.Context, f store.RunFilter) ([]store.Run, error) {
	if err := store.CheckLimit("list runs", f.Limit); err != nil {
		return nil, err
	}
	if err := s.Flush(ctx); err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	var where []string
	var args []any
	add := func(col string, arg any) {
		args = append(args, arg)
		where = append(where, col+" $"+strconv.Itoa(len(args)))
	}
	if f.Tenant != "" {
		add("tenant =", f.Tenant)
	}
	if f.User != "" {
		add("user_name =", f.User)
	}
	if f.Status != "" {
		add("status =", f.Status)
	}
	if !f.Before.IsZero() {
		add("created_at <", f.Before.UTC())
	}
	q := `SELECT ` + runColumns + ` FROM runs`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	q += ` ORDER BY created_at DESC, id DESC`
	if f.Limit > 0 {
		args = append(args, f.Limit)
		q += ` LIMIT $` + strconv.Itoa(len(args))
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	defer rows.Close()
	var runs []store.Run
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, fmt.Errorf("list runs: %w", err)
		}
		runs = append(runs, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	return runs, nil
}

// ListEvents implements store.Store.
func (s *Store) ListEvents(ctx context.Context, f store.EventFilter) ([]store.Event, error) {
	if err := store.CheckLimit("list events", f.Limit); err != nil {
		return nil, err
	}
	if err := s.Flush(ctx); err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	q := `SELECT seq, run_id, time, name, payload::text, request_id FROM events WHERE seq > $1`
	args := []any{f.AfterSeq}
	if f.RunID != "" {
		args = append(args, f.RunID)
		q += ` AND run_id = $` + strconv.Itoa(len(args))
	}
	q += ` ORDER BY seq`
	if f.Limit > 0 {
		args = append(args, f.Limit)
		q += ` LIMIT $` + strconv.Itoa(len(args))
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	defer rows.Close()
	var evs []store.Event
	for rows.Next() {
		var (
			e       store.Event
			runID   *string
			payload string
		)
		if err := rows.Scan(&e.Seq, &runID, &e.Time, &e.Name, &payload, &e.RequestID); err != nil {
			return nil, fmt.Errorf("list events: %w", err)
		}
		if runID != nil {
			e.RunID = *runID
		}
		e.Time = e.Time.UTC()
		e.Payload = []byte(payload)
		evs = append(evs, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return evs, nil
}

func scanRun(row pgx.Row) (store.Run, error) {
	var (
		r        store.Run
		finished *time.Time
	)
	if err := row.Scan(&r.ID, &r.Tenant, &r.User, &r.Trust, &r.RequestedMode, &r.ResolvedMode, &r.Source, &r.Driver,
		&r.Admission, &r.Status, &r.FailureCode, &r.Disposition, &r.CreatedAt, &finished); err != nil {
		return r, err
	}
	r.CreatedAt = r.CreatedAt.UTC()
	if finished != nil {
		r.FinishedAt = finished.UTC()
	}
	return r, nil
}

func isCode(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
