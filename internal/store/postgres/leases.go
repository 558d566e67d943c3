package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sandkeep/sandkeep/internal/store"
)

const leaseColumns = `name, owner, address, token, expires_at, expires_at > now()`

// acquireTries bounds AcquireLease's retries when the holder it was refused by is gone by the time it reads it.
const acquireTries = 3

// AcquireLease implements store.LeaseStore: one upsert that takes the row when it is free, expired or owner's,
// by the server's clock, so no two owners ever both succeed.
func (s *Store) AcquireLease(ctx context.Context, name, owner, address string, ttl time.Duration) (store.Lease, error) {
	if err := store.CheckLease(name, owner, ttl); err != nil {
		return store.Lease{}, err
	}
	for range acquireTries {
		l, err := scanLease(s.pool.QueryRow(ctx, `INSERT INTO leases AS l (name, owner, address, token, expires_at)
			VALUES ($1, $2, $3, 1, now() + $4 * interval '1 microsecond')
			ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, address = EXCLUDED.address,
				token = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > now() THEN l.token ELSE l.token + 1 END,
				expires_at = EXCLUDED.expires_at
			WHERE l.owner = EXCLUDED.owner OR l.expires_at <= now()
			RETURNING `+leaseColumns, name, owner, address, ttl.Microseconds()))
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return store.Lease{}, fmt.Errorf("acquire lease %s: %w", name, err)
		}
		holder, err := s.GetLease(ctx, name)
		if err != nil {
			return store.Lease{}, fmt.Errorf("acquire lease %s: %w", name, err)
		}
		if holder.Live {
			return holder, store.ErrHeld(name, holder)
		}
		// Released or expired between the two statements: try again.
	}
	return store.Lease{}, fmt.Errorf("acquire lease %s: it kept changing hands: %w", name, store.ErrLeaseHeld)
}

// RenewLeases implements store.LeaseStore in one statement for every lease of held.
func (s *Store) RenewLeases(ctx context.Context, owner string, held []store.Lease, ttl time.Duration) ([]store.Lease, error) {
	if err := store.CheckRenew(owner, held, ttl); err != nil {
		return nil, err
	}
	if len(held) == 0 {
		return nil, nil
	}
	names := make([]string, len(held))
	tokens := make([]int64, len(held))
	for i, l := range held {
		names[i], tokens[i] = l.Name, l.Token
	}
	// The rows are locked first, in name order, as CheckFences locks them: an UPDATE alone locks them in its
	// plan's order, and a group commit checking the same leases' fences then deadlocked with it (40P01).
	rows, err := s.pool.Query(ctx, `WITH h AS (
			SELECT l.name FROM leases AS l
			JOIN unnest($3::text[], $4::bigint[]) AS h(name, token) ON l.name = h.name AND l.token = h.token
			WHERE l.owner = $1 AND l.expires_at > now()
			ORDER BY l.name FOR NO KEY UPDATE OF l)
		UPDATE leases AS l SET expires_at = now() + $2 * interval '1 microsecond'
		FROM h WHERE l.name = h.name
		RETURNING l.name, l.owner, l.address, l.token, l.expires_at, true`,
		owner, ttl.Microseconds(), names, tokens)
	if err != nil {
		return nil, fmt.Errorf("renew leases of %s: %w", owner, err)
	}
	renewed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Lease, error) { return scanLease(r) })
	if err != nil {
		return nil, fmt.Errorf("renew leases of %s: %w", owner, err)
	}
	return renewed, nil
}

// ReleaseLease implements store.LeaseStore.
func (s *Store) ReleaseLease(ctx context.Context, l store.Lease) error {
	_, err := s.pool.Exec(ctx, `UPDATE leases SET expires_at = now()
		WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > now()`, l.Name, l.Owner, l.Token)
	if err != nil {
		return fmt.Errorf("release lease %s: %w", l.Name, err)
	}
	return nil
}

// GetLease implements store.LeaseStore.
func (s *Store) GetLease(ctx context.Context, name string) (store.Lease, error) {
	l, err := scanLease(s.pool.QueryRow(ctx, `SELECT `+leaseColumns+` FROM leases WHERE name = $1`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Lease{}, store.ErrLeaseNotFound(name)
	}
	if err != nil {
		return store.Lease{}, fmt.Errorf("get lease %s: %w", name, err)
	}
	return l, nil
}

// ListLeases implements store.LeaseStore.
func (s *Store) ListLeases(ctx context.Context, prefix string) ([]store.Lease, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+leaseColumns+` FROM leases
		WHERE expires_at > now() AND starts_with(name, $1) ORDER BY name`, prefix)
	if err != nil {
		return nil, fmt.Errorf("list leases %q: %w", prefix, err)
	}
	ls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Lease, error) { return scanLease(r) })
	if err != nil {
		return nil, fmt.Errorf("list leases %q: %w", prefix, err)
	}
	return ls, nil
}

// CheckFences implements store.Writes in one statement: FOR SHARE keeps the rows of the fences that hold as they
// are until the transaction ends, so a takeover (an UPDATE of a row) is ordered after the writes they let through.
// The rows are locked in name order (the lock is taken above the sort), as RenewLeases locks them.
func (w writes) CheckFences(ctx context.Context, fs []store.Fence) (map[store.Fence]bool, error) {
	names := make([]string, len(fs))
	tokens := make([]int64, len(fs))
	for i, f := range fs {
		names[i], tokens[i] = f.Lease, f.Token
	}
	rows, err := w.tx.Query(ctx, `SELECT l.name, l.token FROM leases AS l
		JOIN unnest($1::text[], $2::bigint[]) AS f(name, token) ON l.name = f.name AND l.token = f.token
		WHERE l.expires_at > now()
		ORDER BY l.name FOR SHARE OF l`, names, tokens)
	if err != nil {
		return nil, fmt.Errorf("check fences: %w", err)
	}
	held := make(map[store.Fence]bool, len(fs))
	var f store.Fence
	_, err = pgx.ForEachRow(rows, []any{&f.Lease, &f.Token}, func() error {
		held[f] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("check fences: %w", err)
	}
	return held, nil
}

func scanLease(row pgx.Row) (store.Lease, error) {
	var l store.Lease
	if err := row.Scan(&l.Name, &l.Owner, &l.Address, &l.Token, &l.Expires, &l.Live); err != nil {
		return store.Lease{}, err
	}
	l.Expires = l.Expires.UTC()
	return l, nil
}
