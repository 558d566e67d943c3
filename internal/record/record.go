// Package record writes runs and their events to a store on behalf of the CLI and the library: how a run that
// sandkeep owns ends, and a sink that appends a command's events to its run without ever failing the command.
// A run costs two commits on its command's path: its row with the verdict before anything runs, and its finish
// (with the command's events) before the result is handed back.
package record

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/policy"
	"github.com/sandkeep/sandkeep/internal/store"
)

// Recorder appends one run's events. They are enqueued (store.Store.EnqueueEvent): the command never waits for a
// transaction per event, and the store commits them in order within a few milliseconds. A store failure is
// reported once (on Warn when set, else on slog's default logger) and never fails the command: the command's own
// result matters more than its record.
type Recorder struct {
	Store     store.Store
	RunID     string
	RequestID string // set on every event, when not empty
	Warn      io.Writer
	once      sync.Once
}

// Event records one event of the run; it has the shape of a lifecycle sink.
func (r *Recorder) Event(name string, payload any) {
	ev, err := events.New(r.RunID, name, payload)
	if err != nil {
		r.warn(name, err)
		return
	}
	ev.RequestID = r.RequestID
	r.Store.EnqueueEvent(ev, func(_ int64, err error) {
		if err != nil {
			r.warn(name, err)
		}
	})
}

func (r *Recorder) warn(name string, err error) {
	r.once.Do(func() {
		if r.Warn != nil {
			fmt.Fprintf(r.Warn, "sandkeep: warning: cannot record event %s: %v\n", name, err)
			return
		}
		slog.Warn("cannot record event", "run", r.RunID, "event", name, "err", err)
	})
}

// finishWrite bounds the commit of a run's finish. It is not the caller's context: a command cancelled by its
// caller still ends its run.
const finishWrite = 10 * time.Second

// Finish records how run id ended: succeeded when sandkeep ran the command (whatever its exit status, which
// exec_finished records), else failed with the failure's code and whether a retry may help. It returns once the
// finish is committed, together with every event and run log line enqueued before it (store.Store.UpdateRun
// commits what waits in one transaction), so whoever is told the command's result (the HTTP answer, the CLI's
// exit status) is told it only after the store holds it: a crash after the answer loses nothing the caller was
// told (issue 26). It returns the store's error, which the command's outcome does not depend on.
func Finish(st store.Store, id string, err error) error {
	upd := store.RunUpdate{Status: store.StatusSucceeded}
	if err != nil {
		f := policy.SetupFailure(err)
		upd.Status, upd.Disposition = string(f.Status), string(f.Disposition)
		upd.FailureCode = string(fault.CodeOf(f.Err))
		if upd.FailureCode == "" {
			upd.FailureCode = string(fault.Internal)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), finishWrite)
	defer cancel()
	if err := st.UpdateRun(ctx, id, upd); err != nil {
		slog.Warn("cannot record the end of a run", "run", id, "err", err)
		return err
	}
	return nil
}

// Attach checks that a named run may take a command of tenant/user: it exists, is running, and is theirs.
func Attach(ctx context.Context, st store.Store, id, tenant, user string) (store.Run, error) {
	run, err := st.GetRun(ctx, id)
	const hint = "start a run first (sandkeep runs start); `sandkeep runs` lists them"
	switch {
	case err != nil && !errdefs.IsNotFound(err) && !errdefs.IsInvalidArgument(err):
		return store.Run{}, fault.Wrap(err, fault.StoreUnavailable, "check the run store", "cannot read run %q", id)
	case err != nil || run.Tenant != tenant:
		// Another tenant's run answers exactly like a missing one: a caller learns nothing about other tenants.
		return store.Run{}, fault.New(fault.RunNotFound, hint, "no run %q", id)
	case run.User != user:
		return store.Run{}, fault.New(fault.InvalidArgument, hint, "run %s belongs to user %s, not to %s", run.ID, run.User, user)
	case run.Status != store.StatusRunning:
		return store.Run{}, fault.New(fault.InvalidArgument, hint, "run %s is %s: only a running run takes commands", run.ID, run.Status)
	}
	return run, nil
}

// Create records run, giving it a fresh id (a UUIDv7) when it has none, and returns it as recorded. The
// admission verdict is in run: a refused run is created already finished.
func Create(ctx context.Context, st store.Store, run store.Run) (store.Run, error) {
	if run.ID == "" {
		id, err := store.NewRunID()
		if err != nil {
			return run, err
		}
		run.ID = id
	}
	if err := st.CreateRun(ctx, run); err != nil {
		return run, fault.Wrap(err, fault.StoreUnavailable, "check the store (--store, Config.Store)", "cannot record the run")
	}
	return run, nil
}
