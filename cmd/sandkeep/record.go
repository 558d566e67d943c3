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
