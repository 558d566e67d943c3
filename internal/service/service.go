// Package service is what the HTTP API (internal/api) and the MCP server (internal/mcpserver) call: sandkeep's
// library, its run store and its workspaces behind one tenant-aware contract. Callers scope every call to the
// tenant of the caller's token; the Backend itself trusts the Key it is given.
package service

import (
	"context"
	"net"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/store"
)

// Backend is the service's contract. Failures are *fault.Error values (sandkeep.CodeOf) where a caller can act.
type Backend interface {
	// Exec checks req, admits its run for a caller as Admit does (ar.RunID, when set, must name a running run of
	// the same tenant and user) and runs req in it (sandkeep.Manager.ExecWith). A malformed req is refused before
	// anything is admitted.
	Exec(ctx context.Context, key sandkeep.Key, ar AdmitRequest, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error)
	// List returns the sandboxes of tenant, sorted by user.
	List(ctx context.Context, tenant string) ([]sandkeep.Sandbox, error)
	// Sandbox describes key's sandbox; none is fault.NotFound.
	Sandbox(ctx context.Context, key sandkeep.Key) (sandkeep.Sandbox, error)
	// Stop stops key's sandbox; none is fault.NotFound.
	Stop(ctx context.Context, key sandkeep.Key) error
	// Remove deletes key's sandbox and its workspace; neither existing is fault.NotFound.
	Remove(ctx context.Context, key sandkeep.Key) error
	// Workspace opens key's workspace for host-side file access; the caller closes it. With create, a missing
	// workspace is created (owned by the sandbox user); without, it is fault.NotFound.
	Workspace(ctx context.Context, key sandkeep.Key, create bool) (*files.FS, error)
	// Runs lists runs (f.Tenant is always set by the caller), newest first.
	Runs(ctx context.Context, f store.RunFilter) ([]store.Run, error)
	// Run returns one run, or fault.RunNotFound. The caller checks its tenant.
	Run(ctx context.Context, id string) (store.Run, error)
	// Events lists a run's events in sequence order.
	Events(ctx context.Context, f store.EventFilter) ([]store.Event, error)
	// Admit admits a run of key for a caller (a template by name, a trust that may only lower the operator's) and
	// records it, refused ones too; a refused run comes back with its error.
	Admit(ctx context.Context, key sandkeep.Key, req AdmitRequest) (*sandkeep.Run, error)
	// EndRun closes a running run (the caller checks its tenant) as succeeded or failed (FAILED, deterministic).
	EndRun(ctx context.Context, id string, failed bool) error
	// Templates lists the operator templates tenant may use.
	Templates(ctx context.Context, tenant string) ([]string, error)
	// Ready reports whether the store and the driver answer.
	Ready(ctx context.Context) error
}

// PortDialer is optional: a Backend that can forward connections to a port inside a sandbox (port forwarding).
// The API finds it with a type assertion; without it the port-forward route answers PORT_FORWARD_UNAVAILABLE.
type PortDialer interface {
	// DialPort opens one connection to 127.0.0.1:port inside key's running sandbox (sandkeep.Manager.DialPort).
	DialPort(ctx context.Context, key sandkeep.Key, port int, pf sandkeep.PortForward) (net.Conn, error)
}

// RunLogLister is optional: a Backend that reads runs' logs (what the driver did, what setup steps printed) from
// its store. Without it GET /v1/runs/{id}/logs answers RUN_NOT_FOUND.
type RunLogLister interface {
	// RunLogs lists one run's log entries in sequence order. The caller checks the run's tenant.
	RunLogs(ctx context.Context, f store.RunLogFilter) ([]store.RunLog, error)
}

// ForwardPortLister is optional: a Backend that reads the forwardPorts of the repository key's runs follow
// (devcontainer.json) and what port forwarding does with each. Without it GET /v1/sandboxes/{user}/ports answers
// PORT_FORWARD_UNAVAILABLE.
type ForwardPortLister interface {
	// ForwardPorts is sandkeep.Manager.ForwardPorts with the server's own spec.
	ForwardPorts(ctx context.Context, key sandkeep.Key) ([]sandkeep.ForwardPort, error)
}
