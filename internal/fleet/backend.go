package fleet

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
)

// Backend is the service.Backend of a replica: every call about a key goes to the key's owner, this replica
// (the local Service, once the lease is claimed) or another (forwarded). Calls about no key (lists, runs,
// events, templates, readiness) are answered here from the shared store and driver. Optional capabilities
// that hold a stream (files, port forwarding, processes) are served only for keys this replica owns: the HTTP
// API hands their requests for other keys over whole (Proxy).
type Backend struct {
	local *service.Service
	r     *Replica
	fwd   *Forwarder

	sharedSnapshots bool // ShareSnapshots
}

// NewBackend returns the replica's Backend over local.
func NewBackend(local *service.Service, r *Replica, fwd *Forwarder) *Backend {
	return &Backend{local: local, r: r, fwd: fwd}
}

var (
	_ service.Backend           = (*Backend)(nil)
	_ service.PortDialer        = (*Backend)(nil)
	_ service.ForwardPortLister = (*Backend)(nil)
	_ service.ProcessBackend    = (*Backend)(nil)
)

// route claims key: it returns nil when this replica serves it, else the owner to forward to.
func (b *Backend) route(ctx context.Context, key sandkeep.Key) (*leaseAddr, error) {
	deadline := time.Now().Add(b.r.TTL() + 5*time.Second)
	for {
		o, err := b.r.Claim(ctx, key)
		if err != nil {
			return nil, claimErr(err)
		}
		if o.Self {
			return nil, nil
		}
		if o.Lease.Address != "" || time.Now().After(deadline) {
			return &leaseAddr{Owner: o.Lease.Owner, Address: o.Lease.Address}, nil
		}
		// Held by what takes no calls: the reaper, for the moment it removes the key's orphaned sandbox
		// (internal/reaper). Claim again until it released the key.
		b.r.Forget(key)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(handoverPoll):
		}
	}
}

// mine is route for the owner's side of a forwarded call: another owner is an error, never a second hop.
func (b *Backend) mine(ctx context.Context, key sandkeep.Key) error {
	to, err := b.route(ctx, key)
	if err != nil || to == nil {
		return err
	}
	return fault.New(fault.OwnerUnavailable, "retry: the call goes to the key's new owner",
		"the key moved to replica %s while the call was forwarded", to.Owner)
}

func claimErr(err error) error {
	if fault.CodeOf(err) != "" {
		return err
	}
	return fault.Wrap(err, fault.StoreUnavailable, "check the run store (PostgreSQL): leases live there",
		"cannot tell which replica owns the key")
}

func callOf(key sandkeep.Key, ar service.AdmitRequest) call {
	return call{Tenant: key.Tenant, User: key.User, Admit: admitCall{RunID: ar.RunID, Template: ar.Template,
		Trust: ar.Trust, RequestID: ar.RequestID, Network: ar.Network}}
}

// Exec implements service.Backend: run on the owner, output streamed back as it comes.
func (b *Backend) Exec(ctx context.Context, key sandkeep.Key, ar service.AdmitRequest, req sandkeep.ExecRequest) (*sandkeep.ExecResult, error) {
	var res *sandkeep.ExecResult
	var c *call
	err := b.call(ctx, key, func() (err error) {
		res, err = b.local.Exec(ctx, key, ar, req)
		return err
	}, func(to leaseAddr) error {
		if req.TTY != nil || len(req.Secrets) > 0 {
			return fault.New(fault.OwnerUnavailable, "send the request to the replica that owns the key",
				"a terminal or secret files of a key another replica owns (%s) are not forwarded yet", to.Owner)
		}
		if c == nil {
			cc := callOf(key, ar)
			e := &execCall{Argv: req.Argv, Workdir: req.Workdir, Env: req.Env, Timeout: req.Timeout,
				OutputLimit: req.OutputLimit, Concurrent: req.Concurrent, Stream: req.Stdout != nil || req.Stderr != nil}
			if req.Stdin != nil {
				in, err := io.ReadAll(io.LimitReader(req.Stdin, maxCallBytes/2))
				if err != nil {
					return fault.Wrap(err, fault.RequestInvalid, "", "read the command's stdin")
				}
				e.Stdin = &in
				req.Stdin = bytes.NewReader(in) // for a retry served here
			}
			cc.Exec = e
			c = &cc
		}
		var out sandkeep.ExecResult
		if err := b.forward(ctx, key, to, "exec", *c, b.execFrames(ar, req), &out); err != nil {
			return err
		}
		res = &out
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// call serves a call about key here (when this replica owns the key) or forwards it to the key's owner (there).
// A forward the owner provably never ran (errNotReached: it is handing its keys over, refused the connection or
// closed it before answering) claims the key again until the key has a reachable owner (this replica, once the
// lease is released or expired), bounded by a lease's lifetime and a margin: a rolling restart loses no call.
// Anything else, OWNER_LOST included, is the caller's: a call the owner may have run is never sent twice.
func (b *Backend) call(ctx context.Context, key sandkeep.Key, here func() error, there func(leaseAddr) error) error {
	to, err := b.route(ctx, key)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(b.r.TTL() + 5*time.Second)
	for {
		if to == nil {
			return here()
		}
		err = there(*to)
		if !errors.Is(err, errNotReached) || !time.Now().Before(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(handoverPoll):
		}
		b.r.Forget(key)
		if to, err = b.route(ctx, key); err != nil {
			return err
		}
	}
}

// handoverPoll is how often a forwarded exec whose owner is handing over claims the key again.
const handoverPoll = 100 * time.Millisecond

// execFrames turns a forwarded exec's frames over to the caller's observer and writers.
func (b *Backend) execFrames(ar service.AdmitRequest, req sandkeep.ExecRequest) func(frame) error {
	return func(fr frame) error {
		switch {
		case fr.Started:
			if ar.Observer.Started != nil {
				ar.Observer.Started()
			}
		case fr.Stream == "stdout" && req.Stdout != nil:
			_, err := req.Stdout.Write(fr.Data)
			return err
		case fr.Stream == "stderr" && req.Stderr != nil:
			_, err := req.Stderr.Write(fr.Data)
			return err
		}
		return nil
	}
}

// Admit implements service.Backend on the key's owner.
func (b *Backend) Admit(ctx context.Context, key sandkeep.Key, ar service.AdmitRequest) (*sandkeep.Run, error) {
	var run *sandkeep.Run
	err := b.call(ctx, key, func() (err error) {
		run, err = b.local.Admit(ctx, key, ar)
		return err
	}, func(to leaseAddr) error {
		var out sandkeep.Run
		if err := b.forward(ctx, key, to, "admit", callOf(key, ar), nil, &out); err != nil {
			return err
		}
		run = &out
		return nil
	})
	if err != nil {
		return nil, err
	}
	return run, nil
}

// Sandbox implements service.Backend on the key's owner.
func (b *Backend) Sandbox(ctx context.Context, key sandkeep.Key) (sandkeep.Sandbox, error) {
	var sb sandkeep.Sandbox
	err := b.call(ctx, key, func() (err error) {
		sb, err = b.local.Sandbox(ctx, key)
		return err
	}, func(to leaseAddr) error {
		sb = sandkeep.Sandbox{}
		return b.forward(ctx, key, to, "sandbox", callOf(key, service.AdmitRequest{}), nil, &sb)
	})
	return sb, err
}

// Stop implements service.Backend on the key's owner.
func (b *Backend) Stop(ctx context.Context, key sandkeep.Key) error {
	return b.call(ctx, key, func() error { return b.local.Stop(ctx, key) }, func(to leaseAddr) error {
		return b.forward(ctx, key, to, "stop", callOf(key, service.AdmitRequest{}), nil, nil)
	})
}

// Remove implements service.Backend on the key's owner.
func (b *Backend) Remove(ctx context.Context, key sandkeep.Key) error {
	return b.call(ctx, key, func() error { return b.local.Remove(ctx, key) }, func(to leaseAddr) error {
		return b.forward(ctx, key, to, "remove", callOf(key, service.AdmitRequest{}), nil, nil)
	})
}

// EndRun implements service.Backend on the owner of the run's key: the finish is a fenced write.
func (b *Backend) EndRun(ctx context.Context, id string, failed bool) error {
	run, err := b.local.Run(ctx, id)
	if err != nil {
		return err
	}
	key, err := sandkeep.NewKey(run.Tenant, run.User)
	if err != nil {
		return err
	}
	return b.call(ctx, key, func() error { return b.local.EndRun(ctx, id, failed) }, func(to leaseAddr) error {
		c := callOf(key, service.AdmitRequest{})
		c.RunID, c.Failed = id, failed
		return b.forward(ctx, key, to, "endrun", c, nil, nil)
	})
}

// endRunHere is the owner's side of a forwarded EndRun.
func (b *Backend) endRunHere(ctx context.Context, key sandkeep.Key, id string, failed bool) error {
	if err := b.mine(ctx, key); err != nil {
		return err
	}
	return b.local.EndRun(ctx, id, failed)
}

// Workspace implements service.Backend for keys this replica owns. The HTTP API hands file requests of other
// replicas' keys over whole (Proxy); other entry points get FILES_UNAVAILABLE for them.
func (b *Backend) Workspace(ctx context.Context, key sandkeep.Key, create bool) (*files.FS, error) {
	to, err := b.route(ctx, key)
	if err != nil {
		return nil, err
	}
	if to != nil {
		return nil, errNotOwner(fault.FilesUnavailable, "the files", to)
	}
	return b.local.Workspace(ctx, key, create)
}

// DialPort implements service.PortDialer for keys this replica owns (the HTTP API hands other keys' port
// forwards over whole).
func (b *Backend) DialPort(ctx context.Context, key sandkeep.Key, port int, pf sandkeep.PortForward) (net.Conn, error) {
	to, err := b.route(ctx, key)
	if err != nil {
		return nil, err
	}
	if to != nil {
		return nil, errNotOwner(fault.PortForwardUnavailable, "the ports", to)
	}
	return b.local.DialPort(ctx, key, port, pf)
}

// ForwardPorts implements service.ForwardPortLister (it reads the spec, no sandbox).
func (b *Backend) ForwardPorts(ctx context.Context, key sandkeep.Key) ([]sandkeep.ForwardPort, error) {
	return b.local.ForwardPorts(ctx, key)
}

// List implements service.Backend.
func (b *Backend) List(ctx context.Context, tenant string) ([]sandkeep.Sandbox, error) {
	return b.local.List(ctx, tenant)
}

// ListAll is the local Service's (the API's sandboxes gauge).
func (b *Backend) ListAll(ctx context.Context) ([]sandkeep.Sandbox, error) {
	return b.local.ListAll(ctx)
}

// Runs implements service.Backend.
func (b *Backend) Runs(ctx context.Context, f store.RunFilter) ([]store.Run, error) {
	return b.local.Runs(ctx, f)
}

// Run implements service.Backend.
func (b *Backend) Run(ctx context.Context, id string) (store.Run, error) { return b.local.Run(ctx, id) }

// Events implements service.Backend.
func (b *Backend) Events(ctx context.Context, f store.EventFilter) ([]store.Event, error) {
	return b.local.Events(ctx, f)
}

// Templates implements service.Backend.
func (b *Backend) Templates(ctx context.Context, tenant string) ([]string, error) {
	return b.local.Templates(ctx, tenant)
}

// Ready implements service.Backend.
func (b *Backend) Ready(ctx context.Context) error { return b.local.Ready(ctx) }

// forward makes a call to the owner; an owner that is gone or moved is forgotten, so the next call reads the
// store again.
func (b *Backend) forward(ctx context.Context, key sandkeep.Key, to leaseAddr, op string, c call, on func(frame) error, out any) error {
	err := b.fwd.do(ctx, to, op, c, on, out)
	if fault.Is(err, fault.OwnerUnavailable) || fault.Is(err, fault.OwnerLost) {
		b.r.Forget(key)
	}
	return err
}
