package client

import (
	"context"
	"net/url"
	"strconv"

	"github.com/sandkeep/sandkeep/internal/store"
)

// RunLog is one entry of a run's log: what the driver did for the run, or what one of its setup steps printed
// (Source: driver, build, features, post_create, post_start, post_attach; truncated says the log reached its
// bound). It is the type the server encodes.
type RunLog = store.RunLog

// RunLogs lists run id's log entries with a sequence number above after, in order (at most limit; 0 is the
// server's page size). Poll with the Seq of the last entry for more; a run of another tenant is RUN_NOT_FOUND.
func (c *Client) RunLogs(ctx context.Context, id string, after int64, limit int) ([]RunLog, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out struct {
		Logs []RunLog `json:"logs"`
	}
	err := c.call(ctx, "GET", "/v1/runs/"+escape(id)+"/logs", q, nil, nil, &out)
	return out.Logs, err
}

// FollowRunLogs calls fn with each entry of run id's log after sequence number after, as it is written, until the
// run is finished and its whole log was delivered (nil), fn returns an error (that error), or ctx ends. A stream
// the server ended early (it was draining) is an error wrapping io.ErrUnexpectedEOF: call again with the Seq of
// the last entry fn saw.
func (c *Client) FollowRunLogs(ctx context.Context, id string, after int64, fn func(RunLog) error) error {
	return follow(ctx, c, "/v1/runs/"+escape(id)+"/logs", after, fn)
}
