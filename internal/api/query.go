package api

import (
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/sandkeep/sandkeep/internal/store"
)

// Page sizes of the list routes.
const (
	defaultPage = 100
	maxPage     = 1000
)

// checkQuery refuses a parameter that is not in allowed, or given twice: a typo is an error, not a
// parameter silently ignored.
func checkQuery(q url.Values, allowed ...string) error {
	for k, v := range q {
		if !slices.Contains(allowed, k) {
			if len(allowed) == 0 {
				return invalid("this route takes no query parameters", "unknown query parameter %q", k)
			}
			return invalid("this route takes: "+joinQuoted(allowed), "unknown query parameter %q", k)
		}
		if len(v) > 1 {
			return invalid("give each parameter once", "query parameter %q is given %d times", k, len(v))
		}
	}
	return nil
}

func joinQuoted(ss []string) string {
	out := ""
	for i, s := range ss {
		if i > 0 {
			out += ", "
		}
		out += strconv.Quote(s)
	}
	return out
}

// boolParam reads a flag parameter: absent, "0" or "false" is false; present with no value, "1" or "true" is
// true.
func boolParam(q url.Values, name string) (bool, error) {
	v, ok := q[name]
	if !ok {
		return false, nil
	}
	switch v[0] {
	case "", "1", "true":
		return true, nil
	case "0", "false":
		return false, nil
	}
	return false, invalid("use "+name+"=1 or "+name+"=0", "query parameter %s=%q is not a flag", name, v[0])
}

// intParam reads a non-negative integer parameter no larger than max; absent is def.
func intParam(q url.Values, name string, def, max int64) (int64, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > max {
		return 0, invalid("give "+name+" as an integer from 0 to "+strconv.FormatInt(max, 10),
			"query parameter %s=%q is out of range", name, v)
	}
	return n, nil
}

// parseRunsQuery reads GET /v1/runs's parameters: user, status, limit (1..1000, default 100), before
// (RFC 3339: the created_at of the last run of the previous page). The tenant is never a parameter.
func parseRunsQuery(q url.Values) (store.RunFilter, error) {
	var f store.RunFilter
	if err := checkQuery(q, "user", "status", "limit", "before"); err != nil {
		return f, err
	}
	f.User = q.Get("user")
	f.Status = q.Get("status")
	switch f.Status {
	case "", store.StatusRunning, store.StatusSucceeded, store.StatusFailed, store.StatusFailedResumable:
	default:
		return f, invalid("use running, succeeded, failed or failed_resumable", "query parameter status=%q is unknown", f.Status)
	}
	limit, err := intParam(q, "limit", defaultPage, maxPage)
	if err != nil {
		return f, err
	}
	if limit == 0 {
		limit = defaultPage
	}
	f.Limit = int(limit)
	if b := q.Get("before"); b != "" {
		t, err := time.Parse(time.RFC3339Nano, b)
		if err != nil {
			return f, invalid("give before as RFC 3339, e.g. 2026-01-02T15:04:05.000Z", "query parameter before=%q is not a time", b)
		}
		f.Before = t
	}
	return f, nil
}

// eventsQuery is GET /v1/runs/{id}/events's parameters.
type eventsQuery struct {
	after  int64 // only events with a larger sequence number
	limit  int   // at most this many (not when following)
	follow bool  // stream as SSE until the run is over
}

func parseEventsQuery(q url.Values) (eventsQuery, error) {
	var e eventsQuery
	if err := checkQuery(q, "after", "limit", "follow"); err != nil {
		return e, err
	}
	var err error
	if e.after, err = intParam(q, "after", 0, 1<<62); err != nil {
		return e, err
	}
	limit, err := intParam(q, "limit", maxPage, 10*maxPage)
	if err != nil {
		return e, err
	}
	if limit == 0 {
		limit = maxPage
	}
	e.limit = int(limit)
	e.follow, err = boolParam(q, "follow")
	return e, err
}
