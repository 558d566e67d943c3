package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/store"
)

const tokenColumns = `id, tenant, name, scopes, hash, created_at, expires_at, revoked_at`

// CreateToken implements store.TokenStore.
func (s *Store) CreateToken(ctx context.Context, t store.Token) error {
	t, err := store.PrepareToken(t)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO tokens (`+tokenColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL)`,
		t.ID, t.Tenant, t.Name, t.Scopes, t.Hash, t.CreatedAt, nullTime(t.ExpiresAt))
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == codeUniqueViolation {
		// The index a violation names says which uniqueness rule the token broke (names from the migration).
		switch pe.ConstraintName {
		case "tokens_id_key":
			return store.ErrTokenExists(t, "the id is taken")
		case "tokens_by_hash":
			return store.ErrTokenExists(t, "a token with the same hash exists")
		case "tokens_live_name":
			return store.ErrTokenExists(t, fmt.Sprintf("tenant %q already has a live token named %q", t.Tenant, t.Name))
		}
		return store.ErrTokenExists(t, "it collides with a stored token")
	}
	if err != nil {
		return fmt.Errorf("create token %s: %w", t.ID, err)
	}
	return nil
}

// TokenByHash implements store.TokenStore.
func (s *Store) TokenByHash(ctx context.Context, hash string) (store.Token, error) {
	t, err := scanToken(s.pool.QueryRow(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE hash = $1`, hash))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Token{}, store.ErrTokenNotFound("token by hash", "with that hash")
	}
	if err != nil {
		return store.Token{}, fmt.Errorf("token by hash: %w", err)
	}
	return t, nil
}

// ListTokens implements store.TokenStore.
func (s *Store) ListTokens(ctx context.Context, tenant string) ([]store.Token, error) {
	q := `SELECT ` + tokenColumns + ` FROM tokens`
	var args []any
	if tenant != "" {
		q += ` WHERE tenant = $1`
		args = append(args, tenant)
	}
	q += ` ORDER BY created_at, seq`
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	defer rows.Close()
	var toks []store.Token
	for rows.Next() {
		t, err := scanToken(rows)
		if err != nil {
			return nil, fmt.Errorf("list tokens: %w", err)
		}
		toks = append(toks, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	return toks, nil
}

// RevokeToken implements store.TokenStore. A revoked token keeps its first revocation time.
func (s *Store) RevokeToken(ctx context.Context, id string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE tokens SET revoked_at = coalesce(revoked_at, $1) WHERE id = $2`, events.Now(), id)
	if err != nil {
		return fmt.Errorf("revoke token %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrTokenNotFound("revoke token", id)
	}
	return nil
}

func scanToken(row pgx.Row) (store.Token, error) {
	var (
		t                store.Token
		expires, revoked *time.Time
	)
	if err := row.Scan(&t.ID, &t.Tenant, &t.Name, &t.Scopes, &t.Hash, &t.CreatedAt, &expires, &revoked); err != nil {
		return t, err
	}
	t.CreatedAt = t.CreatedAt.UTC()
	if expires != nil {
		t.ExpiresAt = expires.UTC()
	}
	if revoked != nil {
		t.RevokedAt = revoked.UTC()
	}
	return t, nil
}
