package snapshot

import (
	"bytes"
	"context"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// TestStoreS3: TestStore with the archives in an S3-compatible bucket (gofakes3, an S3 server run in this
// process on loopback, spoken to through minio-go as a real server would be): the same dedup, removal, quotas and
// digest check; the objects are content addressed under the prefix, and nothing is written to the home's blobs.
// A bucket that does not exist fails the create, keeping nothing.
func TestStoreS3(t *testing.T) {
	backend := s3mem.New()
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(srv.Close)
	if err := backend.CreateBucket("snaps"); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(srv.URL)
	cfg := S3Config{Endpoint: u.Host, Bucket: "snaps", Prefix: "site-a/", Region: "us-east-1", AccessKey: "k", SecretKey: "s", Insecure: true}
	arch, err := OpenS3(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s, err := Open(dir, Quota{Count: 3, Bytes: 10}, nil, arch)
	if err != nil {
		t.Fatal(err)
	}
	objects := func() []string {
		res, err := backend.ListBucket("snaps", &gofakes3.Prefix{}, gofakes3.ListBucketPage{})
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, c := range res.Contents {
			keys = append(keys, c.Key)
		}
		return keys
	}
	testStore(t, s, dir, func() int { return len(objects()) }, func(digest string) {
		obj := "site-a/blobs/sha256/" + strings.TrimPrefix(digest, "sha256:") + ".tar"
		if _, err := backend.PutObject("snaps", obj, map[string]string{}, bytes.NewReader([]byte("XX")), 2, nil); err != nil {
			t.Fatal(err)
		}
	})
	for _, k := range objects() {
		if !strings.HasPrefix(k, "site-a/blobs/sha256/") || !strings.HasSuffix(k, ".tar") {
			t.Errorf("object %q is not content addressed under the prefix", k)
		}
	}
	if local, _ := os.ReadDir(filepath.Join(dir, "blobs", "sha256")); len(local) != 0 {
		t.Errorf("%d archives in the home's directory with an S3 store", len(local))
	}

	cfg.Bucket = "absent"
	arch, err = OpenS3(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := Open(t.TempDir(), Quota{}, nil, arch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Create(context.Background(), Snapshot{Name: "x", Tenant: "acme"}, fill("1")); err == nil {
		t.Fatal("a create into a bucket that does not exist succeeded")
	}
	if list, _ := s2.List("acme"); len(list) != 0 {
		t.Fatalf("a failed create kept %+v", list)
	}
}
