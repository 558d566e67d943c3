// Package snapshot keeps workspace snapshots in a state home: each one a tar of a workspace stored once under its
// SHA-256 (blobs/sha256/<hex>.tar, shared by every snapshot with the same content: in the home, or in an
// S3-compatible bucket the operator configures, Archives), and a record per (tenant, name) in the home that names
// the archive and the template and image it was taken from. It bounds each tenant's snapshots
// (how many, and their archives' bytes) and refuses what would pass; it knows nothing of sandboxes.
package snapshot

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/gofrs/flock"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
)

// Snapshot is one snapshot's record: the run store's type, also what the home's record files hold.
type Snapshot = store.SnapshotRecord

// Quota bounds one tenant's snapshots; a zero field is no bound.
type Quota = store.SnapshotQuota

// Store is the snapshots of one state home, or (UseStore) of every process sharing a run store. It is safe for
// concurrent use by several processes: in the home, changes take an exclusive file lock and records are replaced
// atomically; in a run store, the store checks a record's name and quota in its insert's transaction, and the
// archive of one digest is stored or removed under a lease of that digest's, so a delete never removes an archive
// a create has just named.
type Store struct {
	dir   string
	quota Quota
	now   func() time.Time
	arch  Archives
	db    store.Store // UseStore: the records are there; nil: in dir/records
	owner string      // db: who holds the digests' leases
}

// Open makes (or opens) the store under dir, its archives in arch (nil: dir's blobs/sha256).
func Open(dir string, q Quota, now func() time.Time, arch Archives) (*Store, error) {
	for _, d := range []string{"blobs/sha256", "records", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("snapshots: %w", err)
		}
	}
	if now == nil {
		now = time.Now
	}
	if arch == nil {
		arch = dirArchives(filepath.Join(dir, "blobs", "sha256"))
	}
	return &Store{dir: dir, quota: q, now: now, arch: arch}, nil
}

// ValidName reports whether s may name a snapshot: 1..64 of [A-Za-z0-9._-], not starting with '.' or '-'.
func ValidName(s string) bool {
	if s == "" || len(s) > 64 || s[0] == '.' || s[0] == '-' {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
		default:
			return false
		}
	}
	return true
}

func checkName(name string) error {
	if !ValidName(name) {
		return fault.New(fault.InvalidArgument, "name snapshots with 1 to 64 letters, digits, '.', '_' and '-' (not starting with '.' or '-')",
			"snapshot name %q is not valid", name)
	}
	return nil
}

// ErrNotFound is SNAPSHOT_NOT_FOUND for tenant's name.
func ErrNotFound(name string) error {
	return fault.New(fault.SnapshotNotFound, "sandkeep snapshot list (GET /v1/snapshots) lists the tenant's snapshots",
		"no snapshot %q", name)
}

func (s *Store) tenantDir(tenant string) string {
	sum := sha256.Sum256([]byte(tenant))
	return filepath.Join(s.dir, "records", hex.EncodeToString(sum[:]))
}

func (s *Store) recordPath(tenant, name string) string {
	return filepath.Join(s.tenantDir(tenant), name+".json")
}

// lock takes the store's exclusive lock; the function releases it.
func (s *Store) lock(ctx context.Context) (func(), error) {
	l := flock.New(filepath.Join(s.dir, "lock"))
	ok, err := l.TryLockContext(ctx, 20*time.Millisecond)
	if err != nil || !ok {
		return nil, fmt.Errorf("snapshots: lock: %w", errors.Join(err, ctx.Err()))
	}
	return func() { _ = l.Unlock() }, nil
}

// NewName is a fresh snapshot name: snap-<UTC time>-<4 random hex>.
func (s *Store) NewName() string {
	var b [2]byte
	_, _ = rand.Read(b[:])
	return "snap-" + s.now().UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b[:])
}

// Create stores a snapshot of sn.Tenant named sn.Name ("" for NewName) with the archive fill writes. A name the
// tenant already has is SNAPSHOT_EXISTS, and one past the tenant's quota QUOTA_EXCEEDED (checked before fill runs
// and again once the archive's size is known); either way nothing is kept.
func (s *Store) Create(ctx context.Context, sn Snapshot, fill func(w io.Writer) error) (Snapshot, error) {
	if sn.Name == "" {
		sn.Name = s.NewName()
	}
	if err := checkName(sn.Name); err != nil {
		return Snapshot{}, err
	}
	room, err := s.room(sn.Tenant, sn.Name)
	if err != nil {
		return Snapshot{}, err
	}
	tmp, err := os.CreateTemp(filepath.Join(s.dir, "tmp"), "archive-*")
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshots: %w", err)
	}
	defer os.Remove(tmp.Name()) // renamed away on success
	h := sha256.New()
	cw := &capped{w: io.MultiWriter(tmp, h), left: room}
	err = fill(cw)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if cw.over {
		return Snapshot{}, s.errQuota(sn.Tenant, "bytes")
	}
	if err != nil {
		return Snapshot{}, err
	}
	sn.Digest, sn.Bytes, sn.CreatedAt = "sha256:"+hex.EncodeToString(h.Sum(nil)), cw.n, s.now().UTC()
	if s.db != nil {
		return s.createRecord(ctx, sn, tmp.Name())
	}
	release, err := s.lock(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	defer release()
	if _, err := s.room(sn.Tenant, sn.Name); err != nil { // another process may have taken the name or the room
		return Snapshot{}, err
	}
	if left, _ := s.bytesLeft(sn.Tenant); left >= 0 && sn.Bytes > left {
		return Snapshot{}, s.errQuota(sn.Tenant, "bytes")
	}
	if err := s.arch.Put(ctx, sn.Digest, tmp.Name(), sn.Bytes); err != nil {
		return Snapshot{}, err
	}
	if err := s.writeRecord(sn); err != nil {
		return Snapshot{}, err
	}
	return sn, nil
}

// room checks that tenant may add a snapshot called name and returns how many archive bytes it may still take
// (-1: no bound).
func (s *Store) room(tenant, name string) (int64, error) {
	if _, err := s.Get(tenant, name); err == nil {
		return 0, fault.New(fault.SnapshotExists, "choose another name, or delete that snapshot first (sandkeep snapshot rm)",
			"tenant %s already has a snapshot %q", tenant, name)
	}
	list, err := s.List(tenant)
	if err != nil {
		return 0, err
	}
	if s.quota.Count > 0 && len(list) >= s.quota.Count {
		return 0, s.errQuota(tenant, "snapshots")
	}
	return s.bytesLeft(tenant)
}

// bytesLeft is what tenant's snapshots may still take in bytes; -1 is no bound.
func (s *Store) bytesLeft(tenant string) (int64, error) {
	if s.quota.Bytes <= 0 {
		return -1, nil
	}
	list, err := s.List(tenant)
	if err != nil {
		return 0, err
	}
	used := int64(0)
	for _, sn := range list {
		used += sn.Bytes
	}
	return max(0, s.quota.Bytes-used), nil
}

func (s *Store) errQuota(tenant, what string) error {
	limit := fmt.Sprint(s.quota.Count)
	if what == "bytes" {
		limit = fmt.Sprint(s.quota.Bytes)
	}
	return fault.New(fault.QuotaExceeded, "delete snapshots the tenant no longer needs (sandkeep snapshot rm), or ask the operator for a larger snapshot quota",
		"tenant %s would pass its snapshot quota of %s %s; nothing was kept", tenant, limit, what)
}

func (s *Store) writeRecord(sn Snapshot) error {
	dir := s.tenantDir(sn.Tenant)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("snapshots: %w", err)
	}
	b, err := json.Marshal(sn)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".record-*")
	if err != nil {
		return fmt.Errorf("snapshots: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("snapshots: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("snapshots: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.recordPath(sn.Tenant, sn.Name)); err != nil {
		return fmt.Errorf("snapshots: %w", err)
	}
	return nil
}

// List returns tenant's snapshots, sorted by name.
func (s *Store) List(tenant string) ([]Snapshot, error) {
	if s.db != nil {
		ctx, cancel := context.WithTimeout(context.Background(), dbWait)
		defer cancel()
		recs, err := s.db.ListSnapshots(ctx, tenant)
		if err != nil {
			return nil, fmt.Errorf("snapshots: %w", err)
		}
		out := make([]Snapshot, 0, len(recs))
		for _, r := range recs {
			out = append(out, Snapshot(r))
		}
		return out, nil
	}
	entries, err := os.ReadDir(s.tenantDir(tenant))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("snapshots: %w", err)
	}
	var out []Snapshot
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !ValidName(name) {
			continue
		}
		sn, err := s.Get(tenant, name)
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, sn)
	}
	slices.SortFunc(out, func(a, b Snapshot) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Get returns tenant's snapshot called name, or SNAPSHOT_NOT_FOUND.
func (s *Store) Get(tenant, name string) (Snapshot, error) {
	if !ValidName(name) {
		return Snapshot{}, ErrNotFound(name)
	}
	if s.db != nil {
		ctx, cancel := context.WithTimeout(context.Background(), dbWait)
		defer cancel()
		r, err := s.db.GetSnapshot(ctx, tenant, name)
		if errdefs.IsNotFound(err) {
			return Snapshot{}, ErrNotFound(name)
		}
		if err != nil {
			return Snapshot{}, fmt.Errorf("snapshots: %w", err)
		}
		return Snapshot(r), nil
	}
	sn, err := s.getFile(s.recordPath(tenant, name), name)
	if err == nil && sn.Tenant != tenant {
		err = fmt.Errorf("snapshots: record %s of %s is damaged: another tenant's", name, tenant)
	}
	return sn, err
}

// getFile reads the record at path, which names the snapshot name.
func (s *Store) getFile(path, name string) (Snapshot, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Snapshot{}, ErrNotFound(name)
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshots: %w", err)
	}
	var sn Snapshot
	if err := json.Unmarshal(b, &sn); err != nil || sn.Name != name {
		return Snapshot{}, fmt.Errorf("snapshots: record %s is damaged: %v", path, err)
	}
	return sn, nil
}

// Open returns a reader of sn's archive that fails at its end when the content is not the recorded digest.
func (s *Store) Open(ctx context.Context, sn Snapshot) (io.ReadCloser, error) {
	rc, err := s.arch.Open(ctx, sn.Digest)
	if err != nil {
		return nil, fmt.Errorf("snapshots: archive of %s: %w", sn.Name, err)
	}
	return &verified{f: rc, h: sha256.New(), want: sn.Digest}, nil
}

// Delete removes tenant's snapshot called name (SNAPSHOT_NOT_FOUND when there is none), and its archive when no
// other snapshot shares it. blobRemoved says whether the archive went.
func (s *Store) Delete(ctx context.Context, tenant, name string) (sn Snapshot, blobRemoved bool, err error) {
	if s.db != nil {
		return s.deleteRecord(ctx, tenant, name)
	}
	release, err := s.lock(ctx)
	if err != nil {
		return Snapshot{}, false, err
	}
	defer release()
	if sn, err = s.Get(tenant, name); err != nil {
		return Snapshot{}, false, err
	}
	if err := os.Remove(s.recordPath(tenant, name)); err != nil {
		return Snapshot{}, false, fmt.Errorf("snapshots: %w", err)
	}
	shared, err := s.referenced(sn.Digest)
	if err != nil || shared {
		return sn, false, err
	}
	if err := s.arch.Remove(ctx, sn.Digest); err != nil {
		return sn, false, err
	}
	return sn, true, nil
}

// referenced reports whether any tenant's record names digest.
func (s *Store) referenced(digest string) (bool, error) {
	found := false
	err := filepath.WalkDir(filepath.Join(s.dir, "records"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || found || d.IsDir() || !strings.HasSuffix(p, ".json") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil // removed meanwhile
		}
		var sn Snapshot
		if json.Unmarshal(b, &sn) == nil && sn.Digest == digest {
			found = true
		}
		return nil
	})
	return found, err
}

// capped passes at most left bytes to w (left < 0: no bound); past it, it fails and says so.
type capped struct {
	w    io.Writer
	left int64
	n    int64
	over bool
}

var errOver = errors.New("snapshot archive past the quota")

func (c *capped) Write(p []byte) (int, error) {
	if c.left >= 0 && c.n+int64(len(p)) > c.left {
		c.over = true
		return 0, errOver
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// verified reads an archive and, at its end, fails unless it hashed to want.
type verified struct {
	f    io.ReadCloser
	h    hash.Hash
	want string
}

func (v *verified) Read(p []byte) (int, error) {
	n, err := v.f.Read(p)
	v.h.Write(p[:n])
	if errors.Is(err, io.EOF) && "sha256:"+hex.EncodeToString(v.h.Sum(nil)) != v.want {
		return n, fmt.Errorf("snapshots: the archive does not match its digest %s: damaged where it is kept", v.want)
	}
	return n, err
}

func (v *verified) Close() error { return v.f.Close() }
