package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/store"
)

// sameRecord compares two E2B records as JSON values (PostgreSQL keeps jsonb, not the bytes).
func sameRecord(t *testing.T, got, want json.RawMessage) bool {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("stored record %q: %v", got, err)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(g, w)
}

func testE2BSandboxes(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	t0 := time.Date(2026, 12, 4, 10, 0, 0, 123456789, time.UTC)
	mk := func(id, tenant string, started time.Time) store.E2BSandbox {
		return store.E2BSandbox{ID: id, Tenant: tenant, StartedAt: started, EndAt: started.Add(5 * time.Minute),
			Record: json.RawMessage(fmt.Sprintf(`{"id": %q, "metadata": {"k": "v"}, "access_token": "ea_x"}`, id))}
	}
	a, b, c := mk("sbxa", "acme", t0.Add(2*time.Second)), mk("sbxb", "acme", t0), mk("sbxc", "other", t0.Add(time.Second))
	for _, sb := range []store.E2BSandbox{a, b, c} {
		if err := s.CreateE2BSandbox(ctx, sb); err != nil {
			t.Fatalf("CreateE2BSandbox(%s): %v", sb.ID, err)
		}
	}
	if err := s.CreateE2BSandbox(ctx, a); !errdefs.IsAlreadyExists(err) {
		t.Errorf("a second create of %s: %v; want ErrAlreadyExists", a.ID, err)
	}
	for _, bad := range []store.E2BSandbox{{Tenant: "acme", Record: json.RawMessage(`{}`)}, {ID: "x", Record: json.RawMessage(`{}`)},
		{ID: "x", Tenant: "acme", Record: json.RawMessage(`[1]`)}, {ID: "x", Tenant: "acme", Record: json.RawMessage(`{`)}} {
		if err := s.CreateE2BSandbox(ctx, bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("CreateE2BSandbox(%+v): %v; want ErrInvalidArgument", bad, err)
		}
	}

	got, err := s.GetE2BSandbox(ctx, "sbxa")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "sbxa" || got.Tenant != "acme" || got.Version != 1 || got.Paused ||
		!got.StartedAt.Equal(a.StartedAt.Truncate(time.Millisecond)) || !got.EndAt.Equal(a.EndAt.Truncate(time.Millisecond)) ||
		!sameRecord(t, got.Record, a.Record) {
		t.Errorf("GetE2BSandbox = %+v (record %s); want %+v at version 1, times in milliseconds", got, got.Record, a)
	}
	if _, err := s.GetE2BSandbox(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("GetE2BSandbox(nope): %v; want ErrNotFound", err)
	}

	ids := func(tenant string) []string {
		t.Helper()
		list, err := s.ListE2BSandboxes(ctx, tenant)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, sb := range list {
			out = append(out, sb.ID)
		}
		return out
	}
	if got := ids("acme"); !reflect.DeepEqual(got, []string{"sbxb", "sbxa"}) {
		t.Errorf("ListE2BSandboxes(acme) = %v; want [sbxb sbxa] (oldest first, one tenant)", got)
	}
	if got := ids(""); !reflect.DeepEqual(got, []string{"sbxb", "sbxc", "sbxa"}) {
		t.Errorf("ListE2BSandboxes(all) = %v; want [sbxb sbxc sbxa]", got)
	}

	upd := got
	upd.Paused, upd.EndAt, upd.Record = true, t0.Add(time.Hour), json.RawMessage(`{"id": "sbxa", "paused": true}`)
	v, err := s.UpdateE2BSandbox(ctx, upd)
	if err != nil || v != 2 {
		t.Fatalf("UpdateE2BSandbox = %d, %v; want version 2", v, err)
	}
	if _, err := s.UpdateE2BSandbox(ctx, upd); !errdefs.IsConflict(err) {
		t.Errorf("an update from a stale version: %v; want ErrConflict", err)
	}
	got, err = s.GetE2BSandbox(ctx, "sbxa")
	if err != nil || !got.Paused || got.Version != 2 || !got.EndAt.Equal(t0.Add(time.Hour).Truncate(time.Millisecond)) || !sameRecord(t, got.Record, upd.Record) {
		t.Errorf("after the update: %+v (%v)", got, err)
	}
	if _, err := s.UpdateE2BSandbox(ctx, store.E2BSandbox{ID: "nope", Tenant: "acme", Version: 1, Record: json.RawMessage(`{}`)}); !errdefs.IsNotFound(err) {
		t.Errorf("update of an absent sandbox: %v; want ErrNotFound", err)
	}

	if err := s.DeleteE2BSandbox(ctx, "sbxa"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteE2BSandbox(ctx, "sbxa"); !errdefs.IsNotFound(err) {
		t.Errorf("a second delete: %v; want ErrNotFound", err)
	}
	if _, err := s.GetE2BSandbox(ctx, "sbxa"); !errdefs.IsNotFound(err) {
		t.Errorf("get after delete: %v; want ErrNotFound", err)
	}
	if _, err := s.UpdateE2BSandbox(ctx, got); !errdefs.IsNotFound(err) {
		t.Errorf("update after delete: %v; want ErrNotFound", err)
	}
	if got := ids("acme"); !reflect.DeepEqual(got, []string{"sbxb"}) {
		t.Errorf("after the delete ListE2BSandboxes(acme) = %v", got)
	}
}

// testE2BConcurrentUpdate: writers that each read a sandbox and write it back at the version they read never
// lose a write: each either commits or is told it conflicted, and the count of commits is the final version.
func testE2BConcurrentUpdate(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	sb := store.E2BSandbox{ID: "race", Tenant: "acme", StartedAt: time.Now(), EndAt: time.Now(), Record: json.RawMessage(`{"n": 0}`)}
	if err := s.CreateE2BSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	const writers, each = 4, 10
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		committed int
	)
	for range writers {
		wg.Go(func() {
			for range each {
				for {
					cur, err := s.GetE2BSandbox(ctx, "race")
					if err != nil {
						t.Error(err)
						return
					}
					var n struct{ N int }
					_ = json.Unmarshal(cur.Record, &n)
					cur.Record = json.RawMessage(fmt.Sprintf(`{"n": %d}`, n.N+1))
					if _, err = s.UpdateE2BSandbox(ctx, cur); errors.Is(err, errdefs.ErrConflict) {
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					committed++
					mu.Unlock()
					break
				}
			}
		})
	}
	wg.Wait()
	got, err := s.GetE2BSandbox(ctx, "race")
	if err != nil {
		t.Fatal(err)
	}
	var n struct{ N int }
	_ = json.Unmarshal(got.Record, &n)
	if committed != writers*each || n.N != writers*each || got.Version != int64(writers*each+1) {
		t.Errorf("%d commits, record n=%d, version %d; want %d, %d, %d (no write lost)", committed, n.N, got.Version,
			writers*each, writers*each, writers*each+1)
	}
}
