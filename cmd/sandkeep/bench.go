package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/moby/moby/client"
	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/drivers"
	"github.com/sandkeep/sandkeep/internal/bench"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
)

const benchLong = `Measure sandkeep against the raw Docker Engine API on this machine, side by side in one process and one
run: each scenario alternates sandkeep's samples with its baseline's and reports medians, p90, p99 and the
ratio of medians. Scenarios (in run order):

  warm        warm exec of 'true': agent channel, sandkeep's exec transport, raw Engine-API exec (rotated)
  output      warm exec writing 1 MiB to stdout: agent channel vs raw exec
  first       first command for a new key vs 'docker run --rm' of the same image
  concurrent  100 concurrent first calls for one key: time to all done, containers created for the key
  throughput  --keys keys x N warm commands in parallel: execs/s and p99, agent channel vs raw exec
  footprint   --footprint idle sandboxes: agent RSS inside each, host memory per sandbox, engine overhead
  api         warm exec through the HTTP API (Go SDK, loopback TCP) vs the library, side by side; then
              --requests execs by 50 clients over 20 users: execs/s, errors, lost results, Go heap growth
  cli         warm one-shot 'sandkeep exec -- true' as whole CLI processes: through the home's daemon vs
              'docker exec' of the same command in the same container, and vs in-process (opt in: --scenario cli)
  admission   what admission adds to a warm 'true': Manager.Exec (admitted per command) vs Run.Exec on a run
              admitted once; without a store, then with an SQLite run record
  tunnel      the egress proxy's plain tunnel (side listener, socket handoff, hello check) moving 64 MiB up
              and down vs a direct loopback copy with the same client and server, in rotating blocks, with
              a bare two-socket splice relay beside it as the control (of_minimal_relay)
  hardening   what the hardening costs: first command for a new key and warm 'true' with sandkeep's seccomp
              profile, ulimits, per-key uid and a 1 GiB workspace quota on vs all of them off (the engine's
              defaults), side by side over the agent channel; targets 1.15x and 1.05x
  connect     what the ClientHello check and the per-command proxy token add: CONNECT + TLS handshake to a
              loopback server with them on vs off, and warm 'true' with a network block (a proxy session per
              command) vs without; paired per block, bar 0.1 ms
  pool        warm pools (issue 23): a new key's first command with its template's pool warm vs 'docker run
              --rm'; --keys (default 50) new keys at once with a pool of as many (p99 vs one run's median);
              the on-demand fallback's first command beside them
  fleet       a fleet (issue 27): warm 'true' sent to a replica that forwards it to the key's owner vs sent to
              the owner, side by side (target 1.5x at the median); one renewal of 10,000 key leases in one
              write vs one acquisition, with the rows and statements per second renewal costs (SQLite, or
              --postgres)
  e2b         the E2B front from the e2b npm SDK's side (node, opt in: --scenario e2b, SDK in --e2b-sdk): warm
              commands.run('true') vs an Engine-API exec and 'docker exec' of 'true' in the same container;
              Sandbox.create() to its first command's result vs 'docker run --rm'; rotating blocks (bar 0.25x)

bench never touches your state home or your sandboxes: it opens two managers (transports agent and exec)
on a fresh temporary home, with a tenant unique to the run, and removes every container and file it created
when it ends, also when interrupted. --image and --agent apply; --home and --transport are refused.
Timings depend on the machine and its load: compare ratios within one run, not numbers across machines.`

func newBench(g *globals) *cobra.Command {
	var (
		asJSON    bool
		scenarios string
		n         int
		keys      int
		footprint int
		requests  int
		postgres  string
		e2bSDK    string
	)
	cmd := &cobra.Command{
		Use:   "bench [--json] [--scenario warm,output,...] [--n N] [--keys K] [--footprint K] [--requests R] [--postgres DSN]",
		Short: "Benchmark sandkeep against the raw Docker Engine API on this machine",
		Long:  benchLong,
		Example: "  sandkeep bench\n" +
			"  sandkeep bench --scenario warm,first --n 50 --json",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fail := func(err error) error {
				if asJSON {
					jsonError(g.stdout, err)
					return exitError{exitFailure}
				}
				return err
			}
			opts, err := benchOptions(cmd, scenarios, n, keys, footprint, requests)
			if err != nil {
				return fail(err)
			}
			opts.Postgres, opts.E2BSDK = postgres, e2bSDK
			cli := slices.Contains(opts.Scenarios, scenarioCLI)
			opts.Scenarios = slices.DeleteFunc(opts.Scenarios, func(s string) bool { return s == scenarioCLI })
			var rep bench.Report
			if len(opts.Scenarios) > 0 {
				rep, err = runBench(cmd.Context(), g, opts)
			}
			if err == nil && cli {
				var rs []bench.Result
				if rs, err = benchCLI(cmd.Context(), g, opts.N, &rep.Machine, g.stderr); err == nil {
					rep.Results = append(rep.Results, rs...)
				}
			}
			if err != nil {
				if _, ok := interruptedBy(cmd.Context()); ok {
					return err // run reports the signal
				}
				return fail(err)
			}
			if asJSON {
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				enc.SetEscapeHTML(false)
				return enc.Encode(rep)
			}
			return bench.WriteMarkdown(g.stdout, rep)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, `print one JSON document {"machine": ..., "results": [...], "footprint": ...}`)
	f.StringVar(&scenarios, "scenario", strings.Join(bench.Scenarios, ","), "comma-separated scenarios to run")
	f.IntVar(&n, "n", 0, fmt.Sprintf("samples per series of every timed scenario, and commands per key of throughput (default: warm %d, output %d, first %d, throughput %d, api %d, tunnel %d blocks, hardening %d warm and %d first)",
		bench.DefaultWarmN, bench.DefaultOutputN, bench.DefaultFirstN, bench.DefaultThroughputN, bench.DefaultAPIN, bench.DefaultTunnelN,
		bench.DefaultHardeningWarmN, bench.DefaultHardeningFirstN))
	f.IntVar(&keys, "keys", bench.DefaultKeys, "keys running in parallel in the throughput scenario")
	f.IntVar(&footprint, "footprint", bench.DefaultFootprint, "idle sandboxes in the footprint scenario")
	f.IntVar(&requests, "requests", bench.DefaultAPIRequests, "requests of the api scenario's sustained load (and as many through the library)")
	f.StringVar(&postgres, "postgres", "", "a postgres:// DSN the api scenario's served rows also record runs and events into (default: SQLite only)")
	f.StringVar(&e2bSDK, "e2b-sdk", bench.DefaultE2BSDK, "the e2b scenario's directory holding bench.mjs and the e2b SDK (`npm ci` there)")
	return cmd
}

// Bounds on the sizes: a typo must not start a run that takes the machine down or never ends.
const (
	maxBenchN         = 100000
	maxBenchKeys      = 500
	maxBenchFootprint = 1000
)

// benchOptions checks the flags before anything touches the engine.
func benchOptions(cmd *cobra.Command, scenarios string, n, keys, footprint, requests int) (bench.Options, error) {
	help := fmt.Sprintf("see '%s --help'", cmd.CommandPath())
	for _, flag := range []string{"home", "transport"} {
		if cmd.Flags().Changed(flag) {
			return bench.Options{}, fault.New(fault.InvalidArgument,
				"bench always uses a fresh temporary home and both transports; drop --"+flag,
				"--%s does not apply to bench", flag)
		}
	}
	var names []string
	for _, s := range strings.Split(scenarios, ",") {
		if s = strings.TrimSpace(s); s != "" {
			names = append(names, s)
		}
	}
	if len(names) == 0 {
		return bench.Options{}, fault.New(fault.InvalidArgument, "name at least one of "+strings.Join(bench.Scenarios, ","),
			"--scenario is empty")
	}
	if err := bench.CheckScenarios(slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s == scenarioCLI })); err != nil {
		return bench.Options{}, fault.Wrap(err, fault.InvalidArgument, help, "%v", err)
	}
	switch {
	case cmd.Flags().Changed("n") && (n < 1 || n > maxBenchN):
		return bench.Options{}, fault.New(fault.InvalidArgument, help, "--n %d is out of range 1..%d", n, maxBenchN)
	case keys < 1 || keys > maxBenchKeys:
		return bench.Options{}, fault.New(fault.InvalidArgument, help, "--keys %d is out of range 1..%d", keys, maxBenchKeys)
	case footprint < 1 || footprint > maxBenchFootprint:
		return bench.Options{}, fault.New(fault.InvalidArgument, help, "--footprint %d is out of range 1..%d", footprint, maxBenchFootprint)
	case requests < 1 || requests > maxBenchN:
		return bench.Options{}, fault.New(fault.InvalidArgument, help, "--requests %d is out of range 1..%d", requests, maxBenchN)
	}
	return bench.Options{Scenarios: names, N: n, Keys: keys, Footprint: footprint, Requests: requests}, nil
}

// runBench sets up the bench environment on a fresh temporary home, runs the scenarios and removes everything
// the run created, under its own timeout even when ctx was cancelled.
func runBench(ctx context.Context, g *globals, opts bench.Options) (_ bench.Report, err error) {
	cfg, err := g.config()
	if err != nil {
		return bench.Report{}, err
	}
	if cfg.Image == "" {
		cfg.Image = sandkeep.DefaultImage
	}
	cfg.Drivers = []sandkeep.DriverOption{drivers.Docker()} // sandkeep against raw Docker: Docker only
	home, err := os.MkdirTemp("", "sandkeep-bench-")
	if err != nil {
		return bench.Report{}, fault.Wrap(err, fault.Internal, "check that the temporary directory is writable", "create a temporary home: %v", err)
	}
	cfg.Home = home
	docker, err := client.New(client.FromEnv)
	if err != nil {
		_ = os.RemoveAll(home)
		return bench.Report{}, fault.Wrap(err, fault.DriverUnavailable, "check DOCKER_HOST", "cannot set up the Docker client")
	}
	var tenant [6]byte
	_, _ = rand.Read(tenant[:])
	e := &bench.Env{Docker: docker, Image: cfg.Image, Tenant: "bench-" + hex.EncodeToString(tenant[:]), Config: cfg}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
		defer cancel()
		var errs []error
		if e.M != nil {
			errs = append(errs, bench.Cleanup(cctx, docker, e.M.Installation(), e.Tenant))
		}
		for _, m := range []*sandkeep.Manager{e.MExec, e.M} {
			if m != nil {
				errs = append(errs, m.Close())
			}
		}
		errs = append(errs, os.RemoveAll(home), docker.Close())
		if cerr := errors.Join(errs...); cerr != nil {
			if err == nil {
				err = fault.Wrap(cerr, fault.SandboxFailed,
					fmt.Sprintf("remove the leftovers with: docker rm -f $(docker ps -aq --filter label=%s=%s) $(docker ps -aq --filter label=%s=%s)",
						driver.LabelInstallation, e.M.Installation(), bench.LabelRaw, e.Tenant),
					"bench cleanup: %v", cerr)
			} else {
				fmt.Fprintf(g.stderr, "sandkeep: bench cleanup: %v\n", oneLine(cerr.Error()))
			}
		}
	}()
	open := func(transport string) (*sandkeep.Manager, error) {
		c := cfg
		c.Transport = transport
		return sandkeep.Open(ctx, c)
	}
	if e.M, err = open("agent"); err != nil {
		return bench.Report{}, err
	}
	if e.MExec, err = open("exec"); err != nil {
		return bench.Report{}, err
	}
	fmt.Fprintf(g.stderr, "bench: image %s, temporary home %s, tenant %s\n", e.Image, home, e.Tenant)
	return bench.Run(ctx, e, opts, g.stderr)
}
