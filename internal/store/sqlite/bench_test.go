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
