package store

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/internal/events"
)

// Dashboard is the read-only queries the operator dashboard (internal/ui) needs beyond ListRuns and ListEvents:
// filtered pages of runs, counts, and aggregates of events over a time window, each one statement so that a page
// renders in bounded time however many runs and events the store holds. Every Store implements it; storetest
// checks it.
//
// Tenant scoping: a non-empty Tenant selects only that tenant's runs, and only events of those runs (an event of
// no run belongs to no tenant and is selected only when Tenant is empty).
type Dashboard interface {
	// QueryRuns returns one page of the runs matching q, newest first (CreatedAt, then ID, descending), and
	// whether more runs follow the page.
	QueryRuns(ctx context.Context, q RunQuery) (RunPage, error)
	// CountRuns counts the runs of tenant ("" for every tenant) created at or after since (zero: ever), by
	// status and admission.
	CountRuns(ctx context.Context, tenant string, since time.Time) (RunCounts, error)
	// RefusedHosts aggregates the network_blocked events matching q by host, port, reason and rule: most
	// refused first (then the latest refusal first), at most q.Limit groups (0: DefaultRefusedLimit).
	RefusedHosts(ctx context.Context, q EventQuery) ([]RefusedHost, error)
	// RecentEvents returns the events matching q, newest first (descending Seq), each with the tenant and user
	// of its run (empty for an event of no run); at most q.Limit (0: DefaultRecentLimit).
	RecentEvents(ctx context.Context, q EventQuery) ([]RunEvent, error)
}

// RunQuery selects a page of runs; zero fields match everything.
type RunQuery struct {
	Tenant      string
	User        string
	Status      string
	FailureCode string
	Mode        string // the resolved mode
	Driver      string
	Admission   string // admitted | refused
	// After is the cursor of a page: only runs strictly older than (After.CreatedAt, After.ID) in the page order.
	// Zero: from the newest.
	After Cursor
	Limit int // the page size; 0 means DefaultPageSize, at most MaxPageSize
}

// Cursor is a position in the newest-first order of runs: the CreatedAt and ID of the last run of a page.
type Cursor struct {
	CreatedAt time.Time
	ID        string
}

// IsZero reports whether c is the start of the list.
func (c Cursor) IsZero() bool { return c.ID == "" && c.CreatedAt.IsZero() }

// RunPage is one page of QueryRuns.
type RunPage struct {
	Runs []Run
	More bool // more runs match after the last one of Runs
}

// Page sizes of QueryRuns.
const (
	DefaultPageSize = 50
	MaxPageSize     = 500
)

// Bounds of the event aggregates.
const (
	DefaultRefusedLimit = 100
	DefaultRecentLimit  = 100
	MaxEventLimit       = 50_000
	MaxRunIDs           = 1_000
)

// RunCounts are runs by status and admission. Refused counts the runs admission refused (their status is
// failed); the status counts include them.
type RunCounts struct {
	Total           int
	Running         int
	Succeeded       int
	Failed          int
	FailedResumable int
	Refused         int
}

// EventQuery selects events over a time window; zero fields match everything.
type EventQuery struct {
	Tenant string
	User   string    // only events of this user's runs (with Tenant)
	RunIDs []string  // only events of these runs (at most MaxRunIDs); empty: of any run
	Names  []string  // only events with one of these names (RecentEvents); RefusedHosts ignores it
	Since  time.Time // only events at or after Since
	Limit  int
	// Newest bounds the work of RefusedHosts: it aggregates at most the Newest matching events, newest first
	// (0: all of them). RecentEvents ignores it.
	Newest int
}

// RefusedHost is one group of network_blocked events: the same host, port, reason and rule.
type RefusedHost struct {
	Host      string    `json:"host"`
	Port      int       `json:"port"`
	Reason    string    `json:"reason"`
	Rule      string    `json:"rule"`
	Count     int       `json:"count"`
	Sandboxes int       `json:"sandboxes"` // distinct sandboxes that were refused
	Last      time.Time `json:"last"`
}

// RunEvent is an event with the tenant and user of its run.
type RunEvent struct {
	Event
	Tenant string `json:"tenant,omitempty"`
	User   string `json:"user,omitempty"`
}

// PrepareRunQuery validates q and fills its defaults (the page size). Implementations call it in QueryRuns.
func PrepareRunQuery(q RunQuery) (RunQuery, error) {
	switch {
	case q.Limit < 0:
		return q, invalid("query runs: negative limit %d", q.Limit)
	case q.Limit == 0:
		q.Limit = DefaultPageSize
	case q.Limit > MaxPageSize:
		q.Limit = MaxPageSize
	}
	if q.Status != "" {
		if err := oneOf("query runs: status", q.Status, StatusRunning, StatusSucceeded, StatusFailed, StatusFailedResumable); err != nil {
			return q, err
		}
	}
	if q.Admission != "" {
		if err := oneOf("query runs: admission", q.Admission, AdmissionAdmitted, AdmissionRefused); err != nil {
			return q, err
		}
	}
	if !q.After.IsZero() {
		if q.After.ID == "" || q.After.CreatedAt.IsZero() {
			return q, invalid("query runs: a cursor needs both a time and an id")
		}
		q.After.CreatedAt = events.Truncate(q.After.CreatedAt)
	}
	return q, nil
}

// PrepareEventQuery validates q and fills its defaults (limit def, at most MaxEventLimit), normalising Since to
// UTC milliseconds. Implementations call it in RefusedHosts and RecentEvents.
func PrepareEventQuery(op string, q EventQuery, def int) (EventQuery, error) {
	switch {
	case q.Limit < 0:
		return q, invalid("%s: negative limit %d", op, q.Limit)
	case q.Limit == 0:
		q.Limit = def
	case q.Limit > MaxEventLimit:
		q.Limit = MaxEventLimit
	}
	if !q.Since.IsZero() {
		q.Since = events.Truncate(q.Since)
	}
	if q.Newest < 0 {
		return q, invalid("%s: negative bound %d", op, q.Newest)
	}
	if len(q.RunIDs) > MaxRunIDs {
		return q, invalid("%s: %d run ids: at most %d", op, len(q.RunIDs), MaxRunIDs)
	}
	if q.User != "" && q.Tenant == "" {
		return q, invalid("%s: a user needs a tenant", op)
	}
	for _, n := range q.Names {
		if n == "" {
			return q, invalid("%s: empty event name", op)
		}
	}
	return q, nil
}

// RefusedGroups groups network_blocked payloads as RefusedHosts does, for a store that aggregates in Go. The zero
// value is empty and ready.
type RefusedGroups struct {
	groups map[refusedKey]*refusedGroup
}

type refusedKey struct {
	host, reason, rule string
	port               int
}

type refusedGroup struct {
	RefusedHost
	boxes map[string]bool
}

// Add counts one network_blocked payload recorded at at. A payload that does not decode counts under an empty
// host, as SQL's COALESCE of a missing field would.
func (g *RefusedGroups) Add(payload []byte, at time.Time) {
	var p events.NetworkBlocked
	_ = json.Unmarshal(payload, &p)
	if g.groups == nil {
		g.groups = map[refusedKey]*refusedGroup{}
	}
	k := refusedKey{p.Host, p.Reason, p.Rule, p.Port}
	gr := g.groups[k]
	if gr == nil {
		gr = &refusedGroup{RefusedHost: RefusedHost{Host: p.Host, Port: p.Port, Reason: p.Reason, Rule: p.Rule}, boxes: map[string]bool{}}
		g.groups[k] = gr
	}
	gr.Count++
	if p.Sandbox != "" {
		gr.boxes[p.Sandbox] = true
	}
	if at.After(gr.Last) {
		gr.Last = at.UTC()
	}
}

// Result returns the groups most refused first, then the latest refusal first, then by host; at most limit.
func (g *RefusedGroups) Result(limit int) []RefusedHost {
	out := make([]RefusedHost, 0, len(g.groups))
	for _, gr := range g.groups {
		gr.Sandboxes = len(gr.boxes)
		out = append(out, gr.RefusedHost)
	}
	slices.SortFunc(out, func(a, b RefusedHost) int {
		switch {
		case a.Count != b.Count:
			return b.Count - a.Count
		case !a.Last.Equal(b.Last):
			return b.Last.Compare(a.Last)
		}
		return strings.Compare(a.Host, b.Host)
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}
