package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/store"
)

// QueryRuns implements store.Dashboard.
func (s *Store) QueryRuns(ctx context.Context, q store.RunQuery) (store.RunPage, error) {
	if err := s.Flush(ctx); err != nil {
		return store.RunPage{}, err
	}
	q, err := store.PrepareRunQuery(q)
	if err != nil {
		return store.RunPage{}, err
	}
	var where []string
	var args []any
	eq := func(col, v string) {
		if v != "" {
			where = append(where, col+" = ?")
			args = append(args, v)
		}
	}
	eq("tenant", q.Tenant)
	eq("user_name", q.User)
	eq("status", q.Status)
	eq("failure_code", q.FailureCode)
	eq("resolved_mode", q.Mode)
	eq("driver", q.Driver)
	eq("admission", q.Admission)
	if !q.After.IsZero() {
		at := fmtTime(q.After.CreatedAt)
		where = append(where, "(created_at < ? OR (created_at = ? AND id < ?))")
		args = append(args, at, at, q.After.ID)
	}
	stmt := `SELECT ` + runColumns + ` FROM runs`
	if len(where) > 0 {
		stmt += ` WHERE ` + strings.Join(where, " AND ")
	}
	stmt += ` ORDER BY created_at DESC, id DESC LIMIT ?`
	args = append(args, q.Limit+1)
	rows, err := s.db.QueryContext(ctx, stmt, args...)
	if err != nil {
		return store.RunPage{}, fmt.Errorf("query runs: %w", err)
	}
	defer rows.Close()
	var page store.RunPage
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return store.RunPage{}, fmt.Errorf("query runs: %w", err)
		}
		page.Runs = append(page.Runs, r)
	}
	if err := rows.Err(); err != nil {
		return store.RunPage{}, fmt.Errorf("query runs: %w", err)
	}
	if len(page.Runs) > q.Limit {
		page.Runs, page.More = page.Runs[:q.Limit], true
	}
	return page, nil
}

// CountRuns implements store.Dashboard.
func (s *Store) CountRuns(ctx context.Context, tenant string, since time.Time) (store.RunCounts, error) {
	if err := s.Flush(ctx); err != nil {
		return store.RunCounts{}, err
	}
	stmt := `SELECT COUNT(*),
		COALESCE(SUM(status = 'running'), 0), COALESCE(SUM(status = 'succeeded'), 0),
		COALESCE(SUM(status = 'failed'), 0), COALESCE(SUM(status = 'failed_resumable'), 0),
		COALESCE(SUM(admission = 'refused'), 0)
		FROM runs WHERE created_at >= ?`
	args := []any{""}
	if !since.IsZero() {
		args[0] = fmtTime(events.Truncate(since))
	}
	if tenant != "" {
		stmt += ` AND tenant = ?`
		args = append(args, tenant)
	}
	var c store.RunCounts
	err := s.db.QueryRowContext(ctx, stmt, args...).Scan(&c.Total, &c.Running, &c.Succeeded, &c.Failed, &c.FailedResumable, &c.Refused)
	if err != nil {
		return store.RunCounts{}, fmt.Errorf("count runs: %w", err)
	}
	return c, nil
}

// eventScope returns the join and conditions that select the events of q's window and tenant.
func eventScope(q store.EventQuery) (join string, where []string, args []any) {
	join = ` LEFT JOIN runs r ON r.id = e.run_id`
	if len(q.RunIDs) > 0 { // a few runs: their events by the events-by-run index, not a scan of the window
		join = ` INDEXED BY events_by_run` + join
	}
	if q.Tenant != "" {
		join = strings.Replace(join, "LEFT JOIN", "JOIN", 1)
		where = append(where, "r.tenant = ?")
		args = append(args, q.Tenant)
		if q.User != "" {
			where = append(where, "r.user_name = ?")
			args = append(args, q.User)
		}
	}
	if len(q.RunIDs) > 0 {
		where = append(where, "e.run_id IN (?"+strings.Repeat(", ?", len(q.RunIDs)-1)+")")
		for _, id := range q.RunIDs {
			args = append(args, id)
		}
	}
	if !q.Since.IsZero() {
		where = append(where, "e.time >= ?")
		args = append(args, fmtTime(q.Since))
	}
	return join, where, args
}

// RefusedHosts implements store.Dashboard. The newest matching events are read (bounded by q.Newest) and
// grouped here: decoding the payloads in Go costs a fraction of SQLite's json_extract on every row.
func (s *Store) RefusedHosts(ctx context.Context, q store.EventQuery) ([]store.RefusedHost, error) {
	if err := s.Flush(ctx); err != nil {
		return nil, err
	}
	q, err := store.PrepareEventQuery("refused hosts", q, store.DefaultRefusedLimit)
	if err != nil {
		return nil, err
	}
	join, where, args := eventScope(q)
	where = append([]string{"e.name = ?"}, where...)
	args = append([]any{events.NameNetworkBlocked}, args...)
	stmt := `SELECT e.payload, e.time FROM events e` + join + ` WHERE ` + strings.Join(where, " AND ") + ` ORDER BY e.seq DESC`
	if q.Newest > 0 {
		stmt += ` LIMIT ?`
		args = append(args, q.Newest)
	}
	rows, err := s.db.QueryContext(ctx, stmt, args...)
	if err != nil {
		return nil, fmt.Errorf("refused hosts: %w", err)
	}
	defer rows.Close()
	var g store.RefusedGroups
	for rows.Next() {
		var payload, t string
		if err := rows.Scan(&payload, &t); err != nil {
			return nil, fmt.Errorf("refused hosts: %w", err)
		}
		at, err := parseTime(t)
		if err != nil {
			return nil, fmt.Errorf("refused hosts: %w", err)
		}
		g.Add([]byte(payload), at)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("refused hosts: %w", err)
	}
	return g.Result(q.Limit), nil
}

// RecentEvents implements store.Dashboard.
func (s *Store) RecentEvents(ctx context.Context, q store.EventQuery) ([]store.RunEvent, error) {
	if err := s.Flush(ctx); err != nil {
		return nil, err
	}
	q, err := store.PrepareEventQuery("recent events", q, store.DefaultRecentLimit)
	if err != nil {
		return nil, err
	}
	join, where, args := eventScope(q)
	if len(q.Names) > 0 {
		where = append(where, "e.name IN (?"+strings.Repeat(", ?", len(q.Names)-1)+")")
		for _, n := range q.Names {
			args = append(args, n)
		}
	}
	stmt := `SELECT e.seq, e.run_id, e.time, e.name, e.payload, e.request_id, COALESCE(r.tenant, ''), COALESCE(r.user_name, '')
		FROM events e` + join
	if len(where) > 0 {
		stmt += ` WHERE ` + strings.Join(where, " AND ")
	}
	stmt += ` ORDER BY e.seq DESC LIMIT ?`
	args = append(args, q.Limit)
	rows, err := s.db.QueryContext(ctx, stmt, args...)
	if err != nil {
		return nil, fmt.Errorf("recent events: %w", err)
	}
	defer rows.Close()
	var out []store.RunEvent
	for rows.Next() {
		var (
			e       store.RunEvent
			runID   sql.NullString
			t       string
			payload string
		)
		if err := rows.Scan(&e.Seq, &runID, &t, &e.Name, &payload, &e.RequestID, &e.Tenant, &e.User); err != nil {
			return nil, fmt.Errorf("recent events: %w", err)
		}
		e.RunID = runID.String
		if e.Time, err = parseTime(t); err != nil {
			return nil, fmt.Errorf("recent events: event %d: %w", e.Seq, err)
		}
		e.Payload = []byte(payload)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("recent events: %w", err)
	}
	return out, nil
}
