package apitest

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/snapshots"
)

var (
	_ service.Forker      = (*Backend)(nil)
	_ service.Snapshotter = (*Backend)(nil)
)

// snapMap is the fake's snapshots, by tenant + "\x00" + name (they keep no files); b.mu guards it.
func (b *Backend) snapMap() map[string]snapshots.Snapshot {
	if b.snaps == nil {
		b.snaps = map[string]snapshots.Snapshot{}
	}
	return b.snaps
}

// Fork makes to's sandbox (no files are copied) when from has one and to has none.
func (b *Backend) Fork(ctx context.Context, from, to sandkeep.Key, ar service.AdmitRequest) (sandkeep.Sandbox, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	src, ok := b.boxes[from.Hex()]
	if !ok {
		return sandkeep.Sandbox{}, errNoSandbox(from)
	}
	if _, ok := b.boxes[to.Hex()]; ok {
		return sandkeep.Sandbox{}, fault.New(fault.SandboxExists, "name a new user", "user %q has a sandbox", to.User)
	}
	sb := sandkeep.Sandbox{Tenant: to.Tenant, User: to.User, Key: to.Hex(), Name: to.ContainerName(), State: "running",
		Image: src.Image, Template: src.Template, CreatedAt: time.Now().UTC()}
	b.boxes[to.Hex()] = sb
	return sb, nil
}

// CreateSnapshot records a snapshot of key's sandbox (which must exist) called name.
func (b *Backend) CreateSnapshot(ctx context.Context, key sandkeep.Key, name, requestID string) (snapshots.Snapshot, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.boxes[key.Hex()]; !ok {
		return snapshots.Snapshot{}, errNoSandbox(key)
	}
	if _, ok := b.snapMap()[key.Tenant+"\x00"+name]; ok {
		return snapshots.Snapshot{}, fault.New(fault.SnapshotExists, "choose another name", "snapshot %q exists", name)
	}
	sn := snapshots.Snapshot{Name: name, Tenant: key.Tenant, User: key.User, Digest: "sha256:00", CreatedAt: time.Now().UTC()}
	b.snapMap()[key.Tenant+"\x00"+name] = sn
	return sn, nil
}

// Snapshots lists tenant's snapshots by name.
func (b *Backend) Snapshots(ctx context.Context, tenant string) ([]snapshots.Snapshot, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []snapshots.Snapshot
	for _, sn := range b.snapMap() {
		if sn.Tenant == tenant {
			out = append(out, sn)
		}
	}
	slices.SortFunc(out, func(a, c snapshots.Snapshot) int { return strings.Compare(a.Name, c.Name) })
	return out, nil
}

func errNoSnapshot(name string) error {
	return fault.New(fault.SnapshotNotFound, "GET /v1/snapshots lists them", "no snapshot %q", name)
}

// DeleteSnapshot removes tenant's snapshot called name.
func (b *Backend) DeleteSnapshot(ctx context.Context, tenant, name, requestID string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.snapMap()[tenant+"\x00"+name]; !ok {
		return errNoSnapshot(name)
	}
	delete(b.snapMap(), tenant+"\x00"+name)
	return nil
}

// RestoreSnapshot makes to's sandbox from to's tenant's snapshot called name.
func (b *Backend) RestoreSnapshot(ctx context.Context, name string, to sandkeep.Key, ar service.AdmitRequest, opts service.RestoreOptions) (sandkeep.Sandbox, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.snapMap()[to.Tenant+"\x00"+name]; !ok {
		return sandkeep.Sandbox{}, errNoSnapshot(name)
	}
	if _, ok := b.boxes[to.Hex()]; ok && !opts.Replace {
		return sandkeep.Sandbox{}, fault.New(fault.SandboxExists, "name a new user", "user %q has a sandbox", to.User)
	}
	sb := sandkeep.Sandbox{Tenant: to.Tenant, User: to.User, Key: to.Hex(), Name: to.ContainerName(), State: "running", CreatedAt: time.Now().UTC()}
	b.boxes[to.Hex()] = sb
	return sb, nil
}
