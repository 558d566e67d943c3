package api

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/store"
)

// TestRunLogs: GET /v1/runs/{id}/logs returns a run's log of the caller's tenant in order, pages with after and
// limit, answers another tenant's run exactly as a missing one (RUN_NOT_FOUND, naming nothing of it), and refuses
// parameters it does not know.
func TestRunLogs(t *testing.T) {
	e := newEnv(t, nil)
	mine := e.be.AddRun(store.Run{Tenant: "acme", User: "alice", Trust: store.TrustTrusted, Admission: store.AdmissionAdmitted})
	foreign := e.be.AddRun(store.Run{Tenant: "globex", User: "alice", Trust: store.TrustTrusted, Admission: store.AdmissionAdmitted})
	first := e.be.AppendRunLog(store.RunLog{RunID: mine.ID, Source: store.LogBuild, Text: "Step 1/2 : FROM scratch\n"})
	e.be.AppendRunLog(store.RunLog{RunID: foreign.ID, Source: store.LogBuild, Text: "globex secret build line"})
	e.be.AppendRunLog(store.RunLog{RunID: mine.ID, Source: store.LogPostCreate, Text: "installed deps\n"})

	logs := decodeJSON[RunLogList](t, e.req("GET", "/v1/runs/"+mine.ID+"/logs", e.tok, nil)).Logs
	if len(logs) != 2 || logs[0].Source != store.LogBuild || logs[1].Text != "installed deps\n" || logs[1].RunID != mine.ID {
		t.Fatalf("logs = %+v", logs)
	}
	page := decodeJSON[RunLogList](t, e.req("GET", "/v1/runs/"+mine.ID+"/logs?after="+strconv.FormatInt(first, 10)+"&limit=1", e.tok, nil)).Logs
	if len(page) != 1 || page[0].Source != store.LogPostCreate {
		t.Errorf("after the first, limit 1: %+v", page)
	}
	a := wantError(t, e.req("GET", "/v1/runs/"+foreign.ID+"/logs", e.tok, nil), http.StatusNotFound, "RUN_NOT_FOUND")
	if strings.Contains(a.Message+a.Hint, "globex") {
		t.Errorf("answer names the other tenant: %+v", a)
	}
	wantError(t, e.req("GET", "/v1/runs/nope/logs", e.tok, nil), http.StatusNotFound, "RUN_NOT_FOUND")
	for _, q := range []string{"follow=x", "tail=1", "after=-1", "limit=x"} {
		wantError(t, e.req("GET", "/v1/runs/"+mine.ID+"/logs?"+q, e.tok, nil), http.StatusBadRequest, "REQUEST_INVALID")
	}
}
