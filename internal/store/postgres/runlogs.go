package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/sandkeep/sandkeep/internal/store"
)

// InsertRunLog implements store.Writes inside the group's transaction, under a per-run advisory lock held to its
// end: the run's bytes so far are read and the entry written while no other appender of that run can, so the
// bound holds across replicas and one run's seqs become visible in increasing order.
func (w writes) InsertRunLog(ctx context.Context, l store.RunLog) (int64, error) {
	seq, err := w.insertRunLog(ctx, l)
	if err != nil {
		return 0, fmt.Errorf("append run log %s: %w", l.RunID, err)
	}
	return seq, nil
}

func (w writes) insertRunLog(ctx context.Context, l store.RunLog) (int64, error) {
	if _, err := w.tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('run_logs/' || $1, 0))`, l.RunID); err != nil {
		return 0, err
	}
	var one int
	if err := w.tx.QueryRow(ctx, `SELECT 1 FROM runs WHERE id = $1`, l.RunID).Scan(&one); errors.Is(err, pgx.ErrNoRows) {
		return 0, store.ErrRunNotFound("append run log", l.RunID)
	} else if err != nil {
		return 0, err
	}
	var (
		used      int64
		truncated bool
	)
	if err := w.tx.QueryRow(ctx, `SELECT COALESCE(SUM(CASE WHEN source = $2 THEN 0 ELSE octet_length(text) END), 0)::bigint,
		COALESCE(bool_or(source = $2), false) FROM run_logs WHERE run_id = $1`, l.RunID, store.LogTruncated).Scan(&used, &truncated); err != nil {
		return 0, err
	}
	var seq int64
	for i, e := range store.FitRunLog(l, used, truncated) {
		var got int64
		if err := w.tx.QueryRow(ctx, `INSERT INTO run_logs (run_id, time, source, text) VALUES ($1, $2, $3, $4) RETURNING seq`,
			e.RunID, e.Time, e.Source, e.Text).Scan(&got); err != nil {
			return 0, err
		}
		if i == 0 && e.Source == l.Source {
			seq = got
		}
	}
	return seq, nil
}

// ListRunLogs implements store.RunLogStore.
func (s *Store) ListRunLogs(ctx context.Context, f store.RunLogFilter) ([]store.RunLog, error) {
	if err := store.CheckRunLogFilter(f); err != nil {
		return nil, err
	}
	if err := s.Flush(ctx); err != nil {
		return nil, err
	}
	q := `SELECT seq, run_id, time, source, text FROM run_logs WHERE run_id = $1 AND seq > $2 ORDER BY seq`
	args := []any{f.RunID, f.AfterSeq}
	if f.Limit > 0 {
		q += ` LIMIT $3`
		args = append(args, f.Limit)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list run logs %s: %w", f.RunID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.RunLog, error) {
		var l store.RunLog
		err := r.Scan(&l.Seq, &l.RunID, &l.Time, &l.Source, &l.Text)
		l.Time = l.Time.UTC()
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("list run logs %s: %w", f.RunID, err)
	}
	return out, nil
}
