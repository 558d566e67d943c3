package mcpserver

import (
	"context"
	"testing"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/snapshots"
)

// snapBackend is the fake backend with an in-memory Snapshotter that keys snapshots by tenant and name.
type snapBackend struct {
	*fakeBackend
	snaps    map[string]snapshots.Snapshot // tenant + "/" + name
	restored []sandkeep.Key
	replaced []bool // each restore's RestoreOptions.Replace
}

func (b *snapBackend) CreateSnapshot(_ context.Context, key sandkeep.Key, name, _ string) (snapshots.Snapshot, error) {
	if _, ok := b.snaps[key.Tenant+"/"+name]; ok {
		return snapshots.Snapshot{}, fault.New(fault.SnapshotExists, "other name", "exists")
	}
	sn := snapshots.Snapshot{Name: name, Tenant: key.Tenant, User: key.User, Digest: "sha256:00", Bytes: 3}
	b.snaps[key.Tenant+"/"+name] = sn
	return sn, nil
}

func (b *snapBackend) Snapshots(_ context.Context, tenant string) ([]snapshots.Snapshot, error) {
	var out []snapshots.Snapshot
	for _, sn := range b.snaps {
		if sn.Tenant == tenant {
			out = append(out, sn)
		}
	}
	return out, nil
}

func (b *snapBackend) DeleteSnapshot(_ context.Context, tenant, name, _ string) error {
	if _, ok := b.snaps[tenant+"/"+name]; !ok {
		return fault.New(fault.SnapshotNotFound, "list", "none")
	}
	delete(b.snaps, tenant+"/"+name)
	return nil
}

var _ service.Snapshotter = (*snapBackend)(nil)

func (b *snapBackend) RestoreSnapshot(_ context.Context, name string, to sandkeep.Key, _ service.AdmitRequest, opts service.RestoreOptions) (sandkeep.Sandbox, error) {
	if _, ok := b.snaps[to.Tenant+"/"+name]; !ok {
		return sandkeep.Sandbox{}, fault.New(fault.SnapshotNotFound, "list", "none")
	}
	b.restored = append(b.restored, to)
	b.replaced = append(b.replaced, opts.Replace)
	return sandkeep.Sandbox{Tenant: to.Tenant, User: to.User, Name: to.ContainerName(), State: "running"}, nil
}

// TestSnapshotTools: the snapshot tools act on the session's own key and tenant (a restore goes to a user of the
// same tenant), pass the backend's codes on, need their scopes, and answer SPEC_UNSUPPORTED over a backend that
// keeps no snapshots.
func TestSnapshotTools(t *testing.T) {
	b := &snapBackend{fakeBackend: newFakeBackend(t), snaps: map[string]snapshots.Snapshot{}}
	alice := mustKey(t, "acme", "alice")
	cs := connect(t, New(b, alice, Options{}))
	out := output[SnapshotOutput](t, call(t, cs, ToolCreateSnapshot, map[string]any{"name": "s1"}))
	if out.Name != "s1" || out.User != "alice" {
		t.Fatalf("create_snapshot: %+v", out)
	}
	wantCode(t, call(t, cs, ToolCreateSnapshot, map[string]any{"name": "s1"}), fault.SnapshotExists)
	b.snaps["globex/s2"] = snapshots.Snapshot{Name: "s2", Tenant: "globex"}
	list := output[SnapshotListOutput](t, call(t, cs, ToolListSnapshots, map[string]any{}))
	if len(list.Snapshots) != 1 || list.Snapshots[0].Name != "s1" {
		t.Fatalf("list_snapshots shows %+v", list)
	}
	sb := output[ForkOutput](t, call(t, cs, ToolRestoreSnapshot, map[string]any{"name": "s1", "user": "bob"}))
	if sb.User != "bob" || len(b.restored) != 1 || b.restored[0] != mustKey(t, "acme", "bob") || b.replaced[0] {
		t.Fatalf("restore_snapshot: %+v, %v (replace %v)", sb, b.restored, b.replaced)
	}
	output[ForkOutput](t, call(t, cs, ToolRestoreSnapshot, map[string]any{"name": "s1", "user": "bob", "replace": true}))
	if len(b.replaced) != 2 || !b.replaced[1] {
		t.Fatalf("restore_snapshot with replace reached the backend as %v", b.replaced)
	}
	wantCode(t, call(t, cs, ToolRestoreSnapshot, map[string]any{"name": "s2", "user": "bob"}), fault.SnapshotNotFound)
	output[DeleteOutput](t, call(t, cs, ToolDeleteSnapshot, map[string]any{"name": "s1"}))
	wantCode(t, call(t, cs, ToolDeleteSnapshot, map[string]any{"name": "s1"}), fault.SnapshotNotFound)
	for tool, want := range map[string]string{ToolCreateSnapshot: "exec", ToolRestoreSnapshot: "exec", ToolDeleteSnapshot: "exec", ToolListSnapshots: "read"} {
		if Scope(tool) != want {
			t.Errorf("%s needs scope %q, want %q", tool, Scope(tool), want)
		}
	}
	plain := connect(t, New(newFakeBackend(t), alice, Options{}))
	wantCode(t, call(t, plain, ToolListSnapshots, map[string]any{}), fault.SpecUnsupported)
}
