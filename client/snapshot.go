package client

import (
	"bytes"
	"context"
	"encoding/json"

	"github.com/sandkeep/sandkeep/wire"
)

// Snapshot is one snapshot of a workspace, as GET /v1/snapshots lists it.
type Snapshot = wire.Snapshot

// CreateSnapshot archives user's workspace as a snapshot of the token's tenant called name ("" for a fresh
// name). It needs the exec scope. A user without a sandbox is SANDBOX_NOT_FOUND, a name the tenant has
// SNAPSHOT_EXISTS, one past the tenant's snapshot quota QUOTA_EXCEEDED.
func (c *Client) CreateSnapshot(ctx context.Context, user, name string) (Snapshot, error) {
	b, err := json.Marshal(wire.SnapshotCreate{Name: name})
	if err != nil {
		return Snapshot{}, err
	}
	var sn Snapshot
	err = c.call(ctx, "POST", "/v1/sandboxes/"+escape(user)+"/snapshots", nil, bytes.NewReader(b), jsonBody(), &sn)
	return sn, err
}

// Snapshots lists the token's tenant's snapshots, sorted by name.
func (c *Client) Snapshots(ctx context.Context) ([]Snapshot, error) {
	var out wire.SnapshotList
	err := c.call(ctx, "GET", "/v1/snapshots", nil, nil, nil, &out)
	return out.Snapshots, err
}

// DeleteSnapshot deletes the tenant's snapshot called name (SNAPSHOT_NOT_FOUND when there is none). It needs the
// exec scope.
func (c *Client) DeleteSnapshot(ctx context.Context, name string) error {
	return c.call(ctx, "DELETE", "/v1/snapshots/"+escape(name), nil, nil, nil, nil)
}

// RestoreSnapshot makes user, a new user of the token's tenant, a sandbox whose workspace holds the snapshot
// called name, in its template. It needs the exec scope. An unknown name is SNAPSHOT_NOT_FOUND, a user that has a
// sandbox SANDBOX_EXISTS, one past the tenant's max_sandboxes QUOTA_EXCEEDED.
func (c *Client) RestoreSnapshot(ctx context.Context, name, user string) (Sandbox, error) {
	return c.restore(ctx, wire.SnapshotRestore{User: user}, name)
}

// ReplaceFromSnapshot is RestoreSnapshot onto user whether or not it has a sandbox: an existing user's sandbox is
// stopped (its processes end) and its workspace replaced whole by the snapshot's, once the archive was read and
// checked (an unknown or damaged snapshot leaves the user as it was); a new user is restored as RestoreSnapshot
// does.
func (c *Client) ReplaceFromSnapshot(ctx context.Context, name, user string) (Sandbox, error) {
	return c.restore(ctx, wire.SnapshotRestore{User: user, Replace: true}, name)
}

func (c *Client) restore(ctx context.Context, req wire.SnapshotRestore, name string) (Sandbox, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return Sandbox{}, err
	}
	var sb Sandbox
	err = c.call(ctx, "POST", "/v1/snapshots/"+escape(name)+"/restore", nil, bytes.NewReader(b), jsonBody(), &sb)
	return sb, err
}
