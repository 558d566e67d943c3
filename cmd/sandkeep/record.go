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
	dsn, err := g.storeDSN()
	if err != nil {
		return nil, err
	}
	return record.Open(ctx, dsn)
}

// storeDSN is the store openStore opens.
func (g *globals) storeDSN() (string, error) {
	dsn := g.store
	if dsn == "" {
		dsn = os.Getenv("SANDKEEP_STORE")
	}
	if dsn != "" {
		return dsn, nil
	}
	c, err := g.config()
	if err != nil {
		return "", err
	}
	home := c.Home
	if home == "" {
		home = sandkeep.DefaultHome()
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		return "", fault.Wrap(err, fault.StoreUnavailable, "set SANDKEEP_HOME to a directory you can write", "state home %s", home)
	}
	return filepath.Join(home, "sandkeep.db"), nil
}

// openRun records the implicit run of plan p for key (admitted, or refused and already finished).
func openRun(ctx context.Context, st store.Store, p *plan, key sandkeep.Key, requested string) (store.Run, error) {
	r := store.Run{
		Tenant: key.Tenant, User: key.User, Trust: string(p.trust),
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
	return record.Create(ctx, st, r)
}
