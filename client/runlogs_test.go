package client_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/client"
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

// TestFollowRunLogs: the SDK follows a running run's log over GET /v1/runs/{id}/logs?follow=1 (SSE): the entries
// written while it follows arrive in order, and the stream ends once the run is finished and its log delivered;
// another tenant's run is RUN_NOT_FOUND before any stream starts.
func TestFollowRunLogs(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	live := f.be.AddRun(store.Run{Tenant: "acme", User: "bob", Trust: store.TrustTrusted, Admission: store.AdmissionAdmitted})
	other := f.be.AddRun(store.Run{Tenant: "globex", User: "bob", Trust: store.TrustTrusted, Admission: store.AdmissionAdmitted})
	first := f.be.AppendRunLog(store.RunLog{RunID: live.ID, Source: store.LogDriver, Text: "docker: create sandbox"})
	var seen []string
	err := f.c.FollowRunLogs(ctx, live.ID, 0, func(l client.RunLog) error {
		seen = append(seen, l.Source+": "+l.Text)
		if len(seen) == 1 { // written while the stream is open
			f.be.AppendRunLog(store.RunLog{RunID: live.ID, Source: store.LogPostCreate, Text: "npm install done"})
			f.be.FinishRun(live.ID, store.StatusSucceeded)
		}
		return nil
	})
	want := []string{"driver: docker: create sandbox", "post_create: npm install done"}
	if err != nil || !slices.Equal(seen, want) {
		t.Fatalf("followed %q, %v; want %q", seen, err, want)
	}
	seen = nil
	if err := f.c.FollowRunLogs(ctx, live.ID, first, func(l client.RunLog) error { seen = append(seen, l.Text); return nil }); err != nil || !slices.Equal(seen, []string{"npm install done"}) {
		t.Errorf("after %d: %q, %v", first, seen, err)
	}
	stop := errors.New("enough")
	if err := f.c.FollowRunLogs(ctx, live.ID, 0, func(client.RunLog) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("fn's error: %v", err)
	}
	if err := f.c.FollowRunLogs(ctx, other.ID, 0, func(client.RunLog) error { return nil }); sandkeep.CodeOf(err) != "RUN_NOT_FOUND" {
		t.Errorf("another tenant's run: %v, want RUN_NOT_FOUND", err)
	}
}
