package sandkeep_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/store"
)

// TestLibraryRuns: with Config.Store, every library Exec belongs to a run, recorded with its events; a failure
// is recorded with its code and disposition; RunID attaches to a running run and leaves it open.
func TestLibraryRuns(t *testing.T) {
	t.Parallel()
	cfg := baseConfig(t)
	dsn := filepath.Join(t.TempDir(), "runs.db")
	cfg = withStore(t, cfg, dsn)
	st := cfg.Store
	s := newSuite(t, cfg)
	key := s.key("acme", "lib")
	s.exec(s.m, key, "true")
	runs, err := st.ListRuns(t.Context(), store.RunFilter{})
	if err != nil || len(runs) != 1 || runs[0].Status != store.StatusSucceeded || runs[0].Driver != "docker" {
		t.Fatalf("runs: %+v, %v", runs, err)
	}
	evs, err := st.ListEvents(t.Context(), store.EventFilter{RunID: runs[0].ID})
	var names []string
	for _, e := range evs {
		names = append(names, e.Name)
	}
	if err != nil || !slices.Contains(names, "sandbox_started") || !slices.Contains(names, "exec_finished") {
		t.Fatalf("events: %v, %v", names, err)
	}

	id, _ := store.NewRunID()
	if err := st.CreateRun(t.Context(), store.Run{ID: id, Tenant: key.Tenant, User: key.User, Trust: store.TrustTrusted,
		ResolvedMode: "inline", Source: "cli", Admission: store.AdmissionAdmitted}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.m.ExecWith(t.Context(), sandkeep.RunRequest{Key: key, RunID: id}, sandkeep.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if run, _ := st.GetRun(t.Context(), id); run.Status != store.StatusRunning {
		t.Errorf("a named run was finished by one of its commands: %+v", run)
	}

	bad := baseConfig(t)
	bad.Store, bad.Image = st, "localhost:1/sandkeep-missing:none"
	m, err := sandkeep.Open(t.Context(), bad)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Exec(t.Context(), key, sandkeep.ExecRequest{Argv: []string{"true"}}); sandkeep.CodeOf(err) != "IMAGE_UNAVAILABLE" {
		t.Fatalf("err = %v", err)
	}
	failed, _ := st.ListRuns(t.Context(), store.RunFilter{Status: store.StatusFailed})
	if len(failed) != 1 || failed[0].FailureCode != "IMAGE_UNAVAILABLE" || failed[0].Disposition != store.DispositionDeterministic {
		t.Fatalf("failed runs: %+v", failed)
	}
}
