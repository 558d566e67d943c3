package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/snapshots"
)

func newFork(g *globals) *cobra.Command {
	var (
		w      who
		to     string
		pf     policyFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "fork --user A --to B [--tenant T] [--trust untrusted] [--json]",
		Short: "Make a new user's sandbox with a copy of another's workspace and template",
		Long: "fork makes user B of the tenant a sandbox holding a copy of A's /workspace (reflinked where the file\n" +
			"system can, a copy where it cannot), in A's template; A keeps running, and later changes on either side\n" +
			"stay apart. The fork is admitted as B's first exec would be, recorded as a run of B with a sandbox_forked\n" +
			"event. B must be new (SANDBOX_EXISTS otherwise); a copy past B's workspace quota is QUOTA_EXCEEDED and\n" +
			"leaves nothing. Prints B's sandbox name, or with --json its description as ps --json shows it.",
		Example: "  sandkeep fork --tenant acme --user alice --to alice-try2",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			from, err := w.key(cmd)
			if err != nil {
				return err
			}
			if to == "" {
				return fault.New(fault.InvalidArgument, fmt.Sprintf("name the new user, e.g. %s --user alice --to bob", cmd.CommandPath()),
					"--to is required")
			}
			key, err := sandkeep.NewKey(w.tenant, to)
			if err != nil {
				return err
			}
			m, closeAll, err := g.manager(cmd.Context(), nil)
			if err != nil {
				return err
			}
			defer closeAll()
			sb, err := snapshots.Fork(sayWhenWaiting(cmd.Context(), g.stderr, from, "forking"), m, from, pf.request(key, g.stderr), snapshots.ForkLimits{})
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(g.stdout)
				enc.SetEscapeHTML(false)
				return enc.Encode(sb)
			}
			fmt.Fprintln(g.stdout, sb.Name)
			return nil
		},
	}
	w.bind(cmd)
	f := cmd.Flags()
	f.StringVar(&to, "to", "", "the new user to fork into (required)")
	f.StringVar(&pf.trust, "trust", "trusted", "trusted or untrusted")
	f.StringVar(&pf.sandbox, "sandbox", "", "sandbox mode: auto or inline (a fork always needs a sandbox)")
	f.StringVar(&pf.driver, "driver", "", "require this driver")
	f.BoolVar(&asJSON, "json", false, "print the new sandbox as JSON")
	return cmd
}
