package main

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	sdk "github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// TestFleetSnapshots: snapshots and forks through a fleet of two replicas that share no directory (as replicas on
// two hosts: homes of their own, no fleet.sandbox_dir), the records in the fleet's PostgreSQL store and the
// archives in an S3-compatible bucket (gofakes3 on loopback, spoken to through minio-go), each call made through
// the replica that does not own the key it reads. A snapshot taken through one replica is listed and restored
// through the other (before, SPEC_UNSUPPORTED without a shared sandbox_dir), a fork through the other copies the
// source's files and stays apart, the tenant's snapshot quota counts the snapshots of both, and a snapshot
// deleted through one is gone for the other, its archive with it.
func TestFleetSnapshots(t *testing.T) {
	dsn := postgresSchema(t)
	c := newCLI(t)
	if c.kc != nil {
		t.Skip("the one-host fleet runs on Docker; the kubernetes fleet is deploy/'s")
	}
	bucket := s3mem.New()
	s3 := httptest.NewServer(gofakes3.New(bucket).Server())
	t.Cleanup(s3.Close)
	if err := bucket.CreateBucket("snaps"); err != nil {
		t.Fatal(err)
	}
	objects := func() int {
		res, err := bucket.ListBucket("snaps", &gofakes3.Prefix{}, gofakes3.ListBucketPage{})
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Contents)
	}
	c.env = append(c.env, "SANDKEEP_STORE="+dsn, "SANDKEEP_DAEMON=off")
	u, _ := url.Parse(s3.URL)
	reps, _ := c.fleetWith(t, 2, 5*time.Second, "", "snapshot_quota:\n  count: 2\nsnapshot_store:\n  endpoint: "+u.Host+
		"\n  bucket: snaps\n  access_key: k\n  secret_key: s\n  insecure: true\n")
	tok := c.createToken(t, c.ten("fleetsnap"), "snap", "admin")
	r0, r1 := reps[0].client(t, tok.Token), reps[1].client(t, tok.Token)
	ctx := bounded(t)
	cat := func(cl *sdk.Client, user, want string) {
		t.Helper()
		if res, err := cl.Exec(ctx, user, sdk.ExecRequest{Command: "cat /workspace/f"}); err != nil || res.Stdout != want {
			t.Fatalf("cat /workspace/f of %s: %+v, %v; want %q", user, res, err, want)
		}
	}

	// Replica 0 owns alice; the snapshot is taken through replica 1.
	if _, err := r0.Exec(ctx, "alice", sdk.ExecRequest{Command: "echo one > /workspace/f"}); err != nil {
		t.Fatal(err)
	}
	sn, err := r1.CreateSnapshot(ctx, "alice", "s1")
	if err != nil || sn.Name != "s1" || sn.User != "alice" || !strings.HasPrefix(sn.Digest, "sha256:") {
		t.Fatalf("snapshot of replica 0's key through replica 1: %+v, %v", sn, err)
	}
	for i, cl := range []*sdk.Client{r0, r1} {
		if got, err := cl.Snapshots(ctx); err != nil || len(got) != 1 || got[0].Digest != sn.Digest {
			t.Fatalf("snapshots listed through replica %d: %+v, %v", i, got, err)
		}
	}
	// Restored through replica 1 (bob is its key), read through replica 0.
	if sb, err := r1.RestoreSnapshot(ctx, "s1", "bob"); err != nil || sb.User != "bob" {
		t.Fatalf("restore through replica 1: %+v, %v", sb, err)
	}
	cat(r0, "bob", "one\n")
	// A fork of alice through replica 1: alice's owner makes it; later changes stay apart.
	if sb, err := r1.Fork(ctx, "alice", "carol"); err != nil || sb.User != "carol" {
		t.Fatalf("fork through replica 1: %+v, %v", sb, err)
	}
	cat(r1, "carol", "one\n")
	if _, err := r1.Exec(ctx, "carol", sdk.ExecRequest{Command: "echo two > /workspace/f"}); err != nil {
		t.Fatal(err)
	}
	cat(r0, "alice", "one\n")

	// The quota (2) counts the snapshots taken through both replicas.
	if _, err := r0.CreateSnapshot(ctx, "carol", "s2"); err != nil {
		t.Fatalf("second snapshot, through replica 0: %v", err)
	}
	_, err = r1.CreateSnapshot(ctx, "bob", "s3")
	wantAPIError(t, err, http.StatusInsufficientStorage, fault.QuotaExceeded)

	// Deleted through replica 1, gone through replica 0.
	if n := objects(); n != 2 {
		t.Fatalf("%d archives in the bucket for 2 snapshots of other content", n)
	}
	if err := r1.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if n := objects(); n != 1 {
		t.Fatalf("%d archives in the bucket after s1 was deleted, want s2's", n)
	}
	_, err = r0.RestoreSnapshot(ctx, "s1", "dave")
	wantAPIError(t, err, http.StatusNotFound, fault.SnapshotNotFound)
	if sb, err := r0.RestoreSnapshot(ctx, "s2", "erin"); err != nil || sb.User != "erin" {
		t.Fatalf("restore of s2 through replica 0: %+v, %v", sb, err)
	}
	cat(r1, "erin", "two\n")
}
