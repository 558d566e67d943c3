package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/postgres"
	"github.com/sandkeep/sandkeep/internal/store/storetest"
)

// testDSN returns the DSN of the test database from SANDKEEP_TEST_POSTGRES (scripts/postgres-up.sh prints one).
// Without it the test skips, unless SANDKEEP_REQUIRE_POSTGRES=1: then it fails.
func testDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv("SANDKEEP_TEST_POSTGRES")
	if dsn == "" {
		if os.Getenv("SANDKEEP_REQUIRE_POSTGRES") == "1" {
			t.Fatal("SANDKEEP_REQUIRE_POSTGRES=1 but SANDKEEP_TEST_POSTGRES is not set (run scripts/postgres-up.sh)")
		}
		t.Skip("SANDKEEP_TEST_POSTGRES is not set (scripts/postgres-up.sh prints a DSN)")
	}
	return dsn
}

// freshSchema creates an empty schema for one test, dropped when the test ends, and returns a DSN whose
// search_path is that schema.
func freshSchema(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("SANDKEEP_TEST_POSTGRES must be a postgres:// URL")
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "storetest_" + hex.EncodeToString(b)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect to the test database: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

func openAt(ctx context.Context, dsn string) (store.Store, error) { return postgres.Open(ctx, dsn) }

func TestPostgres(t *testing.T) {
	dsn := testDSN(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := postgres.Open(t.Context(), freshSchema(t, dsn))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, storetest.MultiProcess(func(t *testing.T) string { return freshSchema(t, dsn) }, openAt))
}

// TestReopen checks that a second Open of the same schema keeps the data and does not migrate again.
func TestReopen(t *testing.T) {
	ctx := t.Context()
	dsn := freshSchema(t, testDSN(t))
	s, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	id, err := store.NewRunID()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateRun(ctx, store.Run{ID: id, Trust: store.TrustTrusted, Admission: store.AdmissionAdmitted}); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	s, err = postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.GetRun(ctx, id); err != nil {
		t.Fatalf("GetRun after reopen: %v", err)
	}
}

func TestOpenErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := postgres.Open(ctx, "postgres://u:secret-pw@127.0.0.1:1/db?connect_timeout=2&bogus_param=%zz"); err == nil {
		t.Error("Open with a bad DSN succeeded")
	}
	_, err := postgres.Open(ctx, "postgres://u:secret-pw@127.0.0.1:1/db?sslmode=disable&connect_timeout=2")
	if err == nil {
		t.Fatal("Open of a closed port succeeded")
	}
	if s := err.Error(); strings.Contains(s, "secret-pw") {
		t.Errorf("error %q reveals the password", s)
	}
	// A search_path naming no schema: migrations have nowhere to go.
	u, _ := url.Parse(testDSN(t))
	q := u.Query()
	q.Set("search_path", "no_such_schema_here")
	u.RawQuery = q.Encode()
	if _, err := postgres.Open(ctx, u.String()); err == nil {
		t.Error("Open with a missing schema succeeded")
	}
}

// TestInTxRunsAnAbortedTransactionAgain: a transaction PostgreSQL aborts for a deadlock or a serialization
// conflict is run again (a group commit's writes, a run's finish among them, would otherwise all fail for what
// another transaction did); any other error is returned at once.
func TestInTxRunsAnAbortedTransactionAgain(t *testing.T) {
	s, err := postgres.Open(t.Context(), freshSchema(t, testDSN(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		code  string
		calls int
		ok    bool
	}{
		{"40P01", 2, true}, // deadlock_detected
		{"40001", 2, true}, // serialization_failure
		{"23505", 1, false},
	} {
		calls := 0
		err := s.InTx(t.Context(), func(store.Writes) error {
			calls++
			if calls == 1 {
				return &pgconn.PgError{Code: tc.code}
			}
			return nil
		})
		if calls != tc.calls || (err == nil) != tc.ok {
			t.Errorf("a transaction failing once with %s: %d calls, %v; want %d calls, success %v", tc.code, calls, err, tc.calls, tc.ok)
		}
	}
	calls := 0
	err = s.InTx(t.Context(), func(store.Writes) error { calls++; return &pgconn.PgError{Code: "40P01"} })
	if !strings.Contains(fmt.Sprint(err), "40P01") || calls < 2 || calls > 8 {
		t.Errorf("a transaction that always deadlocks: %d calls, %v; want a few, then its error", calls, err)
	}
}
