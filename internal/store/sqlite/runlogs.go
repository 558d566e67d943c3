package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sandkeep/sandkeep/internal/store"
)

// AppendRunLog implements store.RunLogStore in one BEGIN IMMEDIATE transaction: the run's bytes so far are read
// and the entry written under the same write lock, so concurrent appenders never pass the bound together.
func (s *Store) AppendRunLog(ctx context.Context, l store.RunLog) (int64, error) {
	l, err := store.PrepareRunLog(l)
	if err != nil {
		return 0, err
	}
	var seq int64
	err = s.write(ctx, func(tx *sql.Tx) error {
		var one int
		if err := tx.QueryRowContext(ctx, `SELECT 1 FROM runs WHERE id = ?`, l.RunID).Scan(&one); errors.Is(err, sql.ErrNoRows) {
			return store.ErrRunNotFound("append run log", l.RunID)
		} else if err != nil {
			return err
		}
		var used int64
		var truncated int
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(SUM(CASE WHEN source = ? THEN 0 ELSE length(CAST(text AS BLOB)) END), 0),
			COALESCE(MAX(source = ?), 0) FROM run_logs WHERE run_id = ?`, store.LogTruncated, store.LogTruncated, l.RunID).Scan(&used, &truncated); err != nil {
			return err
		}
		for i, e := range store.FitRunLog(l, used, truncated == 1) {
			var got int64
			if err := tx.QueryRowContext(ctx, `INSERT INTO run_logs (run_id, time, source, text) VALUES (?, ?, ?, ?) RETURNING seq`,
				e.RunID, fmtTime(e.Time), e.Source, e.Text).Scan(&got); err != nil {
				return err
			}
			if i == 0 && e.Source == l.Source {
				seq = got
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("append run log %s: %w", l.RunID, err)
	}
	return seq, nil
}

// ListRunLogs implements store.RunLogStore.
func (s *Store) ListRunLogs(ctx context.Context, f store.RunLogFilter) ([]store.RunLog, error) {
	if err := store.CheckRunLogFilter(f); err != nil {
		return nil, err
	}
	q := `SELECT seq, run_id, time, source, text FROM run_logs WHERE run_id = ? AND seq > ? ORDER BY seq`
	args := []any{f.RunID, f.AfterSeq}
	if f.Limit > 0 {
		q += ` LIMIT ?`
		args = append(args, f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list run logs %s: %w", f.RunID, err)
	}
	defer rows.Close()
	var out []store.RunLog
	for rows.Next() {
		var (
			l  store.RunLog
			at string
		)
		if err := rows.Scan(&l.Seq, &l.RunID, &at, &l.Source, &l.Text); err != nil {
			return nil, fmt.Errorf("list run logs %s: %w", f.RunID, err)
		}
		if l.Time, err = parseTime(at); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list run logs %s: %w", f.RunID, err)
	}
	return out, nil
}
