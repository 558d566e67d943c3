package e2b

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/snapshots"
)

// E2B's fork and snapshots on sandkeep's (issue 23): a snapshot is a content-addressed archive of the sandbox's
// workspace (no memory: processes do not survive it), named in the tenant's namespace; its id is its name, which
// Sandbox.create() takes as a template to make a new sandbox from it. A fork is a new sandbox with a copy of
// the workspace. Both go through the backend's Forker and Snapshotter: the same admission, tenant bound, runs
// and events as /v1's fork and snapshot routes. Where the backend has none (or the driver cannot archive a
// workspace), the caller gets that error in E2B's shape.

// Bounds of fork.
const (
	maxForks           = 16
	defaultForkTimeout = 15 // seconds: E2B's default for forks (SandboxForkRequest.timeout)
)

// snapshotJSON is E2B's SnapshotInfo.
type snapshotJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func snapshotOf(sn snapshots.Snapshot) snapshotJSON {
	return snapshotJSON{SnapshotID: sn.Name, Names: []string{sn.Name}}
}

// snapshotName is the snapshot an E2B id names: its name, with E2B's default tag allowed.
func snapshotName(id string) string { return strings.TrimSuffix(id, ":default") }

func snapshotter(b service.Backend) (service.Snapshotter, error) {
	sn, ok := b.(service.Snapshotter)
	if !ok {
		return nil, service.ErrNoSnapshots()
	}
	return sn, nil
}

// tenantSnapshot returns tenant's snapshot that the template id names, if there is one.
func tenantSnapshot(ctx context.Context, b service.Backend, tenant, id string) (*snapshots.Snapshot, error) {
	sn, ok := b.(service.Snapshotter)
	if !ok || id == "" || id == BaseTemplate {
		return nil, nil
	}
	all, err := sn.Snapshots(ctx, tenant)
	if err != nil {
		if fault.Is(err, fault.SpecUnsupported) || fault.Is(err, fault.FilesUnavailable) {
			return nil, nil // no snapshots here: the id is a template's
		}
		return nil, err
	}
	name := snapshotName(id)
	for i := range all {
		if all[i].Name == name {
			return &all[i], nil
		}
	}
	return nil, nil
}

// handleCreateSnapshot is POST /sandboxes/{id}/snapshots: a snapshot of the sandbox's workspace, named by the
// caller or by sandkeep.
func (f *Front) handleCreateSnapshot(w http.ResponseWriter, r *http.Request) {
	_, rec, ok := f.ownedBy(w, r, auth.ScopeExec)
	if !ok {
		return
	}
	var body struct {
		Name string `json:"name"`
	}
	if err := decode(r, &body); err != nil {
		f.writeError(w, r, err)
		return
	}
	b, _ := f.backend()
	sn, err := snapshotter(b)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	key, err := keyOf(rec)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	snap, err := sn.CreateSnapshot(r.Context(), key, body.Name, f.requestID(r))
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotOf(snap))
}

// handleSnapshots is GET /snapshots: the tenant's snapshots, filtered by source sandbox and name, paginated.
func (f *Front) handleSnapshots(w http.ResponseWriter, r *http.Request) {
	tok, err := f.authControl(r, auth.ScopeRead)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	q := r.URL.Query()
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			f.writeError(w, r, badRequest("limit must be 1..1000, got %q", l))
			return
		}
		limit = n
	}
	b, _ := f.backend()
	sn, err := snapshotter(b)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	all, err := sn.Snapshots(r.Context(), tok.Tenant)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	slices.SortFunc(all, func(a, b snapshots.Snapshot) int { return strings.Compare(a.Name, b.Name) })
	out := []snapshotJSON{}
	from, next := q.Get("nextToken"), ""
	for _, s := range all {
		switch {
		case from != "" && s.Name <= from:
			continue
		case q.Get("sandboxID") != "" && s.User != userPrefix+q.Get("sandboxID"):
			continue
		case q.Get("name") != "" && s.Name != snapshotName(q.Get("name")):
			continue
		}
		if len(out) == limit {
			next = out[len(out)-1].SnapshotID
			break
		}
		out = append(out, snapshotOf(s))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

// handleDeleteSnapshot is DELETE /templates/{id}, which the SDK's deleteSnapshot calls: templates are the
// operator's, so the id is one of the tenant's snapshots (else 404, which the SDK answers as false).
func (f *Front) handleDeleteSnapshot(w http.ResponseWriter, r *http.Request) {
	tok, err := f.authControl(r, auth.ScopeExec)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	b, _ := f.backend()
	sn, err := snapshotter(b)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	if err := sn.DeleteSnapshot(r.Context(), tok.Tenant, snapshotName(r.PathValue("id")), f.requestID(r)); err != nil {
		f.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// forkResult is E2B's SandboxForkResult: the new sandbox, or why it could not be made.
type forkResult struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	Error   *errorJSON   `json:"error,omitempty"`
}

type errorJSON struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// handleFork is POST /sandboxes/{id}/fork: count new sandboxes, each with a copy of the sandbox's workspace, its
// template, metadata and env vars, and a timeout of their own. Each fork succeeds or fails on its own (a failed
// one leaves nothing behind); the answer lists each one's outcome.
func (f *Front) handleFork(w http.ResponseWriter, r *http.Request) {
	tok, src, ok := f.ownedBy(w, r, auth.ScopeExec)
	if !ok {
		return
	}
	var body struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if err := decode(r, &body); err != nil {
		f.writeError(w, r, err)
		return
	}
	count := 1
	if body.Count != nil {
		count = *body.Count
	}
	if count < 1 || count > maxForks {
		f.writeError(w, r, badRequest("count must be 1..%d, got %d", maxForks, count))
		return
	}
	def := int64(defaultForkTimeout)
	if body.Timeout == nil {
		body.Timeout = &def
	}
	timeout, err := f.timeoutOf(body.Timeout, 0)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	b, _ := f.backend()
	fk, ok := b.(service.Forker)
	if !ok {
		f.writeError(w, r, service.ErrNoFork())
		return
	}
	from, err := keyOf(src)
	if err != nil {
		f.writeError(w, r, err)
		return
	}
	out := make([]forkResult, 0, count)
	for range count {
		now := f.now().UTC()
		rec := &record{ID: newID(), Tenant: tok.Tenant, Template: src.Template, OpTemplate: src.OpTemplate,
			Metadata: src.Metadata, Env: src.Env, StartedAt: now, EndAt: now.Add(timeout), AutoPause: src.AutoPause,
			AccessToken: newAccessToken(), TokenID: tok.ID, TokenHash: tok.Hash,
			AllowInternet: src.AllowInternet, Network: src.Network, Networked: src.Networked} // a fork never widens
		err := f.fork(r.Context(), b, fk, from, rec, f.requestID(r))
		if err != nil {
			st, msg := f.status(r, err)
			out = append(out, forkResult{Error: &errorJSON{Code: st, Message: msg}})
			continue
		}
		d := f.describe(rec, true)
		out = append(out, forkResult{Sandbox: &d})
	}
	writeJSON(w, http.StatusCreated, out)
}

// fork makes rec's sandbox a fork of from and records it; on failure nothing of it is left.
func (f *Front) fork(ctx context.Context, b service.Backend, fk service.Forker, from sandkeep.Key, rec *record, requestID string) error {
	to, err := keyOf(rec)
	if err != nil {
		return err
	}
	if _, err := fk.Fork(ctx, from, to, service.AdmitRequest{RequestID: requestID}); err != nil {
		f.cleanup(b, to) // to is a fresh id: whatever exists of it is this fork's
		return err
	}
	if err := f.recs.put(rec); err != nil {
		f.cleanup(b, to)
		return err
	}
	f.hold(ctx, rec.ID)
	return nil
}
