package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/bytesize"
	"github.com/sandkeep/sandkeep/internal/doctor"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/processes"
)

const execLong = `Run a command in the (tenant, user) sandbox, creating or starting the sandbox when needed.

The command runs directly, without a shell: use sh -c '...' for pipes, redirections and globs. Everything
after the command's name belongs to the command, so put sandkeep's flags before it; a '--' before the
command is optional but keeps it readable.

stdout and stderr stream as they are produced, to sandkeep's stdout and stderr. The command's stdin is
/dev/null unless -i is given. One user's commands run one at a time (a second one waits for the first, at
most --gate-wait); different users run in parallel.

-t runs the command on a pseudo-terminal in the sandbox, of the size of sandkeep's terminal (24x80 when
stdin is not one), resized with it; stdout and stderr are then one stream, on sandkeep's stdout. With -it
from a terminal, sandkeep's terminal is raw while the command runs: every key, Ctrl-C included, goes to the
command (Ctrl-C interrupts its foreground process, not sandkeep). Deadline, tree kill, output limit and exit
status are as without -t.

Exit status: the command's own (128+N when a signal N killed it); 124 when it ran past --timeout, after its
whole process tree was killed; 125 when sandkeep itself failed ("sandkeep: CODE: message" and a hint on
stderr, or {"error": {...}} on stdout with --json); 130/143 when sandkeep was interrupted (the command's
tree is killed before sandkeep exits).`

const execExample = `  sandkeep exec --tenant acme --user alice -- sh -c 'echo hi > /workspace/f; id -u'
  sandkeep exec --user bob --timeout 5s --workdir src -- make test
  sandkeep exec --user bob -e GOFLAGS=-mod=mod -e CI=1 -- go test ./...
  echo data | sandkeep exec --user bob -i -- cat
  sandkeep exec --user bob -it -- sh
  sandkeep exec --user bob --json -- ls /workspace`

func newExec(g *globals) *cobra.Command {
	var (
		w           who
		timeout     time.Duration
		workdir     string
		env         []string
		asJSON      bool
		outputLimit = byteSize(agentproto.DefaultLimit)
		interactive bool
		tty         bool
		gateWait    time.Duration
		pf          policyFlags
		nf          networkFlags
		detach      detachFlags
	)
	cmd := &cobra.Command{
		Use:     "exec --user U [--tenant T] [flags] [--] COMMAND [ARG...]",
		Short:   "Run a command in the user's sandbox",
		Long:    execLong,
		Example: execExample,
		Args:    cobra.ArbitraryArgs, // checked in RunE, so that --json reports it too
		RunE: func(cmd *cobra.Command, args []string) error {
			fail := func(err error) error {
				if asJSON {
					jsonError(g.stdout, err)
					return exitError{exitFailure}
				}
				return err
			}
			key, err := w.key(cmd)
			if err != nil {
				return fail(err)
			}
			req := sandkeep.ExecRequest{
				Argv: args, Workdir: workdir, Env: env, Timeout: timeout, OutputLimit: int64(outputLimit),
			}
			if err := checkExec(cmd, req, gateWait); err != nil {
				return fail(err)
			}
			if err := checkAttached(cmd, pf); err != nil {
				return fail(err)
			}
			if err := checkDetach(cmd, detach); err != nil {
				return fail(err)
			}
			if detach.on {
				sreq := processes.StartRequest{Argv: args, Workdir: workdir, Env: env, Lifetime: detach.lifetime,
					Stdin: interactive, Tag: detach.tag}
				return runDetach(cmd.Context(), g, key, sreq, asJSON, pf, nf.block(cmd), fail)
			}
			if interactive {
				req.Stdin = g.stdin
			}
			var caller *callerTTY
			if tty {
				if asJSON {
					return fail(fault.New(fault.InvalidArgument, "leave out --json, or -t: a terminal's output is for a person",
						"--tty and --json cannot be combined"))
				}
				caller, req.TTY = newCallerTTY(g.stdin)
			}
			ctx := cmd.Context()
			if !asJSON {
				// A reader that goes away (`sandkeep exec ... | head -1`) stops the command like a signal
				// would: its tree is killed before sandkeep exits 141, instead of running on unread.
				var cancel context.CancelCauseFunc
				ctx, cancel = context.WithCancelCause(ctx)
				defer cancel(nil)
				req.Stdout = &stopOnError{w: g.stdout, cancel: cancel}
				req.Stderr = &stopOnError{w: g.stderr, cancel: cancel}
			}
			return runExec(ctx, g, key, req, asJSON, gateWait, pf, nf.block(cmd), fail, caller)
		},
	}
	cmd.Flags().SetInterspersed(false) // everything after the command's name belongs to it
	w.bind(cmd)
	f := cmd.Flags()
	f.DurationVar(&timeout, "timeout", sandkeep.DefaultTimeout, "deadline for the command, 1s to 24h; past it the whole process tree is killed")
	f.StringVarP(&workdir, "workdir", "w", "", "working directory, relative to /workspace or absolute under it; created when missing")
	f.StringArrayVarP(&env, "env", "e", nil, "set an environment variable, NAME=VALUE (repeatable)")
	f.BoolVar(&asJSON, "json", false, "collect the output and print one JSON object with the result instead of streaming")
	f.Var(&outputLimit, "output-limit", "output kept per stream (stdout, stderr), e.g. 65536, 512KiB, 4MiB; at most 64MiB")
	f.BoolVarP(&interactive, "interactive", "i", false, "pass sandkeep's stdin to the command (default: /dev/null)")
	f.BoolVarP(&tty, "tty", "t", false, "run the command on a pseudo-terminal; with -i and a terminal on stdin, sandkeep's terminal is raw while it runs and keys, Ctrl-C included, go to the command")
	f.DurationVar(&gateWait, "gate-wait", 0, "how long to wait while the user's previous command runs (default $SANDKEEP_GATE_WAIT, else 10m)")
	f.StringVar(&pf.spec, "spec", "", "the project's sandkeep.yaml (default $SANDKEEP_SPEC); its directory is where devcontainer.json is looked up")
	f.StringVar(&pf.sandbox, "sandbox", "", "sandbox mode: none, auto (sandbox if a driver is usable, else run on the host, loudly) or inline (sandbox or refuse); default: the spec's, else $SANDKEEP_SANDBOX_DEFAULT, else auto")
	f.StringVar(&pf.trust, "trust", "trusted", "trusted, or untrusted: an untrusted run is refused rather than run outside a sandbox")
	f.StringVar(&pf.run, "run", "", "attach this command to a running run (sandkeep runs start) instead of an implicit one; the run stays open")
	f.StringVar(&pf.driver, "driver", "", "use this driver (docker, host); unavailable is an error, never a fallback")
	f.StringVar(&pf.hostState, "host-state", "", "auto: bind your git identity and Go/npm/pnpm/yarn caches into the sandbox at their own paths (HOME is yours, on a tmpfs); none: pass the git identity as GIT_* variables (default: the config's host_state)")
	nf.bind(f)
	f.BoolVarP(&detach.on, "detach", "d", false, "start the command as a process that outlives this call and print its pid (sandkeep proc ls|logs|attach|kill); with -i its stdin stays open for proc attach -i")
	f.StringVar(&detach.tag, "tag", "", "with --detach: name the process, unique among the sandbox's running processes")
	f.DurationVar(&detach.lifetime, "lifetime", 0, "with --detach: kill the process's tree after this long (default 1h, at most 24h)")
	return cmd
}

// checkDetach refuses the flags that do not go with --detach, and the process's flags without it.
func checkDetach(cmd *cobra.Command, d detachFlags) error {
	f := cmd.Flags()
	if !d.on {
		for _, name := range []string{"tag", "lifetime"} {
			if f.Changed(name) {
				return fault.New(fault.InvalidArgument, "add --detach, or leave out --"+name, "--%s needs --detach", name)
			}
		}
		return nil
	}
	for _, name := range []string{"tty", "timeout", "output-limit", "gate-wait"} {
		if f.Changed(name) {
			hint := "leave out --" + name
			if name == "timeout" {
				hint = "use --lifetime for a process's bound"
			}
			return fault.New(fault.InvalidArgument, hint, "--%s does not go with --detach", name)
		}
	}
	return nil
}

// networkFlags are one command's network block: merged with the spec's (append) or instead of it (replace).
type networkFlags struct {
	mode, preset, inherit string
	rules                 []string
}

func (n *networkFlags) bind(f *pflag.FlagSet) {
	f.StringVar(&n.mode, "network", "", "network mode for this command: none, allowlist, denylist or open (default: the spec's, else none)")
	f.StringArrayVar(&n.rules, "allow", nil, "an egress rule for this command, e.g. **.github.com, !gist.github.com, 10.0.0.0/8:443 (repeatable; added after the spec's)")
	f.StringVar(&n.preset, "network-preset", "", "add a preset's rules, e.g. default (package registries and source hosts)")
	f.StringVar(&n.inherit, "network-inherit", "", "append (default: add to the spec's network block) or replace it")
}

// block is the command's network block, or nil when no network flag was given.
func (n *networkFlags) block(cmd *cobra.Command) *sandkeep.Network {
	f := cmd.Flags()
	if !f.Changed("network") && !f.Changed("allow") && !f.Changed("network-preset") && !f.Changed("network-inherit") {
		return nil
	}
	return &sandkeep.Network{Mode: n.mode, Rules: n.rules, Preset: n.preset, Inherit: n.inherit}
}

// checkExec refuses a malformed command before anything touches the state home or the Docker engine: what the
// flags cannot say (no command, a zero --timeout or --output-limit, which the library would take as its default,
// a gate wait that is not positive), then the engine's one validator, which the run checks the command with again
// within the operator's bounds.
func checkExec(cmd *cobra.Command, req sandkeep.ExecRequest, gateWait time.Duration) error {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return fault.New(fault.InvalidArgument,
			fmt.Sprintf("pass the command after the flags, e.g. %s --user alice -- ls -la", cmd.CommandPath()),
			"no command given")
	}
	if req.Timeout <= 0 {
		return fault.New(fault.InvalidTimeout, "use a --timeout between 1s and 24h, e.g. --timeout 30s or --timeout 2h",
			"timeout %s is out of range", req.Timeout)
	}
	if req.OutputLimit <= 0 {
		return fault.New(fault.InvalidArgument, "use an --output-limit between 1 byte and 64MiB",
			"output limit %s is out of range", byteSize(req.OutputLimit))
	}
	if cmd.Flags().Changed("gate-wait") && gateWait <= 0 {
		return fault.New(fault.InvalidArgument, "use a positive --gate-wait, e.g. --gate-wait 30s",
			"gate wait %s is not positive", gateWait)
	}
	return req.Check()
}

// checkAttached refuses admission flags on a command attached to a run (--run): the run keeps the mode, trust and
// driver it was admitted with, and a command that asks for others is told so rather than silently overruled.
func checkAttached(cmd *cobra.Command, pf policyFlags) error {
	if pf.run == "" {
		return nil
	}
	var set []string
	for _, name := range []string{"sandbox", "trust", "driver", "host-state"} {
		if cmd.Flags().Changed(name) {
			set = append(set, "--"+name)
		}
	}
	if len(set) == 0 {
		return nil
	}
	return fault.New(fault.InvalidArgument, "leave out "+strings.Join(set, " and ")+", or start a new run with them (sandkeep runs start)",
		"run %s keeps the mode, trust and driver it was admitted with; %s cannot change them", pf.run, strings.Join(set, " and "))
}

func runExec(ctx context.Context, g *globals, key sandkeep.Key, req sandkeep.ExecRequest, asJSON bool,
	gateWait time.Duration, pf policyFlags, network *sandkeep.Network, fail func(error) error, caller *callerTTY) error {
	pre, err := doctor.ParsePreflight(os.Getenv("SANDKEEP_PREFLIGHT"))
	if err != nil {
		return fail(err)
	}
	if pre.On {
		if err := preflight(ctx, g, pf, pre); err != nil {
			return fail(err)
		}
	}
	m, closeAll, err := g.manager(ctx, func(c *sandkeep.Config) {
		if gateWait > 0 {
			c.GateWait = gateWait
		}
	})
	if err != nil {
		return fail(err)
	}
	defer closeAll()
	// Admission: the library resolves the mode, selects the driver and records the run before anything runs. A
	// named run (--run) keeps the mode, trust and driver it was admitted with, and stays open for whoever
	// started it; an implicit run is this command's own.
	rr := pf.request(key, g.stderr)
	rr.Network = network
	run, err := m.Admit(ctx, rr)
	if run != nil {
		for _, w := range run.Warnings {
			fmt.Fprintf(g.stderr, "sandkeep: %s\n", w)
		}
	}
	if err != nil {
		return fail(err)
	}
	if run.Notice != "" {
		fmt.Fprintln(g.stderr, run.Notice) // one loud line, prefixed by policy
	}
	if run.Dropped != "" {
		fmt.Fprintln(g.stderr, run.Dropped) // one line; the sandbox_devcontainer_dropped event has each item with why
	}
	if caller != nil && req.Stdin != nil { // raw mode only when the keys go to the command
		if err := caller.begin(); err != nil {
			return fail(fault.Wrap(err, fault.Internal, "run without -t, or from a terminal", "cannot put the terminal in raw mode: %v", err))
		}
	}
	res, err := run.Exec(ctx, req)
	if caller != nil {
		caller.end()
	}
	if ferr := run.Finish(err); ferr != nil {
		fmt.Fprintf(g.stderr, "sandkeep: warning: cannot record the end of run %s: %v\n", run.ID, ferr)
	}
	in, stopped := interruptedBy(ctx)
	if err != nil && (res == nil || !stopped) {
		if stopped { // interrupted before the command started: nothing ran
			return err // run() reports the interruption
		}
		return fail(err)
	}
	if asJSON {
		enc := json.NewEncoder(g.stdout)
		enc.SetEscapeHTML(false)
		if jerr := enc.Encode(res); jerr != nil {
			return fault.Wrap(jerr, fault.Internal, "", "cannot write the result: %v", jerr)
		}
	}
	if res.StdoutTruncated || res.StderrTruncated {
		fmt.Fprintf(g.stderr, "sandkeep: output was truncated at %s per stream (--output-limit)\n", byteSize(req.OutputLimit))
	}
	switch {
	case err != nil: // interrupted while the command ran: its tree is gone now, say so
		if in.sig != syscall.SIGPIPE {
			fmt.Fprintf(g.stderr, "sandkeep: %v; the command's process tree was killed\n", in)
		}
		return exitError{in.exitCode()}
	case res.TimedOut:
		fmt.Fprintf(g.stderr, "sandkeep: command timed out after %s; its process tree was killed (exit %d)\n", req.Timeout, exitTimeout)
		return exitError{exitTimeout}
	case res.ExitCode != 0:
		return exitError{res.ExitCode}
	}
	return nil
}

// stopOnError passes writes to w; the first failed write (a closed pipe) cancels the command with SIGPIPE
// as the cause. Whether w's error is EPIPE or another, the output has nowhere to go.
type stopOnError struct {
	w      io.Writer
	cancel context.CancelCauseFunc
}

func (s *stopOnError) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	if err != nil {
		s.cancel(interrupted{syscall.SIGPIPE})
	}
	return n, err
}

// byteSize is a flag value in bytes that also takes units, as docker's --memory does: 1048576, 1024k, 1m, 1MiB,
// 1Mi (bytesize.Parse: k, m, g are all powers of 1024).
type byteSize int64

func (b byteSize) String() string { return bytesize.Format(int64(b)) }

func (b *byteSize) Set(s string) error {
	n, err := bytesize.Parse(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

func (b *byteSize) Type() string { return "size" }
