package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
)

// RunLogList is the answer of GET /v1/runs/{id}/logs: the run's log entries in sequence order.
type RunLogList struct {
	Logs []store.RunLog `json:"logs"`
}

// handleRunLogs answers GET /v1/runs/{id}/logs: the log of a run of the caller's tenant (another tenant's run is
// RUN_NOT_FOUND, as a missing one), paged with after and limit; with follow=1, streamed as SSE (one `log` message
// per entry, its seq as the id) until the run is over and its whole log was sent, then `end`.
func (s *Server) handleRunLogs(w http.ResponseWriter, r *http.Request) {
	after, limit, follow, err := parseRunLogsQuery(r.URL.Query())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	run, err := s.runOf(r.Context(), tenantOf(r), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if follow {
		if after, err = lastEventID(r, after); err != nil {
			s.writeError(w, r, err)
			return
		}
		if _, err := s.runLogs(r.Context(), store.RunLogFilter{RunID: run.ID, AfterSeq: after, Limit: 1}); err != nil {
			s.writeError(w, r, err) // a backend without run logs answers before the stream starts
			return
		}
		s.follow(w, r, run, after, func(ctx context.Context, after int64) ([]sseItem, error) {
			logs, err := s.runLogs(ctx, store.RunLogFilter{RunID: run.ID, AfterSeq: after, Limit: maxPage})
			items := make([]sseItem, 0, len(logs))
			for _, l := range logs {
				if line, err := json.Marshal(l); err == nil {
					items = append(items, sseItem{seq: l.Seq, name: "log", data: line})
				}
			}
			return items, err
		})
		return
	}
	logs, err := s.runLogs(r.Context(), store.RunLogFilter{RunID: run.ID, AfterSeq: after, Limit: limit})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if logs == nil {
		logs = []store.RunLog{}
	}
	writeJSON(w, http.StatusOK, RunLogList{Logs: logs})
}

func parseRunLogsQuery(q url.Values) (after int64, limit int, follow bool, err error) {
	if err := checkQuery(q, "after", "limit", "follow"); err != nil {
		return 0, 0, false, err
	}
	if after, err = intParam(q, "after", 0, 1<<62); err != nil {
		return 0, 0, false, err
	}
	n, err := intParam(q, "limit", maxPage, 10*maxPage)
	if err != nil {
		return 0, 0, false, err
	}
	if n == 0 {
		n = maxPage
	}
	if follow, err = boolParam(q, "follow"); err != nil {
		return 0, 0, false, err
	}
	return after, int(n), follow, nil
}

// RunLogs reads a run's log through the backend; a backend that keeps no run logs has none for any run
// (RUN_NOT_FOUND), rather than an empty log that would look like a run that logged nothing.
func (g *guarded) RunLogs(ctx context.Context, f store.RunLogFilter) ([]store.RunLog, error) {
	rl, ok := g.Backend.(service.RunLogLister)
	if !ok {
		return nil, fault.New(fault.RunNotFound, "use a server that records runs in a store", "this server keeps no run logs")
	}
	return rl.RunLogs(ctx, f)
}

var _ service.RunLogLister = (*guarded)(nil)

// runLogs is the backend's RunLogs (the guarded backend always has it; another one may not).
func (s *Server) runLogs(ctx context.Context, f store.RunLogFilter) ([]store.RunLog, error) {
	if rl, ok := s.backend.(service.RunLogLister); ok {
		return rl.RunLogs(ctx, f)
	}
	return (&guarded{}).RunLogs(ctx, f)
}
