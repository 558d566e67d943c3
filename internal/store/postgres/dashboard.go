package postgres

import (
	"context"
	"fmt"
	"strconv"
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
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	eq := func(col, v string) {
		if v != "" {
			where = append(where, col+" = "+arg(v))
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
		where = append(where, "(created_at, id) < ("+arg(q.After.CreatedAt)+", "+arg(q.After.ID)+")")
	}
	stmt := `SELECT ` + runColumns + ` FROM runs`
	if len(where) > 0 {
		stmt += ` WHERE ` + strings.Join(where, " AND ")
	}
	stmt += ` ORDER BY created_at DESC, id DESC LIMIT ` + arg(q.Limit+1)
	rows, err := s.pool.Query(ctx, stmt, args...)
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
		COUNT(*) FILTER (WHERE status = 'running'), COUNT(*) FILTER (WHERE status = 'succeeded'),
		COUNT(*) FILTER (WHERE status = 'failed'), COUNT(*) FILTER (WHERE status = 'failed_resumable'),
		COUNT(*) FILTER (WHERE admission = 'refused')
		FROM runs WHERE TRUE`
	var args []any
	if !since.IsZero() {
		args = append(args, events.Truncate(since))
		stmt += ` AND created_at >= $` + strconv.Itoa(len(args))
	}
	if tenant != "" {
		args = append(args, tenant)
		stmt += ` AND tenant = $` + strconv.Itoa(len(args))
	}
	var c store.RunCounts
	err := s.pool.QueryRow(ctx, stmt, args...).Scan(&c.Total, &c.Running, &c.Succeeded, &c.Failed, &c.FailedResumable, &c.Refused)
	if err != nil {
		return store.RunCounts{}, fmt.Errorf("count runs: %w", err)
	}
	return c, nil
}

// eventScope returns the join and conditions that select the events of q's window and tenant; args already
// holds n arguments.
func eventScope(q store.EventQuery, args []any) (join string, where []string, _ []any) {
	join = ` LEFT JOIN runs r ON r.id = e.run_id`
	if q.Tenant != "" {
		join = ` JOIN runs r ON r.id = e.run_id`
		args = append(args, q.Tenant)
		where = append(where, "r.tenant = $"+strconv.Itoa(len(args)))
		if q.User != "" {
			args = append(args, q.User)
			where = append(where, "r.user_name = $"+strconv.Itoa(len(args)))
		}
	}
	if len(q.RunIDs) > 0 {
		args = append(args, q.RunIDs)
		where = append(where, "e.run_id = ANY($"+strconv.Itoa(len(args))+")")
	}
	if !q.Since.IsZero() {
		args = append(args, q.Since)
		where = append(where, "e.time >= $"+strconv.Itoa(len(args)))
	}
	return join, where, args
}

// RefusedHosts implements store.Dashboard.
func (s *Store) RefusedHosts(ctx context.Context, q store.EventQuery) ([]store.RefusedHost, error) {
	if err := s.Flush(ctx); err != nil {
		return nil, err
	}
	q, err := store.PrepareEventQuery("refused hosts", q, store.DefaultRefusedLimit)
	if err != nil {
		return nil, err
	}
	join, where, args := eventScope(q, []any{events.NameNetworkBlocked})
	where = append([]string{"e.name = $1"}, where...)
	// The newest matching events first (bounded by q.Newest), then their groups.
	// Each payload is parsed once (jsonb), not once per field (json's ->> parses the text every time).
	inner := `SELECT e.payload::jsonb AS payload, e.time FROM events e` + join + ` WHERE ` + strings.Join(where, " AND ") + ` ORDER BY e.seq DESC`
	if q.Newest > 0 {
		args = append(args, q.Newest)
		inner += ` LIMIT $` + strconv.Itoa(len(args))
	}
	args = append(args, q.Limit)
	stmt := `SELECT COALESCE(payload->>'host', '') AS host,
		COALESCE((payload->>'port')::int, 0) AS port,
		COALESCE(payload->>'reason', '') AS reason,
		COALESCE(payload->>'rule', '') AS rule,
		COUNT(*) AS n, COUNT(DISTINCT payload->>'sandbox') AS boxes, MAX(time) AS last
		FROM (` + inner + `) AS blocked GROUP BY 1, 2, 3, 4 ORDER BY n DESC, last DESC, host LIMIT $` + strconv.Itoa(len(args))
	rows, err := s.pool.Query(ctx, stmt, args...)
	if err != nil {
		return nil, fmt.Errorf("refused hosts: %w", err)
	}
	defer rows.Close()
	var out []store.RefusedHost
	for rows.Next() {
		var (
			h        store.RefusedHost
			n, boxes int64
			port     int32
		)
		if err := rows.Scan(&h.Host, &port, &h.Reason, &h.Rule, &n, &boxes, &h.Last); err != nil {
			return nil, fmt.Errorf("refused hosts: %w", err)
		}
		h.Port, h.Count, h.Sandboxes, h.Last = int(port), int(n), int(boxes), h.Last.UTC()
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("refused hosts: %w", err)
	}
	return out, nil
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
	join, where, args := eventScope(q, nil)
	if len(q.Names) > 0 {
		args = append(args, q.Names)
		where = append(where, "e.name = ANY($"+strconv.Itoa(len(args))+")")
	}
	stmt := `SELECT e.seq, e.run_id, e.time, e.name, e.payload::text, e.request_id, COALESCE(r.tenant, ''), COALESCE(r.user_name, '')
		FROM events e` + join
	if len(where) > 0 {
		stmt += ` WHERE ` + strings.Join(where, " AND ")
	}
	args = append(args, q.Limit)
	stmt += ` ORDER BY e.seq DESC LIMIT $` + strconv.Itoa(len(args))
	rows, err := s.pool.Query(ctx, stmt, args...)
	if err != nil {
		return nil, fmt.Errorf("recent events: %w", err)
	}
	defer rows.Close()
	var out []store.RunEvent
	for rows.Next() {
		var (
			e       store.RunEvent
			runID   *string
			payload string
		)
		if err := rows.Scan(&e.Seq, &runID, &e.Time, &e.Name, &payload, &e.RequestID, &e.Tenant, &e.User); err != nil {
			return nil, fmt.Errorf("recent events: %w", err)
		}
		if runID != nil {
			e.RunID = *runID
		}
		e.Time = e.Time.UTC()
		e.Payload = []byte(payload)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("recent events: %w", err)
	}
	return out, nil
}
