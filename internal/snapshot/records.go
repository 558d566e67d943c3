package snapshot

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
)

// dbWait bounds a read of the records in the run store by a caller that passes no context.
const dbWait = 30 * time.Second

// digestLeaseTTL is how long a digest's lease lasts: longer than storing or removing one archive takes. A process
// killed while it holds one leaves that digest's creates and deletes waiting for at most that long.
const digestLeaseTTL = 10 * time.Minute

// UseStore keeps s's records in db, the run store (store.SnapshotStore), instead of the home: every process
// sharing db (the replicas of a fleet) lists, restores and deletes every snapshot, whichever took it, as long as
// they read the same archives (an S3 bucket, or a directory they share). The records an earlier version kept in
// the home are moved into db first (a name db has already stays as db has it).
func (s *Store) UseStore(ctx context.Context, db store.Store) error {
	var b [8]byte
	_, _ = rand.Read(b[:])
	s.db, s.owner = db, "snapshots/"+hex.EncodeToString(b[:])
	return s.importRecords(ctx)
}

// importRecords moves the home's records into the run store.
func (s *Store) importRecords(ctx context.Context) error {
	root := filepath.Join(s.dir, "records")
	var paths []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".json") {
			paths = append(paths, p)
		}
		return err
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("snapshots: %w", err)
	}
	file := &Store{dir: s.dir}
	for _, p := range paths {
		tenantDir := filepath.Base(filepath.Dir(p))
		name := strings.TrimSuffix(filepath.Base(p), ".json")
		sn, err := file.getFile(p, name)
		if err != nil || file.tenantDir(sn.Tenant) != filepath.Join(root, tenantDir) {
			continue // damaged, or not where its tenant's records are: left for the operator
		}
		err = s.db.CreateSnapshot(ctx, sn, Quota{})
		if err != nil && !errdefs.IsAlreadyExists(err) {
			return fmt.Errorf("snapshots: move %s of %s into the store: %w", sn.Name, sn.Tenant, err)
		}
		_ = os.Remove(p)
	}
	return nil
}

// createRecord stores the archive in file under sn's digest and records sn, both under the digest's lease.
func (s *Store) createRecord(ctx context.Context, sn Snapshot, file string) (Snapshot, error) {
	release, err := s.leaseDigest(ctx, sn.Digest)
	if err != nil {
		return Snapshot{}, err
	}
	defer release()
	if err := s.arch.Put(ctx, sn.Digest, file, sn.Bytes); err != nil {
		return Snapshot{}, err
	}
	err = s.db.CreateSnapshot(ctx, sn, s.quota)
	var qe *store.SnapshotQuotaError
	switch {
	case errdefs.IsAlreadyExists(err):
		return Snapshot{}, fault.New(fault.SnapshotExists, "choose another name, or delete that snapshot first (sandkeep snapshot rm)",
			"tenant %s already has a snapshot %q", sn.Tenant, sn.Name)
	case errors.As(err, &qe):
		return Snapshot{}, s.errQuota(sn.Tenant, qe.What)
	case err != nil:
		return Snapshot{}, fmt.Errorf("snapshots: %w", err)
	}
	return sn, nil
}

// deleteRecord removes tenant's record name and, when it was the last to name its archive, the archive, under
// the digest's lease.
func (s *Store) deleteRecord(ctx context.Context, tenant, name string) (Snapshot, bool, error) {
	sn, err := s.Get(tenant, name)
	if err != nil {
		return Snapshot{}, false, err
	}
	release, err := s.leaseDigest(ctx, sn.Digest)
	if err != nil {
		return Snapshot{}, false, err
	}
	defer release()
	r, last, err := s.db.DeleteSnapshot(ctx, tenant, name)
	if errdefs.IsNotFound(err) {
		return Snapshot{}, false, ErrNotFound(name)
	}
	if err != nil {
		return Snapshot{}, false, fmt.Errorf("snapshots: %w", err)
	}
	if !last {
		return r, false, nil
	}
	if err := s.arch.Remove(ctx, r.Digest); err != nil {
		return r, false, err
	}
	return r, true, nil
}

// leaseDigest waits until this Store holds digest's lease in the run store; the function gives it back.
func (s *Store) leaseDigest(ctx context.Context, digest string) (func(), error) {
	h, err := hexOf(digest)
	if err != nil {
		return nil, err
	}
	name := "snapshot-archive/" + h
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		l, err := s.db.AcquireLease(ctx, name, s.owner, "", digestLeaseTTL)
		if err == nil {
			return func() { _ = s.db.ReleaseLease(context.WithoutCancel(ctx), l) }, nil
		}
		if !errdefs.IsConflict(err) {
			return nil, fmt.Errorf("snapshots: lease of %s: %w", digest, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("snapshots: another process is storing or removing the archive %s: %w", digest, ctx.Err())
		case <-time.After(wait):
		}
	}
}
