// Command sandkeep runs commands in persistent per-user sandboxes: `sandkeep exec`, `ps`, `stop`, `rm`,
// `sweep`. It is a thin layer over package sandkeep and the only place that wires concrete drivers.
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
	"syscall"

	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep"
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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes the CLI and returns the process exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot(stdin, stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	default:
		printError(stderr, err)
		return exitFailure
	}
}

// globals are the flags every subcommand shares.
type globals struct {
	home, image, agent string
	logLevel           string
	stdin              io.Reader
	stdout, stderr     io.Writer
}

func newRoot(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdin: stdin, stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "sandkeep",
		Short: "Run commands in persistent, hardened, per-user sandboxes",
		Long: "sandkeep keeps one warm, hardened sandbox per (tenant, user) and runs each command in it with an exact\n" +
			"deadline, exact exit status and bounded output. Exit status: the command's own; 124 when it timed out;\n" +
			"125 when sandkeep itself failed (a stable error code and a hint are printed).",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&g.home, "home", "", "state home (default $SANDKEEP_HOME, else /var/lib/sandkeep for root or ~/.local/state/sandkeep)")
	pf.StringVar(&g.image, "image", "", "sandbox image (default $SANDKEEP_IMAGE, else "+sandkeep.DefaultImage+")")
	pf.StringVar(&g.agent, "agent", "", "path of the static sandkeep-agent binary (default $SANDKEEP_AGENT, else next to sandkeep)")
	pf.StringVar(&g.logLevel, "log-level", "warn", "log level on stderr: debug, info, warn, error")
	root.AddCommand(newExec(g), newPs(g), newStop(g), newRm(g), newSweep(g), newVersion(g))
	return root
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
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(g.logLevel)); err != nil {
		return c, fault.New(fault.InvalidArgument, "use debug, info, warn or error", "unknown log level %q", g.logLevel)
	}
	c.Logger = slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: lvl}))
	return c, nil
}

func (g *globals) open(ctx context.Context, mutate ...func(*sandkeep.Config)) (*sandkeep.Manager, error) {
	c, err := g.config()
	if err != nil {
		return nil, err
	}
	for _, f := range mutate {
		f(&c)
	}
	return sandkeep.Open(ctx, c)
}

// identity flags shared by exec, stop and rm.
type who struct{ tenant, user string }

func (w *who) bind(cmd *cobra.Command) {
	cmd.Flags().StringVar(&w.tenant, "tenant", "default", "tenant the user belongs to")
	cmd.Flags().StringVar(&w.user, "user", "", "user whose sandbox to use (required)")
	_ = cmd.MarkFlagRequired("user")
}

func (w *who) key() (sandkeep.Key, error) { return sandkeep.NewKey(w.tenant, w.user) }

// printError writes "sandkeep: CODE: message" and the hint on its own line.
func printError(w io.Writer, err error) {
	var fe *fault.Error
	if errors.As(err, &fe) {
		fmt.Fprintf(w, "sandkeep: %s: %s\n", fe.Code, fe.Message)
		if fe.Hint != "" {
			fmt.Fprintf(w, "hint: %s\n", fe.Hint)
		}
		return
	}
	fmt.Fprintf(w, "sandkeep: %v\n", err)
}

// jsonError is how --json reports sandkeep's own failures on stdout.
func jsonError(w io.Writer, err error) {
	out := map[string]string{"code": string(fault.Internal), "message": err.Error()}
	var fe *fault.Error
	if errors.As(err, &fe) {
		out = map[string]string{"code": string(fe.Code), "message": fe.Message, "hint": fe.Hint}
	}
	enc := json.NewEncoder(w)
	_ = enc.Encode(map[string]any{"error": out})
}

func newVersion(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print sandkeep's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(g.stdout, "sandkeep", version())
			return nil
		},
	}
}
