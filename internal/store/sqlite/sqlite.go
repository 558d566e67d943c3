// Package sqlite is the embedded default store: one SQLite file (modernc.org/sqlite, no cgo) in WAL mode, shared
// safely by every sandkeep process on the machine.
//
// Several processes may write the same file at once and lose nothing: every write is a BEGIN IMMEDIATE
// transaction, which takes SQLite's write lock up front and so never fails half-way with a stale snapshot, and a
// busy timeout makes writers queue for that lock instead of failing. Schema migrations are embedded, applied with
// goose at Open, and serialized across processes by an flock on "<path>.lock".
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/gofrs/flock"
	"github.com/pressly/goose/v3"
	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/sandkeep/sandkeep/internal/store"
)

//go:embed migrations/*.sql
var migrations embed.FS

// BusyTimeout is how long a statement waits for another connection's (or process's) write lock before it fails
// with SQLITE_BUSY.
const BusyTimeout = 5 * time.Second

// lockWait bounds how long Open waits for another process that is migrating the same file.
const lockWait = 30 * time.Second

// timeFormat is how times are stored: fixed width, so text order is time order.
const timeFormat = "2006-01-02T15:04:05.000Z"

// Store is a store.Store over one SQLite file.
type Store struct {
	*store.Group // every write of runs and events, committed in groups by one writer goroutine
	db           *sql.DB
	// The statements on every command's path are prepared once: SQLite would otherwise parse the same SQL each
	// time, which is half of a token lookup's cost and a third of a run record's.
	tokenByHash *sql.Stmt
	insertRun   *sql.Stmt
	runStatus   *sql.Stmt
	finishRun   *sql.Stmt
	insertEvent *sql.Stmt
	// The run log's bound check and insert: the driver's line on every command (a warm sandbox reused).
	runLogUsed   *sql.Stmt
	insertRunLog *sql.Stmt
}

// prepare prepares the statements of the command's path, or none.
func (s *Store) prepare(ctx context.Context) error {
	for _, p := range []struct {
		stmt **sql.Stmt
		sql  string
	}{
		{&s.tokenByHash, `SELECT ` + tokenColumns + ` FROM tokens WHERE hash = ?`},
		{&s.insertRun, `INSERT INTO runs (` + runColumns + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`},
		{&s.runStatus, `SELECT status FROM runs WHERE id = ?`},
		{&s.finishRun, `UPDATE runs SET status = ?, failure_code = ?, disposition = ?, finished_at = ? WHERE id = ? AND status = 'running'`},
		{&s.insertEvent, `INSERT INTO events (run_id, time, name, payload, request_id) VALUES (?, ?, ?, ?, ?)`},
		{&s.runLogUsed, `SELECT COALESCE(SUM(CASE WHEN source = ? THEN 0 ELSE length(CAST(text AS BLOB)) END), 0),
			COALESCE(MAX(source = ?), 0) FROM run_logs WHERE run_id = ?`},
		{&s.insertRunLog, `INSERT INTO run_logs (run_id, time, source, text) VALUES (?, ?, ?, ?)`},
	} {
		stmt, err := s.db.PrepareContext(ctx, p.sql)
		if err != nil {
			_ = s.closeStatements()
			return err
		}
		*p.stmt = stmt
	}
	return nil
}

func (s *Store) closeStatements() error {
	var errs []error
	for _, st := range []*sql.Stmt{s.tokenByHash, s.insertRun, s.runStatus, s.finishRun, s.insertEvent, s.runLogUsed, s.insertRunLog} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}

var _ store.Store = (*Store)(nil)

// Open opens the SQLite database at path, creating it (mode 0600) when missing, and brings its schema up to
// date. The directory must exist.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" {
		return nil, fmt.Errorf("open sqlite store: empty path: %w", errdefs.ErrInvalidArgument)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open sqlite store %s: %w", path, err)
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", BusyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)") // durable across process crashes in WAL mode; a power cut may lose the last commits
	q.Add("_pragma", "foreign_keys(ON)")
	q.Set("_txlock", "immediate")
	// A file: URI, with the path escaped, so a '?' or '#' in a directory name is not read as a parameter.
	dsn := "file:" + (&url.URL{Path: abs}).EscapedPath() + "?" + q.Encode()

	// Only one process migrates at a time: goose checks, then creates, its version table, which two processes
	// would otherwise race on. The lock file is separate from the database: SQLite's own locks are fcntl locks
	// on the database file, which closing any other descriptor of that file would drop.
	lock := flock.New(abs + ".lock")
	lockCtx, cancel := context.WithTimeout(ctx, lockWait)
	defer cancel()
	locked, err := lock.TryLockContext(lockCtx, 20*time.Millisecond)
	if err == nil && !locked {
		err = errdefs.ErrUnavailable
	}
	if err != nil {
		return nil, fmt.Errorf("open sqlite store %s: wait for migration lock %s.lock: %w", abs, abs, err)
	}
	defer func() { _ = lock.Unlock() }()

	// Create the file owner-only before SQLite does (SQLite would use the umask); its -wal and -shm files take
	// their mode from it.
	if f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600); err == nil {
		_ = f.Close()
	} else if !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("open sqlite store %s: %w", abs, err)
	}

	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open sqlite store %s: %w", abs, err)
	}
	if err := migrate(ctx, db); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open sqlite store %s: %w", abs, err)
	}
	s := &Store{db: db}
	if err := s.prepare(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open sqlite store %s: %w", abs, err)
	}
	s.Group = store.NewGroup(s, store.GroupOptions{})
	return s, nil
}

func migrate(ctx context.Context, db *sql.DB) error {
	fsys, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, db, fsys)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// Close commits every enqueued write and closes the database.
func (s *Store) Close() error {
	return errors.Join(s.Group.Close(), s.closeStatements(), s.db.Close())
}

const runColumns = `id, tenant, user_name, trust, requested_mode, resolved_mode, source, driver, admission, status,
	failure_code, disposition, created_at, finished_at`

// InTx implements store.Committer: fn runs in one write transaction. The transaction and its statements run
// without ctx's cancellation: each statement under a cancellable context costs a goroutine of the driver's that
// waits to interrupt it (a spawn and a wake-up per insert, on a command's path when its run row is committed;
// issue 26), and nothing here waits unbounded without it: BEGIN IMMEDIATE waits for the write lock at most
// BusyTimeout, and what follows is a few local inserts under that lock.
func (s *Store) InTx(ctx context.Context, fn func(w store.Writes) error) error {
	return s.write(context.WithoutCancel(ctx), func(tx *sql.Tx) error { return fn(writes{s: s, tx: tx}) })
}

// writes are the store's writes inside transaction tx.
type writes struct {
	s  *Store
	tx *sql.Tx
}

func (w writes) InsertRun(ctx context.Context, r store.Run) error {
	ctx = context.WithoutCancel(ctx) // InTx
	_, err := w.tx.StmtContext(ctx, w.s.insertRun).ExecContext(ctx, r.ID, r.Tenant, r.User, r.Trust, r.RequestedMode, r.ResolvedMode, r.Source, r.Driver, r.Admission,
		r.Status, r.FailureCode, r.Disposition, fmtTime(r.CreatedAt), nullTime(r.FinishedAt))
	if isCode(err, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY) {
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
	ctx = context.WithoutCancel(ctx) // InTx
	res, err := w.tx.StmtContext(ctx, w.s.finishRun).ExecContext(ctx, upd.Status, upd.FailureCode, upd.Disposition, fmtTime(upd.FinishedAt), id)
	if err != nil {
		return fmt.Errorf("update run %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("update run %s: %w", id, err)
	} else if n == 1 {
		return nil
	}
	var status string
	err = w.tx.StmtContext(ctx, w.s.runStatus).QueryRowContext(ctx, id).Scan(&status)
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrRunNotFound("update run", id)
	}
	if err != nil {
		return fmt.Errorf("update run %s: %w", id, err)
	}
	return store.ErrFinished(id, status)
}

func (w writes) InsertEvent(ctx context.Context, e store.Event) (int64, error) {
	ctx = context.WithoutCancel(ctx) // InTx
	// Exec and the rowid (seq is the INTEGER PRIMARY KEY) rather than RETURNING: no result rows to step through
	// and scan, on every event of every command.
	res, err := w.tx.StmtContext(ctx, w.s.insertEvent).ExecContext(ctx, nullString(e.RunID), fmtTime(e.Time), e.Name, string(e.Payload), e.RequestID)
	var seq int64
	if err == nil {
		seq, err = res.LastInsertId()
	}
	if isCode(err, sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY) {
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
	r, err := scanRun(s.db.QueryRowContext(ctx, `SELECT `+runColumns+` FROM runs WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
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
	add := func(cond string, arg any) {
		where = append(where, cond)
		args = append(args, arg)
	}
	if f.Tenant != "" {
		add("tenant = ?", f.Tenant)
	}
	if f.User != "" {
		add("user_name = ?", f.User)
	}
	if f.Status != "" {
		add("status = ?", f.Status)
	}
	if !f.Before.IsZero() {
		// Stored times are whole milliseconds, so "before b" is "before b rounded up to the millisecond".
		b := f.Before.UTC()
		if t := b.Truncate(time.Millisecond); !t.Equal(b) {
			b = t.Add(time.Millisecond)
		}
		add("created_at < ?", fmtTime(b))
	}
	q := `SELECT ` + runColumns + ` FROM runs`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	q += ` ORDER BY created_at DESC, id DESC`
	if f.Limit > 0 {
		q += ` LIMIT ?`
		args = append(args, f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
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
	q := `SELECT seq, run_id, time, name, payload, request_id FROM events WHERE seq > ?`
	args := []any{f.AfterSeq}
	if f.RunID != "" {
		q += ` AND run_id = ?`
		args = append(args, f.RunID)
	}
	q += ` ORDER BY seq`
	if f.Limit > 0 {
		q += ` LIMIT ?`
		args = append(args, f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	defer rows.Close()
	var evs []store.Event
	for rows.Next() {
		var (
			e       store.Event
			runID   sql.NullString
			t       string
			payload string
		)
		if err := rows.Scan(&e.Seq, &runID, &t, &e.Name, &payload, &e.RequestID); err != nil {
			return nil, fmt.Errorf("list events: %w", err)
		}
		e.RunID = runID.String
		if e.Time, err = parseTime(t); err != nil {
			return nil, fmt.Errorf("list events: event %d: %w", e.Seq, err)
		}
		e.Payload = []byte(payload)
		evs = append(evs, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return evs, nil
}

// write runs fn in a write transaction. The DSN's _txlock=immediate makes BeginTx issue BEGIN IMMEDIATE: the
// write lock is taken (waiting up to BusyTimeout) before fn reads anything.
func (s *Store) write(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

type scanner interface{ Scan(dest ...any) error }

func scanRun(sc scanner) (store.Run, error) {
	var (
		r        store.Run
		created  string
		finished sql.NullString
		err      error
	)
	if err = sc.Scan(&r.ID, &r.Tenant, &r.User, &r.Trust, &r.RequestedMode, &r.ResolvedMode, &r.Source, &r.Driver,
		&r.Admission, &r.Status, &r.FailureCode, &r.Disposition, &created, &finished); err != nil {
		return r, err
	}
	if r.CreatedAt, err = parseTime(created); err != nil {
		return r, fmt.Errorf("run %s: %w", r.ID, err)
	}
	if finished.Valid {
		if r.FinishedAt, err = parseTime(finished.String); err != nil {
			return r, fmt.Errorf("run %s: %w", r.ID, err)
		}
	}
	return r, nil
}

func isCode(err error, code int) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code() == code
}

func fmtTime(t time.Time) string { return t.UTC().Format(timeFormat) }

func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(timeFormat, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("stored time %q: %w", s, err)
	}
	return t.UTC(), nil
}

func nullTime(t time.Time) sql.NullString {
	if t.IsZero() {
		return sql.NullString{}
	}
	return sql.NullString{String: fmtTime(t), Valid: true}
}

func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }
