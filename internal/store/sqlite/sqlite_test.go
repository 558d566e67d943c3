package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/sqlite"
	"github.com/sandkeep/sandkeep/internal/store/storetest"
)

func openAt(ctx context.Context, path string) (store.Store, error) { return sqlite.Open(ctx, path) }

func TestSQLite(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "sandkeep.db"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, storetest.MultiProcess(func(t *testing.T) string {
		return filepath.Join(t.TempDir(), "shared.db")
	}, openAt))
}

// TestReopen checks that a second Open of the same file keeps the data and does not migrate again.
func TestReopen(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "dir with ? and #", "sandkeep.db")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	id, err := store.NewRunID()
	if err != nil {
		t.Fatal(err)
	}
	r := store.Run{ID: id, Tenant: "t", User: "u", Trust: store.TrustTrusted, Admission: store.AdmissionAdmitted}
	if err := s.CreateRun(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database file not at the path given: %v", err)
	}
	s, err = sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.GetRun(ctx, id); err != nil {
		t.Fatalf("GetRun after reopen: %v", err)
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := sqlite.Open(t.Context(), ""); err == nil {
		t.Error("Open(\"\") succeeded")
	}
	if _, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "missing", "dir", "x.db")); err == nil {
		t.Error("Open in a missing directory succeeded")
	}
}

func TestFileMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sandkeep.db")
	s, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, p := range []string{path, path + "-wal"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", p, fi.Mode().Perm())
		}
	}
}
