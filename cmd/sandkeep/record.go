package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/policy"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/postgres"
	"github.com/sandkeep/sandkeep/internal/store/sqlite"
)

// openStore opens the store named by --store or $SANDKEEP_STORE: a postgres:// URL, or an SQLite file; by
// default <home>/sandkeep.db.
func (g *globals) openStore(ctx context.Context) (store.Store, error) {
	dsn := g.store
	if dsn == "" {
		dsn = os.Getenv("SANDKEEP_STORE")
	}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		st, err := postgres.Open(ctx, dsn)
		if err != nil {
			return nil, fault.Wrap(err, fault.StoreUnavailable, "check the PostgreSQL URL and that the server is up",
				"cannot open the PostgreSQL store")
		}
		return st, nil
	}
	if dsn == "" {
		c, err := g.config()
		if err != nil {
			return nil, err
		}
		home := c.Home
		if home == "" {
			home = sandkeep.DefaultHome()
		}
		if err := os.MkdirAll(home, 0o700); err != nil {
			return nil, fault.Wrap(err, fault.StoreUnavailable, "set SANDKEEP_HOME to a directory you can write", "state home %s", home)
		}
		dsn = filepath.Join(home, "sandkeep.db")
	}
	st, err := sqlite.Open(ctx, dsn)
	if err != nil {
		return nil, fault.Wrap(err, fault.StoreUnavailable, "check that the file and its directory are writable",
			"cannot open the SQLite store %s", dsn)
	}
	return st, nil
}

// recorder writes one run's events. A store failure is reported once on stderr and does not fail the command:
// the command's own result matters more than its record.
type recorder struct {
	st     store.Store
	run    string
	stderr io.Writer
	once   sync.Once
}

func (r *recorder) event(name string, payload any) {
	ev, err := events.New(r.run, name, payload)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = r.st.AppendEvent(ctx, ev)
	}
	if err != nil {
		r.once.Do(func() { fmt.Fprintf(r.stderr, "sandkeep: warning: cannot record event %s: %v\n", name, err) })
	}
}

// newRun is the run record of plan p for key, admitted or refused.
func newRun(p *plan, key sandkeep.Key, requested string) (store.Run, error) {
	id, err := store.NewRunID()
	if err != nil {
		return store.Run{}, err
	}
	r := store.Run{
		ID: id, Tenant: key.Tenant, User: key.User, Trust: string(p.trust),
		RequestedMode: requested, ResolvedMode: p.mode.Mode, Source: string(p.mode.Source),
		Driver: p.decision.Driver, Admission: store.AdmissionAdmitted, Status: store.StatusRunning,
	}
	if r.Trust != store.TrustTrusted {
		r.Trust = store.TrustUntrusted
	}
	if p.decision.Action == policy.Refuse {
		r.Admission, r.Status = store.AdmissionRefused, string(p.decision.Status)
		r.FailureCode, r.Disposition = string(p.decision.FailureCode), string(p.decision.Disposition)
	}
	return r, nil
}

// finishRun records how the run ended: succeeded when the command ran (whatever its exit status, which
// exec_finished records), else failed with the failure's code and whether a retry may help.
func finishRun(st store.Store, id string, err error) error {
	upd := store.RunUpdate{Status: store.StatusSucceeded}
	if err != nil {
		f := policy.SetupFailure(err)
		upd.Status, upd.Disposition = string(f.Status), string(f.Disposition)
		upd.FailureCode = string(fault.CodeOf(f.Err))
		if upd.FailureCode == "" {
			upd.FailureCode = string(fault.Internal)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return st.UpdateRun(ctx, id, upd)
}

// attachRun returns the run this command belongs to, and whether the command owns it (an implicit run, created
// here and finished when the command ends). A named run (--run) must exist, be running, and belong to the same
// tenant and user; a refusal is then recorded as an event of that run, which stays open. The admission verdict
// of an implicit run is recorded before anything runs, and before a refusal returns.
func attachRun(ctx context.Context, st store.Store, p *plan, key sandkeep.Key, pf policyFlags) (store.Run, bool, error) {
	if pf.run == "" {
		run, err := newRun(p, key, pf.sandbox)
		if err != nil {
			return run, false, err
		}
		if err := st.CreateRun(ctx, run); err != nil {
			return run, false, fault.Wrap(err, fault.StoreUnavailable, "check the store (--store)", "cannot record the run")
		}
		return run, true, nil
	}
	run, err := st.GetRun(ctx, pf.run)
	const hint = "start one with `sandkeep runs start --tenant T --user U`; `sandkeep runs` lists them"
	switch {
	case err != nil:
		return run, false, fault.Wrap(err, fault.NotFound, hint, "no run %q", pf.run)
	case run.Tenant != key.Tenant || run.User != key.User:
		return run, false, fault.New(fault.InvalidArgument, hint, "run %s belongs to %s/%s, not to %s/%s",
			run.ID, run.Tenant, run.User, key.Tenant, key.User)
	case run.Status != store.StatusRunning:
		return run, false, fault.New(fault.InvalidArgument, hint, "run %s is %s: only a running run takes commands", run.ID, run.Status)
	}
	return run, false, nil
}
