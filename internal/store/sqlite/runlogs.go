package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sandkeep/sandkeep/internal/store"
)

// InsertRunLog implements store.Writes inside the group's BEGIN IMMEDIATE transaction: the run's bytes so far
// are read and the entry written under the same write lock, so concurrent appenders never pass the bound together.
func (w writes) InsertRunLog(ctx context.Context, l store.RunLog) (int64, error) {
	ctx = context.WithoutCancel(ctx) // InTx
	var status string
	if err := w.tx.StmtContext(ctx, w.s.runStatus).QueryRowContext(ctx, l.RunID).Scan(&status); errors.Is(err, sql.ErrNoRows) {
		return 0, store.ErrRunNotFound("append run log", l.RunID)
	} else if err != nil {
		return 0, fmt.Errorf("append run log %s: %w", l.RunID, err)
	}
	var used int64
	var truncated int
	if err := w.tx.StmtContext(ctx, w.s.runLogUsed).QueryRowContext(ctx, store.LogTruncated, store.LogTruncated, l.RunID).Scan(&used, &truncated); err != nil {
		return 0, fmt.Errorf("append run log %s: %w", l.RunID, err)
	}
	var seq int64
	for i, e := range store.FitRunLog(l, used, truncated == 1) {
		res, err := w.tx.StmtContext(ctx, w.s.insertRunLog).ExecContext(ctx, e.RunID, fmtTime(e.Time), e.Source, e.Text)
		var got int64
		if err == nil {
			got, err = res.LastInsertId()
		}
		if err != nil {
			return 0, fmt.Errorf("append run log %s: %w", l.RunID, err)
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
