package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sandkeep/sandkeep/internal/store"
)

const snapshotColumns = `tenant, name, user_name, template, image, digest, bytes, created_at`

// CreateSnapshot implements store.SnapshotStore: the name and the quota are checked in the insert's transaction
// under the tenant's advisory lock, so replicas creating at once are taken one after another.
func (s *Store) CreateSnapshot(ctx context.Context, r store.SnapshotRecord, q store.SnapshotQuota) error {
	r, err := store.CheckSnapshot(r)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('snapshots/' || $1, 0))`, r.Tenant); err != nil {
			return fmt.Errorf("create snapshot %s: %w", r.Name, err)
		}
		var taken bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM snapshots WHERE tenant = $1 AND name = $2)`, r.Tenant, r.Name).Scan(&taken); err != nil {
			return fmt.Errorf("create snapshot %s: %w", r.Name, err)
		}
		if taken {
			return store.ErrSnapshotExists(r.Tenant, r.Name)
		}
		var (
			count int
			used  int64
		)
		if err := tx.QueryRow(ctx, `SELECT COUNT(*), COALESCE(SUM(bytes), 0)::bigint FROM snapshots WHERE tenant = $1`, r.Tenant).Scan(&count, &used); err != nil {
			return fmt.Errorf("create snapshot %s: %w", r.Name, err)
		}
		if err := store.SnapshotRoom(r.Tenant, count, used, r.Bytes, q); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO snapshots (`+snapshotColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			r.Tenant, r.Name, r.User, r.Template, r.Image, r.Digest, r.Bytes, r.CreatedAt); err != nil {
			return fmt.Errorf("create snapshot %s: %w", r.Name, err)
		}
		return nil
	})
}

func scanSnapshot(row pgx.Row) (store.SnapshotRecord, error) {
	var r store.SnapshotRecord
	err := row.Scan(&r.Tenant, &r.Name, &r.User, &r.Template, &r.Image, &r.Digest, &r.Bytes, &r.CreatedAt)
	r.CreatedAt = r.CreatedAt.UTC()
	return r, err
}

// GetSnapshot implements store.SnapshotStore.
func (s *Store) GetSnapshot(ctx context.Context, tenant, name string) (store.SnapshotRecord, error) {
	r, err := scanSnapshot(s.pool.QueryRow(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE tenant = $1 AND name = $2`, tenant, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, store.ErrSnapshotNotFound("get snapshot", tenant, name)
	}
	if err != nil {
		return r, fmt.Errorf("get snapshot %s: %w", name, err)
	}
	return r, nil
}

// ListSnapshots implements store.SnapshotStore.
func (s *Store) ListSnapshots(ctx context.Context, tenant string) ([]store.SnapshotRecord, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE tenant = $1 ORDER BY name`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.SnapshotRecord, error) { return scanSnapshot(r) })
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	return out, nil
}

// DeleteSnapshot implements store.SnapshotStore. The digest's advisory lock orders it with another delete of a
// record of the same archive, so of two deleting the last two records one sees itself last.
func (s *Store) DeleteSnapshot(ctx context.Context, tenant, name string) (r store.SnapshotRecord, last bool, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		r, err = scanSnapshot(tx.QueryRow(ctx, `DELETE FROM snapshots WHERE tenant = $1 AND name = $2 RETURNING `+snapshotColumns, tenant, name))
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrSnapshotNotFound("delete snapshot", tenant, name)
		}
		if err != nil {
			return fmt.Errorf("delete snapshot %s: %w", name, err)
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('snapshot-digest/' || $1, 0))`, r.Digest); err != nil {
			return fmt.Errorf("delete snapshot %s: %w", name, err)
		}
		var others bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM snapshots WHERE digest = $1)`, r.Digest).Scan(&others); err != nil {
			return fmt.Errorf("delete snapshot %s: %w", name, err)
		}
		last = !others
		return nil
	})
	return r, last, err
}
