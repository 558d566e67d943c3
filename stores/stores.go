// Package stores opens the run store a library Manager records into (sandkeep.Config.Store): SQLite, the
// embedded default, or PostgreSQL. It is a package of its own so that a program links the database drivers only
// when it records runs.
package stores

import (
	"context"
	"strings"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store/postgres"
	"github.com/sandkeep/sandkeep/internal/store/sqlite"
)

// Open opens the store dsn names: a postgres:// (or postgresql://) URL, else an SQLite file path (created when
// missing). The caller closes it after the Manager.
func Open(ctx context.Context, dsn string) (sandkeep.Store, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		st, err := postgres.Open(ctx, dsn)
		if err != nil {
			return nil, fault.Wrap(err, fault.StoreUnavailable, "check the PostgreSQL URL and that the server is up",
				"cannot open the PostgreSQL store")
		}
		return st, nil
	}
	st, err := sqlite.Open(ctx, dsn)
	if err != nil {
		return nil, fault.Wrap(err, fault.StoreUnavailable, "check that the file and its directory are writable",
			"cannot open the SQLite store %s", dsn)
	}
	return st, nil
}
