package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/sqlite"
)

// BenchmarkRunRecord is what admission writes for one run and its finish: the run row, one event, the update.
func BenchmarkRunRecord(b *testing.B) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "s.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	for b.Loop() {
		id, err := store.NewRunID()
		if err != nil {
			b.Fatal(err)
		}
		if err := st.CreateRun(ctx, store.Run{ID: id, Tenant: "t", User: "u", Trust: store.TrustTrusted,
			ResolvedMode: "auto", Source: "default", Driver: "docker", Admission: store.AdmissionAdmitted}); err != nil {
			b.Fatal(err)
		}
		if _, err := st.AppendEvent(ctx, store.Event{RunID: id, Name: "policy_decided", Payload: []byte(`{}`)}); err != nil {
			b.Fatal(err)
		}
		if err := st.UpdateRun(ctx, id, store.RunUpdate{Status: store.StatusSucceeded}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRunRecordEnqueued is the same record as a command writes it now: the run row committed, the event and
// the finish enqueued (committed with the next run's row, or within the flush delay).
func BenchmarkRunRecordEnqueued(b *testing.B) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "s.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	for b.Loop() {
		id, err := store.NewRunID()
		if err != nil {
			b.Fatal(err)
		}
		if err := st.CreateRun(ctx, store.Run{ID: id, Tenant: "t", User: "u", Trust: store.TrustTrusted,
			ResolvedMode: "auto", Source: "default", Driver: "docker", Admission: store.AdmissionAdmitted}); err != nil {
			b.Fatal(err)
		}
		st.EnqueueEvent(store.Event{RunID: id, Name: "policy_decided", Payload: []byte(`{}`)}, nil)
		st.EnqueueUpdate(id, store.RunUpdate{Status: store.StatusSucceeded}, nil)
	}
	if err := st.Flush(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkCommandRecord is what one warm command through `sandkeep serve` writes (issue 26): the run row
// committed before it runs, then its three events and the driver's run log line enqueued, and its finish
// committed with them before the answer. Two commits per command, both on its path.
func BenchmarkCommandRecord(b *testing.B) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "s.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	for b.Loop() {
		id, err := store.NewRunID()
		if err != nil {
			b.Fatal(err)
		}
		if err := st.CreateRun(ctx, store.Run{ID: id, Tenant: "t", User: "u", Trust: store.TrustTrusted,
			ResolvedMode: "auto", Source: "default", Driver: "docker", Admission: store.AdmissionAdmitted}); err != nil {
			b.Fatal(err)
		}
		st.EnqueueEvent(store.Event{RunID: id, Name: "sandbox_shared", Payload: []byte(`{"reason":"warm","key":"t/u","sandbox":"sandkeep-u-31bd3ff12b"}`)}, nil)
		st.EnqueueRunLog(store.RunLog{RunID: id, Source: store.LogDriver, Text: "docker: reuse sandbox sandkeep-u-31bd3ff12b9c78ec358d0f8a (running, image sandkeep-test-busybox:latest)"}, nil)
		st.EnqueueEvent(store.Event{RunID: id, Name: "exec_started", Payload: []byte(`{"argv":["true"],"transport":"agent","timeout_ms":60000,"output_limit":1048576,"workdir":"/workspace","sandbox":"x"}`)}, nil)
		st.EnqueueEvent(store.Event{RunID: id, Name: "exec_finished", Payload: []byte(`{"exit_code":0,"duration_ms":1,"timed_out":false,"bytes":0}`)}, nil)
		if err := st.UpdateRun(ctx, id, store.RunUpdate{Status: store.StatusSucceeded}); err != nil {
			b.Fatal(err)
		}
	}
}
