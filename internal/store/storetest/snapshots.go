package storetest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/store"
)

// testSnapshots: a snapshot record reads back as written, lists by name within its tenant only, is unique per
// (tenant, name) and not across tenants; delete says whether it was its digest's last record; an unknown name is
// ErrNotFound, a record past the quota (count or bytes) ErrResourceExhausted naming the bound, and nothing kept.
func testSnapshots(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	at := time.Date(2026, 12, 4, 15, 0, 0, 123456789, time.UTC)
	digest := "sha256:" + strings.Repeat("ab", 32)
	rec := func(tenant, name string, bytes int64) store.SnapshotRecord {
		return store.SnapshotRecord{Name: name, Tenant: tenant, User: "alice", Template: "py", Image: "img@sha256:1",
			Digest: digest, Bytes: bytes, CreatedAt: at}
	}
	q := store.SnapshotQuota{Count: 3, Bytes: 100}
	for _, r := range []store.SnapshotRecord{rec("acme", "b", 10), rec("acme", "a", 20), rec("other", "a", 90)} {
		if err := s.CreateSnapshot(ctx, r, q); err != nil {
			t.Fatalf("CreateSnapshot(%s/%s): %v", r.Tenant, r.Name, err)
		}
	}
	got, err := s.GetSnapshot(ctx, "acme", "a")
	want := rec("acme", "a", 20)
	want.CreatedAt = at.Truncate(time.Millisecond)
	if err != nil || got != want {
		t.Fatalf("GetSnapshot = %+v, %v; want %+v", got, err, want)
	}
	list, err := s.ListSnapshots(ctx, "acme")
	if err != nil || len(list) != 2 || list[0].Name != "a" || list[1].Name != "b" {
		t.Fatalf("ListSnapshots(acme) = %+v, %v; want a, b", list, err)
	}
	wantErr(t, "same name", s.CreateSnapshot(ctx, rec("acme", "a", 1), q), errdefs.ErrAlreadyExists)
	var qe *store.SnapshotQuotaError
	err = s.CreateSnapshot(ctx, rec("acme", "c", 71), q) // 30 + 71 > 100
	if !errdefs.IsResourceExhausted(err) || !errors.As(err, &qe) || qe.What != "bytes" {
		t.Errorf("past the bytes: %v, want the bytes quota", err)
	}
	if err := s.CreateSnapshot(ctx, rec("acme", "c", 70), q); err != nil {
		t.Fatalf("up to the bytes: %v", err)
	}
	err = s.CreateSnapshot(ctx, rec("acme", "d", 0), q)
	if !errors.As(err, &qe) || qe.What != "snapshots" || qe.Limit != 3 {
		t.Errorf("past the count: %v, want the count quota", err)
	}
	if list, _ := s.ListSnapshots(ctx, "acme"); len(list) != 3 {
		t.Errorf("after the refusals acme has %d snapshots, want 3", len(list))
	}
	_, err = s.GetSnapshot(ctx, "acme", "zz")
	wantErr(t, "get unknown", err, errdefs.ErrNotFound)
	_, _, err = s.DeleteSnapshot(ctx, "acme", "zz")
	wantErr(t, "delete unknown", err, errdefs.ErrNotFound)
	wantErr(t, "no digest", s.CreateSnapshot(ctx, store.SnapshotRecord{Name: "x", Tenant: "acme"}, q), errdefs.ErrInvalidArgument)
	// Four records name the digest: only the last delete says so.
	for i, r := range []store.SnapshotRecord{rec("acme", "a", 0), rec("acme", "b", 0), rec("other", "a", 0), rec("acme", "c", 0)} {
		d, last, err := s.DeleteSnapshot(ctx, r.Tenant, r.Name)
		if err != nil || d.Name != r.Name || d.Digest != digest || last != (i == 3) {
			t.Errorf("DeleteSnapshot(%s/%s) = %+v, last %v, %v; want last %v", r.Tenant, r.Name, d, last, err, i == 3)
		}
	}
	if list, err := s.ListSnapshots(ctx, "acme"); err != nil || len(list) != 0 {
		t.Errorf("after the deletes: %+v, %v", list, err)
	}
}

// testConcurrentSnapshots: creates racing for one tenant's quota and for one name never pass either together.
func testConcurrentSnapshots(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	const n = 8
	digest := "sha256:" + strings.Repeat("cd", 32)
	race := func(name func(i int) string, q store.SnapshotQuota) (ok int, errs []error) {
		var (
			wg sync.WaitGroup
			mu sync.Mutex
		)
		for i := range n {
			wg.Go(func() {
				err := s.CreateSnapshot(ctx, store.SnapshotRecord{Name: name(i), Tenant: "racer", Digest: digest, Bytes: 1}, q)
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					ok++
				} else {
					errs = append(errs, err)
				}
			})
		}
		wg.Wait()
		return ok, errs
	}
	ok, errs := race(func(i int) string { return fmt.Sprintf("q%d", i) }, store.SnapshotQuota{Count: 3})
	if ok != 3 {
		t.Errorf("%d of %d creates passed a quota of 3", ok, n)
	}
	for _, err := range errs {
		wantErr(t, "past the quota", err, errdefs.ErrResourceExhausted)
	}
	ok, errs = race(func(int) string { return "same" }, store.SnapshotQuota{})
	if ok != 1 {
		t.Errorf("%d of %d creates of one name passed", ok, n)
	}
	for _, err := range errs {
		wantErr(t, "same name", err, errdefs.ErrAlreadyExists)
	}
}
