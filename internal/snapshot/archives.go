package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Archives keeps snapshot archives by their digest ("sha256:<hex>"): content addressed, so one archive serves
// every snapshot of the same content. The Store calls Put and Remove under its lock, and checks every byte it
// reads back against the digest (a damaged or swapped archive is an error at its end), so an implementation need
// not trust its backend.
type Archives interface {
	// Put stores the archive in the local file at path (size bytes, hashing to digest) unless an archive is
	// stored under digest already. The file may be moved away or left; the caller removes what is left.
	Put(ctx context.Context, digest, path string, size int64) error
	// Open reads the archive stored under digest.
	Open(ctx context.Context, digest string) (io.ReadCloser, error)
	// Remove deletes the archive stored under digest; an absent one is not an error.
	Remove(ctx context.Context, digest string) error
}

// hexOf is the hex part of digest, checked: nothing else may name a file or an object.
func hexOf(digest string) (string, error) {
	h, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
		return "", fmt.Errorf("snapshots: %q is not a sha256 digest", digest)
	}
	return h, nil
}

// dirArchives keeps archives in a directory of the home (<dir>/<hex>.tar), the default.
type dirArchives string

var _ Archives = dirArchives("")

func (d dirArchives) file(digest string) (string, error) {
	h, err := hexOf(digest)
	if err != nil {
		return "", err
	}
	return filepath.Join(string(d), h+".tar"), nil
}

func (d dirArchives) Put(_ context.Context, digest, path string, _ int64) error {
	p, err := d.file(digest)
	if err != nil {
		return err
	}
	if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
		return err // there already (nil), or unknown
	}
	if err := os.Rename(path, p); err != nil {
		return fmt.Errorf("snapshots: %w", err)
	}
	return nil
}

func (d dirArchives) Open(_ context.Context, digest string) (io.ReadCloser, error) {
	p, err := d.file(digest)
	if err != nil {
		return nil, err
	}
	return os.Open(p)
}

func (d dirArchives) Remove(_ context.Context, digest string) error {
	p, err := d.file(digest)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("snapshots: %w", err)
	}
	return nil
}

// S3Config names an S3-compatible bucket for snapshot archives: Endpoint is host[:port] (TLS unless Insecure),
// Prefix is put before every object's name, Region may be empty for servers that ignore it. Empty keys are read
// from the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or MINIO_ROOT_USER and MINIO_ROOT_PASSWORD).
type S3Config struct {
	Endpoint, Bucket, Prefix, Region, AccessKey, SecretKey string
	Insecure                                               bool
}

// s3Archives keeps archives as objects <prefix>blobs/sha256/<hex>.tar of one bucket, through minio-go.
type s3Archives struct {
	c      *minio.Client
	bucket string
	prefix string
}

// OpenS3 returns the Archives of the bucket cfg names. Nothing is asked of the server until an archive is stored
// or read: a server that is down fails those calls, not the opening.
func OpenS3(cfg S3Config) (Archives, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, fmt.Errorf("snapshots: an S3 store needs an endpoint and a bucket")
	}
	creds := credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, "")
	if cfg.AccessKey == "" && cfg.SecretKey == "" {
		creds = credentials.NewChainCredentials([]credentials.Provider{&credentials.EnvAWS{}, &credentials.EnvMinio{}})
	}
	c, err := minio.New(cfg.Endpoint, &minio.Options{Creds: creds, Secure: !cfg.Insecure, Region: cfg.Region,
		BucketLookup: minio.BucketLookupPath})
	if err != nil {
		return nil, fmt.Errorf("snapshots: S3 store %s: %w", cfg.Endpoint, err)
	}
	return &s3Archives{c: c, bucket: cfg.Bucket, prefix: cfg.Prefix}, nil
}

func (s *s3Archives) object(digest string) (string, error) {
	h, err := hexOf(digest)
	if err != nil {
		return "", err
	}
	return s.prefix + path.Join("blobs", "sha256", h+".tar"), nil
}

// notFound reports an S3 answer that the object is not there.
func notFound(err error) bool {
	code := minio.ToErrorResponse(err).Code
	return code == minio.NoSuchKey || code == "NotFound"
}

func (s *s3Archives) Put(ctx context.Context, digest, file string, size int64) error {
	obj, err := s.object(digest)
	if err != nil {
		return err
	}
	if _, err := s.c.StatObject(ctx, s.bucket, obj, minio.StatObjectOptions{}); err == nil {
		return nil // the same content, stored by an earlier snapshot
	} else if !notFound(err) {
		return fmt.Errorf("snapshots: S3 %s/%s: %w", s.bucket, obj, err)
	}
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("snapshots: %w", err)
	}
	defer f.Close()
	_, err = s.c.PutObject(ctx, s.bucket, obj, f, size, minio.PutObjectOptions{ContentType: "application/x-tar"})
	if err != nil {
		return fmt.Errorf("snapshots: S3 put %s/%s: %w", s.bucket, obj, err)
	}
	return nil
}

func (s *s3Archives) Open(ctx context.Context, digest string) (io.ReadCloser, error) {
	obj, err := s.object(digest)
	if err != nil {
		return nil, err
	}
	o, err := s.c.GetObject(ctx, s.bucket, obj, minio.GetObjectOptions{})
	if err == nil {
		_, err = o.Stat() // GetObject asks nothing yet: a missing object says so here, not mid-restore
	}
	if err != nil {
		return nil, fmt.Errorf("snapshots: S3 get %s/%s: %w", s.bucket, obj, err)
	}
	return o, nil
}

func (s *s3Archives) Remove(ctx context.Context, digest string) error {
	obj, err := s.object(digest)
	if err != nil {
		return err
	}
	if err := s.c.RemoveObject(ctx, s.bucket, obj, minio.RemoveObjectOptions{}); err != nil && !notFound(err) {
		return fmt.Errorf("snapshots: S3 remove %s/%s: %w", s.bucket, obj, err)
	}
	return nil
}
