package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/processes"
)

// The process commands, in the shape of docker's and kubectl's: `sandkeep exec --detach` starts a process and
// prints its pid; `sandkeep proc ls|logs|attach|kill` list, read, follow and end them by pid or tag. They run
// in the home's daemon, which holds the sandboxes' agent channels, so a process outlives the command that
// started it (and ends when the daemon exits).

const procLong = `Processes are commands that outlive the call that started them (a dev server): started with
'sandkeep exec --detach', they run beside the user's commands until they exit, their lifetime (--lifetime)
passes, a caller kills them, or their sandbox stops. Each is named by its pid or its tag (--tag).`

func newProc(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "proc",
		Short: "List, follow and end a user's processes (started with exec --detach)",
		Long:  procLong,
	}
	cmd.AddCommand(newProcLs(g), newProcLogs(g), newProcAttach(g), newProcKill(g))
	return cmd
}

// procRef reads a pid (digits) or a tag.
func procRef(s string) processes.Ref {
	if n, err := strconv.Atoi(s); err == nil && n > 0 {
		return processes.Ref{PID: n}
	}
	return processes.Ref{Tag: s}
}

// needDaemon refuses a process call that does not run in the home's daemon: a process lives on the channel
// of the sandkeep that started it, and a one-shot CLI's channels end when it exits.
func needDaemon(g *globals) error {
	if g.daemon != nil {
		return nil
	}
	return fault.New(fault.ProcessUnavailable, "let the CLI go through the home's daemon (SANDKEEP_DAEMON=auto, the default, or on), or use sandkeep serve's API",
		"processes need a long-lived sandkeep: this call runs in-process (SANDKEEP_DAEMON=off, or no daemon could serve it)")
}

// withManager opens the Manager (the daemon's) for key's command.
func withManager(cmd *cobra.Command, g *globals, w *who, f func(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key) error) error {
	key, err := w.key(cmd)
	if err != nil {
		return err
	}
	if err := needDaemon(g); err != nil {
		return err
	}
	m, closeM, err := g.open(cmd.Context())
	if err != nil {
		return err
	}
	defer closeM()
	return f(cmd.Context(), m, key)
}

func newProcLs(g *globals) *cobra.Command {
	var w who
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls --user U [--tenant T] [--json]",
		Short: "List the user's processes, running and recently ended",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withManager(cmd, g, &w, func(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key) error {
				ps, err := processes.List(ctx, m, key)
				if err != nil {
					return err
				}
				if asJSON {
					enc := json.NewEncoder(g.stdout)
					enc.SetIndent("", "  ")
					return enc.Encode(ps)
				}
				tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "PID\tTAG\tSTATUS\tSTARTED\tCOMMAND")
				for _, p := range ps {
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", p.PID, cell(p.Tag), procStatus(p), when(p.Started, "-"),
						cell(strings.Join(p.Argv, " ")))
				}
				return tw.Flush()
			})
		},
	}
	w.bind(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

// procStatus is the STATUS cell: running, or how it ended.
func procStatus(p processes.Process) string {
	switch {
	case p.Running:
		return "running"
	case p.StartError != "":
		return fmt.Sprintf("not started (%d)", p.ExitCode)
	case p.Killed:
		return fmt.Sprintf("killed (%d)", p.ExitCode)
	case p.TimedOut:
		return fmt.Sprintf("lifetime passed (%d)", p.ExitCode)
	}
	return fmt.Sprintf("exited (%d)", p.ExitCode)
}

func newProcLogs(g *globals) *cobra.Command {
	var w who
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs --user U [-f] PID|TAG",
		Short: "Print a process's buffered output; with -f, follow it until it ends",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withManager(cmd, g, &w, func(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key) error {
				p, err := processes.Attach(ctx, m, key, procRef(args[0]), processes.AttachOptions{Stdout: g.stdout,
					Stderr: g.stderr, Replay: true, Snapshot: !follow})
				return procEnd(g, p, err, follow)
			})
		},
	}
	w.bind(cmd)
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the output until the process ends (Ctrl-C leaves it running)")
	return cmd
}

// procEnd reports how following a process ended: its exit status becomes sandkeep's, as for exec.
func procEnd(g *globals, p *processes.Process, err error, followed bool) error {
	if err != nil {
		if p != nil && errors.Is(err, context.Canceled) {
			return nil // the caller left; the process runs on
		}
		return err
	}
	if !followed || p.Running {
		return nil
	}
	if p.StdoutDropped+p.StderrDropped > 0 {
		fmt.Fprintf(g.stderr, "sandkeep: %d bytes of the process's output were no longer buffered\n", p.StdoutDropped+p.StderrDropped)
	}
	if p.ExitCode != 0 {
		return exitError{p.ExitCode}
	}
	return nil
}

func newProcAttach(g *globals) *cobra.Command {
	var w who
	var interactive, replay bool
	cmd := &cobra.Command{
		Use:   "attach --user U [-i] PID|TAG",
		Short: "Follow a process's output from now on; with -i, send sandkeep's stdin to it (EOF closes its stdin)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withManager(cmd, g, &w, func(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key) error {
				ref := procRef(args[0])
				ctx, cancel := context.WithCancelCause(ctx)
				defer cancel(nil)
				if interactive {
					go pumpInput(ctx, m, key, ref, g.stdin, cancel)
				}
				p, err := processes.Attach(ctx, m, key, ref, processes.AttachOptions{Stdout: g.stdout, Stderr: g.stderr, Replay: replay})
				if cerr := context.Cause(ctx); err != nil && cerr != nil && !errors.Is(cerr, context.Canceled) {
					err = cerr // the input failed (the process takes none)
				}
				return procEnd(g, p, err, true)
			})
		},
	}
	w.bind(cmd)
	cmd.Flags().BoolVarP(&interactive, "interactive", "i", false, "send sandkeep's stdin to the process (started with exec --detach -i); EOF closes its stdin")
	cmd.Flags().BoolVar(&replay, "replay", false, "print its buffered output first")
	return cmd
}

// pumpInput sends r to ref's stdin until EOF (then closes it) or ctx ends; a refusal cancels the attach.
func pumpInput(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key, ref processes.Ref, r io.Reader, cancel context.CancelCauseFunc) {
	buf := make([]byte, 32<<10)
	for ctx.Err() == nil {
		n, err := r.Read(buf)
		if n > 0 {
			if serr := processes.SendInput(ctx, m, key, ref, buf[:n]); serr != nil {
				cancel(serr)
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if cerr := processes.CloseStdin(ctx, m, key, ref); cerr != nil && !fault.Is(cerr, fault.ProcessExited) {
					cancel(cerr)
				}
			}
			return
		}
	}
}

func newProcKill(g *globals) *cobra.Command {
	var w who
	var signal string
	cmd := &cobra.Command{
		Use:   "kill --user U [-s SIGNAL] PID|TAG",
		Short: "Kill a process's tree (SIGTERM, a grace, SIGKILL), or send it one signal with -s",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var sig int
			if signal != "" {
				s, err := processes.ParseSignal(signal)
				if err != nil {
					return err
				}
				sig = int(s)
			}
			return withManager(cmd, g, &w, func(ctx context.Context, m *sandkeep.Manager, key sandkeep.Key) error {
				ref := procRef(args[0])
				if sig != 0 {
					return processes.Signal(ctx, m, key, ref, syscall.Signal(sig))
				}
				return processes.Kill(ctx, m, key, ref)
			})
		},
	}
	w.bind(cmd)
	cmd.Flags().StringVarP(&signal, "signal", "s", "", "send this signal (TERM, INT, HUP, 9...) to its process group instead of killing its tree")
	return cmd
}

// detachFlags are exec's --detach and the process's own settings.
type detachFlags struct {
	on       bool
	tag      string
	lifetime time.Duration
}

// runDetach starts req as a process in an admitted run and prints its pid (or, with --json, the process).
func runDetach(ctx context.Context, g *globals, key sandkeep.Key, req processes.StartRequest, asJSON bool, pf policyFlags,
	network *sandkeep.Network, fail func(error) error) error {
	if err := needDaemon(g); err != nil {
		return fail(err)
	}
	m, closeAll, err := g.manager(ctx, nil)
	if err != nil {
		return fail(err)
	}
	defer closeAll()
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
	p, err := processes.StartIn(ctx, run, req)
	if ferr := run.Finish(err); ferr != nil {
		fmt.Fprintf(g.stderr, "sandkeep: warning: cannot record the end of run %s: %v\n", run.ID, ferr)
	}
	if err != nil {
		return fail(err)
	}
	if asJSON {
		enc := json.NewEncoder(g.stdout)
		enc.SetEscapeHTML(false)
		return enc.Encode(p)
	}
	if !p.Running {
		fmt.Fprintf(g.stderr, "sandkeep: the process did not start: %s\n", p.StartError)
		return exitError{p.ExitCode}
	}
	fmt.Fprintln(g.stdout, p.PID)
	return nil
}
