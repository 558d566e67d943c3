package main

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
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/fleet"
	"github.com/sandkeep/sandkeep/internal/reaper"
	"github.com/sandkeep/sandkeep/internal/service"
	"github.com/sandkeep/sandkeep/internal/store"
)

// fleetConfig is the fleet: block of sandkeep-server.yaml (docs/ARCHITECTURE.md, "Fleet"): this replica's
// internal address, the secret every replica shares, the lease lifetime, and the installation id every replica
// labels its sandboxes with (so that one replica can take over another's).
type fleetConfig struct {
	Listen       string `yaml:"listen"`        // the internal address, e.g. 0.0.0.0:7879; empty: no fleet
	Advertise    string `yaml:"advertise"`     // what other replicas dial (host:port, ${VAR} expanded); default: Listen
	SecretEnv    string `yaml:"secret_env"`    // the environment variable holding the shared secret (16 bytes or more)
	LeaseTTL     string `yaml:"lease_ttl"`     // default 10s
	Installation string `yaml:"installation"`  // 32 lower-case hex digits, the same on every replica
	ReapInterval string `yaml:"reap_interval"` // how often the leading replica reaps (default 1m; "0": never)
	// Leader is how the reaping replica is chosen and what it reaps: "store" (default: a lease in the store; the
	// Docker engine's containers) or "kubernetes" (a coordination.k8s.io Lease through client-go's leader
	// election; the sandbox namespace's pods, records, claims and NetworkPolicies, servefleet_kube.go).
	Leader string `yaml:"leader"`
	// SandboxDir is where replicas on one host with homes of their own keep what sandboxes see of the host
	// (workspaces, channel directories, the agent): the same directory on every replica of the host, so the
	// replica that takes a key over adopts its container and workspace, and snapshot archives unless
	// snapshot_store names a bucket (their records are in the store) so that any replica serves them. Empty: each
	// replica's home (a takeover then recreates the container, without the workspace; snapshot calls answer
	// SPEC_UNSUPPORTED unless snapshot_store names a bucket).
	SandboxDir string `yaml:"sandbox_dir"`
}

var installationRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// fleetSetup is what serve needs of a fleet before it opens its Manager.
type fleetSetup struct {
	cfg      fleetConfig
	secret   string
	ttl      time.Duration
	ln       net.Listener
	address  string
	replica  *fleet.Replica  // made when the store is open (mutate)
	proxy    *fleet.Proxy    // set by run: api.Config.Forward
	internal *fleet.Internal // set by run
	wait     func()          // set by run
	// sharedArchives: every replica reads the same snapshot archives (snapshot_store's bucket, or
	// fleet.sandbox_dir on one host); their records are in the store.
	sharedArchives bool
}

// openFleet checks the fleet block, pins the home's installation id to the fleet's and opens the internal
// listener. No fleet block: nil.
func (g *globals) openFleet(fc fleetConfig) (*fleetSetup, error) {
	if fc.Listen == "" {
		if fc != (fleetConfig{}) {
			return nil, fault.New(fault.InvalidArgument, "set fleet.listen (the internal address), or remove the fleet block",
				"the fleet block has no listen address")
		}
		return nil, nil
	}
	bad := func(hint, format string, args ...any) error {
		return fault.New(fault.InvalidArgument, hint, "fleet: "+format, args...)
	}
	if fc.SecretEnv == "" {
		return nil, bad("set fleet.secret_env to a variable holding a random secret shared by every replica", "no secret_env")
	}
	secret := os.Getenv(fc.SecretEnv)
	if len(secret) < fleet.MinSecretBytes {
		return nil, bad("export "+fc.SecretEnv+" with a random secret of 16 bytes or more", "%s is unset or shorter than %d bytes", fc.SecretEnv, fleet.MinSecretBytes)
	}
	if !installationRE.MatchString(fc.Installation) {
		return nil, bad("set fleet.installation to 32 lower-case hex digits (openssl rand -hex 16), the same on every replica",
			"installation %q", fc.Installation)
	}
	ttl := fleet.DefaultTTL
	if fc.LeaseTTL != "" {
		d, err := time.ParseDuration(fc.LeaseTTL)
		if err != nil || d < time.Second {
			return nil, bad("write a duration of 1s or more, e.g. 10s", "lease_ttl %q", fc.LeaseTTL)
		}
		ttl = d
	}
	if err := pinInstallation(g.resolvedHome(), fc.Installation); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", fc.Listen)
	if err != nil {
		return nil, fault.Wrap(err, fault.InvalidArgument, "choose a free address for fleet.listen", "cannot listen on %s", fc.Listen)
	}
	// The advertised address may name the environment (`$(POD_IP)` is not expanded in a file from a Secret, so
	// deploy/ writes `${POD_IP}:7879`): each replica's own address from one config every replica shares.
	addr := os.ExpandEnv(fc.Advertise)
	if addr == "" {
		addr = ln.Addr().String()
	}
	if fc.Leader != "" && fc.Leader != leaderStore && fc.Leader != leaderKubernetes {
		return nil, bad("set fleet.leader to store or kubernetes", "leader %q", fc.Leader)
	}
	if fc.ReapInterval != "" && fc.ReapInterval != "0" {
		if d, err := time.ParseDuration(fc.ReapInterval); err != nil || d < time.Second {
			return nil, bad("write a duration of 1s or more, or 0", "reap_interval %q", fc.ReapInterval)
		}
	}
	return &fleetSetup{cfg: fc, secret: secret, ttl: ttl, ln: ln, address: addr}, nil
}

// reaperOwner names the reaper in the key leases it takes while it removes: not the replica's own id, which
// would let this replica's own claim of the key renew the reaper's lease and adopt what is being removed.
func (f *fleetSetup) reaperOwner() string { return f.replica.ID() + "/reaper" }

// pinInstallation makes home's installation id the fleet's: written when the home has none yet, refused when it
// has another (its sandboxes would be another installation's).
func pinInstallation(home, id string) error {
	if err := os.MkdirAll(home, 0o700); err != nil {
		return fault.Wrap(err, fault.InvalidArgument, "set SANDKEEP_HOME to a directory you can write", "state home %s", home)
	}
	path := filepath.Join(home, "installation-id")
	b, err := os.ReadFile(path)
	if err == nil {
		if got := strings.TrimSpace(string(b)); got != id {
			return fault.New(fault.InvalidArgument, "give this replica a fresh state home, or set fleet.installation to "+got,
				"state home %s belongs to installation %s, not the fleet's %s", home, got, id)
		}
		return nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read installation id: %w", err)
	}
	return os.WriteFile(path, []byte(id+"\n"), 0o600)
}

// store wraps the Manager's store so every run is fenced by its key's lease, and makes the replica.
func (f *fleetSetup) store(c *sandkeep.Config, log io.Writer) error {
	r, err := fleet.New(fleet.Config{Leases: c.Store, ID: fleet.NewReplicaID(), Address: f.address, TTL: f.ttl})
	if err != nil {
		return err
	}
	f.replica = r
	c.Store = fleet.NewFencedStore(c.Store, r)
	if f.cfg.SandboxDir != "" {
		c.SandboxDir = os.ExpandEnv(f.cfg.SandboxDir)
	}
	fmt.Fprintf(log, "sandkeep: fleet replica %s, internal address %s, leases of %s\n", r.ID(), f.address, f.ttl)
	return nil
}

// run serves the internal wire, renews the leases and, unless sandboxing is off, reaps while this replica leads,
// until ctx ends. The returned func hands the leases over and shuts the wire down (handOver), bounded by its ctx;
// f.wait then waits for everything run started, once ctx has ended.
//
// The internal address serves the public API too, for the requests another replica hands over whole
// (f.proxy): f.internal.SetAPI once the API is built.
func (f *fleetSetup) run(ctx context.Context, local *service.Service, st store.Store, sandboxOff bool, log io.Writer) (*fleet.Backend, func(context.Context)) {
	b := fleet.NewBackend(local, f.replica, fleet.NewForwarder(nil, f.secret))
	if f.sharedArchives {
		b.ShareSnapshots() // records in the store, archives in the bucket or fleet.sandbox_dir
	}
	f.proxy = fleet.NewProxy(f.replica, f.secret)
	wire := fleet.NewHandler(b, f.secret)
	f.internal = fleet.NewInternal(wire, f.secret)
	hs := &http.Server{Handler: f.internal, ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = hs.Serve(f.ln) })
	wg.Go(func() { _ = f.replica.Run(ctx) })
	if every := duration(f.cfg.ReapInterval, time.Minute); every > 0 && !sandboxOff && f.cfg.Leader == leaderKubernetes {
		wg.Go(func() { f.reapKube(ctx, st, every, log) })
	} else if every > 0 && !sandboxOff {
		// The reaper of the Docker engine's containers; one replica at a time (the store lease "reaper").
		if docker, err := client.New(client.FromEnv); err != nil {
			fmt.Fprintf(log, "sandkeep: fleet: no reaper: %v\n", err)
		} else {
			r := reaper.New(reaper.Config{Installation: f.cfg.Installation, Source: reaper.Docker{API: docker}, Store: st,
				Logger: slog.New(slog.NewTextHandler(log, nil)), Owner: f.reaperOwner()})
			wg.Go(func() {
				defer docker.Close()
				r.RunLeader(ctx, st, f.replica.ID(), f.ttl, every)
			})
		}
	}
	f.wait = func() {
		_ = hs.Close()
		wg.Wait()
	}
	return b, func(ctx context.Context) { f.handOver(ctx, wire, hs, log) }
}

// handOver is a draining replica's last step, bounded by ctx: the forwarded calls it took end (new ones are
// answered SHUTTING_DOWN, and their callers claim the key again), then its leases are released, and only then
// does its internal address stop answering, once no replica can still take it for a key's owner (another's memory
// of a lease lasts a third of a TTL, Replica.Claim). So a call forwarded here during a rolling restart is either
// run, or provably not run and sent to the key's next owner, never lost to a closed address.
func (f *fleetSetup) handOver(ctx context.Context, wire *fleet.Handler, hs *http.Server, log io.Writer) {
	if err := wire.Wait(ctx); err != nil {
		fmt.Fprintf(log, "sandkeep: fleet: forwarded calls still running at the end of the grace: %v\n", err)
	}
	if err := f.replica.Release(ctx); err != nil {
		fmt.Fprintf(log, "sandkeep: fleet: hand leases over: %v\n", err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(f.ttl/3 + handOverMargin):
	}
	_ = hs.Shutdown(ctx)
}

// handOverMargin is how much longer than another replica's memory of a lease the internal address keeps
// answering after the leases were released.
const handOverMargin = 500 * time.Millisecond

// forwardOf is the API's Forward of a fleet replica (nil without a fleet): requests that hold a stream to a key's
// sandbox go to its owner whole.
func forwardOf(f *fleetSetup) func(http.ResponseWriter, *http.Request, sandkeep.Key) (bool, error) {
	if f == nil {
		return nil
	}
	return f.proxy.Forward
}

// forwardE2BOf is the API's ForwardE2B of a fleet replica (nil without a fleet): an E2B sandbox's requests go to
// the replica that holds its id (the one that keeps its record, e2b.Holder).
func forwardE2BOf(f *fleetSetup) func(http.ResponseWriter, *http.Request, string) (bool, error) {
	if f == nil {
		return nil
	}
	return func(w http.ResponseWriter, r *http.Request, id string) (bool, error) {
		return f.proxy.ForwardHeld(w, r, fleet.AliasE2B(id))
	}
}
