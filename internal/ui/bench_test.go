package ui

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/api/apitest"
	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/postgres"
	"github.com/sandkeep/sandkeep/internal/store/sqlite"
)

// BenchmarkPages renders every page on the server (the handler, no network) over a store holding benchRuns runs
// and benchRuns*benchEventsPerRun events, SQLite and PostgreSQL (SANDKEEP_TEST_POSTGRES), for an admin (every
// tenant) and for one tenant. It reports; it asserts no speed. docs/BENCHMARKS.md has the figures and the
// command.
//
//	go test -run '^$' -bench BenchmarkPages -benchtime 20x -count 3 ./internal/ui/
func BenchmarkPages(b *testing.B) {
	kinds := []string{"sqlite"}
	if os.Getenv("SANDKEEP_TEST_POSTGRES") != "" {
		kinds = append(kinds, "postgres")
	}
	for _, kind := range kinds {
		f := seeded(b, kind)
		for _, who := range []string{"admin", "tenant"} {
			for _, p := range f.pages {
				b.Run(kind+"/"+who+"/"+p.name, func(b *testing.B) {
					cookie := f.cookies[who]
					for b.Loop() {
						req := httptest.NewRequest("GET", p.path, nil)
						req.AddCookie(cookie)
						rec := httptest.NewRecorder()
						f.ui.ServeHTTP(rec, req)
						if rec.Code != http.StatusOK {
							b.Fatalf("GET %s: %d\n%s", p.path, rec.Code, rec.Body.String())
						}
					}
				})
			}
		}
	}
}

const (
	benchRuns         = 10_000
	benchEventsPerRun = 10 // 100,000 events
	benchTenants      = 20
	benchSandboxes    = 40
)

type benchPage struct{ name, path string }

type fixture struct {
	ui      *UI
	pages   []benchPage
	cookies map[string]*http.Cookie
}

var (
	fixturesMu sync.Mutex
	fixtures   = map[string]*fixture{}
	cleanups   []func()
)

// seeded returns the fixture of kind, seeding its store once per test process (benchmarks run again with
// -count reuse it).
func seeded(b *testing.B, kind string) *fixture {
	b.Helper()
	fixturesMu.Lock()
	defer fixturesMu.Unlock()
	if f, ok := fixtures[kind]; ok {
		return f
	}
	ctx := context.Background()
	var st store.Store
	var err error
	switch kind {
	case "sqlite":
		dir, derr := os.MkdirTemp("", "sandkeep-ui-bench-")
		if derr != nil {
			b.Fatal(derr)
		}
		cleanups = append(cleanups, func() { os.RemoveAll(dir) })
		st, err = sqlite.Open(ctx, filepath.Join(dir, "runs.db"))
	case "postgres":
		st, err = postgres.Open(ctx, benchSchema(b, os.Getenv("SANDKEEP_TEST_POSTGRES")))
	}
	if err != nil {
		b.Fatal(err)
	}
	cleanups = append(cleanups, func() { st.Close() })
	start := time.Now()
	runID, err := seed(ctx, st, map[string]int{"sqlite": 1, "postgres": 8}[kind])
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%s: seeded %d runs and %d events in %v", kind, benchRuns, benchRuns*benchEventsPerRun, time.Since(start).Round(time.Second))

	be := apitest.NewBackend(b.TempDir())
	for i := range benchSandboxes {
		k, _ := sandkeep.NewKey(fmt.Sprintf("tenant-%02d", i%benchTenants), fmt.Sprintf("user-%02d", i))
		if _, err := be.Exec(ctx, k, sandkeep.ExecRequest{Argv: []string{"echo"}}); err != nil {
			b.Fatal(err)
		}
	}
	u, err := New(Config{Backend: be, Store: st, Tokens: st})
	if err != nil {
		b.Fatal(err)
	}
	cleanups = append(cleanups, u.Close)
	f := &fixture{ui: u, cookies: map[string]*http.Cookie{}}
	for who, spec := range map[string]auth.Spec{
		"admin":  {Tenant: "ops", Name: "bench-admin", Scopes: []string{auth.ScopeAdmin}},
		"tenant": {Tenant: "tenant-03", Name: "bench-read", Scopes: []string{auth.ScopeRead}},
	} {
		tok, _, err := auth.Create(ctx, st, spec, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		f.cookies[who] = &http.Cookie{Name: CookieName, Value: u.sessions.open(tok.Hash, false).id}
	}
	page, err := st.QueryRuns(ctx, store.RunQuery{Limit: 200})
	if err != nil {
		b.Fatal(err)
	}
	last := page.Runs[len(page.Runs)-1]
	f.pages = []benchPage{
		{"overview", "/ui/"},
		{"sandboxes", "/ui/sandboxes"},
		{"runs", "/ui/runs"},
		{"runs-filtered", "/ui/runs?status=failed&driver=docker&mode=auto"},
		{"runs-failure-code", "/ui/runs?failure=EXEC_TIMEOUT"},
		{"runs-page-5", "/ui/runs?after=" + url.QueryEscape(fmtCursor(store.Cursor{CreatedAt: last.CreatedAt, ID: last.ID}))},
		{"run", "/ui/runs/" + runID},
		{"egress-24h", "/ui/egress"},
		{"egress-30d", "/ui/egress?window=30d"},
		{"latency-24h", "/ui/latency"},
		{"latency-30d", "/ui/latency?window=30d"},
	}
	fixtures[kind] = f
	return f
}

// seed writes benchRuns runs over the last 7 days, each with benchEventsPerRun events: four commands (exec
// started and finished), a refused request, and a sandbox start. It returns one run of tenant-03 (the tenant
// viewer's).
func seed(ctx context.Context, st store.Store, writers int) (string, error) {
	now := time.Now()
	hosts := []string{"pypi.org", "registry.npmjs.org", "github.com", "evil.test", "metadata.test", "api.openai.com", "example.com"}
	reasons := []string{"not-allowlisted", "denied-by-rule", "metadata", "private"}
	var mu sync.Mutex
	var tenantRun string
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(writers) // SQLite serializes writers anyway; many of them only wait for its lock
	for i := range benchRuns {
		g.Go(func() error {
			id, err := store.NewRunID()
			if err != nil {
				return err
			}
			tenant := fmt.Sprintf("tenant-%02d", i%benchTenants)
			at := now.Add(-time.Duration(i) * 7 * 24 * time.Hour / benchRuns)
			r := store.Run{ID: id, Tenant: tenant, User: fmt.Sprintf("user-%02d", i%benchSandboxes), Trust: store.TrustTrusted,
				ResolvedMode: []string{"auto", "inline"}[i%2], Source: "default", Driver: "docker", Admission: store.AdmissionAdmitted,
				CreatedAt: at}
			if err := st.CreateRun(gctx, r); err != nil {
				return err
			}
			add := func(k int, name string, payload any) error {
				e, err := events.New(id, name, payload)
				if err != nil {
					return err
				}
				e.Time = at.Add(time.Duration(k) * 100 * time.Millisecond)
				_, err = st.AppendEvent(gctx, e)
				return err
			}
			if err := add(0, events.NameSandboxStarted, events.SandboxStarted{Sandbox: "sandkeep-u-x", Driver: "docker", Created: i%10 == 0, DurationMS: 800}); err != nil {
				return err
			}
			for c := range 4 {
				if err := add(1+2*c, events.NameExecStarted, events.ExecStarted{Command: "python", GateWaitMS: int64(i % 7)}); err != nil {
					return err
				}
				if err := add(2+2*c, events.NameExecFinished, events.ExecFinished{ExitCode: i % 3, DurationMS: int64(20 + i%200)}); err != nil {
					return err
				}
			}
			if err := add(9, events.NameNetworkBlocked, events.NetworkBlocked{Host: hosts[i%len(hosts)], Port: 443,
				Reason: reasons[i%len(reasons)], Sandbox: fmt.Sprintf("sandkeep-u-%02d", i%benchSandboxes)}); err != nil {
				return err
			}
			upd := store.RunUpdate{Status: store.StatusSucceeded, FinishedAt: at.Add(time.Second)}
			if i%5 == 0 {
				upd = store.RunUpdate{Status: store.StatusFailed, FailureCode: []string{"EXEC_TIMEOUT", "SANDBOX_BUSY"}[i%2],
					Disposition: store.DispositionDeterministic, FinishedAt: upd.FinishedAt}
			}
			if err := st.UpdateRun(gctx, id, upd); err != nil {
				return err
			}
			if tenant == "tenant-03" {
				mu.Lock()
				tenantRun = id
				mu.Unlock()
			}
			return nil
		})
	}
	return tenantRun, g.Wait()
}

// benchSchema creates a fresh schema (dropped when the benchmarks end) and returns a DSN whose search_path is it.
func benchSchema(b *testing.B, dsn string) string {
	b.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		b.Fatal("SANDKEEP_TEST_POSTGRES must be a postgres:// URL")
	}
	raw := make([]byte, 6)
	_, _ = rand.Read(raw)
	schema := "uibench_" + hex.EncodeToString(raw)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		b.Fatal(err)
	}
	cleanups = append(cleanups, func() {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	})
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
