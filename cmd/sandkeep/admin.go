package main

import (
	"encoding/json"
	"fmt"
	"runtime/debug"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep"
)

func newPs(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ps",
		Short: "List every sandbox of this state home",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer m.Close()
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
			fmt.Fprintln(tw, "TENANT\tUSER\tKEY\tSTATE\tIMAGE\tCREATED\tLAST USED\tIDLE FOR")
			for _, s := range list {
				used := "never"
				if !s.LastUsed.IsZero() {
					used = s.LastUsed.Local().Format(time.DateTime)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Tenant, s.User, s.Key[:24], s.State, s.Image,
					s.CreatedAt.Local().Format(time.DateTime), used, s.IdleFor)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

func newStop(g *globals) *cobra.Command {
	var w who
	cmd := &cobra.Command{
		Use:   "stop --user U [--tenant T]",
		Short: "Stop the user's sandbox; the next exec starts the same container again",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key, err := w.key()
			if err != nil {
				return err
			}
			m, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer m.Close()
			return m.Stop(cmd.Context(), key)
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
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key, err := w.key()
			if err != nil {
				return err
			}
			m, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer m.Close()
			return m.Remove(cmd.Context(), key, keep)
		},
	}
	w.bind(cmd)
	cmd.Flags().BoolVar(&keep, "keep-workspace", false, "keep the user's /workspace files on the host")
	return cmd
}

func newSweep(g *globals) *cobra.Command {
	var (
		once      bool
		interval  time.Duration
		idle, ret time.Duration
		rmWs      bool
	)
	cmd := &cobra.Command{
		Use:   "sweep [--once]",
		Short: "Stop idle sandboxes and remove those past retention (one sweeper per state home)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := g.open(cmd.Context(), func(c *sandkeep.Config) {
				c.IdleTimeout, c.Retention, c.RemoveWorkspaceOnRetention = idle, ret, rmWs
			})
			if err != nil {
				return err
			}
			defer m.Close()
			if !once {
				return m.RunSweeper(cmd.Context(), interval)
			}
			rep, err := m.SweepOnce(cmd.Context())
			for _, n := range rep.Stopped {
				fmt.Fprintln(g.stdout, "stopped", n)
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
