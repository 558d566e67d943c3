// Command sandkeep runs commands in persistent per-user sandboxes: `sandkeep exec`, `ps`, `stop`, `rm`,
// `sweep`. It is a thin layer over package sandkeep and the only place that wires concrete drivers.
//
// Start-up has a fast path: package cmd/sandkeep/internal/fastpath (imported below) has an init that runs
// before the heavy packages' inits and, when the home's daemon runs and may serve this command line, relays the
// whole call through it and exits with the command's status; main below never runs then. Anything it does not
// handle falls through to main unchanged. See that package's doc and docs/DAEMON.md ("The fast path").
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/cmd/sandkeep/internal/fastpath" // its init is the fast path through the daemon
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// Exit statuses of sandkeep itself; a command's own status passes through unchanged.
const (
	exitTimeout = 124 // the command ran past its deadline and was killed (like timeout(1))
	exitFailure = 125 // sandkeep could not run the command (like docker run)
)

// exitError carries an exit status out of a subcommand without printing anything more.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// interrupted is the cancel cause when sandkeep receives SIGINT or SIGTERM: the command is stopped (its tree
// killed, the gate held until it is gone) and sandkeep exits 128+signal, as a shell would.
type interrupted struct{ sig syscall.Signal }

func (e interrupted) Error() string { return fastpath.InterruptMessage(e.sig) }

func (e interrupted) exitCode() int { return 128 + int(e.sig) }

// interruptedBy returns the signal that cancelled ctx, if one did.
func interruptedBy(ctx context.Context) (interrupted, bool) {
	var in interrupted
	if ctx.Err() == nil || !errors.As(context.Cause(ctx), &in) {
		return interrupted{}, false
	}
	return in, true
}

func main() {
	// A closed stdout is seen as EPIPE, not as a fatal SIGPIPE: exec then stops its command before exiting.
	signal.Ignore(syscall.SIGPIPE)
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { watchSignals(sigs, done, cancel, os.Stderr) })

	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)

	signal.Stop(sigs)
	close(done)
	wg.Wait()
	cancel(nil)
	os.Exit(code)
}

// watchSignals cancels the run on the first signal. Later signals are swallowed with a note: sandkeep is
// already stopping the command, which is bounded by the kill grace plus a few seconds, and exiting earlier
// would give up the key's gate while the command's processes may still be alive.
func watchSignals(sigs <-chan os.Signal, done <-chan struct{}, cancel context.CancelCauseFunc, stderr io.Writer) {
	first := true
	for {
		select {
		case s := <-sigs:
			sig, _ := s.(syscall.Signal)
			if first {
				first = false
				cancel(interrupted{sig})
				continue
			}
			fmt.Fprintln(stderr, fastpath.AlreadyStopping)
		case <-done:
			return
		}
	}
}

// run executes the CLI and returns the process exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return runWith(ctx, args, stdin, stdout, stderr, nil)
}

// runWith is run inside the home's daemon d (nil: this process's own command line, which may go through d).
func runWith(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, d *daemon) int {
	root, g := newRoot(stdin, stdout, stderr)
	g.daemon, g.args = d, args
	if args == nil {
		g.args = []string{}
	}
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	var ee exitError
	var fw forwarded
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &fw):
		return fw.code // the daemon ran the command and wrote its output and errors
	}
	if in, ok := interruptedBy(ctx); ok {
		// Whatever failed after the signal failed because of it: report the interruption, not the symptom.
		fmt.Fprintf(stderr, "sandkeep: %v\n", in)
		return in.exitCode()
	}
	if !g.started && fault.CodeOf(err) == "" {
		// cobra refused the command line before any subcommand ran: unknown command or flag, bad value.
		err = usageError(root, args, err)
		if cmd, _, ferr := root.Find(args); ferr == nil && cmd.Name() == "doctor" {
			printError(stderr, err)
			return exitUsage // doctor's statuses are 0, 1 and 2 (bad usage), like a linter's
		}
	}
	printError(stderr, err)
	return exitFailure
}

// usageError turns a command-line error from cobra into an INVALID_ARGUMENT with a pointer to the help of the
// subcommand that was meant.
func usageError(root *cobra.Command, args []string, err error) error {
	cmd, _, ferr := root.Find(args)
	if ferr != nil || cmd == nil {
		cmd = root
	}
	return fault.Wrap(err, fault.InvalidArgument, fmt.Sprintf("see '%s --help'", cmd.CommandPath()), "%v", err)
}

// globals are the flags every subcommand shares.
type globals struct {
	home, image, agent string
	transport          string
	store              string

	dockerOnce     sync.Once      // guards dockerDrv and dockerErr (see docker())
	dockerDrv      *docker.Driver // nil until docker() is called
	dockerErr      error
	logLevel       string
	stdin          io.Reader
	stdout, stderr io.Writer
	started        bool // cobra accepted the command line and a subcommand began to run

	daemon *daemon  // the home's daemon this call runs in; nil in-process
	args   []string // the command line, for the daemon to run it
}

const rootLong = `sandkeep keeps one warm, hardened sandbox per (tenant, user) and runs each command in it with an exact
deadline, exact exit status and bounded output. Files in /workspace persist across commands and sessions.

Exit status of 'sandkeep exec': the command's own; 124 when it ran past --timeout (its whole process tree
was killed); 125 when sandkeep itself failed, with a stable error code and a hint on stderr
("sandkeep: CODE: message" then "hint: ..."); 130 or 143 when sandkeep was interrupted by SIGINT or SIGTERM.

Environment:
  SANDKEEP_HOME       state home (sandbox workspaces, locks, installation id)
  SANDKEEP_IMAGE      sandbox image when --image is not given
  SANDKEEP_AGENT      path of the static sandkeep-agent binary
  SANDKEEP_GATE_WAIT  how long a command waits for the same user's running command (default 10m)
  SANDKEEP_TRANSPORT  how commands reach the agent: auto (default), agent or exec
  SANDKEEP_SPEC       the project's sandkeep.yaml when --spec is not given
  SANDKEEP_SANDBOX_DEFAULT  the sandbox mode when neither --sandbox nor the spec says (default auto)
  SANDKEEP_HOST_KIND  local or cloud (default: cloud when KUBERNETES_SERVICE_HOST is set)
  SANDKEEP_STORE      where runs and events are recorded (default <home>/sandkeep.db)
  SANDKEEP_DAEMON     auto (default: go through the home's daemon, starting one), on (require it) or off
  SANDKEEP_DAEMON_IDLE  how long a daemon the CLI started waits idle before it exits (default 10m)
  SANDKEEP_DAEMON_FASTPATH  off: calls through the daemon start the whole CLI first (default: served early)
  DOCKER_HOST         the Docker engine to use`

func newRoot(stdin io.Reader, stdout, stderr io.Writer) (*cobra.Command, *globals) {
	g := &globals{stdin: stdin, stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "sandkeep",
		Short: "Run commands in persistent, hardened, per-user sandboxes",
		Long:  rootLong,
		Example: "  sandkeep exec --tenant acme --user alice -- sh -c 'echo hi > /workspace/f; id -u'\n" +
			"  sandkeep ps\n" +
			"  sandkeep stop --tenant acme --user alice\n" +
			"  sandkeep rm --tenant acme --user alice --keep-workspace",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			g.started = true
			if handled, err := g.viaDaemon(cmd); handled {
				return err
			}
			return nil
		},
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&g.home, "home", "", "state home (default $SANDKEEP_HOME, else /var/lib/sandkeep for root or ~/.local/state/sandkeep)")
	pf.StringVar(&g.image, "image", "", "sandbox image (default $SANDKEEP_IMAGE, else "+sandkeep.DefaultImage+")")
	pf.StringVar(&g.agent, "agent", "", "path of the static sandkeep-agent binary (default $SANDKEEP_AGENT, else next to sandkeep, else on PATH)")
	pf.StringVar(&g.logLevel, "log-level", "warn", "log level on stderr: debug, info, warn, error")
	pf.StringVar(&g.transport, "transport", "", "how commands reach the agent: auto (the persistent channel when up, else Docker exec), agent, exec (default $SANDKEEP_TRANSPORT, else auto)")
	pf.StringVar(&g.store, "store", "", "where runs and events are recorded: an SQLite file or a postgres:// URL (default $SANDKEEP_STORE, else <home>/sandkeep.db)")
	root.AddCommand(newExec(g), newRuns(g), newEvents(g), newLogs(g), newDoctor(g), newPs(g), newStop(g), newRm(g), newSweep(g), newVersion(g), newBench(g))
	root.AddCommand(newToken(g), newMCP(g), newServe(g))
	root.AddCommand(newAgent(g), newPortForward(g), newDaemon(g), newProc(g))
	root.AddCommand(newFork(g), newSnapshot(g))
	return root, g
}

// config merges flags over the environment.
func (g *globals) config() (sandkeep.Config, error) {
	c := sandkeep.ConfigFromEnv()
	if g.home != "" {
		c.Home = g.home
	}
	if g.image != "" {
		c.Image = g.image
	}
	if g.agent != "" {
		c.AgentPath = g.agent
	}
	if g.transport != "" {
		c.Transport = g.transport
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(g.logLevel)); err != nil {
		return c, fault.New(fault.InvalidArgument, "use debug, info, warn or error", "unknown log level %q", g.logLevel)
	}
	c.Logger = slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: lvl}))
	c.NoSweeper = true // serve, the daemon and `sweep` run the sweeper; a one-shot command never does
	return c, nil
}

// open opens a Manager on the operator's Config without a store, for what records no run (ps, stop, rm, sweep).
// Inside the daemon it is the daemon's shared one (unless mutated). The close function releases it.
func (g *globals) open(ctx context.Context, mutate ...func(*sandkeep.Config)) (*sandkeep.Manager, func() error, error) {
	if g.daemon != nil && len(mutate) == 0 {
		m, err := g.daemon.manager(ctx, managerKey{withStore: true}) // one Manager owns the channels
		return m, func() error { return nil }, err
	}
	m, err := g.openOwn(ctx, mutate...)
	if err != nil {
		return nil, nil, err
	}
	return m, m.Close, nil
}

func (g *globals) openOwn(ctx context.Context, mutate ...func(*sandkeep.Config)) (*sandkeep.Manager, error) {
	sc, err := loadServerConfig(os.Getenv(envConfig))
	if err != nil {
		return nil, err
	}
	c, err := g.operator(sc)
	if err != nil {
		return nil, err
	}
	for _, f := range mutate {
		f(&c)
	}
	return sandkeep.Open(ctx, c)
}

// who holds the identity flags shared by exec, stop and rm.
type who struct{ tenant, user string }

func (w *who) bind(cmd *cobra.Command) {
	cmd.Flags().StringVar(&w.tenant, "tenant", "default", "tenant the user belongs to")
	cmd.Flags().StringVar(&w.user, "user", "", "user whose sandbox to use (required)")
}

// key validates the identity. A missing --user is checked here rather than with cobra's required-flag
// annotation, so that it is reported like every other failure (a code, a hint, and JSON under --json).
func (w *who) key(cmd *cobra.Command) (sandkeep.Key, error) {
	if w.user == "" {
		return sandkeep.Key{}, fault.New(fault.InvalidArgument,
			fmt.Sprintf("pass the user whose sandbox to use, e.g. %s --user alice (see '%s --help')",
				cmd.CommandPath(), cmd.CommandPath()),
			"--user is required")
	}
	return sandkeep.NewKey(w.tenant, w.user)
}

// printError writes "sandkeep: CODE: message" and the hint on its own line. An error without a code is a
// failure sandkeep did not classify: it is reported as INTERNAL with its whole chain.
func printError(w io.Writer, err error) {
	fe := asFault(err)
	fastpath.PrintError(w, string(fe.Code), fe.Message, fe.Hint)
}

// jsonError is how --json reports sandkeep's own failures on stdout.
func jsonError(w io.Writer, err error) {
	fe := asFault(err)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(map[string]any{"error": map[string]string{
		"code": string(fe.Code), "message": fe.Message, "hint": fe.Hint,
	}})
}

func asFault(err error) *fault.Error {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return fe
	}
	return fault.Wrap(err, fault.Internal,
		"run again with --log-level debug for details; if it persists, report it", "%v", err)
}

// oneLine keeps a message on one line so that "sandkeep: CODE: message" stays greppable.
func oneLine(s string) string { return fastpath.OneLine(s) }

func newVersion(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print sandkeep's version",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(g.stdout, "sandkeep", version())
			return nil
		},
	}
}

// noArgs is cobra.NoArgs with sandkeep's error shape.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	return fault.New(fault.InvalidArgument, fmt.Sprintf("see '%s --help'", cmd.CommandPath()),
		"%s takes no arguments, got %q", cmd.CommandPath(), args)
}
