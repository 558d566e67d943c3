package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
)

// BaseTemplate is the template the SDK asks for when its caller names none; it maps to the tenant's default.
const BaseTemplate = "base"

// authControl checks a control-plane request's X-API-KEY (a sandkeep API token) for scope.
func (f *Front) authControl(r *http.Request, scope string) (store.Token, error) {
	_, hooks := f.backend()
	return hooks.Authenticate(r, r.Header.Get("X-API-KEY"), scope)
}

// ownedBy authenticates a control-plane call with scope and finds the sandbox of its path, answering the error
// itself when either fails (ok false).
func (f *Front) ownedBy(w http.ResponseWriter, r *http.Request, scope string) (tok store.Token, rec *record, ok bool) {
	tok, err := f.authControl(r, scope)
	if err == nil {
		rec, err = f.owned(r, tok)
	}
	if err != nil {
		f.writeError(w, r, err)
		return tok, nil, false
	}
	return tok, rec, true
}

// owned returns the record of the path's sandbox if the request's tenant owns it; another tenant's sandbox
// answers exactly as one that does not exist.
func (f *Front) owned(r *http.Request, tok store.Token) (*record, error) {
	id := r.PathValue("id")
	rec, err := f.recs.get(id)
	if errors.Is(err, errNoRecord) || (err == nil && rec.Tenant != tok.Tenant) {
		return nil, notFound(id)
	}
	return rec, err
}

// decode reads a small JSON body into v; an empty body leaves v as it is.
func decode(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
	if err != nil {
		return err
	}
	if len(body) > 1<<20 {
		return &statusError{status: http.StatusRequestEntityTooLarge, msg: "the request body is over 1 MiB"}
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest("the request body is not valid JSON: %v", err)
	}
	return nil
}

// timeoutOf turns E2B's timeout in seconds into a duration within the operator's bound; nil takes def.
func (f *Front) timeoutOf(secs *int64, def time.Duration) (time.Duration, error) {
	if secs == nil {
		return def, nil
	}
	if *secs <= 0 {
		return 0, badRequest("timeout must be a positive number of seconds, got %d", *secs)
	}
	d := time.Duration(*secs) * time.Second
	if d > f.cfg.MaxTimeout || *secs > int64(f.cfg.MaxTimeout/time.Second) {
		return 0, badRequest("timeout %ds is past this server's bound of %ds", *secs, int64(f.cfg.MaxTimeout/time.Second))
	}
	return d, nil
}

type createBody struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int64            `json:"timeout"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	AutoPause  bool              `json:"autoPause"`
	Secure     *bool             `json:"secure"`
	// AllowInternet is E2B's allow_internet_access (the SDK's allowInternetAccess); Network its network config.
	AllowInternet *bool           `json:"allow_internet_access"`
	Network       json.RawMessage `json:"network"`
}

// sandboxJSON is E2B's Sandbox and SandboxDetail/ListedSandbox in one: the SDK reads the fields it knows.
type sandboxJSON struct {
	TemplateID      string            `json:"templateID"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain"`
	StartedAt       *time.Time        `json:"startedAt,omitempty"`
	EndAt           *time.Time        `json:"endAt,omitempty"`
	State           string            `json:"state,omitempty"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	// AllowInternet and Network are what the sandbox's network was asked to be (getInfo's allowInternetAccess
	// and network), as given.
	AllowInternet *bool        `json:"allowInternetAccess,omitempty"`
	Network       *networkJSON `json:"network,omitempty"`
	CPUCount      int          `json:"cpuCount"`
	MemoryMB      int          `json:"memoryMB"`
	DiskSizeMB    int          `json:"diskSizeMB"`
}

func (f *Front) describe(r *record, withToken bool) sandboxJSON {
	s := sandboxJSON{TemplateID: r.Template, SandboxID: r.ID, ClientID: "sandkeep", EnvdVersion: EnvdVersion,
		State: r.state(), Metadata: r.Metadata, AllowInternet: r.AllowInternet, Network: r.Network}
	started, end := r.StartedAt, r.EndAt
	s.StartedAt, s.EndAt = &started, &end
	if withToken {
		s.EnvdAccessToken = r.AccessToken
	}
	return s
}

func (f *Front) handleCreate(w http.ResponseWriter, r *http.Request) {
	tok, err := f.authControl(r, auth.ScopeExec)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	var body createBody
	if err := decode(r, &body); err != nil {
		f.writeError(w, r, err)
		return
	}
	timeout, err := f.timeoutOf(body.Timeout, DefaultTimeout)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	tmpl := body.TemplateID
	if tmpl == "" {
		tmpl = BaseTemplate
	}
	op := tmpl
	if tmpl == BaseTemplate {
		op = ""
	}
	now := f.now().UTC()
	rec := &record{ID: newID(), Tenant: tok.Tenant, Template: tmpl, OpTemplate: op, Metadata: body.Metadata,
		Env: body.EnvVars, StartedAt: now, EndAt: now.Add(timeout), AutoPause: body.AutoPause,
		AccessToken: newAccessToken(), TokenID: tok.ID, TokenHash: tok.Hash}
	b, _ := f.backend()
	key, err := keyOf(rec)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	// A template id that names one of the tenant's snapshots makes the sandbox from it (its workspace, its
	// template), admitted and bounded as a restore through /v1 is.
	snap, err := tenantSnapshot(r.Context(), b, tok.Tenant, tmpl)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	if snap != nil {
		rec.OpTemplate = snap.Template
	}
	// The network asked for is admitted before anything is made: a block that would widen the template's
	// (NETWORK_WIDENED) or that sandkeep cannot apply (NETWORK_INVALID) is refused with nothing left behind.
	netw, err := parseNetwork(body.Network)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	if rec.Networked, err = f.admitNetwork(r, b, rec, body.AllowInternet, netw); err != nil {
		f.writeError(w, r, err)
		return
	}
	rec.AllowInternet, rec.Network = body.AllowInternet, netw
	if snap != nil {
		sn, _ := snapshotter(b)
		if _, err := sn.RestoreSnapshot(r.Context(), snap.Name, key, service.AdmitRequest{RequestID: f.requestID(r)}, service.RestoreOptions{}); err != nil {
			f.cleanup(b, key)
			f.writeError(w, r, err)
			return
		}
	}
	// The sandbox is made now (admitted as any command is: template, limits, run, events), so that a refused
	// template or a full tenant answers here and nothing is left of a refused sandbox.
	if _, err := f.exec(r.Context(), b, rec, []string{"true"}, nil); err != nil {
		f.cleanup(b, key)
		f.writeError(w, r, err)
		return
	}
	if err := f.recs.put(rec); err != nil {
		f.cleanup(b, key)
		f.writeError(w, r, err)
		return
	}
	f.hold(r.Context(), rec.ID)
	writeJSON(w, http.StatusCreated, f.describe(rec, true))
}

// cleanup removes what a refused create may have left.
func (f *Front) cleanup(b service.Backend, key sandkeep.Key) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = b.Remove(ctx, key)
}

// exec runs one command to its end in rec's sandbox, with the sandbox's env vars and template.
func (f *Front) exec(ctx context.Context, b service.Backend, rec *record, argv []string, env map[string]string) (*sandkeep.ExecResult, error) {
	key, err := keyOf(rec)
	if err != nil {
		return nil, err
	}
	return b.Exec(ctx, key, service.AdmitRequest{Template: rec.OpTemplate, Network: rec.network()},
		sandkeep.ExecRequest{Argv: argv, Env: envList(rec.Env, env), Timeout: 2 * time.Minute})
}

// envList merges the sandbox's env vars with a command's (the command's win) into sorted "K=V" entries.
func envList(base, over map[string]string) []string {
	m := make(map[string]string, len(base)+len(over))
	for k, v := range base {
		m[k] = v
	}
	for k, v := range over {
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

func (f *Front) handleList(w http.ResponseWriter, r *http.Request) {
	tok, err := f.authControl(r, auth.ScopeRead)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	q := r.URL.Query()
	want, err := metadataFilter(q.Get("metadata"))
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	var states []string
	for _, s := range q["state"] {
		states = append(states, strings.Split(s, ",")...)
	}
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			f.writeError(w, r, badRequest("limit must be 1..1000, got %q", l))
			return
		}
		limit = n
	}
	var after time.Time
	if v := q.Get("startedAfter"); v != "" {
		if after, err = time.Parse(time.RFC3339Nano, v); err != nil {
			f.writeError(w, r, badRequest("startedAfter must be an RFC 3339 time, got %q", v))
			return
		}
	}
	recs, err := f.recs.all(tok.Tenant)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	out := []sandboxJSON{}
	from := q.Get("nextToken")
	skipping := from != ""
	next := ""
	for _, rec := range recs {
		if skipping {
			skipping = rec.ID != from
			continue
		}
		if len(states) > 0 && !slices.Contains(states, rec.state()) {
			continue
		}
		if tmpl := q.Get("template"); (tmpl != "" && tmpl != rec.Template) || !rec.StartedAt.After(after) {
			continue
		}
		if !matches(rec.Metadata, want) {
			continue
		}
		if len(out) == limit {
			next = out[len(out)-1].SandboxID
			break
		}
		out = append(out, f.describe(rec, false))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

// metadataFilter parses the SDK's metadata query: "k=v&k2=v2", URL-encoded inside the parameter.
func metadataFilter(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	v, err := url.ParseQuery(s)
	if err != nil {
		return nil, badRequest("metadata filter %q: %v", s, err)
	}
	out := map[string]string{}
	for k, vs := range v {
		out[k] = vs[len(vs)-1]
	}
	return out, nil
}

func matches(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

func (f *Front) handleGet(w http.ResponseWriter, r *http.Request) {
	_, rec, ok := f.ownedBy(w, r, auth.ScopeRead)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, f.describe(rec, true))
}

func (f *Front) handleKill(w http.ResponseWriter, r *http.Request) {
	_, rec, ok := f.ownedBy(w, r, auth.ScopeExec)
	if !ok {
		return
	}
	b, _ := f.backend()
	if err := f.kill(r.Context(), b, rec); err != nil {
		f.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (f *Front) handleTimeout(w http.ResponseWriter, r *http.Request) {
	_, rec, ok := f.ownedBy(w, r, auth.ScopeExec)
	if !ok {
		return
	}
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decode(r, &body); err != nil {
		f.writeError(w, r, err)
		return
	}
	if body.Timeout == nil {
		f.writeError(w, r, badRequest("send the timeout in seconds"))
		return
	}
	d, err := f.timeoutOf(body.Timeout, 0)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	end := f.now().UTC().Add(d)
	if _, err := f.recs.update(rec.ID, func(r *record) error { r.EndAt = end; return nil }); err != nil {
		f.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (f *Front) handlePause(w http.ResponseWriter, r *http.Request) {
	_, rec, ok := f.ownedBy(w, r, auth.ScopeExec)
	if !ok {
		return
	}
	if rec.Paused {
		f.writeError(w, r, &statusError{status: http.StatusConflict, msg: "sandbox " + rec.ID + " is already paused"})
		return
	}
	b, _ := f.backend()
	if err := f.pause(r.Context(), b, rec); err != nil {
		f.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleConnect resumes a paused sandbox (its workspace kept; processes do not survive a pause) and extends
// its timeout; a running one only gets the new timeout, when it is later than its end.
func (f *Front) handleConnect(w http.ResponseWriter, r *http.Request) {
	_, rec, ok := f.ownedBy(w, r, auth.ScopeExec)
	if !ok {
		return
	}
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decode(r, &body); err != nil {
		f.writeError(w, r, err)
		return
	}
	d, err := f.timeoutOf(body.Timeout, DefaultTimeout)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	status := http.StatusOK
	if rec.Paused {
		b, _ := f.backend()
		if _, err := f.exec(r.Context(), b, rec, []string{"true"}, nil); err != nil {
			f.writeError(w, r, err)
			return
		}
		status = http.StatusCreated
	}
	end := f.now().UTC().Add(d)
	rec, err = f.recs.update(rec.ID, func(r *record) error {
		if r.Paused || end.After(r.EndAt) {
			r.EndAt = end
		}
		r.Paused = false
		return nil
	})
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	writeJSON(w, status, f.describe(rec, true))
}
