package snapshot

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/store/sqlite"
)

// TestStoreInRunStore is TestStore with the records in a run store (UseStore): the same names, quotas and
// archive sharing; and two Stores over one run store with their own homes (two replicas sharing an archive
// directory) see each other's snapshots. Records an earlier version kept in the home move into the run store.
func TestStoreInRunStore(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "runs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	dir, blobs := t.TempDir(), t.TempDir()
	// An earlier version's record in the home, with its archive.
	old, err := Open(dir, Quota{}, nil, dirArchives(blobs))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Create(ctx, Snapshot{Name: "old", Tenant: "initech"}, fill("old")); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, Quota{Count: 3, Bytes: 10}, nil, dirArchives(blobs))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.UseStore(ctx, db); err != nil {
		t.Fatal(err)
	}
	if recs, err := db.ListSnapshots(ctx, "initech"); err != nil || len(recs) != 1 || recs[0].Name != "old" {
		t.Fatalf("the home's record was not moved into the store: %+v, %v", recs, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "records", "*", "*.json")); len(left) != 0 {
		t.Fatalf("records left in the home after the move: %v", left)
	}
	other, err := Open(t.TempDir(), Quota{Count: 3, Bytes: 10}, nil, dirArchives(blobs))
	if err != nil {
		t.Fatal(err)
	}
	if err := other.UseStore(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Create(ctx, Snapshot{Name: "elsewhere", Tenant: "globex"}, fill("zz")); err != nil {
		t.Fatal(err)
	}
	if sn, err := s.Get("globex", "elsewhere"); err != nil || sn.Bytes != 2 {
		t.Fatalf("a snapshot taken through another Store: %+v, %v", sn, err)
	}
	if _, _, err := s.Delete(ctx, "globex", "elsewhere"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Delete(ctx, "initech", "old"); err != nil {
		t.Fatal(err)
	}
	testStore(t, s, dir, func() int {
		entries, _ := os.ReadDir(blobs)
		return len(entries)
	}, func(digest string) {
		if err := os.WriteFile(filepath.Join(blobs, strings.TrimPrefix(digest, "sha256:")+".tar"), []byte("XX"), 0o600); err != nil {
			t.Fatal(err)
		}
	})
}
