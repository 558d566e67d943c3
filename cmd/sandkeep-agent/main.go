//go:build linux

// Command sandkeep-agent is the helper placed in every sandbox (bind-mounted read-only at
// /.sandkeep/sandkeep-agent). It owns each command's process tree: it starts the command in a new session,
// streams its output in length-prefixed frames with the output bounds applied, enforces the deadline by killing
// the whole tree (orphans included: it is a child subreaper), and reports the exact exit status.
//
// Modes:
//
//	sandkeep-agent init     PID 1 of the sandbox: reaps zombies, exits 0 on SIGTERM or SIGINT
//	sandkeep-agent serve    speaks the agentproto wire on stdin/stdout, one command after another
//	sandkeep-agent version  prints the agent and protocol versions
//
// It uses the standard library only and builds with CGO_ENABLED=0, because it runs in images that may hold
// nothing else (FROM scratch + busybox). Diagnostics go to stderr; stdout carries frames only.
package main

import (
	"fmt"
	"os"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	if len(os.Args) != 2 {
		usage()
	}
	switch os.Args[1] {
	case "init":
		os.Exit(runInit())
	case "serve":
		os.Exit(serve(os.Stdin, os.Stdout))
	case "version", "-version", "--version":
		fmt.Printf("sandkeep-agent %s (protocol %d)\n", version, agentproto.Version)
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: sandkeep-agent init|serve|version")
	os.Exit(2)
}
