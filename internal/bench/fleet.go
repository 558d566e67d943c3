package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/api"
	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/fleet"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/stores"
)

// ScenarioFleet is the fleet's scenario (issue 27).
const ScenarioFleet = "fleet"

// Defaults of the fleet scenario.
const (
	DefaultFleetN    = 200   // warm exec samples per series
	DefaultLeaseKeys = 10000 // leases renewed at once
	DefaultLeaseN    = 10    // renewals timed
)

// FleetTarget is issue 27's bar for a forwarded warm command: at most this ratio to the owner's, at the median.
const FleetTarget = 1.5

// Fleet measures what a fleet adds, in one process over one store (SQLite in a temporary directory, or
// PostgreSQL at dsn). Row one: warm `true` sent to replica B's HTTP API and forwarded over the internal wire to
// the key's owner A, vs the same command sent to A's API, side by side (rotated), same sandbox; Extra says
// whether the median ratio is within FleetTarget. Row two: one RenewLeases of keys leases (what each replica
// writes every lease TTL/3 to keep all of its keys) vs one AcquireLease; Extra has the rows and statements per
// second that renewal costs at the default TTL and the share of the renewal period one statement takes.
func Fleet(ctx context.Context, e *Env, n, keys int, dsn string) (_ []Result, err error) {
	dir, err := os.MkdirTemp("", "sandkeep-bench-fleet-")
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	storeName := "postgres"
	if dsn == "" {
		dsn, storeName = filepath.Join(dir, "sandkeep.db"), "sqlite"
	}
	st, err := stores.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, st.Close()) }()
	const user = "fleet-warm"
	defer func() { err = errors.Join(err, e.removeUsers(ctx, []string{user})) }()

	fwd, err := forwardedRow(ctx, e, st, user, n)
	if err != nil {
		return nil, err
	}
	fwd.Extra["store"] = storeName
	renew, err := renewalRow(ctx, st, e.Tenant, keys)
	if err != nil {
		return nil, err
	}
	renew.Extra["store"] = storeName
	return []Result{fwd, renew}, nil
}

// listenLoopback opens a listener on 127.0.0.1:0.
func listenLoopback(ctx context.Context) (net.Listener, error) {
	var lc net.ListenConfig
	return lc.Listen(ctx, "tcp", "127.0.0.1:0")
}

// serveOn serves h on ln until the returned func shuts it down.
func serveOn(ctx context.Context, ln net.Listener, h http.Handler) func() {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(ln) }()
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		<-done
	}
}

// replicaAPI is a replica's HTTP API (api.Server over its fleet Backend) on loopback, and an SDK client of it.
func replicaAPI(ctx context.Context, b service.Backend, st store.Store, token string) (*client.Client, *http.Transport, func(), error) {
	unlimited := api.Limits{MaxSandboxes: api.Unlimited, MaxConcurrentExecs: api.Unlimited, RequestsPerSecond: api.Unlimited,
		MaxConcurrentFileOps: api.Unlimited}
	srv, err := api.New(api.Config{Backend: b, Tokens: st, Limits: unlimited, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		return nil, nil, nil, err
	}
	ln, err := listenLoopback(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	stop := serveOn(ctx, ln, srv.Handler())
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 4
	c, err := client.New("http://"+ln.Addr().String(), token, client.WithHTTPClient(&http.Client{Transport: tr}))
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	return c, tr, stop, nil
}

func forwardedRow(ctx context.Context, e *Env, st store.Store, user string, n int) (Result, error) {
	secret := "bench-fleet-secret-" + e.Tenant
	svc := service.New(e.M, st, files.Limits{}, service.Admission{})
	fwd := fleet.NewForwarder(nil, secret)
	// A owns the key and serves the internal wire; B forwards to it.
	ln, err := listenLoopback(ctx)
	if err != nil {
		return Result{}, err
	}
	ra, err := fleet.New(fleet.Config{Leases: st, ID: "bench-a-" + e.Tenant, Address: ln.Addr().String()})
	if err != nil {
		ln.Close()
		return Result{}, err
	}
	rb, err := fleet.New(fleet.Config{Leases: st, ID: "bench-b-" + e.Tenant, Address: "127.0.0.1:1"})
	if err != nil {
		ln.Close()
		return Result{}, err
	}
	ba, bb := fleet.NewBackend(svc, ra, fwd), fleet.NewBackend(svc, rb, fwd)
	defer serveOn(ctx, ln, fleet.NewHandler(ba, secret))()
	key, err := e.key(user)
	if err != nil {
		return Result{}, err
	}
	if o, err := ra.Claim(ctx, key); err != nil || !o.Self {
		return Result{}, fmt.Errorf("fleet: replica A's claim: %+v, %v", o, err)
	}
	defer func() { _ = ra.Release(context.WithoutCancel(ctx)) }()
	_, token, err := auth.Create(ctx, st, auth.Spec{Tenant: e.Tenant, Name: "bench-fleet", Scopes: []string{auth.ScopeExec}}, time.Now())
	if err != nil {
		return Result{}, err
	}
	ca, tra, stopA, err := replicaAPI(ctx, ba, st, token)
	if err != nil {
		return Result{}, err
	}
	defer stopA()
	defer tra.CloseIdleConnections()
	cb, trb, stopB, err := replicaAPI(ctx, bb, st, token)
	if err != nil {
		return Result{}, err
	}
	defer stopB()
	defer trb.CloseIdleConnections()

	res, err := e.skTrue(ctx, user)
	if err != nil {
		return Result{}, err
	}
	sandbox := res.Sandbox.ID
	via := func(c *client.Client) func(context.Context) error {
		return func(ctx context.Context) error {
			res, err := apiTrue(ctx, c, e.Tenant, user, "")
			if err == nil && res.Sandbox.ID != sandbox {
				err = fmt.Errorf("fleet exec for %s ran in %s, want %s", user, res.Sandbox.ID, sandbox)
			}
			return err
		}
	}
	owner, forwarded := via(ca), via(cb)
	for range 10 { // not measured: dials, first token lookups
		if err := errors.Join(owner(ctx), forwarded(ctx)); err != nil {
			return Result{}, fmt.Errorf("fleet warm-up: %w", err)
		}
	}
	s, err := rotate(ctx, n, owner, forwarded)
	if err != nil {
		return Result{}, fmt.Errorf("fleet side by side: %w", err)
	}
	r := newResult("warm exec `true` sent to replica B, forwarded to the key's owner A (internal wire, loopback)",
		"the same command sent to the owner's API (replica A), same sandbox", s[1], s[0])
	r.Extra = map[string]string{
		"transport":       transportAgent,
		"added_median_ms": msString(r.Sandkeep.Median - r.Base.Median),
		"target":          fmt.Sprintf("%.1fx", FleetTarget),
		"meets":           strconv.FormatBool(r.Ratio <= FleetTarget),
	}
	return r, nil
}

// renewalRow takes keys leases for one owner and times their renewal in one write against one acquisition.
func renewalRow(ctx context.Context, st store.Store, tenant string, keys int) (Result, error) {
	owner := "bench-renew-" + tenant
	held := make([]store.Lease, keys)
	acquire := make([]time.Duration, keys)
	if err := forEach(ctx, keys, 16, func(ctx context.Context, i int) error {
		start := time.Now()
		l, err := st.AcquireLease(ctx, fmt.Sprintf("bench/%s/key/%06d", tenant, i), owner, "", time.Hour)
		acquire[i] = time.Since(start)
		held[i] = l
		return err
	}); err != nil {
		return Result{}, fmt.Errorf("fleet: take %d leases: %w", keys, err)
	}
	defer func() {
		_ = forEach(context.WithoutCancel(ctx), keys, 16, func(ctx context.Context, i int) error {
			return st.ReleaseLease(ctx, held[i])
		})
	}()
	renew := make([]time.Duration, 0, DefaultLeaseN)
	for range DefaultLeaseN {
		start := time.Now()
		renewed, err := st.RenewLeases(ctx, owner, held, time.Hour)
		if err != nil {
			return Result{}, fmt.Errorf("fleet: renew %d leases: %w", keys, err)
		}
		renew = append(renew, time.Since(start))
		if len(renewed) != keys {
			return Result{}, fmt.Errorf("fleet: renewed %d of %d leases", len(renewed), keys)
		}
	}
	r := newResult(fmt.Sprintf("lease renewal: %d keys of one replica in one write", keys), "one AcquireLease (a key's first claim)", renew, acquire)
	period := fleet.DefaultTTL / 3
	r.Extra = map[string]string{
		"keys":                strconv.Itoa(keys),
		"ttl":                 fleet.DefaultTTL.String(),
		"statements_per_s":    strconv.FormatFloat(float64(time.Second)/float64(period), 'f', 2, 64),
		"rows_per_s":          strconv.FormatFloat(float64(keys)*float64(time.Second)/float64(period), 'f', 0, 64),
		"share_of_period_pct": strconv.FormatFloat(100*float64(r.Sandkeep.Median)/float64(period), 'f', 2, 64),
	}
	return r, nil
}
