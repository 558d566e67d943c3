package main

import (
	"os"

	"github.com/sandkeep/sandkeep/internal/files"
)

// The file API on drivers whose workspace is not on sandkeep's host (the kubernetes driver's claim): the host
// runs `sandkeep-agent fs OP` as an ordinary command through the agent protocol, OP the JSON of one file
// operation, its data on stdin and stdout (internal/files/wire.go). It runs package files' own code here, as
// the sandbox's user, on /workspace through an os.Root: the same confinement (no symlink the sandbox planted is
// ever followed), limits and faults as the host applies to a Docker workspace.
//
//	sandkeep-agent fs OP   exit 0: done (the answer on stdout); 1: refused (a JSON reply on stderr); 2: usage

// workspaceDir is where every sandbox has its workspace (driver.WorkspaceDir; a test checks that they agree).
const workspaceDir = "/workspace"

// fsBuiltin runs `fs OP` when args (os.Args[1:]) name it, and returns its exit code; ok is false otherwise.
func fsBuiltin(args []string) (code int, ok bool) {
	if len(args) == 0 || args[0] != "fs" {
		return 0, false
	}
	return files.Serve(workspaceDir, args[1:], os.Stdin, os.Stdout, os.Stderr), true
}
