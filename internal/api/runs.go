package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
)

// RunList is the answer of GET /v1/runs.
type RunList struct {
	Runs []store.Run `json:"runs"`
}

// EventList is the answer of GET /v1/runs/{id}/events.
type EventList struct {
	Events []store.Event `json:"events"`
}

// maxRunID bounds a run id from a path: ids are UUIDs; anything much longer is not one and is not looked up.
const maxRunID = 128

// heartbeat is how long an event stream stays silent before it sends an SSE comment, so that proxies keep it
// open and a client that left is noticed.
const heartbeat = 15 * time.Second

func (s *Server) handleRuns(w http.ResponseWriter, r *http.Request) {
	f, err := parseRunsQuery(r.URL.Query())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	f.Tenant = tenantOf(r) // from the token, always
	runs, err := s.backend.Runs(r.Context(), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if runs == nil {
		runs = []store.Run{}
	}
	writeJSON(w, http.StatusOK, RunList{Runs: runs})
}

// errRunNotFound is the one answer for a run that does not exist and for a run of another tenant: the same
// code, message and hint, so the two cannot be told apart.
func errRunNotFound(id string) error {
	return fault.New(fault.RunNotFound, "GET /v1/runs lists the runs of your tenant", "no run %q", id)
}

// runOf returns run id when it belongs to r's tenant.
func (s *Server) runOf(ctx context.Context, tenant, id string) (store.Run, error) {
	if id == "" || len(id) > maxRunID {
		return store.Run{}, errRunNotFound(id)
	}
	run, err := s.backend.Run(ctx, id)
	switch {
	case fault.Is(err, fault.RunNotFound) || errdefs.IsNotFound(err):
		return store.Run{}, errRunNotFound(id)
	case err != nil:
		return store.Run{}, err
	case run.Tenant != tenant:
		return store.Run{}, errRunNotFound(id)
	}
	return run, nil
}

func (s *Server) handleRun(w http.ResponseWriter, r *http.Request) {
	if err := checkQuery(r.URL.Query()); err != nil {
		s.writeError(w, r, err)
		return
	}
	run, err := s.runOf(r.Context(), tenantOf(r), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, run)
}

func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	q, err := parseEventsQuery(r.URL.Query())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	id := r.PathValue("id")
	run, err := s.runOf(r.Context(), tenantOf(r), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !q.follow {
		evs, err := s.backend.Events(r.Context(), store.EventFilter{RunID: run.ID, AfterSeq: q.after, Limit: q.limit})
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if evs == nil {
			evs = []store.Event{}
		}
		writeJSON(w, http.StatusOK, EventList{Events: evs})
		return
	}
	after, err := lastEventID(r, q.after)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.follow(w, r, run, after, func(ctx context.Context, after int64) ([]sseItem, error) {
		evs, err := s.backend.Events(ctx, store.EventFilter{RunID: run.ID, AfterSeq: after, Limit: maxPage})
		items := make([]sseItem, 0, len(evs))
		for _, e := range evs {
			line, err := json.Marshal(e)
			if err != nil {
				continue // a stored payload is compact JSON (store.PrepareEvent); this cannot happen
			}
			items = append(items, sseItem{seq: e.Seq, name: sseName(e.Name), data: line})
		}
		return items, err
	})
}

// lastEventID is after, raised to the id a reconnecting EventSource sends of the last message it saw.
func lastEventID(r *http.Request, after int64) (int64, error) {
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		return after, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, invalid("send the id of a message this stream sent", "Last-Event-ID %q is not a sequence number", v)
	}
	return max(after, n), nil
}

// sseItem is one message of a followed stream: its sequence number (the SSE id), event name and JSON data.
type sseItem struct {
	seq  int64
	name string
	data []byte
}

// follow streams run's records after seq (a page of at most maxPage at a time: its events, its log) as SSE
// until the run is over and every record of it was sent, the client leaves, or the server drains. It polls the
// backend every PollInterval.
func (s *Server) follow(w http.ResponseWriter, r *http.Request, run store.Run, after int64,
	page func(ctx context.Context, after int64) ([]sseItem, error)) {
	ctx := r.Context()
	h := w.Header()
	h.Set("Content-Type", ctSSE)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	tick := time.NewTicker(s.poll)
	defer tick.Stop()
	lastWrite := time.Now()
	for {
		// Read the status before the events: a run seen finished has appended all its events by then, so an
		// empty poll after it means the stream is complete.
		finished := store.Finished(run.Status)
		if !finished {
			cur, err := s.backend.Run(ctx, run.ID)
			if err != nil {
				s.streamError(w, r, err)
				return
			}
			run.Status = cur.Status
			finished = store.Finished(cur.Status)
		}
		evs, err := page(ctx, after)
		if err != nil {
			s.streamError(w, r, err)
			return
		}
		var buf bytes.Buffer
		for _, e := range evs {
			buf.WriteString("id: " + strconv.FormatInt(e.seq, 10) + "\nevent: " + e.name + "\ndata: ")
			buf.Write(e.data)
			buf.WriteString("\n\n")
			after = e.seq
		}
		done := finished && len(evs) == 0
		if done {
			buf.WriteString("event: end\ndata: {}\n\n")
		} else if buf.Len() == 0 && time.Since(lastWrite) >= heartbeat {
			buf.WriteString(": keepalive\n\n")
		}
		if buf.Len() > 0 {
			if _, err := w.Write(buf.Bytes()); err != nil || rc.Flush() != nil {
				return
			}
			lastWrite = time.Now()
		}
		if done {
			return
		}
		if len(evs) == maxPage {
			continue // more are waiting: no pause
		}
		select {
		case <-ctx.Done():
			infoOf(r).clientGone = true
			return
		case <-s.drain.stop:
			return // the client reconnects elsewhere with Last-Event-ID
		case <-tick.C:
		}
	}
}

// streamError ends an SSE stream with an error event.
func (s *Server) streamError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		infoOf(r).clientGone = true
		return
	}
	fe, _ := s.classify(r, err)
	line, _ := json.Marshal(map[string]errorBody{"error": wireError(fe)})
	_, _ = w.Write([]byte("event: error\ndata: " + string(line) + "\n\n"))
	_ = http.NewResponseController(w).Flush()
}

// sseName keeps an event name from breaking the SSE framing: names are constants of internal/events, but the
// store does not forbid a line break, and the stream must not trust it.
func sseName(name string) string {
	if strings.ContainsAny(name, "\r\n") {
		return "message"
	}
	return name
}
