package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/bench"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// scenarioCLI is bench's whole-process scenario: a warm one-shot `sandkeep exec -- true` as a CLI process,
// through the home's daemon and in-process, against `docker exec` of the same command in the same sandbox
// container (the same image), each sample a whole process, in blocks that rotate the order.
const scenarioCLI = "cli"

const defaultCLIN = 30

// benchCLI runs the cli scenario on a fresh temporary home of its own (the daemon owns its home), with this
// process's binary, image and agent, and removes what it created. m is the report's machine: described here
// when no other scenario ran (its load at the start and at the end of this scenario).
func benchCLI(ctx context.Context, g *globals, n int, m *bench.Machine, progress io.Writer) (_ []bench.Result, err error) {
	if n <= 0 {
		n = defaultCLIN
	}
	dockerCLI, err := exec.LookPath("docker")
	if err != nil {
		return nil, fault.Wrap(err, fault.DriverUnavailable, "install the docker CLI (the baseline is `docker exec`)", "no docker CLI on PATH")
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fault.Wrap(err, fault.Internal, "", "cannot find sandkeep's own binary: %v", err)
	}
	cfg, err := g.config()
	if err != nil {
		return nil, err
	}
	home, err := os.MkdirTemp("", "sandkeep-bench-cli-")
	if err != nil {
		return nil, fault.Wrap(err, fault.Internal, "check that the temporary directory is writable", "create a temporary home: %v", err)
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "SANDKEEP_") })
	env = append(env, "SANDKEEP_HOME="+home, "SANDKEEP_HOST_PASSTHROUGH=deny")
	if cfg.Image != "" {
		env = append(env, "SANDKEEP_IMAGE="+cfg.Image)
	}
	if cfg.AgentPath != "" {
		env = append(env, "SANDKEEP_AGENT="+cfg.AgentPath)
	}
	tenant := fmt.Sprintf("bench-cli-%d", os.Getpid())
	run := func(ctx context.Context, mode string, args ...string) error {
		c := exec.CommandContext(ctx, exe, args...)
		c.Env = append(slices.Clone(env), "SANDKEEP_DAEMON="+mode)
		out, err := c.CombinedOutput()
		if err != nil {
			return fmt.Errorf("sandkeep %s (SANDKEEP_DAEMON=%s): %v: %s", strings.Join(args, " "), mode, err, out)
		}
		return nil
	}
	docker, err := client.New(client.FromEnv)
	if err != nil {
		_ = os.RemoveAll(home)
		return nil, fault.Wrap(err, fault.DriverUnavailable, "check DOCKER_HOST", "cannot set up the Docker client")
	}
	began := time.Now()
	if m.Started.IsZero() {
		*m = bench.Describe(ctx, docker)
		defer func() {
			m.LoadEnd = bench.Describe(context.WithoutCancel(ctx), docker).LoadStart // the load now
			m.Duration = time.Since(began).Round(time.Millisecond).String()
		}()
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		errs := []error{run(cctx, "on", "daemon", "stop")}
		if id, rerr := os.ReadFile(filepath.Join(home, "installation-id")); rerr == nil {
			errs = append(errs, bench.Cleanup(cctx, docker, strings.TrimSpace(string(id)), tenant))
		}
		errs = append(errs, os.RemoveAll(home), docker.Close())
		if cerr := errors.Join(errs...); cerr != nil && err == nil {
			err = fault.Wrap(cerr, fault.SandboxFailed, "remove the leftovers by the label "+driver.LabelInstallation, "bench cli cleanup: %v", cerr)
		}
	}()
	if err := run(ctx, "on", "daemon", "start"); err != nil {
		return nil, fault.Wrap(err, fault.DaemonUnavailable, "see "+filepath.Join(home, daemonLogName), "%v", err)
	}
	execArgs := []string{"exec", "--tenant", tenant, "--user", "cli", "--", "true"}
	if err := run(ctx, "on", execArgs...); err != nil { // creates the sandbox: the samples are warm
		return nil, fault.Wrap(err, fault.SandboxFailed, "", "%v", err)
	}
	id, err := os.ReadFile(filepath.Join(home, "installation-id"))
	if err != nil {
		return nil, fault.Wrap(err, fault.Internal, "", "installation id: %v", err)
	}
	list, err := docker.ContainerList(ctx, client.ContainerListOptions{
		Filters: client.Filters{}.Add("label", driver.LabelInstallation+"="+strings.TrimSpace(string(id))),
	})
	if err != nil || len(list.Items) != 1 {
		return nil, fault.New(fault.SandboxFailed, "", "the bench sandbox's container: %d found, %v", len(list.Items), err)
	}
	ctr := list.Items[0].ID
	dockerExec := func(ctx context.Context) error {
		out, err := exec.CommandContext(ctx, dockerCLI, "exec", ctr, "true").CombinedOutput()
		if err != nil {
			return fmt.Errorf("docker exec: %v: %s", err, out)
		}
		return nil
	}
	fmt.Fprintf(progress, "bench: cli: %d samples of each, rotating: sandkeep exec through the daemon, docker exec, sandkeep exec in-process\n", n)
	series := []func(context.Context) error{
		func(ctx context.Context) error { return run(ctx, "on", execArgs...) },
		dockerExec,
		func(ctx context.Context) error { return run(ctx, "off", execArgs...) },
	}
	samples := make([][]time.Duration, len(series))
	for i := range n {
		for j := range series {
			k := (i + j) % len(series) // each block starts with the next series
			start := time.Now()
			if err := series[k](ctx); err != nil {
				return nil, fault.Wrap(err, fault.SandboxFailed, "", "%v", err)
			}
			samples[k] = append(samples[k], time.Since(start))
		}
	}
	result := func(scenario, baseline string, sk, base []time.Duration) bench.Result {
		r := bench.Result{Scenario: scenario, Baseline: baseline, Sandkeep: bench.Summarise(sk), Base: bench.Summarise(base)}
		if r.Base.Median > 0 {
			r.Ratio = float64(r.Sandkeep.Median) / float64(r.Base.Median)
		}
		return r
	}
	return []bench.Result{
		result("cli: warm `sandkeep exec -- true`, whole process, through the daemon", "`docker exec CONTAINER true`, whole process", samples[0], samples[1]),
		result("cli: warm `sandkeep exec -- true`, whole process, through the daemon", "the same, in-process (SANDKEEP_DAEMON=off)", samples[0], samples[2]),
	}, nil
}
