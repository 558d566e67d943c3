package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime/debug"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
)

func newPs(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ps [--json]",
		Short: "List every sandbox of this state home",
		Long: "List every sandbox of this state home (running or stopped): tenant, user, key, state, image,\n" +
			"when it was created, when it last ran a command and how long it has been idle.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, closeM, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer closeM()
			list, err := m.List(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TENANT\tUSER\tKEY\tSTATE\tIMAGE\tCREATED\tLAST USED\tIDLE FOR\tDISK")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cell(s.Tenant), cell(s.User), shortKey(s.Key),
					s.State, cell(s.Image), when(s.CreatedAt, "-"), when(s.LastUsed, "never"), s.IdleFor, disk(s.Disk))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

// disk is the DISK cell: "12.5M/64.0M" of the workspace quota, or "-" without one.
func disk(d *sandkeep.DiskUsage) string {
	if d == nil {
		return "-"
	}
	mib := func(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + "M" }
	return mib(d.Bytes) + "/" + mib(d.BytesLimit)
}

// cell keeps a table cell on one line and its columns aligned: tenant and user may hold any printable
// character, tabs and newlines excluded by validation, but spaces are shown quoted.
func cell(s string) string {
	if s == "" || strings.ContainsAny(s, " \t\n") {
		return strconv.Quote(s)
	}
	return s
}

// shortKey is the key as the container name shows it (sandkeep-u-<24 hex>).
func shortKey(k string) string { return k[:min(len(k), 24)] }

func when(t time.Time, zero string) string {
	if t.IsZero() {
		return zero
	}
	return t.Local().Format(time.DateTime)
}

func newStop(g *globals) *cobra.Command {
	var w who
	cmd := &cobra.Command{
		Use:   "stop --user U [--tenant T]",
		Short: "Stop the user's sandbox; the next exec starts the same container again",
		Long: "Stop the user's sandbox, after the command it runs (if any) is over. Its container, /workspace and\n" +
			"installed state are kept: the next exec starts the same container again. Prints the sandbox's name.\n" +
			"A stop that waits for a running command says so on stderr after a second; it gives up with\n" +
			"SANDBOX_BUSY after the gate wait (--gate-wait / SANDKEEP_GATE_WAIT), or when interrupted.",
		Example: "  sandkeep stop --tenant acme --user alice",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key, err := w.key(cmd)
			if err != nil {
				return err
			}
			m, closeM, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer closeM()
			if err := m.Stop(sayWhenWaiting(cmd.Context(), g.stderr, key, "stopping"), key); err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, key.ContainerName())
			return nil
		},
	}
	w.bind(cmd)
	return cmd
}

func newRm(g *globals) *cobra.Command {
	var (
		w    who
		keep bool
	)
	cmd := &cobra.Command{
		Use:   "rm --user U [--tenant T] [--keep-workspace]",
		Short: "Remove the user's sandbox and, unless --keep-workspace, its workspace",
		Long: "Remove the user's sandbox, after the command it runs (if any) is over, and delete its /workspace\n" +
			"files on the host unless --keep-workspace. The next exec creates a fresh sandbox. Prints the sandbox's name.\n" +
			"An rm that waits for a running command says so on stderr after a second, as stop does.",
		Example: "  sandkeep rm --tenant acme --user alice\n" +
			"  sandkeep rm --tenant acme --user alice --keep-workspace",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key, err := w.key(cmd)
			if err != nil {
				return err
			}
			m, closeM, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer closeM()
			if err := m.Remove(sayWhenWaiting(cmd.Context(), g.stderr, key, "removing"), key, keep); err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, key.ContainerName())
			return nil
		},
	}
	w.bind(cmd)
	cmd.Flags().BoolVar(&keep, "keep-workspace", false, "keep the user's /workspace files on the host")
	return cmd
}

// sayWhenWaiting has a stop or rm (doing: "stopping", "removing") print one line to stderr when it has waited a
// second for key's gate: without it a user at a terminal sees a hang with nothing saying what it waits for.
func sayWhenWaiting(ctx context.Context, stderr io.Writer, key sandkeep.Key, doing string) context.Context {
	return sandkeep.WhenWaiting(ctx, func(bound time.Duration) {
		fmt.Fprintf(stderr, "sandkeep: %s %s: waiting for the command or file operation it runs to finish (at most %s, then SANDBOX_BUSY; Ctrl-C gives up)\n",
			doing, key.ContainerName(), bound)
	})
}

func newSweep(g *globals) *cobra.Command {
	var (
		once      bool
		interval  time.Duration
		idle, ret time.Duration
		rmWs      bool
	)
	cmd := &cobra.Command{
		Use:   "sweep [--once] [--interval D] [--idle-timeout D] [--retention D]",
		Short: "Stop idle sandboxes and remove those past retention (one sweeper per state home)",
		Long: "Stop sandboxes idle past --idle-timeout and remove stopped ones past --retention, every --interval,\n" +
			"until interrupted (exit 0). Only one sweeper per state home acts at a time; others wait for its lock.\n" +
			"A sandbox with a command running or queued is never touched. With --once, sweep once and exit.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, d := range []struct {
				flag string
				v    time.Duration
			}{{"interval", interval}, {"idle-timeout", idle}, {"retention", ret}} {
				if d.v <= 0 {
					return fault.New(fault.InvalidArgument, fmt.Sprintf("use a positive --%s, e.g. --%s 1m", d.flag, d.flag),
						"--%s %s is not positive", d.flag, d.v)
				}
			}
			m, closeM, err := g.open(cmd.Context(), func(c *sandkeep.Config) {
				c.IdleTimeout, c.Retention, c.RemoveWorkspaceOnRetention = idle, ret, rmWs
			})
			if err != nil {
				return err
			}
			defer closeM()
			if !once {
				err := m.RunSweeper(cmd.Context(), interval)
				if _, ok := interruptedBy(cmd.Context()); ok {
					return nil // the way to stop a sweeper
				}
				return err
			}
			rep, err := m.SweepOnce(cmd.Context())
			for _, n := range rep.Stopped {
				fmt.Fprintln(g.stdout, "stopped", n)
			}
			for _, n := range rep.Suspended {
				fmt.Fprintln(g.stdout, "suspended", n)
			}
			for _, n := range rep.Removed {
				fmt.Fprintln(g.stdout, "removed", n)
			}
			for _, n := range rep.Skipped {
				fmt.Fprintln(g.stdout, "busy, skipped", n)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVar(&once, "once", false, "sweep once and exit (does not take the sweeper lock)")
	f.DurationVar(&interval, "interval", time.Minute, "time between sweeps")
	f.DurationVar(&idle, "idle-timeout", 30*time.Minute, "stop a sandbox idle this long")
	f.DurationVar(&ret, "retention", 24*time.Hour, "remove a sandbox stopped this long")
	f.BoolVar(&rmWs, "remove-workspace", false, "also delete the workspace of a sandbox removed past retention")
	return cmd
}

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
