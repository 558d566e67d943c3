package ui

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/internal/store"
)

// Live updates are server-sent events. A stream polls the store (or the backend) every PollInterval, re-checks
// the viewer's token every recheck, ends after StreamMax (the browser's EventSource reconnects, with
// Last-Event-ID for a run's events) and ends at once when the UI is closed.

const recheck = 10 * time.Second

// stream runs fn with an SSE writer until fn returns, the client goes away, the stream's time is up, or the UI
// closes. fn returns false to end the stream.
func (u *UI) stream(w http.ResponseWriter, r *http.Request, v *viewer, tick func(ctx context.Context, sw *sse) bool) {
	if !u.join() {
		u.fail(w, r, v, http.StatusServiceUnavailable, "The server is shutting down.", "Reload the page in a moment.")
		return
	}
	defer u.wg.Done()
	ctx, cancel := context.WithTimeout(r.Context(), u.cfg.StreamMax)
	defer cancel()
	stop := context.AfterFunc(u.ctx, cancel)
	defer stop()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	sw := &sse{w: w, rc: http.NewResponseController(w)}
	_, _ = io.WriteString(w, "retry: 2000\n\n")
	if sw.flush() != nil {
		return
	}
	poll := time.NewTicker(u.cfg.PollInterval)
	defer poll.Stop()
	checked := time.Now()
	for {
		if !tick(ctx, sw) || sw.err != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
		}
		if time.Since(checked) >= recheck {
			if u.viewerOf(r.WithContext(ctx)) == nil { // signed out, revoked or expired: stop telling
				sw.send("signedout", "", "{}")
				return
			}
			checked = time.Now()
		}
	}
}

type sse struct {
	w   io.Writer
	rc  *http.ResponseController
	err error
}

// send writes one event; data may span lines. A write error ends the stream.
func (s *sse) send(event, id, data string) {
	if s.err != nil {
		return
	}
	var b bytes.Buffer
	if id != "" {
		fmt.Fprintf(&b, "id: %s\n", id)
	}
	fmt.Fprintf(&b, "event: %s\n", event)
	// A line of an event stream ends at CRLF, LF or a lone CR: split at all three, so that no CR in data (a
	// command's text in a rendered row) ends a data line early and starts a field or an event of its own.
	for _, line := range strings.Split(lineEnds.Replace(data), "\n") {
		fmt.Fprintf(&b, "data: %s\n", line)
	}
	b.WriteByte('\n')
	if _, s.err = s.w.Write(b.Bytes()); s.err == nil {
		s.err = s.flush()
	}
}

// lineEnds turns every end of line an event stream knows into LF.
var lineEnds = strings.NewReplacer("\r\n", "\n", "\r", "\n")

func (s *sse) flush() error { return s.rc.Flush() }

// handleRunLive streams a run's events after the seq the page showed (?after=, or Last-Event-ID on a
// reconnect), then "done" with the run's final status once it is finished and every event was sent.
func (u *UI) handleRunLive(w http.ResponseWriter, r *http.Request, v *viewer) {
	ctx, cancel := pageCtx(r)
	run, ok := u.visibleRun(ctx, w, r, v)
	cancel()
	if !ok {
		return
	}
	after, _ := strconv.ParseInt(r.URL.Query().Get("after"), 10, 64)
	if id, err := strconv.ParseInt(r.Header.Get("Last-Event-ID"), 10, 64); err == nil && id > after {
		after = id
	}
	u.stream(w, r, v, func(ctx context.Context, sw *sse) bool {
		// Read the run's status before its events: a run that is finished now has all its events stored.
		cur, err := u.cfg.Store.GetRun(ctx, run.ID)
		if err != nil {
			return ctx.Err() == nil // a passing store failure: try again on the next tick
		}
		for {
			evs, err := u.cfg.Store.ListEvents(ctx, store.EventFilter{RunID: run.ID, AfterSeq: after, Limit: 200})
			if err != nil {
				return ctx.Err() == nil
			}
			for _, e := range evs {
				raw, _ := json.Marshal(lineOf(run, e))
				sw.send("ev", strconv.FormatInt(e.Seq, 10), string(raw))
				after = e.Seq
			}
			if len(evs) < 200 || sw.err != nil {
				break
			}
		}
		if store.Finished(cur.Status) {
			raw, _ := json.Marshal(map[string]string{"status": cur.Status, "failure_code": cur.FailureCode,
				"duration": fmtDuration(cur.FinishedAt.Sub(cur.CreatedAt))})
			sw.send("done", "", string(raw))
			return false
		}
		return true
	})
}

// handleSandboxesLive streams the sandboxes table's body, rendered as on the page, whenever it changes.
func (u *UI) handleSandboxesLive(w http.ResponseWriter, r *http.Request, v *viewer) {
	var (
		last     string
		lastSent time.Time
		sent     bool
	)
	u.stream(w, r, v, func(ctx context.Context, sw *sse) bool {
		// The sandbox list asks the engine: once a second is plenty, whatever the poll interval.
		if sent && time.Since(lastSent) < time.Second {
			return true
		}
		lctx, cancel := context.WithTimeout(ctx, pageTimeout)
		rows, err := u.sandboxRows(lctx, v)
		cancel()
		if err != nil {
			return ctx.Err() == nil
		}
		var b bytes.Buffer
		if err := u.rows.ExecuteTemplate(&b, "rows", sandboxesData{Rows: rows, CSRF: v.sess.csrf, Admin: v.admin}); err != nil {
			u.log.Error("ui: render rows", "err", err)
			return false
		}
		lastSent = time.Now()
		if s := b.String(); !sent || s != last {
			last, sent = s, true
			sw.send("rows", "", s)
		}
		return true
	})
}
