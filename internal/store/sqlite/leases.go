package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/internal/store"
)

// Leases are for the replicas of one host: expiry is by the host's clock (millisecond precision), and every
// change is a BEGIN IMMEDIATE transaction, so the read and the write of one decision see no other writer.

const leaseColumns = `name, owner, address, token, expires_at`

// AcquireLease implements store.LeaseStore.
func (s *Store) AcquireLease(ctx context.Context, name, owner, address string, ttl time.Duration) (store.Lease, error) {
	if err := store.CheckLease(name, owner, ttl); err != nil {
		return store.Lease{}, err
	}
	var (
		got  store.Lease
		held error
	)
	err := s.write(ctx, func(tx *sql.Tx) error {
		now := time.Now()
		cur, err := scanLease(tx.QueryRowContext(ctx, `SELECT `+leaseColumns+` FROM leases WHERE name = ?`, name), now)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			got = store.Lease{Name: name, Owner: owner, Address: address, Token: 1}
		case err != nil:
			return err
		case cur.Live && cur.Owner != owner:
			got, held = cur, store.ErrHeld(name, cur)
			return nil
		case cur.Live: // owner's already: a renewal
			got = cur
			got.Address = address
		default: // expired or released: a new token, whoever takes it
			got = store.Lease{Name: name, Owner: owner, Address: address, Token: cur.Token + 1}
		}
		got.Expires, got.Live = truncMillis(now.Add(ttl)), true
		_, err = tx.ExecContext(ctx, `INSERT INTO leases (`+leaseColumns+`) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, address = excluded.address, token = excluded.token,
				expires_at = excluded.expires_at`, got.Name, got.Owner, got.Address, got.Token, fmtTime(got.Expires))
		return err
	})
	if err != nil {
		return store.Lease{}, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	return got, held
}

// RenewLeases implements store.LeaseStore in one transaction.
func (s *Store) RenewLeases(ctx context.Context, owner string, held []store.Lease, ttl time.Duration) ([]store.Lease, error) {
	if err := store.CheckRenew(owner, held, ttl); err != nil {
		return nil, err
	}
	if len(held) == 0 {
		return nil, nil
	}
	var renewed []store.Lease
	err := s.write(ctx, func(tx *sql.Tx) error {
		renewed = renewed[:0]
		now := time.Now()
		until := truncMillis(now.Add(ttl))
		stmt, err := tx.PrepareContext(ctx, `UPDATE leases SET expires_at = ?
			WHERE name = ? AND owner = ? AND token = ? AND expires_at > ? RETURNING `+leaseColumns)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for _, l := range held {
			got, err := scanLease(stmt.QueryRowContext(ctx, fmtTime(until), l.Name, owner, l.Token, fmtTime(now)), now)
			if errors.Is(err, sql.ErrNoRows) {
				continue // lost
			}
			if err != nil {
				return err
			}
			renewed = append(renewed, got)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("renew leases of %s: %w", owner, err)
	}
	return renewed, nil
}

// ReleaseLease implements store.LeaseStore.
func (s *Store) ReleaseLease(ctx context.Context, l store.Lease) error {
	err := s.write(ctx, func(tx *sql.Tx) error {
		now := fmtTime(time.Now())
		_, err := tx.ExecContext(ctx, `UPDATE leases SET expires_at = ?
			WHERE name = ? AND owner = ? AND token = ? AND expires_at > ?`, now, l.Name, l.Owner, l.Token, now)
		return err
	})
	if err != nil {
		return fmt.Errorf("release lease %s: %w", l.Name, err)
	}
	return nil
}

// GetLease implements store.LeaseStore.
func (s *Store) GetLease(ctx context.Context, name string) (store.Lease, error) {
	l, err := scanLease(s.db.QueryRowContext(ctx, `SELECT `+leaseColumns+` FROM leases WHERE name = ?`, name), time.Now())
	if errors.Is(err, sql.ErrNoRows) {
		return store.Lease{}, store.ErrLeaseNotFound(name)
	}
	if err != nil {
		return store.Lease{}, fmt.Errorf("get lease %s: %w", name, err)
	}
	return l, nil
}

// ListLeases implements store.LeaseStore.
func (s *Store) ListLeases(ctx context.Context, prefix string) ([]store.Lease, error) {
	now := time.Now()
	rows, err := s.db.QueryContext(ctx, `SELECT `+leaseColumns+` FROM leases
		WHERE expires_at > ? AND substr(name, 1, ?) = ? ORDER BY name`, fmtTime(now), len(prefix), prefix)
	if err != nil {
		return nil, fmt.Errorf("list leases %q: %w", prefix, err)
	}
	defer rows.Close()
	var ls []store.Lease
	for rows.Next() {
		l, err := scanLease(rows, now)
		if err != nil {
			return nil, fmt.Errorf("list leases %q: %w", prefix, err)
		}
		ls = append(ls, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list leases %q: %w", prefix, err)
	}
	return ls, nil
}

// CheckFences implements store.Writes: the transaction holds SQLite's write lock, so nothing changes a lease
// before it commits (and no order of taking rows matters).
func (w writes) CheckFences(ctx context.Context, fs []store.Fence) (map[store.Fence]bool, error) {
	now := fmtTime(time.Now())
	held := make(map[store.Fence]bool, len(fs))
	for _, f := range fs {
		var one int
		err := w.tx.QueryRowContext(ctx, `SELECT 1 FROM leases WHERE name = ? AND token = ? AND expires_at > ?`,
			f.Lease, f.Token, now).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("check fence %s: %w", f.Lease, err)
		}
		held[f] = true
	}
	return held, nil
}

func scanLease(sc scanner, now time.Time) (store.Lease, error) {
	var (
		l       store.Lease
		expires string
		err     error
	)
	if err = sc.Scan(&l.Name, &l.Owner, &l.Address, &l.Token, &expires); err != nil {
		return l, err
	}
	if l.Expires, err = parseTime(expires); err != nil {
		return l, fmt.Errorf("lease %s: %w", l.Name, err)
	}
	l.Live = l.Expires.After(now)
	return l, nil
}

func truncMillis(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }
