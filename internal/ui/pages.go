package ui

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
)

// page names, the template files under templates/.
var pageNames = []string{"signin", "error", "overview", "sandboxes", "runs", "run", "egress", "latency"}

func parseTemplates() (map[string]*template.Template, *template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/rows.html", "templates/"+name+".html")
		if err != nil {
			return nil, nil, fmt.Errorf("ui: template %s: %w", name, err)
		}
		pages[name] = t
	}
	rows, err := template.New("rows.html").Funcs(funcs).ParseFS(templateFS, "templates/rows.html")
	if err != nil {
		return nil, nil, fmt.Errorf("ui: template rows: %w", err)
	}
	return pages, rows, nil
}

var funcs = template.FuncMap{
	"ago":       ago,
	"stamp":     func(t time.Time) string { return stamp(t) },
	"iso":       func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) },
	"ms":        fmtMS,
	"dash":      func(s string) string { return orDash(s) },
	"mib":       func(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) },
	"lower":     strings.ToLower,
	"stateCls":  stateClass,
	"hasSuffix": strings.HasSuffix,
}

// layoutData is what the layout needs around every page.
type layoutData struct {
	Title  string
	Nav    string // the current section
	Viewer *viewer
	CSRF   string
	Page   any
}

// Who says who is signed in, for the header.
func (d layoutData) Who() string {
	if d.Viewer == nil {
		return ""
	}
	switch {
	case d.Viewer.operator:
		return "operator (every tenant)"
	case d.Viewer.admin:
		return d.Viewer.tok.Tenant + " · admin"
	}
	return d.Viewer.tok.Tenant
}

// Admin reports whether the viewer is an admin.
func (d layoutData) Admin() bool { return d.Viewer != nil && d.Viewer.admin }

var titles = map[string]string{"signin": "Sign in", "error": "Error", "overview": "Overview", "sandboxes": "Sandboxes",
	"runs": "Runs", "run": "Run", "egress": "Egress", "latency": "Latency"}

// render writes page name with data inside the layout. The page is rendered into a buffer first, so a template
// error is a 500, not half a page.
func (u *UI) render(w http.ResponseWriter, r *http.Request, v *viewer, status int, name string, data any) {
	ld := layoutData{Title: titles[name], Nav: name, Viewer: v, Page: data}
	if v != nil {
		ld.CSRF = v.sess.csrf
	}
	var b bytes.Buffer
	if err := u.pages[name].Execute(&b, ld); err != nil {
		u.log.Error("ui: render", "page", name, "err", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

type errorData struct {
	Status        int
	Message, Hint string
}

// fail renders the error page. cause, when set, is logged, never shown: it may name hosts or files.
func (u *UI) fail(w http.ResponseWriter, r *http.Request, v *viewer, status int, msg, hint string) {
	u.render(w, r, v, status, "error", errorData{Status: status, Message: msg, Hint: hint})
}

// notFound is the one answer for a missing object and for another tenant's: the same status and the same page.
func (u *UI) notFound(w http.ResponseWriter, r *http.Request, v *viewer) {
	u.fail(w, r, v, http.StatusNotFound, "Nothing here: no such page, run or sandbox.", "Go back to the overview.")
}

// failErr answers a backend or store error: not found as notFound, anything else as 503 with the cause logged.
func (u *UI) failErr(w http.ResponseWriter, r *http.Request, v *viewer, what string, err error) {
	switch c := fault.CodeOf(err); {
	case c == fault.NotFound || c == fault.RunNotFound || errdefs.IsNotFound(err):
		u.notFound(w, r, v)
	case errors.Is(err, context.Canceled):
	default:
		u.log.Error("ui: "+what, "err", err)
		u.fail(w, r, v, http.StatusServiceUnavailable, "The server could not read "+what+" just now.",
			"Try again shortly; if it persists, check the server's log and its store and driver (GET /readyz).")
	}
}

func pageCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), pageTimeout)
}

// --- overview ---

type overviewData struct {
	Day, All      store.RunCounts
	States        []stateCount
	Sandboxes     int
	Blocked       []refusal
	BlockedN      int  // refused requests in 24h
	BlockedCapped bool // BlockedN is the bound: there were at least as many
	Refused       []store.Run
	Truncated     bool // the sandbox list could not be read
}

type stateCount struct {
	State string
	N     int
}

// refusal is one network_blocked event as a line of the overview.
type refusal struct {
	Time                time.Time
	Tenant, User, RunID string
	Host, Reason, Rule  string
	Port                int
	Sandbox             string
}

func (u *UI) handleOverview(w http.ResponseWriter, r *http.Request, v *viewer) {
	ctx, cancel := pageCtx(r)
	defer cancel()
	var d overviewData
	var err error
	if d.Day, err = u.cfg.Store.CountRuns(ctx, v.scope(), u.now().Add(-24*time.Hour)); err != nil {
		u.failErr(w, r, v, "the run counts", err)
		return
	}
	if d.All, err = u.cfg.Store.CountRuns(ctx, v.scope(), time.Time{}); err != nil {
		u.failErr(w, r, v, "the run counts", err)
		return
	}
	boxes, err := u.sandboxes(ctx, v)
	if err != nil {
		u.log.Warn("ui: overview: list sandboxes", "err", err)
		d.Truncated = true
	}
	d.Sandboxes = len(boxes)
	counts := map[string]int{}
	for _, sb := range boxes {
		counts[sb.State]++
	}
	for s, n := range counts {
		d.States = append(d.States, stateCount{s, n})
	}
	sort.Slice(d.States, func(i, j int) bool { return d.States[i].State < d.States[j].State })
	hosts, err := u.cfg.Store.RefusedHosts(ctx, store.EventQuery{Tenant: v.scope(), Since: u.now().Add(-24 * time.Hour),
		Limit: store.MaxEventLimit, Newest: egressEvents})
	if err != nil {
		u.failErr(w, r, v, "the refused hosts", err)
		return
	}
	for _, h := range hosts {
		d.BlockedN += h.Count
	}
	d.BlockedCapped = d.BlockedN >= egressEvents
	if d.Blocked, err = u.refusals(ctx, v, 10); err != nil {
		u.failErr(w, r, v, "the refusals", err)
		return
	}
	page, err := u.cfg.Store.QueryRuns(ctx, store.RunQuery{Tenant: v.scope(), Admission: store.AdmissionRefused, Limit: 10})
	if err != nil {
		u.failErr(w, r, v, "the refused runs", err)
		return
	}
	d.Refused = page.Runs
	u.render(w, r, v, http.StatusOK, "overview", d)
}

func (u *UI) refusals(ctx context.Context, v *viewer, n int) ([]refusal, error) {
	evs, err := u.cfg.Store.RecentEvents(ctx, store.EventQuery{Tenant: v.scope(), Names: []string{events.NameNetworkBlocked}, Limit: n})
	if err != nil {
		return nil, err
	}
	out := make([]refusal, 0, len(evs))
	for _, e := range evs {
		var b events.NetworkBlocked
		_ = json.Unmarshal(e.Payload, &b) // a payload that does not decode still shows its time and run
		out = append(out, refusal{Time: e.Time, Tenant: e.Tenant, User: e.User, RunID: e.RunID, Host: b.Host,
			Port: b.Port, Reason: b.Reason, Rule: b.Rule, Sandbox: b.Sandbox})
	}
	return out, nil
}

// --- sandboxes ---

// sandboxRow is one sandbox as the table shows it.
type sandboxRow struct {
	sandkeep.Sandbox
	LastCommand string
	LastAt      time.Time
	LastRun     string
}

type sandboxesData struct {
	Rows   []sandboxRow
	Done   string // what the last action did
	CSRF   string
	Admin  bool
	Notice string
}

// sandboxes lists the sandboxes the viewer sees: every tenant's for the operator (when the backend can list
// them all), else the viewer's tenant's, whatever its scopes.
func (u *UI) sandboxes(ctx context.Context, v *viewer) ([]sandkeep.Sandbox, error) {
	if al, ok := u.cfg.Backend.(AllLister); ok && v.operator {
		return al.ListAll(ctx)
	}
	return u.cfg.Backend.List(ctx, v.tok.Tenant)
}

// sandboxRows lists the sandboxes with the last command each ran (from the newest exec_started events).
func (u *UI) sandboxRows(ctx context.Context, v *viewer) ([]sandboxRow, error) {
	boxes, err := u.sandboxes(ctx, v)
	if err != nil {
		return nil, err
	}
	// The last command of each sandbox: one bounded query per sandbox when there are few (a user's newest
	// exec_started), else the newest exec_started events of the viewer's scope.
	last := map[[2]string]store.RunEvent{}
	if len(boxes) <= perSandboxQueries {
		for _, sb := range boxes {
			if !v.sees(sb.Tenant) {
				continue
			}
			evs, err := u.cfg.Store.RecentEvents(ctx, store.EventQuery{Tenant: sb.Tenant, User: sb.User, Names: []string{events.NameExecStarted}, Limit: 1})
			if err != nil {
				return nil, err
			}
			if len(evs) > 0 {
				last[[2]string{sb.Tenant, sb.User}] = evs[0]
			}
		}
	} else {
		evs, err := u.cfg.Store.RecentEvents(ctx, store.EventQuery{Tenant: v.scope(), Names: []string{events.NameExecStarted}, Limit: 1000})
		if err != nil {
			return nil, err
		}
		for _, e := range evs {
			k := [2]string{e.Tenant, e.User}
			if _, ok := last[k]; !ok {
				last[k] = e
			}
		}
	}
	rows := make([]sandboxRow, 0, len(boxes))
	for _, sb := range boxes {
		if !v.sees(sb.Tenant) {
			continue
		}
		row := sandboxRow{Sandbox: sb}
		if e, ok := last[[2]string{sb.Tenant, sb.User}]; ok {
			var p events.ExecStarted
			_ = json.Unmarshal(e.Payload, &p)
			row.LastCommand, row.LastAt, row.LastRun = p.Command, e.Time, e.RunID
		}
		rows = append(rows, row)
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Tenant != rows[j].Tenant {
			return rows[i].Tenant < rows[j].Tenant
		}
		return rows[i].User < rows[j].User
	})
	return rows, nil
}

func (u *UI) handleSandboxes(w http.ResponseWriter, r *http.Request, v *viewer) {
	ctx, cancel := pageCtx(r)
	defer cancel()
	rows, err := u.sandboxRows(ctx, v)
	if err != nil {
		u.failErr(w, r, v, "the sandboxes", err)
		return
	}
	d := sandboxesData{Rows: rows, CSRF: v.sess.csrf, Admin: v.admin}
	switch r.URL.Query().Get("done") {
	case "stopped":
		d.Done = "Stopped " + r.URL.Query().Get("who") + "."
	case "removed":
		d.Done = "Removed " + r.URL.Query().Get("who") + " and its workspace."
	}
	u.render(w, r, v, http.StatusOK, "sandboxes", d)
}

// handleSandboxAction stops or removes a sandbox (admin only). A tenant that the viewer cannot see, and a
// sandbox that does not exist, answer the same 404.
func (u *UI) handleSandboxAction(w http.ResponseWriter, r *http.Request, v *viewer) {
	if !v.admin {
		u.fail(w, r, v, http.StatusForbidden, "Stopping and removing sandboxes needs an admin token.",
			"Sign in with a token that has the admin scope (sandkeep token create --scopes admin).")
		return
	}
	tenant, user := r.PostFormValue("tenant"), r.PostFormValue("user")
	if !v.sees(tenant) {
		u.notFound(w, r, v)
		return
	}
	key, err := sandkeep.NewKey(tenant, user)
	if err != nil {
		u.notFound(w, r, v)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
	defer cancel()
	remove := strings.HasSuffix(r.URL.Path, "/remove")
	done := "stopped"
	if remove {
		err, done = u.cfg.Backend.Remove(ctx, key), "removed"
	} else {
		err = u.cfg.Backend.Stop(ctx, key)
	}
	if err != nil {
		u.failErr(w, r, v, "the sandbox", err)
		return
	}
	u.log.Info("ui: sandbox "+done, "tenant", tenant, "user", user, "token", v.tok.ID)
	q := url.Values{"done": {done}, "who": {tenant + "/" + user}}
	http.Redirect(w, r, Prefix+"sandboxes?"+q.Encode(), http.StatusSeeOther)
}

// --- runs ---

type runsData struct {
	Q      store.RunQuery
	Runs   []store.Run
	More   bool
	Next   string // the query string of the next page
	First  string // the query string of the first page (empty on it)
	Admin  bool
	Status []string
	Modes  []string
	Driver []string
}

func (u *UI) handleRuns(w http.ResponseWriter, r *http.Request, v *viewer) {
	qs := r.URL.Query()
	q := store.RunQuery{Tenant: qs.Get("tenant"), User: qs.Get("user"), Status: qs.Get("status"),
		FailureCode: qs.Get("failure"), Mode: qs.Get("mode"), Driver: qs.Get("driver"), Limit: store.DefaultPageSize}
	if !v.operator {
		q.Tenant = v.tok.Tenant
	}
	if c, ok := parseCursor(qs.Get("after")); ok {
		q.After = c
	}
	if q.Status != "" && !store.Finished(q.Status) && q.Status != store.StatusRunning {
		q.Status = ""
	}
	ctx, cancel := pageCtx(r)
	defer cancel()
	page, err := u.cfg.Store.QueryRuns(ctx, q)
	if err != nil {
		u.failErr(w, r, v, "the runs", err)
		return
	}
	d := runsData{Q: q, Runs: page.Runs, More: page.More, Admin: v.operator,
		Status: []string{store.StatusRunning, store.StatusSucceeded, store.StatusFailed, store.StatusFailedResumable},
		Modes:  []string{"auto", "inline", "none"}, Driver: []string{"docker", "kubernetes", "host"}}
	if page.More && len(page.Runs) > 0 {
		last := page.Runs[len(page.Runs)-1]
		next := url.Values{}
		for k, vs := range qs {
			if k != "after" {
				next[k] = vs
			}
		}
		next.Set("after", fmtCursor(store.Cursor{CreatedAt: last.CreatedAt, ID: last.ID}))
		d.Next = next.Encode()
	}
	if !q.After.IsZero() {
		first := url.Values{}
		for k, vs := range qs {
			if k != "after" {
				first[k] = vs
			}
		}
		d.First = "?" + first.Encode()
	}
	u.render(w, r, v, http.StatusOK, "runs", d)
}

// A cursor in a URL is the run's creation time in Unix milliseconds, a dot, and its id.
func fmtCursor(c store.Cursor) string {
	return strconv.FormatInt(c.CreatedAt.UnixMilli(), 10) + "." + c.ID
}

func parseCursor(s string) (store.Cursor, bool) {
	msText, id, ok := strings.Cut(s, ".")
	if !ok || id == "" || len(id) > 64 {
		return store.Cursor{}, false
	}
	ms, err := strconv.ParseInt(msText, 10, 64)
	if err != nil || ms <= 0 {
		return store.Cursor{}, false
	}
	return store.Cursor{CreatedAt: time.UnixMilli(ms).UTC(), ID: id}, true
}

// --- one run ---

type runData struct {
	Run       store.Run
	Events    []eventLine
	LastSeq   int64
	Live      bool
	Truncated bool
	Duration  string
	// Logs is the run's log (store.RunLog), shown as text: escaped like any other.
	Logs          []store.RunLog
	LogsTruncated bool
}

// maxRunLogs bounds the log entries a run page shows; `sandkeep logs --run` has them all.
const maxRunLogs = 2000

// eventLine is one event of a run's timeline.
type eventLine struct {
	Seq     int64     `json:"seq"`
	Time    time.Time `json:"-"`
	Stamp   string    `json:"stamp"`
	Offset  string    `json:"offset"` // since the run began
	Name    string    `json:"name"`
	Summary string    `json:"summary"`
	Class   string    `json:"class"` // ok, warn, bad, or ""
}

const maxRunEvents = 2000

// perSandboxQueries is how many sandboxes get a query of their own for their last command.
const perSandboxQueries = 50

func (u *UI) handleRun(w http.ResponseWriter, r *http.Request, v *viewer) {
	ctx, cancel := pageCtx(r)
	defer cancel()
	run, ok := u.visibleRun(ctx, w, r, v)
	if !ok {
		return
	}
	evs, err := u.cfg.Store.ListEvents(ctx, store.EventFilter{RunID: run.ID, Limit: maxRunEvents + 1})
	if err != nil {
		u.failErr(w, r, v, "the run's events", err)
		return
	}
	d := runData{Run: run, Live: run.Status == store.StatusRunning}
	if len(evs) > maxRunEvents {
		evs, d.Truncated = evs[:maxRunEvents], true
	}
	for _, e := range evs {
		d.Events = append(d.Events, lineOf(run, e))
		d.LastSeq = e.Seq
	}
	if !run.FinishedAt.IsZero() {
		d.Duration = fmtDuration(run.FinishedAt.Sub(run.CreatedAt))
	}
	// The run's log: what the driver did and what the setup steps printed (bounded per run by the store).
	logs, err := u.cfg.Store.ListRunLogs(ctx, store.RunLogFilter{RunID: run.ID, Limit: maxRunLogs + 1})
	if err != nil {
		u.failErr(w, r, v, "the run's log", err)
		return
	}
	if len(logs) > maxRunLogs {
		logs, d.LogsTruncated = logs[:maxRunLogs], true
	}
	d.Logs = logs
	u.render(w, r, v, http.StatusOK, "run", d)
}

// visibleRun returns the run of the path's id when the viewer may see it; else it answers 404, the same for a
// missing run, a malformed id and another tenant's run.
func (u *UI) visibleRun(ctx context.Context, w http.ResponseWriter, r *http.Request, v *viewer) (store.Run, bool) {
	id := r.PathValue("id")
	run, err := u.cfg.Store.GetRun(ctx, id)
	if errdefs.IsNotFound(err) || errdefs.IsInvalidArgument(err) || (err == nil && !v.sees(run.Tenant)) {
		u.notFound(w, r, v)
		return store.Run{}, false
	}
	if err != nil {
		u.failErr(w, r, v, "the run", err)
		return store.Run{}, false
	}
	return run, true
}

// lineOf describes e for the timeline. Payloads never carry secrets (package events), so what they say may be
// shown; it is escaped like any text.
func lineOf(run store.Run, e store.Event) eventLine {
	l := eventLine{Seq: e.Seq, Time: e.Time, Stamp: e.Time.UTC().Format("15:04:05.000"), Name: e.Name,
		Offset: "+" + fmtDuration(e.Time.Sub(run.CreatedAt))}
	p, err := e.Decode()
	if err != nil {
		l.Summary = string(e.Payload)
		return l
	}
	switch p := p.(type) {
	case events.ExecStarted:
		l.Summary = fmt.Sprintf("%s started (transport %s, waited %s for the gate)", orDash(p.Command), orDash(p.Transport), fmtMS(p.GateWaitMS))
	case events.ExecFinished:
		l.Summary = fmt.Sprintf("exit %d after %s", p.ExitCode, fmtMS(p.DurationMS))
		l.Class = "ok"
		if p.TimedOut {
			l.Summary, l.Class = fmt.Sprintf("timed out after %s; its process tree was killed", fmtMS(p.DurationMS)), "bad"
		} else if p.ExitCode != 0 {
			l.Class = "warn"
		}
		if p.Truncated {
			l.Summary += "; output truncated"
		}
	case events.NetworkBlocked:
		l.Summary = fmt.Sprintf("refused %s:%d: %s", p.Host, p.Port, orDash(p.Reason))
		if p.Rule != "" {
			l.Summary += " (rule " + p.Rule + ")"
		}
		l.Class = "bad"
	case events.SandboxStarted:
		verb := "started (it existed, stopped)"
		if p.Created {
			verb = "created"
		}
		l.Summary = fmt.Sprintf("sandbox %s %s in %s, image %s", p.Sandbox, verb, fmtMS(p.DurationMS), orDash(p.Image))
	case events.SandboxSkipped:
		l.Summary = fmt.Sprintf("no sandbox (mode %s from %s): %s", p.Mode, p.Source, p.Obstacle)
		l.Class = "warn"
		if p.Refused {
			l.Summary, l.Class = "refused: "+l.Summary, "bad"
		}
	case events.SandboxRecycled:
		l.Summary = fmt.Sprintf("sandbox %s recycled: %s", p.Sandbox, p.Reason)
		l.Class = "warn"
	default:
		raw, _ := json.Marshal(p)
		l.Summary = string(raw)
	}
	return l
}

// --- helpers ---

func ago(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := time.Since(t)
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s ago"
	}
	return fmtDuration(d) + " ago"
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func fmtMS(ms int64) string { return fmtDuration(time.Duration(ms) * time.Millisecond) }

// fmtDuration writes d short: 850ms, 3.2s, 4m10s, 2h5m, 3d4h.
func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func stateClass(state string) string {
	switch state {
	case "running", store.StatusSucceeded:
		return "ok"
	case store.StatusFailed:
		return "bad"
	case store.StatusFailedResumable, "exited", "stopped", "created":
		return "warn"
	}
	return ""
}
