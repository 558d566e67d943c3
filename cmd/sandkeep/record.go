package main

import (
	"context"
	"os"
	"path/filepath"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/policy"
	"github.com/sandkeep/sandkeep/internal/record"
	"github.com/sandkeep/sandkeep/internal/store"
)

// openStore opens the store named by --store or $SANDKEEP_STORE: a postgres:// URL, or an SQLite file; by
// default <home>/sandkeep.db.
func (g *globals) openStore(ctx context.Context) (store.Store, error) {
	dsn := g.store
	if dsn == "" {
		dsn = os.Getenv("SANDKEEP_STORE")
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
	return record.Open(ctx, dsn)
}

// recorder writes one run's events (see record.Recorder).
type recorder = record.Recorder

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

// finishRun records how a run sandkeep owns ended (see record.Finish).
func finishRun(st store.Store, id string, err error) error { return record.Finish(st, id, err) }

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
	run, err := record.Attach(ctx, st, pf.run, key.Tenant, key.User)
	if err != nil {
		return run, false, err
	}
	return run, false, nil
}
