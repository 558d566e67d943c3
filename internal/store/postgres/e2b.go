package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/jackc/pgx/v5"

	"github.com/sandkeep/sandkeep/internal/store"
)

const e2bColumns = `id, tenant, started_at, end_at, paused, record, version`

// CreateE2BSandbox implements store.E2BStore.
func (s *Store) CreateE2BSandbox(ctx context.Context, sb store.E2BSandbox) error {
	sb, err := store.PrepareE2BSandbox(sb)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO e2b_sandboxes (`+e2bColumns+`) VALUES ($1, $2, $3, $4, $5, $6, 1)`,
		sb.ID, sb.Tenant, sb.StartedAt, sb.EndAt, sb.Paused, string(sb.Record))
	if isCode(err, codeUniqueViolation) {
		return fmt.Errorf("create e2b sandbox %s: %w", sb.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create e2b sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// GetE2BSandbox implements store.E2BStore.
func (s *Store) GetE2BSandbox(ctx context.Context, id string) (store.E2BSandbox, error) {
	sb, err := scanE2B(s.pool.QueryRow(ctx, `SELECT `+e2bColumns+` FROM e2b_sandboxes WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.E2BSandbox{}, store.ErrE2BNotFound("get", id)
	}
	if err != nil {
		return store.E2BSandbox{}, fmt.Errorf("get e2b sandbox %s: %w", id, err)
	}
	return sb, nil
}

// UpdateE2BSandbox implements store.E2BStore: one statement matched on the version read; a miss is told apart
// (gone, or changed) by a second read.
func (s *Store) UpdateE2BSandbox(ctx context.Context, sb store.E2BSandbox) (int64, error) {
	sb, err := store.PrepareE2BSandbox(sb)
	if err != nil {
		return 0, err
	}
	var version int64
	err = s.pool.QueryRow(ctx, `UPDATE e2b_sandboxes SET tenant = $1, started_at = $2, end_at = $3, paused = $4,
		record = $5, version = version + 1 WHERE id = $6 AND version = $7 RETURNING version`,
		sb.Tenant, sb.StartedAt, sb.EndAt, sb.Paused, string(sb.Record), sb.ID, sb.Version).Scan(&version)
	if err == nil {
		return version, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("update e2b sandbox %s: %w", sb.ID, err)
	}
	if _, err := s.GetE2BSandbox(ctx, sb.ID); err != nil {
		return 0, err
	}
	return 0, store.ErrE2BChanged(sb.ID, sb.Version)
}

// DeleteE2BSandbox implements store.E2BStore.
func (s *Store) DeleteE2BSandbox(ctx context.Context, id string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM e2b_sandboxes WHERE id = $1`, id)
	if err != nil {
		return fmt.Errorf("delete e2b sandbox %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrE2BNotFound("delete", id)
	}
	return nil
}

// ListE2BSandboxes implements store.E2BStore.
func (s *Store) ListE2BSandboxes(ctx context.Context, tenant string) ([]store.E2BSandbox, error) {
	q := `SELECT ` + e2bColumns + ` FROM e2b_sandboxes`
	var args []any
	if tenant != "" {
		q += ` WHERE tenant = $1`
		args = append(args, tenant)
	}
	rows, err := s.pool.Query(ctx, q+` ORDER BY started_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("list e2b sandboxes: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.E2BSandbox, error) { return scanE2B(r) })
	if err != nil {
		return nil, fmt.Errorf("list e2b sandboxes: %w", err)
	}
	return out, nil
}

func scanE2B(r pgx.Row) (store.E2BSandbox, error) {
	var (
		sb  store.E2BSandbox
		rec string
	)
	err := r.Scan(&sb.ID, &sb.Tenant, &sb.StartedAt, &sb.EndAt, &sb.Paused, &rec, &sb.Version)
	sb.StartedAt, sb.EndAt, sb.Record = sb.StartedAt.UTC(), sb.EndAt.UTC(), []byte(rec)
	return sb, err
}
