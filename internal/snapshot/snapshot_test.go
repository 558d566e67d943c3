package snapshot

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
)

func fill(s string) func(io.Writer) error {
	return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
}

// TestStore: archives are stored once per content and removed with their last snapshot; names are per tenant;
// the count and byte quotas hold and keep nothing past them; a damaged archive fails its reader. In the home's
// directory (the default).
func TestStore(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Quota{Count: 3, Bytes: 10}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	blobs := filepath.Join(dir, "blobs", "sha256")
	testStore(t, s, dir, func() int {
		entries, _ := os.ReadDir(blobs)
		return len(entries)
	}, func(digest string) {
		if err := os.WriteFile(filepath.Join(blobs, strings.TrimPrefix(digest, "sha256:")+".tar"), []byte("XX"), 0o600); err != nil {
			t.Fatal(err)
		}
	})
}

// testStore is TestStore's body over a store s in dir whose archives are counted by archives and overwritten
// with other content by damage.
func testStore(t *testing.T, s *Store, dir string, archives func() int, damage func(digest string)) {
	t.Helper()
	ctx := context.Background()
	a, err := s.Create(ctx, Snapshot{Name: "a", Tenant: "acme", User: "u"}, fill("1234"))
	if err != nil || a.Bytes != 4 || !strings.HasPrefix(a.Digest, "sha256:") {
		t.Fatalf("create a: %+v, %v", a, err)
	}
	b, err := s.Create(ctx, Snapshot{Name: "b", Tenant: "acme"}, fill("1234"))
	if err != nil || b.Digest != a.Digest {
		t.Fatalf("create b: %+v, %v", b, err)
	}
	if n := archives(); n != 1 {
		t.Fatalf("%d archives for one content", n)
	}
	if _, err := s.Create(ctx, Snapshot{Name: "a", Tenant: "acme"}, fill("x")); !fault.Is(err, fault.SnapshotExists) {
		t.Fatalf("a name taken: %v", err)
	}
	if _, err := s.Create(ctx, Snapshot{Name: "a", Tenant: "globex"}, fill("x")); err != nil {
		t.Fatalf("the same name in another tenant: %v", err)
	}
	if _, err := s.Create(ctx, Snapshot{Name: "big", Tenant: "acme"}, fill("12345")); !fault.Is(err, fault.QuotaExceeded) {
		t.Fatalf("past 10 bytes: %v", err)
	}
	if _, err := s.Create(ctx, Snapshot{Name: "c", Tenant: "acme"}, fill("12")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, Snapshot{Name: "d", Tenant: "acme"}, fill("")); !fault.Is(err, fault.QuotaExceeded) {
		t.Fatalf("past 3 snapshots: %v", err)
	}
	if _, err := s.Create(ctx, Snapshot{Name: "../x", Tenant: "acme"}, fill("")); !fault.Is(err, fault.InvalidArgument) {
		t.Fatalf("a bad name: %v", err)
	}
	tmp, _ := os.ReadDir(filepath.Join(dir, "tmp"))
	if list, _ := s.List("acme"); len(list) != 3 || len(tmp) != 0 {
		t.Fatalf("after refusals: %d snapshots, %d temporary files", len(list), len(tmp))
	}
	if _, _, err := s.Delete(ctx, "acme", "zzz"); !fault.Is(err, fault.SnapshotNotFound) {
		t.Fatalf("delete of none: %v", err)
	}
	if _, gone, err := s.Delete(ctx, "acme", "a"); err != nil || gone {
		t.Fatalf("delete a (b shares its archive): removed %v, %v", gone, err)
	}
	if _, gone, err := s.Delete(ctx, "acme", "b"); err != nil || !gone {
		t.Fatalf("delete b (the last): removed %v, %v", gone, err)
	}
	if n := archives(); n != 2 { // c's and globex's a
		t.Fatalf("%d archives after the last snapshot of one went, want 2", n)
	}

	c, _ := s.Get("acme", "c")
	rc, err := s.Open(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(rc); err != nil || string(got) != "12" {
		t.Fatalf("c's archive reads %q, %v", got, err)
	}
	rc.Close()
	damage(c.Digest)
	rc, err = s.Open(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadAll(rc); err == nil || !strings.Contains(err.Error(), "digest") {
		t.Fatalf("a damaged archive read without error: %v", err)
	}
}
