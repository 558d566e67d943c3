package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/sandkeep/sandkeep/internal/store"
)

const e2bColumns = `id, tenant, started_at, end_at, paused, record, version`

// CreateE2BSandbox implements store.E2BStore.
func (s *Store) CreateE2BSandbox(ctx context.Context, sb store.E2BSandbox) error {
	sb, err := store.PrepareE2BSandbox(sb)
	if err != nil {
		return err
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO e2b_sandboxes (`+e2bColumns+`) VALUES (?, ?, ?, ?, ?, ?, 1)`,
			sb.ID, sb.Tenant, fmtTime(sb.StartedAt), fmtTime(sb.EndAt), sb.Paused, string(sb.Record))
		if isCode(err, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY) {
			return fmt.Errorf("create e2b sandbox %s: %w", sb.ID, errdefs.ErrAlreadyExists)
		}
		if err != nil {
			return fmt.Errorf("create e2b sandbox %s: %w", sb.ID, err)
		}
		return nil
	})
}

// GetE2BSandbox implements store.E2BStore.
func (s *Store) GetE2BSandbox(ctx context.Context, id string) (store.E2BSandbox, error) {
	sb, err := scanE2B(s.db.QueryRowContext(ctx, `SELECT `+e2bColumns+` FROM e2b_sandboxes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return store.E2BSandbox{}, store.ErrE2BNotFound("get", id)
	}
	if err != nil {
		return store.E2BSandbox{}, fmt.Errorf("get e2b sandbox %s: %w", id, err)
	}
	return sb, nil
}

// UpdateE2BSandbox implements store.E2BStore: one statement, matched on the version read.
func (s *Store) UpdateE2BSandbox(ctx context.Context, sb store.E2BSandbox) (int64, error) {
	sb, err := store.PrepareE2BSandbox(sb)
	if err != nil {
		return 0, err
	}
	var version int64
	err = s.write(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, `UPDATE e2b_sandboxes SET tenant = ?, started_at = ?, end_at = ?, paused = ?,
			record = ?, version = version + 1 WHERE id = ? AND version = ? RETURNING version`,
			sb.Tenant, fmtTime(sb.StartedAt), fmtTime(sb.EndAt), sb.Paused, string(sb.Record), sb.ID, sb.Version).Scan(&version)
		if !errors.Is(err, sql.ErrNoRows) {
			return wrapE2B("update", sb.ID, err)
		}
		var one int
		if err := tx.QueryRowContext(ctx, `SELECT 1 FROM e2b_sandboxes WHERE id = ?`, sb.ID).Scan(&one); errors.Is(err, sql.ErrNoRows) {
			return store.ErrE2BNotFound("update", sb.ID)
		} else if err != nil {
			return wrapE2B("update", sb.ID, err)
		}
		return store.ErrE2BChanged(sb.ID, sb.Version)
	})
	return version, err
}

// DeleteE2BSandbox implements store.E2BStore.
func (s *Store) DeleteE2BSandbox(ctx context.Context, id string) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM e2b_sandboxes WHERE id = ?`, id)
		var n int64
		if err == nil {
			n, err = res.RowsAffected()
		}
		if err != nil {
			return wrapE2B("delete", id, err)
		}
		if n == 0 {
			return store.ErrE2BNotFound("delete", id)
		}
		return nil
	})
}

// ListE2BSandboxes implements store.E2BStore.
func (s *Store) ListE2BSandboxes(ctx context.Context, tenant string) ([]store.E2BSandbox, error) {
	q := `SELECT ` + e2bColumns + ` FROM e2b_sandboxes`
	var args []any
	if tenant != "" {
		q += ` WHERE tenant = ?`
		args = append(args, tenant)
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY started_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("list e2b sandboxes: %w", err)
	}
	defer rows.Close()
	var out []store.E2BSandbox
	for rows.Next() {
		sb, err := scanE2B(rows)
		if err != nil {
			return nil, fmt.Errorf("list e2b sandboxes: %w", err)
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list e2b sandboxes: %w", err)
	}
	return out, nil
}

func scanE2B(sc scanner) (store.E2BSandbox, error) {
	var (
		sb       store.E2BSandbox
		started  string
		end, rec string
		paused   bool
		err      error
	)
	if err = sc.Scan(&sb.ID, &sb.Tenant, &started, &end, &paused, &rec, &sb.Version); err != nil {
		return sb, err
	}
	sb.Paused, sb.Record = paused, []byte(rec)
	if sb.StartedAt, err = parseTime(started); err != nil {
		return sb, err
	}
	sb.EndAt, err = parseTime(end)
	return sb, err
}

func wrapE2B(op, id string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s e2b sandbox %s: %w", op, id, err)
}
