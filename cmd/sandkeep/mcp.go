package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/mcpserver"
)

const mcpLong = `Serve the Model Context Protocol over stdio for one user's sandbox, for coding agents and editors
(Claude Code, Codex, Cursor...). Tools: exec, read_file, write_file, list_files, sandbox_status, fork_sandbox,
and background processes: start_process, list_processes, process_output, process_input, kill_process.

stdout carries the protocol; sandkeep's own log goes to stderr. Every command is recorded as a run in the
store (--store). See docs/MCP.md for how to register it with each client.`

const mcpExample = `  sandkeep mcp --tenant acme --user alice
  claude mcp add sandkeep -- sandkeep mcp --tenant acme --user alice
  sandkeep mcp --user alice --spec ./sandkeep.yaml`

func newMCP(g *globals) *cobra.Command {
	var (
		w  who
		af admissionFlags
	)
	cmd := &cobra.Command{
		Use:     "mcp --user U [--tenant T] [--spec FILE]",
		Short:   "Serve MCP over stdio for one user's sandbox",
		Long:    mcpLong,
		Example: mcpExample,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key, err := w.key(cmd)
			if err != nil {
				return err
			}
			sc, err := loadServerConfig(os.Getenv(envConfig))
			if err != nil {
				return err
			}
			svc, err := g.openService(cmd.Context(), sc, af, files.Limits{}, nil)
			if err != nil {
				return err
			}
			defer svc.Close()
			return mcpserver.ServeStdio(cmd.Context(), svc.backend, key, mcpserver.Options{Version: version(), Logger: svc.log})
		},
	}
	w.bind(cmd)
	af.bind(cmd.Flags())
	return cmd
}
