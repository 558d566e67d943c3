package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/snapshots"
)

func newSnapshot(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Keep workspaces as snapshots and make new sandboxes from them",
		Long: "A snapshot is a content-addressed archive of a user's /workspace in the state home, with the template and\n" +
			"image of its sandbox, named per tenant and bounded by the tenant's snapshot quota (QUOTA_EXCEEDED past it).\n" +
			"restore makes a new user's sandbox from one, in its template; the user it was taken from need not exist.",
		Example: "  sandkeep snapshot create --tenant acme --user alice --name before-upgrade\n" +
			"  sandkeep snapshot list --tenant acme\n" +
			"  sandkeep snapshot restore before-upgrade --tenant acme --user alice-retry\n" +
			"  sandkeep snapshot rm before-upgrade --tenant acme",
		Args: noArgs,
	}
	cmd.AddCommand(newSnapshotCreate(g), newSnapshotList(g), newSnapshotRestore(g), newSnapshotRm(g))
	return cmd
}

func printJSON(g *globals, v any) error {
	enc := json.NewEncoder(g.stdout)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func newSnapshotCreate(g *globals) *cobra.Command {
	var (
		w      who
		name   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "create --user U [--tenant T] [--name N] [--json]",
		Short: "Archive the user's workspace as a snapshot; prints its name",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key, err := w.key(cmd)
			if err != nil {
				return err
			}
			m, closeAll, err := g.manager(cmd.Context(), nil)
			if err != nil {
				return err
			}
			defer closeAll()
			sn, err := snapshots.Create(sayWhenWaiting(cmd.Context(), g.stderr, key, "snapshotting"), m, key, name, snapshots.Events{})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g, sn)
			}
			fmt.Fprintln(g.stdout, sn.Name)
			return nil
		},
	}
	w.bind(cmd)
	cmd.Flags().StringVar(&name, "name", "", "the snapshot's name, unique in the tenant (default: snap-<time>-<hex>)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the snapshot as JSON")
	return cmd
}

func newSnapshotList(g *globals) *cobra.Command {
	var (
		tenant string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list [--tenant T] [--json]",
		Short: "List the tenant's snapshots",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, closeAll, err := g.manager(cmd.Context(), nil)
			if err != nil {
				return err
			}
			defer closeAll()
			list, err := snapshots.List(m, tenant)
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []snapshots.Snapshot{}
				}
				return printJSON(g, list)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tUSER\tTEMPLATE\tBYTES\tDIGEST\tCREATED")
			for _, sn := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", sn.Name, sn.User, dash(sn.Template), sn.Bytes, sn.Digest[:min(len(sn.Digest), 19)],
					sn.CreatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "default", "the tenant whose snapshots to list")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

func newSnapshotRestore(g *globals) *cobra.Command {
	var (
		w       who
		pf      policyFlags
		asJSON  bool
		replace bool
	)
	cmd := &cobra.Command{
		Use:   "restore NAME --user U [--tenant T] [--replace] [--json]",
		Short: "Make a new user's sandbox from a snapshot; prints its name",
		Long: "restore makes the user (a new one: SANDBOX_EXISTS otherwise) a sandbox whose /workspace holds the tenant's\n" +
			"snapshot NAME, in the snapshot's template, admitted as the user's first exec would be. With --replace the\n" +
			"user may exist: its sandbox is stopped and its workspace replaced by the snapshot's (extracted beside it\n" +
			"first, so a failure leaves it as it was), then started again.",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fault.New(fault.InvalidArgument, fmt.Sprintf("e.g. %s before-upgrade --user alice-retry", cmd.CommandPath()),
					"name the snapshot to restore")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := w.key(cmd)
			if err != nil {
				return err
			}
			m, closeAll, err := g.manager(cmd.Context(), nil)
			if err != nil {
				return err
			}
			defer closeAll()
			restore := snapshots.Restore
			if replace {
				restore = snapshots.Replace
			}
			sb, err := restore(cmd.Context(), m, args[0], pf.request(key, g.stderr))
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g, sb)
			}
			fmt.Fprintln(g.stdout, sb.Name)
			return nil
		},
	}
	w.bind(cmd)
	f := cmd.Flags()
	f.StringVar(&pf.trust, "trust", "trusted", "trusted or untrusted")
	f.StringVar(&pf.sandbox, "sandbox", "", "sandbox mode: auto or inline (a restore always needs a sandbox)")
	f.StringVar(&pf.driver, "driver", "", "require this driver")
	f.BoolVar(&asJSON, "json", false, "print the new sandbox as JSON")
	f.BoolVar(&replace, "replace", false, "restore onto an existing user: stop it and replace its workspace")
	return cmd
}

func newSnapshotRm(g *globals) *cobra.Command {
	var tenant string
	cmd := &cobra.Command{
		Use:   "rm NAME [--tenant T]",
		Short: "Delete a snapshot (and its archive unless another snapshot shares it)",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fault.New(fault.InvalidArgument, fmt.Sprintf("e.g. %s before-upgrade", cmd.CommandPath()),
					"name the snapshot to delete")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			m, closeAll, err := g.manager(cmd.Context(), nil)
			if err != nil {
				return err
			}
			defer closeAll()
			if err := snapshots.Delete(cmd.Context(), m, tenant, args[0], snapshots.Events{}); err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, args[0])
			return nil
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "default", "the tenant whose snapshot to delete")
	return cmd
}
