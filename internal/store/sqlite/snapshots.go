package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sandkeep/sandkeep/internal/store"
)

const snapshotColumns = `tenant, name, user_name, template, image, digest, bytes, created_at`

// CreateSnapshot implements store.SnapshotStore: the name and the quota are checked under the write lock the
// insert holds (BEGIN IMMEDIATE), so no other process adds one in between.
func (s *Store) CreateSnapshot(ctx context.Context, r store.SnapshotRecord, q store.SnapshotQuota) error {
	r, err := store.CheckSnapshot(r)
	if err != nil {
		return err
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		var taken int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM snapshots WHERE tenant = ? AND name = ?`, r.Tenant, r.Name).Scan(&taken); err != nil {
			return fmt.Errorf("create snapshot %s: %w", r.Name, err)
		}
		if taken > 0 {
			return store.ErrSnapshotExists(r.Tenant, r.Name)
		}
		var (
			count int
			used  int64
		)
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM snapshots WHERE tenant = ?`, r.Tenant).Scan(&count, &used); err != nil {
			return fmt.Errorf("create snapshot %s: %w", r.Name, err)
		}
		if err := store.SnapshotRoom(r.Tenant, count, used, r.Bytes, q); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO snapshots (`+snapshotColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			r.Tenant, r.Name, r.User, r.Template, r.Image, r.Digest, r.Bytes, fmtTime(r.CreatedAt)); err != nil {
			return fmt.Errorf("create snapshot %s: %w", r.Name, err)
		}
		return nil
	})
}

func scanSnapshot(sc scanner) (store.SnapshotRecord, error) {
	var (
		r  store.SnapshotRecord
		at string
	)
	if err := sc.Scan(&r.Tenant, &r.Name, &r.User, &r.Template, &r.Image, &r.Digest, &r.Bytes, &at); err != nil {
		return r, err
	}
	var err error
	r.CreatedAt, err = parseTime(at)
	return r, err
}

// GetSnapshot implements store.SnapshotStore.
func (s *Store) GetSnapshot(ctx context.Context, tenant, name string) (store.SnapshotRecord, error) {
	r, err := scanSnapshot(s.db.QueryRowContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE tenant = ? AND name = ?`, tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return r, store.ErrSnapshotNotFound("get snapshot", tenant, name)
	}
	if err != nil {
		return r, fmt.Errorf("get snapshot %s: %w", name, err)
	}
	return r, nil
}

// ListSnapshots implements store.SnapshotStore.
func (s *Store) ListSnapshots(ctx context.Context, tenant string) ([]store.SnapshotRecord, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE tenant = ? ORDER BY name`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	defer rows.Close()
	var out []store.SnapshotRecord
	for rows.Next() {
		r, err := scanSnapshot(rows)
		if err != nil {
			return nil, fmt.Errorf("list snapshots: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	return out, nil
}

// DeleteSnapshot implements store.SnapshotStore.
func (s *Store) DeleteSnapshot(ctx context.Context, tenant, name string) (r store.SnapshotRecord, last bool, err error) {
	err = s.write(ctx, func(tx *sql.Tx) error {
		r, err = scanSnapshot(tx.QueryRowContext(ctx, `DELETE FROM snapshots WHERE tenant = ? AND name = ? RETURNING `+snapshotColumns, tenant, name))
		if errors.Is(err, sql.ErrNoRows) {
			return store.ErrSnapshotNotFound("delete snapshot", tenant, name)
		}
		if err != nil {
			return fmt.Errorf("delete snapshot %s: %w", name, err)
		}
		var others int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM snapshots WHERE digest = ?`, r.Digest).Scan(&others); err != nil {
			return fmt.Errorf("delete snapshot %s: %w", name, err)
		}
		last = others == 0
		return nil
	})
	return r, last, err
}
