package client_test

import (
	"testing"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/store"
)

// TestRunLogs: the SDK reads a run's log in order and pages it; another tenant's run is RUN_NOT_FOUND.
func TestRunLogs(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	mine := f.be.AddRun(store.Run{Tenant: "acme", User: "alice", Trust: store.TrustTrusted, Admission: store.AdmissionAdmitted})
	other := f.be.AddRun(store.Run{Tenant: "globex", User: "alice", Trust: store.TrustTrusted, Admission: store.AdmissionAdmitted})
	first := f.be.AppendRunLog(store.RunLog{RunID: mine.ID, Source: store.LogDriver, Text: "docker: create sandbox"})
	f.be.AppendRunLog(store.RunLog{RunID: mine.ID, Source: store.LogPostCreate, Text: "npm install done"})
	f.be.AppendRunLog(store.RunLog{RunID: other.ID, Source: store.LogBuild, Text: "theirs"})
	logs, err := f.c.RunLogs(ctx, mine.ID, 0, 0)
	if err != nil || len(logs) != 2 || logs[0].Text != "docker: create sandbox" || logs[1].Source != store.LogPostCreate {
		t.Fatalf("RunLogs = %+v, %v", logs, err)
	}
	if page, err := f.c.RunLogs(ctx, mine.ID, first, 1); err != nil || len(page) != 1 || page[0].Text != "npm install done" {
		t.Errorf("after %d, limit 1: %+v, %v", first, page, err)
	}
	if _, err := f.c.RunLogs(ctx, other.ID, 0, 0); sandkeep.CodeOf(err) != "RUN_NOT_FOUND" {
		t.Errorf("another tenant's run: %v, want RUN_NOT_FOUND", err)
	}
}
