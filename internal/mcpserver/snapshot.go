package mcpserver

import (
	"context"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/snapshots"
)

// Snapshot tool names.
const (
	ToolCreateSnapshot  = "create_snapshot"
	ToolListSnapshots   = "list_snapshots"
	ToolRestoreSnapshot = "restore_snapshot"
	ToolDeleteSnapshot  = "delete_snapshot"
)

// SnapshotInput names one snapshot.
type SnapshotInput struct {
	Name string `json:"name,omitempty" jsonschema:"the snapshot's name, unique in this session's tenant; for create_snapshot, absent gives a fresh one"`
}

// RestoreInput is the restore_snapshot tool's input.
type RestoreInput struct {
	Name string `json:"name" jsonschema:"the snapshot to restore"`
	User string `json:"user" jsonschema:"the user (of this session's tenant) to restore into: a new one, with no sandbox yet (or, with replace, one that has one)"`
	// Replace restores onto a user that has a sandbox: stopped, its workspace replaced whole.
	Replace bool `json:"replace,omitempty" jsonschema:"restore onto a user that has a sandbox: it is stopped and its whole workspace replaced by the snapshot's (its processes end); without it such a user is refused"`
}

// SnapshotOutput is one snapshot.
type SnapshotOutput struct {
	Name      string    `json:"name" jsonschema:"the snapshot's name"`
	User      string    `json:"user" jsonschema:"the user whose workspace it was taken from"`
	Template  string    `json:"template,omitempty" jsonschema:"the template of that user's sandbox"`
	Digest    string    `json:"digest" jsonschema:"sha256 of the archive"`
	Bytes     int64     `json:"bytes" jsonschema:"the archive's size in bytes"`
	CreatedAt time.Time `json:"created_at" jsonschema:"when it was taken (RFC 3339)"`
}

// SnapshotListOutput is the list_snapshots tool's result.
type SnapshotListOutput struct {
	Snapshots []SnapshotOutput `json:"snapshots" jsonschema:"the tenant's snapshots, sorted by name"`
}

// DeleteOutput is the delete_snapshot tool's result.
type DeleteOutput struct {
	Deleted string `json:"deleted" jsonschema:"the name of the snapshot deleted"`
}

var snapshotTools = struct{ create, list, restore, del *mcp.Tool }{
	create: &mcp.Tool{Name: ToolCreateSnapshot, Title: "Snapshot the workspace",
		Description: "Keep this sandbox's /workspace as a named snapshot, to come back to this state later (restore_snapshot).",
		Annotations: &mcp.ToolAnnotations{Title: "Snapshot the workspace", OpenWorldHint: new(false)},
		InputSchema: inputSchema[SnapshotInput](nil)},
	list: &mcp.Tool{Name: ToolListSnapshots, Title: "List snapshots",
		Description: "List the snapshots of this session's tenant.",
		Annotations: &mcp.ToolAnnotations{Title: "List snapshots", ReadOnlyHint: true, OpenWorldHint: new(false)},
		InputSchema: inputSchema[StatusInput](nil)},
	restore: &mcp.Tool{Name: ToolRestoreSnapshot, Title: "Restore a snapshot",
		Description: "Make a new sandbox for another user of this tenant whose /workspace holds a snapshot, in the snapshot's template.",
		Annotations: &mcp.ToolAnnotations{Title: "Restore a snapshot", OpenWorldHint: new(false)},
		InputSchema: inputSchema[RestoreInput](nil)},
	del: &mcp.Tool{Name: ToolDeleteSnapshot, Title: "Delete a snapshot",
		Description: "Delete one of this tenant's snapshots.",
		Annotations: &mcp.ToolAnnotations{Title: "Delete a snapshot", DestructiveHint: new(true), OpenWorldHint: new(false)},
		InputSchema: inputSchema[SnapshotInput](nil)},
}

func (t *tools) registerSnapshots(s *mcp.Server) {
	mcp.AddTool(s, snapshotTools.create, handle(t, ToolCreateSnapshot, t.createSnapshot))
	mcp.AddTool(s, snapshotTools.list, handle(t, ToolListSnapshots, t.listSnapshots))
	mcp.AddTool(s, snapshotTools.restore, handle(t, ToolRestoreSnapshot, t.restoreSnapshot))
	mcp.AddTool(s, snapshotTools.del, handle(t, ToolDeleteSnapshot, t.deleteSnapshot))
}

func (t *tools) snapshotter() (service.Snapshotter, error) {
	sn, ok := t.b.(service.Snapshotter)
	if !ok {
		return nil, service.ErrNoSnapshots()
	}
	return sn, nil
}

func snapshotOut(sn snapshots.Snapshot) SnapshotOutput {
	return SnapshotOutput{Name: sn.Name, User: sn.User, Template: sn.Template, Digest: sn.Digest, Bytes: sn.Bytes, CreatedAt: sn.CreatedAt}
}

func (t *tools) createSnapshot(ctx context.Context, in SnapshotInput) (SnapshotOutput, error) {
	sn, err := t.snapshotter()
	if err != nil {
		return SnapshotOutput{}, err
	}
	out, err := sn.CreateSnapshot(ctx, t.key, in.Name, t.requestID)
	if err != nil {
		return SnapshotOutput{}, err
	}
	return snapshotOut(out), nil
}

func (t *tools) listSnapshots(ctx context.Context, _ StatusInput) (SnapshotListOutput, error) {
	sn, err := t.snapshotter()
	if err != nil {
		return SnapshotListOutput{}, err
	}
	list, err := sn.Snapshots(ctx, t.key.Tenant)
	if err != nil {
		return SnapshotListOutput{}, err
	}
	out := SnapshotListOutput{Snapshots: []SnapshotOutput{}}
	for _, s := range list {
		out.Snapshots = append(out.Snapshots, snapshotOut(s))
	}
	return out, nil
}

func (t *tools) restoreSnapshot(ctx context.Context, in RestoreInput) (ForkOutput, error) {
	sn, err := t.snapshotter()
	if err != nil {
		return ForkOutput{}, err
	}
	to, err := sandkeep.NewKey(t.key.Tenant, in.User)
	if err != nil {
		return ForkOutput{}, err
	}
	sb, err := sn.RestoreSnapshot(ctx, in.Name, to, service.AdmitRequest{RequestID: t.requestID}, service.RestoreOptions{Replace: in.Replace})
	if err != nil {
		return ForkOutput{}, err
	}
	return ForkOutput{Tenant: sb.Tenant, User: sb.User, Name: sb.Name, State: sb.State, Template: sb.Template}, nil
}

func (t *tools) deleteSnapshot(ctx context.Context, in SnapshotInput) (DeleteOutput, error) {
	sn, err := t.snapshotter()
	if err != nil {
		return DeleteOutput{}, err
	}
	if err := sn.DeleteSnapshot(ctx, t.key.Tenant, in.Name, t.requestID); err != nil {
		return DeleteOutput{}, err
	}
	return DeleteOutput{Deleted: in.Name}, nil
}
