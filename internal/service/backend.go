package service

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/policy"
	"github.com/sandkeep/sandkeep/internal/store"
)

// Service is the Backend over a library Manager and the run store it records into.
type Service struct {
	m     *sandkeep.Manager
	st    store.Store
	limit files.Limits
	adm   Admission
}

// Admission is what the operator decides for every run the service admits: the mode and driver (the server's
// --sandbox and --driver; "" leaves them to the spec, the environment and the host kind) and the trust callers
// get (a call may lower it, never raise it).
type Admission struct {
	Mode, Driver, Trust string
}

var _ Backend = (*Service)(nil)

// New returns the Backend over m and st (the store m records into, opened by the caller); lim bounds file
// operations.
func New(m *sandkeep.Manager, st store.Store, lim files.Limits, adm Admission) *Service {
	return &Service{m: m, st: st, limit: lim, adm: adm}
}

// Exec admits the command's run as the caller tier (or attaches it to ar.RunID) and runs the command in it:
// Manager.ExecWith, the same admission as every other entry point.
func (s *Service) Exec(ctx context.Context, key sandkeep.Key, ar AdmitRequest, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
	rr, err := s.runRequest(key, ar)
	if err != nil {
		return nil, err
	}
	return s.m.ExecWith(ctx, rr, req)
}

// AdmitRequest is what a caller may say about a run: the template, a lower trust, a narrower network, the request
// id to record, and the observer to tell.
type AdmitRequest struct {
	RunID     string // attach to this running run instead
	Template  string
	Trust     string
	RequestID string
	Network   *sandkeep.Network // may only narrow the run's (NETWORK_WIDENED)
	Observer  sandkeep.Observer
}

// Admit admits a run of key for the caller tier (template and a trust that may only lower the operator's), or
// attaches to req.RunID. The run is recorded (refused ones too) before this returns.
func (s *Service) Admit(ctx context.Context, key sandkeep.Key, ar AdmitRequest) (*sandkeep.Run, error) {
	rr, err := s.runRequest(key, ar)
	if err != nil {
		return nil, err
	}
	return s.m.Admit(ctx, rr)
}

// runRequest is a caller's request as admission takes it: the operator's mode and driver, the lower of the two
// trusts, the caller tier.
func (s *Service) runRequest(key sandkeep.Key, ar AdmitRequest) (sandkeep.RunRequest, error) {
	t, err := lower(s.adm.Trust, ar.Trust)
	if err != nil {
		return sandkeep.RunRequest{}, err
	}
	return sandkeep.RunRequest{Key: key, RunID: ar.RunID, Mode: s.adm.Mode, Driver: s.adm.Driver, Trust: t,
		Template: ar.Template, Caller: true, RequestID: ar.RequestID, Network: ar.Network, Observer: ar.Observer}, nil
}

// Check refuses an Admission whose trust is not one (the operator's --trust).
func (a Admission) Check() error {
	_, err := policy.ParseTrust(a.Trust)
	return err
}

// lower is the trust of a call: the operator's, or untrusted when either says so. A caller cannot raise it.
func lower(operator, call string) (string, error) {
	op, err := policy.ParseTrust(operator)
	if err != nil {
		return "", err
	}
	c, err := policy.ParseTrust(call)
	if err != nil {
		return "", err
	}
	if op == policy.Untrusted || c == policy.Untrusted {
		return sandkeep.TrustUntrusted, nil
	}
	return sandkeep.TrustTrusted, nil
}

// EndRun closes a running run.
func (s *Service) EndRun(ctx context.Context, id string, failed bool) error {
	upd := store.RunUpdate{Status: store.StatusSucceeded}
	if failed {
		upd.Status, upd.FailureCode, upd.Disposition = store.StatusFailed, string(fault.CallerFailed), store.DispositionDeterministic
	}
	return storeErr(s.st.UpdateRun(ctx, id, upd))
}

// Templates lists the templates tenant may use.
func (s *Service) Templates(_ context.Context, tenant string) ([]string, error) {
	return s.m.Templates(tenant), nil
}

// List returns tenant's sandboxes.
func (s *Service) List(ctx context.Context, tenant string) ([]sandkeep.Sandbox, error) {
	all, err := s.m.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]sandkeep.Sandbox, 0, len(all))
	for _, sb := range all {
		if sb.Tenant == tenant {
			out = append(out, sb)
		}
	}
	return out, nil
}

// Sandbox describes key's sandbox.
func (s *Service) Sandbox(ctx context.Context, key sandkeep.Key) (sandkeep.Sandbox, error) {
	return s.m.Sandbox(ctx, key)
}

// Stop stops key's sandbox.
func (s *Service) Stop(ctx context.Context, key sandkeep.Key) error { return s.m.Stop(ctx, key) }

// Remove deletes key's sandbox and workspace.
func (s *Service) Remove(ctx context.Context, key sandkeep.Key) error {
	return s.m.Remove(ctx, key, false)
}

// Workspace opens key's workspace; on a driver that keeps it in the sandbox (kubernetes), ctx bounds the
// operations that take no context of their own.
func (s *Service) Workspace(ctx context.Context, key sandkeep.Key, create bool) (*files.FS, error) {
	return s.m.FilesContext(ctx, key, create, s.limit)
}

// Runs lists runs.
func (s *Service) Runs(ctx context.Context, f store.RunFilter) ([]store.Run, error) {
	runs, err := s.st.ListRuns(ctx, f)
	return runs, storeErr(err)
}

// Run returns one run.
func (s *Service) Run(ctx context.Context, id string) (store.Run, error) {
	r, err := s.st.GetRun(ctx, id)
	if errdefs.IsNotFound(err) || errdefs.IsInvalidArgument(err) {
		return store.Run{}, fault.New(fault.RunNotFound, "GET /v1/runs lists the runs that exist", "no run %q", id)
	}
	return r, storeErr(err)
}

// Events lists a run's events.
func (s *Service) Events(ctx context.Context, f store.EventFilter) ([]store.Event, error) {
	evs, err := s.st.ListEvents(ctx, f)
	return evs, storeErr(err)
}

// RunLogs lists one run's log entries.
func (s *Service) RunLogs(ctx context.Context, f store.RunLogFilter) ([]store.RunLog, error) {
	logs, err := s.st.ListRunLogs(ctx, f)
	return logs, storeErr(err)
}

var _ RunLogLister = (*Service)(nil)

// Ready checks the driver and the store.
func (s *Service) Ready(ctx context.Context) error {
	if err := s.m.Ping(ctx); err != nil {
		// /readyz has no auth: say why in words that name no host or file (the log has the whole cause).
		if fault.Is(err, fault.SandboxDriverUnavailable) {
			return fault.Wrap(err, fault.SandboxDriverUnavailable, "start the container engine (docker info); the server retries it",
				"no sandboxing driver is usable: each command is answered by its mode (auto runs it on the host, inline refuses it)")
		}
		return fault.Wrap(err, fault.DriverUnavailable, "check the container engine (docker info)", "the driver does not answer")
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := s.st.ListRuns(ctx, store.RunFilter{Limit: 1})
	return storeErr(err)
}

func storeErr(err error) error {
	if err == nil || fault.CodeOf(err) != "" || errors.Is(err, context.Canceled) {
		return err
	}
	return fault.Wrap(err, fault.StoreUnavailable, "check the run store (SQLite file or PostgreSQL)", "the run store failed")
}

// ListAll returns every sandbox of the installation (the API's sandboxes gauge).
func (s *Service) ListAll(ctx context.Context) ([]sandkeep.Sandbox, error) { return s.m.List(ctx) }

var _ PortDialer = (*Service)(nil)

// DialPort opens one forwarded connection to port in key's running sandbox.
func (s *Service) DialPort(ctx context.Context, key sandkeep.Key, port int, pf sandkeep.PortForward) (net.Conn, error) {
	return s.m.DialPort(ctx, key, port, pf)
}

var _ ForwardPortLister = (*Service)(nil)

// ForwardPorts are the forwardPorts of the repository key's runs follow, each decided.
func (s *Service) ForwardPorts(ctx context.Context, key sandkeep.Key) ([]sandkeep.ForwardPort, error) {
	return s.m.ForwardPorts(ctx, key, "")
}
