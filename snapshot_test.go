package sandkeep_test

import (
	"context"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/snapshots"
)

// TestSnapshots: a snapshot on the real driver (Docker: of the host workspace; kubernetes: of the claim, through
// the pod's agent). It keeps the workspace as it was (contents, modes, links),
// restores into a new key after its source is removed, in its template; later changes stay apart; names are per
// tenant (SNAPSHOT_EXISTS, SNAPSHOT_NOT_FOUND), the tenant's quota holds (QUOTA_EXCEEDED, nothing kept), a
// restore onto a key that exists is SANDBOX_EXISTS; create, restore and delete are recorded as events.
func TestSnapshots(t *testing.T) {
	cfg := baseConfig(t)
	cfg.Templates = map[string]sandkeep.Template{"py": {Env: []string{"FLAVOUR=py"}}}
	cfg.SnapshotQuota = sandkeep.SnapshotQuota{Count: 2}
	// The archives go to an S3-compatible bucket (gofakes3 in this process, on loopback), as an operator's
	// snapshot_store sends them: content addressed there, none in the home.
	backend := s3mem.New()
	s3srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(s3srv.Close)
	if err := backend.CreateBucket("snaps"); err != nil {
		t.Fatal(err)
	}
	s3url, _ := url.Parse(s3srv.URL)
	cfg.SnapshotStore = sandkeep.SnapshotStore{Endpoint: s3url.Host, Bucket: "snaps", Prefix: "p/", AccessKey: "k", SecretKey: "s", Insecure: true}
	objects := func() int {
		t.Helper()
		res, err := backend.ListBucket("snaps", &gofakes3.Prefix{}, gofakes3.ListBucketPage{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range res.Contents {
			if !strings.HasPrefix(c.Key, "p/blobs/sha256/") {
				t.Errorf("object %q", c.Key)
			}
		}
		return len(res.Contents)
	}
	var mu sync.Mutex
	var seen []string
	cfg.OnEvent = func(name string, _ any) {
		mu.Lock()
		seen = append(seen, name)
		mu.Unlock()
	}
	s := newSuite(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	sh := func(key sandkeep.Key, script string) string {
		t.Helper()
		res := s.execRun(s.m, sandkeep.RunRequest{Key: key, Template: "py"}, sandkeep.ExecRequest{Argv: []string{"sh", "-c", script}})
		if res.ExitCode != 0 {
			t.Fatalf("sh -c %q: exit %d, %q %q", script, res.ExitCode, res.Stdout, res.Stderr)
		}
		return res.Stdout
	}
	a := s.key("snap", "a")
	tenant := a.Tenant
	sh(a, "mkdir -p src && echo one > src/f && printf '#!/bin/sh\\necho run\\n' > tool && chmod 750 tool && ln -s src/f link && head -c 100000 /dev/urandom > blob")
	const look = "find . | sort; md5sum blob src/f; stat -c '%n %a' tool; readlink link"
	before := sh(a, look)

	sn, err := snapshots.Create(ctx, s.m, a, "base", snapshots.Events{})
	if err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	if sn.Name != "base" || sn.Tenant != tenant || sn.User != "a" || sn.Template != "py" || sn.Bytes < 100000 || len(sn.Digest) != len("sha256:")+64 {
		t.Fatalf("snapshot %+v", sn)
	}
	sh(a, "echo two > src/f") // after the snapshot: not in it
	if _, err := snapshots.Create(ctx, s.m, a, "base", snapshots.Events{}); sandkeep.CodeOf(err) != "SNAPSHOT_EXISTS" {
		t.Fatalf("a second snapshot named base: %v, want SNAPSHOT_EXISTS", err)
	}
	auto, err := snapshots.Create(ctx, s.m, a, "", snapshots.Events{})
	if err != nil || auto.Name == "" || auto.Digest == sn.Digest {
		t.Fatalf("a snapshot without a name: %+v, %v", auto, err)
	}
	if n := objects(); n != 2 {
		t.Fatalf("%d archives in the bucket for 2 snapshots of different content", n)
	}
	if local, _ := os.ReadDir(filepath.Join(cfg.Home, "snapshots", "blobs", "sha256")); len(local) != 0 {
		t.Fatalf("%d archives in the home with an S3 store", len(local))
	}
	if _, err := snapshots.Create(ctx, s.m, a, "third", snapshots.Events{}); sandkeep.CodeOf(err) != "QUOTA_EXCEEDED" {
		t.Fatalf("a snapshot past the tenant's quota of 2: %v, want QUOTA_EXCEEDED", err)
	}
	list, err := snapshots.List(s.m, tenant)
	if err != nil || len(list) != 2 || list[0].Name != "base" {
		t.Fatalf("Snapshots: %+v, %v", list, err)
	}
	if other, _ := snapshots.List(s.m, "another-"+tenant); len(other) != 0 {
		t.Fatalf("another tenant sees %+v", other)
	}

	if err := s.m.Remove(ctx, a, false); err != nil { // the source goes: the snapshot stays
		t.Fatal(err)
	}
	b := s.key("snap", "b")
	var restored []string
	sb, err := snapshots.Restore(ctx, s.m, "base", sandkeep.RunRequest{Key: b, Observer: sandkeep.Observer{Event: func(name string, _ any) {
		restored = append(restored, name)
	}}})
	if err != nil {
		t.Fatalf("RestoreSnapshot: %v", err)
	}
	if len(restored) == 0 || restored[len(restored)-1] != events.NameSnapshotRestored {
		t.Fatalf("the restore's run events: %v", restored)
	}
	if sb.User != "b" || sb.Template != "py" || sb.State != "running" {
		t.Fatalf("the restored sandbox: %+v", sb)
	}
	if got := sh(b, look); got != before {
		t.Fatalf("the restore differs:\n%s\nsnapshot taken of:\n%s", got, before)
	}
	if got := trim(sh(b, "echo $FLAVOUR; ./tool; [ \"$(stat -c %u blob)\" = \"$(id -u)\" ] && echo owned")); got != "py\nrun\nowned" {
		t.Fatalf("the restore's template, tool and owner: %q", got)
	}
	sh(b, "echo changed > src/f")
	c := s.key("snap", "c")
	if _, err := snapshots.Restore(ctx, s.m, "base", sandkeep.RunRequest{Key: c}); err != nil {
		t.Fatal(err)
	}
	if got := sh(c, "cat src/f"); got != "one\n" {
		t.Fatalf("a change after a restore reached the snapshot: %q", got)
	}
	if _, err := snapshots.Restore(ctx, s.m, "base", sandkeep.RunRequest{Key: b}); sandkeep.CodeOf(err) != "SANDBOX_EXISTS" {
		t.Fatalf("a restore onto an existing key: %v, want SANDBOX_EXISTS", err)
	}
	// Onto an existing key when asked: its sandbox stopped, its workspace replaced whole (b's own file gone).
	sh(b, "echo mine > only-b")
	if _, err := snapshots.Replace(ctx, s.m, "nope", sandkeep.RunRequest{Key: b}); sandkeep.CodeOf(err) != "SNAPSHOT_NOT_FOUND" {
		t.Fatalf("a replace from an unknown snapshot: %v, want SNAPSHOT_NOT_FOUND", err)
	}
	if got := sh(b, "cat only-b src/f"); got != "mine\nchanged\n" {
		t.Fatalf("a refused replace changed the key's files: %q", got)
	}
	var replaced []string
	sb, err = snapshots.Replace(ctx, s.m, "base", sandkeep.RunRequest{Key: b, Observer: sandkeep.Observer{Event: func(name string, _ any) {
		replaced = append(replaced, name)
	}}})
	if err != nil {
		t.Fatalf("Replace: %v", err)
	}
	if sb.User != "b" || sb.State != "running" || !slices.Contains(replaced, events.NameSnapshotRestored) {
		t.Fatalf("the replaced sandbox: %+v, events %v", sb, replaced)
	}
	if got := sh(b, look); got != before {
		t.Fatalf("the replaced workspace differs:\n%s\nsnapshot taken of:\n%s", got, before)
	}
	if got := trim(sh(b, "[ \"$(stat -c %u blob)\" = \"$(id -u)\" ] && echo owned")); got != "owned" {
		t.Fatalf("the replaced files' owner: %q", got)
	}
	d := s.key("snap", "d")
	if _, err := snapshots.Restore(ctx, s.m, "nope", sandkeep.RunRequest{Key: d}); sandkeep.CodeOf(err) != "SNAPSHOT_NOT_FOUND" {
		t.Fatalf("an unknown snapshot: %v, want SNAPSHOT_NOT_FOUND", err)
	}
	if _, err := s.m.Sandbox(ctx, d); sandkeep.CodeOf(err) != "SANDBOX_NOT_FOUND" {
		t.Fatalf("a refused restore left a sandbox: %v", err)
	}

	if err := snapshots.Delete(ctx, s.m, tenant, "base", snapshots.Events{}); err != nil {
		t.Fatal(err)
	}
	if err := snapshots.Delete(ctx, s.m, tenant, "base", snapshots.Events{}); sandkeep.CodeOf(err) != "SNAPSHOT_NOT_FOUND" {
		t.Fatalf("deleting it again: %v, want SNAPSHOT_NOT_FOUND", err)
	}
	if _, err := snapshots.Restore(ctx, s.m, "base", sandkeep.RunRequest{Key: d}); sandkeep.CodeOf(err) != "SNAPSHOT_NOT_FOUND" {
		t.Fatalf("a deleted snapshot: %v, want SNAPSHOT_NOT_FOUND", err)
	}
	if _, err := snapshots.Create(ctx, s.m, c, "third", snapshots.Events{}); err != nil {
		t.Fatalf("a snapshot once the quota has room again: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	count := map[string]int{}
	for _, n := range seen {
		count[n]++
	}
	if count[events.NameSnapshotCreated] != 3 || count[events.NameSnapshotDeleted] != 1 {
		t.Errorf("events with no run: %v", count)
	}
}
