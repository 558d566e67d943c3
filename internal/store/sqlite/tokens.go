package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	sqlite3 "modernc.org/sqlite/lib"

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
	scopes, err := json.Marshal(t.Scopes)
	if err != nil {
		return fmt.Errorf("create token %s: %w", t.ID, err)
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO tokens (`+tokenColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, NULL)`,
			t.ID, t.Tenant, t.Name, string(scopes), t.Hash, fmtTime(t.CreatedAt), nullTime(t.ExpiresAt))
		if isCode(err, sqlite3.SQLITE_CONSTRAINT_UNIQUE) {
			// The failed statement was undone, the transaction (and its write lock) is still ours: find which of
			// the three uniqueness rules the token broke, to say so.
			return tokenConflict(ctx, tx, t)
		}
		if err != nil {
			return fmt.Errorf("create token %s: %w", t.ID, err)
		}
		return nil
	})
}

func tokenConflict(ctx context.Context, tx *sql.Tx, t store.Token) error {
	var sameID, sameHash bool
	err := tx.QueryRowContext(ctx, `SELECT id = ?, hash = ? FROM tokens
		WHERE id = ? OR hash = ? OR (tenant = ? AND name = ? AND revoked_at IS NULL)
		ORDER BY id = ? DESC, hash = ? DESC LIMIT 1`,
		t.ID, t.Hash, t.ID, t.Hash, t.Tenant, t.Name, t.ID, t.Hash).Scan(&sameID, &sameHash)
	switch {
	case err != nil && !errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("create token %s: %w", t.ID, err)
	case sameID:
		return store.ErrTokenExists(t, "the id is taken")
	case sameHash:
		return store.ErrTokenExists(t, "a token with the same hash exists")
	}
	return store.ErrTokenExists(t, fmt.Sprintf("tenant %q already has a live token named %q", t.Tenant, t.Name))
}

// TokenByHash implements store.TokenStore.
func (s *Store) TokenByHash(ctx context.Context, hash string) (store.Token, error) {
	t, err := scanToken(s.tokenByHash.QueryRowContext(ctx, hash))
	if errors.Is(err, sql.ErrNoRows) {
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
		q += ` WHERE tenant = ?`
		args = append(args, tenant)
	}
	q += ` ORDER BY created_at, seq`
	rows, err := s.db.QueryContext(ctx, q, args...)
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
	return s.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE tokens SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?`,
			fmtTime(events.Now()), id)
		if err != nil {
			return fmt.Errorf("revoke token %s: %w", id, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("revoke token %s: %w", id, err)
		}
		if n == 0 {
			return store.ErrTokenNotFound("revoke token", id)
		}
		return nil
	})
}

func scanToken(sc scanner) (store.Token, error) {
	var (
		t                store.Token
		scopes, created  string
		expires, revoked sql.NullString
		err              error
	)
	if err = sc.Scan(&t.ID, &t.Tenant, &t.Name, &scopes, &t.Hash, &created, &expires, &revoked); err != nil {
		return t, err
	}
	if err = json.Unmarshal([]byte(scopes), &t.Scopes); err != nil {
		return t, fmt.Errorf("token %s: scopes: %w", t.ID, err)
	}
	if t.CreatedAt, err = parseTime(created); err != nil {
		return t, fmt.Errorf("token %s: %w", t.ID, err)
	}
	if expires.Valid {
		if t.ExpiresAt, err = parseTime(expires.String); err != nil {
			return t, fmt.Errorf("token %s: %w", t.ID, err)
		}
	}
	if revoked.Valid {
		if t.RevokedAt, err = parseTime(revoked.String); err != nil {
			return t, fmt.Errorf("token %s: %w", t.ID, err)
		}
	}
	return t, nil
}
