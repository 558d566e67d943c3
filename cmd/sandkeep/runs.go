package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
)

func newRuns(g *globals) *cobra.Command {
	var (
		asJSON bool
		f      store.RunFilter
	)
	cmd := &cobra.Command{
		Use:   "runs [--json] [--tenant T] [--user U] [--status S] [--limit N]",
		Short: "List recorded runs, newest first: mode, where it came from, driver, admission, status",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := g.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer st.Close()
			runs, err := st.ListRuns(cmd.Context(), f)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(runs)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RUN\tTENANT\tUSER\tMODE\tSOURCE\tDRIVER\tADMISSION\tSTATUS\tFAILURE\tCREATED")
			for _, r := range runs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Tenant, r.User, r.ResolvedMode, r.Source,
					dash(r.Driver), r.Admission, r.Status, dash(r.FailureCode), r.CreatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&asJSON, "json", false, "print a JSON array")
	fl.StringVar(&f.Tenant, "tenant", "", "only this tenant's runs")
	fl.StringVar(&f.User, "user", "", "only this user's runs")
	fl.StringVar(&f.Status, "status", "", "only runs in this status: running, succeeded, failed, failed_resumable")
	fl.IntVar(&f.Limit, "limit", 50, "at most this many runs (0: all)")
	cmd.AddCommand(newRunsStart(g), newRunsFinish(g))
	return cmd
}

func newRunsStart(g *globals) *cobra.Command {
	var (
		w  who
		pf policyFlags
	)
	cmd := &cobra.Command{
		Use:   "start --user U [--tenant T] [--trust untrusted] [--sandbox MODE] [--spec FILE]",
		Short: "Open a run that several commands attach to (exec --run ID); prints its id",
		Long: "start records a running, admitted run with the mode and driver policy resolves now, and prints its id.\n" +
			"Commands attach to it with `sandkeep exec --run ID` (each is still admitted on its own, with the run's\n" +
			"trust); `sandkeep runs finish ID` closes it.",
		Args: cobra.NoArgs,
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
			pf.run = ""
			run, err := m.Admit(cmd.Context(), pf.request(key, g.stderr))
			if err != nil {
				return err // a refused run is recorded, and finished
			}
			fmt.Fprintln(g.stdout, run.ID)
			return nil
		},
	}
	w.bind(cmd)
	f := cmd.Flags()
	f.StringVar(&pf.spec, "spec", "", "the project's sandkeep.yaml (default $SANDKEEP_SPEC)")
	f.StringVar(&pf.sandbox, "sandbox", "", "sandbox mode: none, auto or inline")
	f.StringVar(&pf.trust, "trust", "trusted", "trusted or untrusted; every command of the run gets it")
	f.StringVar(&pf.driver, "driver", "", "require this driver")
	return cmd
}

func newRunsFinish(g *globals) *cobra.Command {
	var status, code string
	cmd := &cobra.Command{
		Use:   "finish ID [--status succeeded|failed|failed_resumable] [--code CODE]",
		Short: "Close a run opened with `sandkeep runs start`",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := g.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer st.Close()
			upd := store.RunUpdate{Status: status, FailureCode: code}
			if status != store.StatusSucceeded {
				upd.Disposition = store.DispositionDeterministic
				if status == store.StatusFailedResumable {
					upd.Disposition = store.DispositionInfrastructure
				}
				if upd.FailureCode == "" {
					return fault.New(fault.InvalidArgument, "pass --code with the failure's code", "a %s run needs a failure code", status)
				}
			}
			if err := st.UpdateRun(cmd.Context(), args[0], upd); err != nil {
				return fault.Wrap(err, fault.InvalidArgument, "`sandkeep runs` lists the runs and their status", "cannot finish run %s: %v", args[0], err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&status, "status", store.StatusSucceeded, "succeeded, failed or failed_resumable")
	cmd.Flags().StringVar(&code, "code", "", "the failure code of a failed run")
	return cmd
}

func newEvents(g *globals) *cobra.Command {
	var (
		asJSON bool
		follow bool
		runID  string
		every  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "events [--run ID] [--follow] [--json]",
		Short: "Print recorded events in order; --follow keeps printing new ones",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if every <= 0 {
				return fault.New(fault.InvalidArgument, "use a positive interval, e.g. 500ms", "--interval must be positive")
			}
			st, err := g.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer st.Close()
			if runID != "" {
				if _, err := st.GetRun(cmd.Context(), runID); err != nil {
					return fault.Wrap(err, fault.NotFound, "`sandkeep runs` lists the recorded runs", "no run %q", runID)
				}
			}
			return printEvents(cmd.Context(), g, st, runID, follow, every, asJSON)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&asJSON, "json", false, "one JSON object per line")
	fl.BoolVarP(&follow, "follow", "f", false, "keep printing events as they are recorded, until interrupted")
	fl.StringVar(&runID, "run", "", "only this run's events")
	fl.DurationVar(&every, "interval", 500*time.Millisecond, "how often --follow looks for new events")
	return cmd
}

// printEvents prints the events after seq 0, then, with follow, polls for newer ones; the store's sequence
// numbers only grow in the order events become visible, so polling after the last one seen misses none.
func printEvents(ctx context.Context, g *globals, st store.Store, runID string, follow bool, every time.Duration, asJSON bool) error {
	var after int64
	enc := json.NewEncoder(g.stdout)
	for {
		evs, err := st.ListEvents(ctx, store.EventFilter{RunID: runID, AfterSeq: after, Limit: 1000})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, e := range evs {
			after = e.Seq
			if asJSON {
				if err := enc.Encode(e); err != nil {
					return err
				}
				continue
			}
			fmt.Fprintf(g.stdout, "%s  %s  %-22s %s\n", e.Time.Local().Format("2006-01-02 15:04:05.000"), short(e.RunID), e.Name, e.Payload)
		}
		if len(evs) == 1000 {
			continue
		}
		if !follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(every):
		}
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// short is a run id's last 12 characters: UUIDv7s share their leading (time) digits.
func short(id string) string {
	if len(id) > 12 {
		return id[len(id)-12:]
	}
	return dash(id)
}
