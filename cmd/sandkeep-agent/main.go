//go:build linux

// Command sandkeep-agent is the helper placed in every sandbox (bind-mounted read-only at
// /.sandkeep/sandkeep-agent). It owns each command's process tree: it starts the command in a new session,
// streams its output in length-prefixed frames with the output bounds applied, enforces the deadline by killing
// the whole tree (orphans included: it is a child subreaper), and reports the exact exit status.
//
// Modes:
//
//	sandkeep-agent init     PID 1 of the sandbox: reaps zombies, ignores every signal its commands send it
//	sandkeep-agent init --channel PATH
//	                        the same, and keeps the persistent channel up: dials the host's Unix socket at PATH
//	                        and serves commands on it (one `serve` child per connection)
//	sandkeep-agent serve    speaks the agentproto wire on stdin/stdout, one command after another
//	sandkeep-agent install DIR  copies itself to DIR/sandkeep-agent (the kubernetes init container)
//	sandkeep-agent version  prints the agent and protocol versions
//	sandkeep-agent put-file PATH MODE
//	                        writes stdin (a secret, at most 1 MiB) to PATH under /run/secrets, never following links
//	sandkeep-agent rm-file PATH...
//	                        removes secret files placed by put-file
//	sandkeep-agent dial PORT
//	                        connects to 127.0.0.1:PORT inside the sandbox and copies stdin/stdout to and from it
//	                        (one port-forwarded connection)
//
// It uses the standard library only and builds with CGO_ENABLED=0, because it runs in images that may hold
// nothing else (FROM scratch + busybox). Diagnostics go to stderr; stdout carries frames only.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	// Before anything else, in every mode (init, serve, and put-file, which holds a secret): a command of the same
	// uid must never read or ptrace the agent (init_linux.go).
	if err := setNotDumpable(); err != nil {
		fmt.Fprintf(os.Stderr, "sandkeep-agent: PR_SET_DUMPABLE: %v\n", err)
		os.Exit(1)
	}
	if os.Args[1] == "init" {
		channel, egress, err := parseInitArgs(os.Args[2:])
		if err != nil {
			fmt.Fprintf(os.Stderr, "sandkeep-agent init: %v\n", err)
			usage()
		}
		os.Exit(runInit(channel, egress))
	}
	if code, ok := fileBuiltin(os.Args[1:]); ok { // put-file, rm-file: see files_linux.go
		os.Exit(code)
	}
	if code, ok := installBuiltin(os.Args[1:]); ok { // install DIR: see install_linux.go
		os.Exit(code)
	}
	if code, ok := dialBuiltin(os.Args[1:]); ok { // dial PORT: see dial_linux.go
		os.Exit(code)
	}
	if len(os.Args) != 2 {
		usage()
	}
	switch os.Args[1] {
	case "serve":
		os.Exit(serve(os.Stdin, os.Stdout))
	case "version", "-version", "--version":
		fmt.Printf("sandkeep-agent %s (protocol %d)\n", version, agentproto.Version)
	default:
		usage()
	}
}

// parseInitArgs reads init's flags, both optional: --channel PATH (or -channel, =PATH), and --egress ADDR, the
// loopback address of the egress forwarder, which needs --channel (the proxy's socket is next to it).
func parseInitArgs(args []string) (channel, egress string, err error) {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Func("channel", "the host's Unix socket to dial", func(v string) error {
		channel = v
		return checkChannelPath(v)
	})
	fs.Func("egress", "the loopback address to forward to the host's egress proxy", func(v string) error {
		egress = v
		return checkEgressAddr(v)
	})
	if err := fs.Parse(args); err != nil {
		return "", "", err
	}
	if fs.NArg() != 0 {
		return "", "", fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if egress != "" && channel == "" {
		return "", "", errors.New("--egress needs --channel: the proxy's socket is in the channel directory")
	}
	return channel, egress, nil
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: sandkeep-agent init [--channel PATH [--egress 127.0.0.1:PORT]] | serve | version | put-file PATH MODE | rm-file PATH... | dial PORT")
	os.Exit(2)
}
