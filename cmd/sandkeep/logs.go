package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
)

// newLogs is `sandkeep logs --run ID`: the run's log (what the driver did for it, what its setup steps printed),
// read from the store; --follow keeps printing until the run has finished and its log has no more.
func newLogs(g *globals) *cobra.Command {
	var (
		asJSON bool
		follow bool
		runID  string
		every  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "logs --run ID [--follow] [--json]",
		Short: "Print a run's log: the driver's actions and the output of image builds, feature installs, post-create and post-start",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runID == "" {
				return fault.New(fault.InvalidArgument, "name the run: sandkeep logs --run ID (`sandkeep runs` lists them)", "no run given")
			}
			if every <= 0 {
				return fault.New(fault.InvalidArgument, "use a positive interval, e.g. 500ms", "--interval must be positive")
			}
			st, err := g.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer st.Close()
			if _, err := st.GetRun(cmd.Context(), runID); err != nil {
				return fault.Wrap(err, fault.RunNotFound, "`sandkeep runs` lists the recorded runs", "no run %q", runID)
			}
			return printRunLogs(cmd.Context(), g.stdout, st, runID, follow, every, asJSON)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&asJSON, "json", false, "one JSON object per entry")
	fl.BoolVarP(&follow, "follow", "f", false, "keep printing the log as it grows, until the run has finished")
	fl.StringVar(&runID, "run", "", "the run whose log to print")
	fl.DurationVar(&every, "interval", 500*time.Millisecond, "how often --follow looks for more")
	return cmd
}

// printRunLogs prints run id's log from the start; with follow it polls for more until the run is finished and a
// poll after that found nothing (the run's last writes were committed before it finished).
func printRunLogs(ctx context.Context, out io.Writer, st store.Store, id string, follow bool, every time.Duration, asJSON bool) error {
	var after int64
	enc := json.NewEncoder(out)
	for {
		finished := false
		if follow {
			r, err := st.GetRun(ctx, id)
			if err != nil {
				return err
			}
			finished = store.Finished(r.Status)
		}
		logs, err := st.ListRunLogs(ctx, store.RunLogFilter{RunID: id, AfterSeq: after, Limit: 1000})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, l := range logs {
			after = l.Seq
			if asJSON {
				if err := enc.Encode(l); err != nil {
					return err
				}
				continue
			}
			writeRunLog(out, l)
		}
		if len(logs) == 1000 {
			continue
		}
		if !follow || finished {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(every):
		}
	}
}

// writeRunLog prints one entry's text, each line prefixed with its source.
func writeRunLog(out io.Writer, l store.RunLog) {
	for _, line := range strings.Split(strings.TrimRight(l.Text, "\n"), "\n") {
		fmt.Fprintf(out, "%-11s %s\n", "["+l.Source+"]", strings.TrimRight(line, "\r"))
	}
}
