package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/api"
	"github.com/sandkeep/sandkeep/internal/e2b"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/fleet"
	"github.com/sandkeep/sandkeep/internal/mcpserver"
	"github.com/sandkeep/sandkeep/internal/service"
)

const serveLong = `Serve sandkeep's HTTP API (/v1, see docs/API.md) and MCP (/mcp, see docs/MCP.md) to many tenants.

Every request carries a token (sandkeep token create) and is scoped to its tenant. Commands run in one warm
sandbox per (tenant, user), as with sandkeep exec, and every command is recorded as a run in the store.
--config names sandkeep-server.yaml (limits, file bounds, network presets; docs/API.md); flags override it.

On SIGTERM or SIGINT the server stops admitting commands (503 SHUTTING_DOWN), lets running ones finish for
up to shutdown_grace (30s), then closes. Sandboxes keep running: they are persistent.`

const serveExample = `  sandkeep serve --listen 127.0.0.1:7878
  sandkeep serve --config /etc/sandkeep/sandkeep-server.yaml --store postgres://sandkeep@db/sandkeep
  sandkeep serve --listen :7878 --tls-cert server.crt --tls-key server.key --spec sandkeep.yaml`

func newServe(g *globals) *cobra.Command {
	var (
		configPath, listen, certFile, keyFile string
		af                                    admissionFlags
	)
	cmd := &cobra.Command{
		Use:     "serve [--listen ADDR] [--config FILE] [--tls-cert F --tls-key F] [--spec FILE]",
		Short:   "Serve the HTTP API and MCP to many tenants",
		Long:    serveLong,
		Example: serveExample,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configPath == "" {
				configPath = os.Getenv(envConfig)
			} else if err := os.Setenv(envConfig, configPath); err != nil {
				// --config is operator input like $SANDKEEP_CONFIG: as the environment it enters the home
				// socket's fingerprint, so a CLI call without it is not served by this server's config.
				return err
			}
			sc, err := loadServerConfig(configPath)
			if err != nil {
				return err
			}
			f := cmd.Flags()
			override := func(dst *string, flag, v string) {
				if f.Changed(flag) || *dst == "" {
					*dst = v
				}
			}
			override(&sc.Listen, "listen", listen)
			override(&sc.TLS.Cert, "tls-cert", certFile)
			override(&sc.TLS.Key, "tls-key", keyFile)
			override(&sc.Spec, "spec", af.spec)
			af.spec = sc.Spec
			if sc.Store != "" && g.store == "" {
				g.store = sc.Store
			}
			if (sc.TLS.Cert == "") != (sc.TLS.Key == "") {
				return fault.New(fault.InvalidArgument, "pass both --tls-cert and --tls-key, or neither", "TLS needs a certificate and its key")
			}
			return serve(cmd.Context(), g, sc, af)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&configPath, "config", "", "sandkeep-server.yaml: limits, file bounds, network presets (docs/API.md); default $SANDKEEP_CONFIG")
	fl.StringVar(&listen, "listen", "127.0.0.1:7878", "address to listen on")
	fl.StringVar(&certFile, "tls-cert", "", "serve HTTPS with this certificate (PEM)")
	fl.StringVar(&keyFile, "tls-key", "", "the certificate's private key (PEM)")
	af.bind(fl)
	return cmd
}

func serve(ctx context.Context, g *globals, sc serverConfig, af admissionFlags) error {
	// serve is its home's daemon too: it owns the home (a daemon the CLI started is replaced) and serves the
	// CLI's calls on the home's socket with its own Manager, store, channels and proxies.
	// Another owner (a second serve on the home, or a daemon started by 'sandkeep daemon'): this server still
	// serves its API, as before the daemon, but not the home's socket.
	fl, err := g.openFleet(sc.Fleet)
	if err != nil {
		return err
	}
	if fl != nil { // every replica reads the snapshot archives: a bucket, or a directory the replicas of a host share
		fl.sharedArchives = sc.SnapshotStore.Bucket != "" || sc.Fleet.SandboxDir != ""
	}
	var d *daemon
	if fl == nil {
		d, err = ownHome(g, true)
	} else {
		// A replica serves keys only through their leases; the home's socket would let a CLI call run beside
		// the key's owner.
		fmt.Fprintln(g.stderr, "sandkeep: fleet replica: serving the API without the home's socket")
	}
	switch {
	case fault.CodeOf(err) == fault.HomeOwned:
		fmt.Fprintf(g.stderr, "sandkeep: warning: %v; serving the API without the home's socket\n", oneLine(err.Error()))
		d = nil
	case err != nil:
		return err
	case d != nil:
		d.serve = true
		if af != (admissionFlags{}) {
			// serve's Manager follows these flags; a CLI call without them would get other results here than
			// in-process, so it must not match (auto: it works in-process; on: DAEMON_MISMATCH).
			d.fp += fmt.Sprintf("\nserve %+v", af)
		}
	}
	offered, err := offeredDrivers()
	if err == nil {
		offered, err = sc.serveDrivers(offered)
	}
	if err != nil {
		if d != nil {
			d.close(nil)
		}
		return err
	}
	svc, err := g.openService(ctx, sc, af, sc.fileLimits(), func(c *sandkeep.Config) {
		c.IdleTimeout = duration(sc.Sweep.IdleTimeout, 0)
		c.Retention = duration(sc.Sweep.Retention, 0)
		c.Drivers = offered // fail closed: no host passthrough unless the config names its user
		if fl != nil {
			_ = fl.store(c, g.stderr) // fails only without a store; checked below
		}
	})
	if err == nil && fl != nil && fl.replica == nil {
		svc.Close()
		err = fault.New(fault.StoreUnavailable, "pass --store with a PostgreSQL DSN", "a fleet replica needs the shared store")
	}
	if err != nil {
		if d != nil {
			d.close(nil)
		}
		return err
	}
	defer svc.Close()
	if d != nil {
		d.useStore(svc.st)
		d.useManager(svc.m)
		var calls sync.WaitGroup
		calls.Go(d.serveCalls)
		defer func() { d.requestStop(); calls.Wait(); d.close(svc.m) }()
	}
	access := slog.New(slog.NewJSONHandler(g.stderr, nil))
	var metricsToken string
	if sc.MetricsTokenEnv != "" {
		if metricsToken = os.Getenv(sc.MetricsTokenEnv); metricsToken == "" {
			return fault.New(fault.InvalidArgument, "export "+sc.MetricsTokenEnv+", or remove metrics_token_env",
				"metrics_token_env names %s, which is not set", sc.MetricsTokenEnv)
		}
	}
	reg := serveRegistry()
	front, err := g.e2bFront(sc)
	if err != nil {
		return err
	}
	defer front.Close()
	var backend service.Backend = svc.backend
	fleetCtx, stopFleet := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFleet()
	if fl != nil {
		fb, handOver := fl.run(fleetCtx, svc.backend, svc.st, af.sandbox == "none", g.stderr)
		backend = fb
		front.SetHolder(fleetCtx, e2b.Holder{ // E2B sandboxes are reached through the replica that keeps their record
			Hold:   func(ctx context.Context, id string) error { return fl.replica.Hold(ctx, fleet.AliasE2B(id)) },
			Unhold: func(ctx context.Context, id string) error { return fl.replica.Unhold(ctx, fleet.AliasE2B(id)) },
		})
		defer func() {
			// The leases are handed over last: the API's commands ended (Drain), then the forwarded ones, so the
			// next owner starts clean; the internal address answers (SHUTTING_DOWN: their callers claim again)
			// until after the leases are released (handOver). Meanwhile the leases are still renewed.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sc.shutdownGrace())
			defer cancel()
			handOver(wctx)
			stopFleet()
			fl.wait()
		}()
	}
	srv, err := api.New(api.Config{
		Backend: backend, Tokens: svc.st, Registry: reg,
		Limits: sc.Limits.api(), TenantLimits: sc.tenantLimits(),
		MaxBodyBytes: size(sc.MaxBody), MaxUploadBytes: sc.fileLimits().MaxFileBytes,
		Logger: access, MetricsToken: metricsToken, MetricsOpen: sc.MetricsOpen,
		MCP: func(b service.Backend, h api.MCPHooks) http.Handler {
			return mcpserver.Handler(b, h.KeyFor, mcpserver.Options{
				Version: version(), Logger: svc.log, RequestID: h.RequestID,
				Authorize: func(r *http.Request, tool string) error { return h.Authorize(r, mcpserver.Scope(tool)) },
			})
		},
		E2B:        front.Handler,
		Forward:    forwardOf(fl),
		ForwardE2B: forwardE2BOf(fl),
	})
	if err != nil {
		return err
	}
	if fl != nil {
		fl.internal.SetAPI(srv.Handler())
	}
	ln, err := net.Listen("tcp", sc.Listen)
	if err != nil {
		return fault.Wrap(err, fault.InvalidArgument, "choose a free address with --listen", "cannot listen on %s", sc.Listen)
	}
	hs := srv.HTTPServer(sc.Listen)
	var operatorToken string
	if sc.OperatorTokenEnv != "" {
		if operatorToken = os.Getenv(sc.OperatorTokenEnv); len(operatorToken) < 16 {
			return fault.New(fault.InvalidArgument, "export "+sc.OperatorTokenEnv+" with a random secret of 16 bytes or more, or remove operator_token_env",
				"operator_token_env names %s, which is unset or shorter than 16 bytes", sc.OperatorTokenEnv)
		}
	}
	if err := mountUI(hs, svc, reg, access, operatorToken); err != nil {
		return err
	}
	scheme := "http"
	if sc.TLS.Cert != "" {
		scheme = "https"
	}
	fmt.Fprintf(g.stderr, "sandkeep: serving %s://%s (API /v1, MCP /mcp)\n", scheme, ln.Addr())
	// The sweeper stops idle sandboxes and removes old stopped ones (one sweeper per state home: another
	// process holding the lock keeps it). It ends with the server.
	sweepCtx, stopSweep := context.WithCancel(context.WithoutCancel(ctx))
	var sweeping sync.WaitGroup
	if every := duration(sc.Sweep.Interval, time.Minute); every > 0 && fl == nil {
		sweeping.Go(func() {
			if err := svc.m.RunSweeper(sweepCtx, every); err != nil {
				fmt.Fprintf(g.stderr, "sandkeep: sweeper stopped: %v\n", err)
			}
		})
	}
	// E2B sandboxes' timeouts (docs/E2B.md), enforced from the records, so they survive a restart.
	sweeping.Go(func() { front.Sweep(sweepCtx, time.Second) })
	defer func() { stopSweep(); sweeping.Wait() }()
	warmPools(ctx, g, svc.m, fl != nil)
	served := make(chan error, 1)
	go func() {
		if sc.TLS.Cert != "" {
			served <- hs.ServeTLS(ln, sc.TLS.Cert, sc.TLS.Key)
			return
		}
		served <- hs.Serve(ln)
	}()
	select {
	case err := <-served: // the listener failed (or the TLS files did not load)
		return fault.Wrap(err, fault.InvalidArgument, "check the listen address and TLS files", "serving stopped: %v", err)
	case <-ctx.Done():
	}
	// Graceful: refuse new commands, let running ones finish (bounded), then close the listener and connections.
	// Admission stops before the announcement: whoever reads "draining" is refused.
	srv.StopAdmitting()
	if fl != nil {
		fl.replica.Drain()
	}
	fmt.Fprintln(g.stderr, "sandkeep: draining: no new commands; waiting for running ones")
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sc.shutdownGrace())
	defer cancel()
	derr := srv.Drain(gctx)
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer scancel()
	serr := hs.Shutdown(sctx)
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		serr = errors.Join(serr, err)
	}
	if derr != nil || serr != nil {
		fmt.Fprintf(g.stderr, "sandkeep: shutdown: %v\n", errors.Join(derr, serr))
	}
	fmt.Fprintln(g.stderr, "sandkeep: stopped")
	return nil
}
