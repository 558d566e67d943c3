package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/fault"
)

func newExec(g *globals) *cobra.Command {
	var (
		w           who
		timeout     time.Duration
		workdir     string
		env         []string
		asJSON      bool
		outputLimit int64
		interactive bool
		gateWait    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "exec --user U [--tenant T] [flags] -- COMMAND [ARG...]",
		Short: "Run a command in the user's sandbox",
		Long: "Run a command in the (tenant, user) sandbox, creating or starting it when needed. stdout and stderr\n" +
			"stream as they are produced; sandkeep exits with the command's own status, 124 when it timed out\n" +
			"(its whole process tree is killed), 125 when sandkeep itself failed.",
		Example: "  sandkeep exec --tenant acme --user alice -- sh -c 'echo hi > /workspace/f; id -u'\n" +
			"  sandkeep exec --user bob --timeout 5s --workdir src -- make test\n" +
			"  sandkeep exec --user bob --json -- ls /workspace",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := sandkeep.ExecRequest{
				Argv: args, Workdir: workdir, Env: env, Timeout: timeout, OutputLimit: outputLimit,
			}
			if interactive {
				req.Stdin = g.stdin
			}
			if !asJSON {
				req.Stdout, req.Stderr = g.stdout, g.stderr
			}
			return runExec(cmd.Context(), g, &w, req, asJSON, gateWait)
		},
	}
	cmd.Flags().SetInterspersed(false) // everything after the command belongs to it
	w.bind(cmd)
	f := cmd.Flags()
	f.DurationVar(&timeout, "timeout", 120*time.Second, "deadline for the command, 1s to 24h")
	f.StringVarP(&workdir, "workdir", "w", "", "working directory, relative to /workspace or absolute under it")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable K=V (repeatable)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object with the result instead of streaming")
	f.Int64Var(&outputLimit, "output-limit", 1<<20, "bytes kept per stream (stdout, stderr), at most 64 MiB")
	f.BoolVarP(&interactive, "interactive", "i", false, "pass sandkeep's stdin to the command (default /dev/null)")
	f.DurationVar(&gateWait, "gate-wait", 0, "how long to wait for the user's previous command (default 10m)")
	return cmd
}

func runExec(ctx context.Context, g *globals, w *who, req sandkeep.ExecRequest, asJSON bool, gateWait time.Duration) error {
	fail := func(err error) error {
		if asJSON {
			jsonError(g.stdout, err)
			return exitError{exitFailure}
		}
		return err
	}
	key, err := w.key()
	if err != nil {
		return fail(err)
	}
	m, err := g.open(ctx, func(c *sandkeep.Config) {
		if gateWait > 0 {
			c.GateWait = gateWait
		}
	})
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	res, err := m.Exec(ctx, key, req)
	if err != nil && (res == nil || !errors.Is(err, context.Canceled)) {
		return fail(err)
	}
	if asJSON {
		enc := json.NewEncoder(g.stdout)
		enc.SetEscapeHTML(false)
		if jerr := enc.Encode(res); jerr != nil {
			return fail(fault.Wrap(jerr, fault.Internal, "", "cannot write the result"))
		}
	}
	if res.StdoutTruncated || res.StderrTruncated {
		fmt.Fprintf(g.stderr, "sandkeep: output was truncated at %d bytes per stream (--output-limit)\n", req.OutputLimit)
	}
	switch {
	case err != nil: // interrupted: the tree is gone, say so
		fmt.Fprintf(g.stderr, "sandkeep: interrupted; the command's process tree was killed\n")
		return exitError{130}
	case res.TimedOut:
		fmt.Fprintf(g.stderr, "sandkeep: command timed out after %s; its process tree was killed (exit 124)\n", req.Timeout)
		return exitError{exitTimeout}
	case res.ExitCode != 0:
		return exitError{res.ExitCode}
	}
	return nil
}
