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
//	sandkeep-agent init --channel PATH --service 127.0.0.1:PORT...
//	                        with each --service, forwards that loopback address to the host's socket
//	                        svc-PORT.sock next to the channel's (a host service, see service_linux.go)
//	sandkeep-agent init [--channel PATH] --relay
//	                        also (or only) takes channel sessions from relays: `sandkeep-agent relay` processes the
//	                        host execs as uid 0 through the engine, verified with SCM_CREDENTIALS (relay_linux.go)
//	sandkeep-agent init --net-channel HOST:PORT --pod NAME --token-file PATH [--egress 127.0.0.1:PORT]
//	                        the same over TCP (the kubernetes driver): reads and removes the token, dials the
//	                        server and opens each connection with a hello naming the pod and the token; with
//	                        --egress, forwards that address to the server's egress endpoint (the same address)
//	sandkeep-agent announce FILE ANNOUNCEMENT
//	                        writes a channel announcement (a new owner's address, authenticated by the pod's
//	                        token) to FILE and signals PID 1, which dials that address when it is not connected
//	                        (follow_linux.go)
//	sandkeep-agent probe-net SECONDS ADDR...
//	                        dials each ADDR (IP:port) over and over for SECONDS (0: once), sending nothing: the
//	                        kubernetes driver's NetworkPolicy probes, whose server side watches what arrives
//	sandkeep-agent serve    speaks the agentproto wire on stdin/stdout, one command after another
//	sandkeep-agent install DIR  copies itself to DIR/sandkeep-agent (the kubernetes init container)
//	sandkeep-agent version  prints the agent and protocol versions
//	sandkeep-agent put-file PATH MODE
//	                        writes stdin (a secret, at most 1 MiB) to PATH under /run/secrets, never following links
//	sandkeep-agent rm-file PATH...
//	                        removes secret files placed by put-file
//	sandkeep-agent fs OP    one operation of the file API on /workspace (internal/files/wire.go), as the sandbox's
//	                        user: the kubernetes driver's upload, download, list and tar
//	sandkeep-agent relay    connects to init's relay socket and carries one channel session between it and
//	                        stdin/stdout (the gVisor and exec-transport sandboxes' channel)
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
	"path/filepath"

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
		f, err := parseInitFlags(os.Args[2:])
		if err != nil {
			fmt.Fprintf(os.Stderr, "sandkeep-agent init: %v\n", err)
			usage()
		}
		if f.netChannel != "" {
			os.Exit(runNetInit(f))
		}
		if os.Getpid() == 1 {
			startServices(f.services, f.channel)
		}
		os.Exit(runInit(f.channel, f.egress, f.relay))
	}
	if code, ok := fileBuiltin(os.Args[1:]); ok { // put-file, rm-file: see files_linux.go
		os.Exit(code)
	}
	if code, ok := fsBuiltin(os.Args[1:]); ok { // fs OP: the file API through the agent, see fs_linux.go
		os.Exit(code)
	}
	if code, ok := installBuiltin(os.Args[1:]); ok { // install DIR: see install_linux.go
		os.Exit(code)
	}
	if code, ok := dialBuiltin(os.Args[1:]); ok { // dial PORT: see dial_linux.go
		os.Exit(code)
	}
	if code, ok := relayBuiltin(os.Args[1:]); ok { // relay: see relay_linux.go
		os.Exit(code)
	}
	if code, ok := probeNetBuiltin(os.Args[1:]); ok { // probe-net SECONDS ADDR...: see probe_linux.go
		os.Exit(code)
	}
	if code, ok := announceBuiltin(os.Args[1:]); ok { // announce FILE ANNOUNCEMENT: see follow_linux.go
		os.Exit(code)
	}
	if len(os.Args) != 2 {
		usage()
	}
	switch os.Args[1] {
	case "serve":
		consumeToken() // a serve that starts before init read the channel token leaves no command a copy (net_linux.go)
		os.Exit(serve(os.Stdin, os.Stdout))
	case "version", "-version", "--version":
		fmt.Printf("sandkeep-agent %s (protocol %d)\n", version, agentproto.Version)
	default:
		usage()
	}
}

// initFlags are init's flags. channel (a Unix socket the host binds in) and netChannel (a TCP address, the
// kubernetes driver's) are exclusive; netChannel needs pod and tokenFile.
type initFlags struct {
	channel    string   // --channel PATH
	egress     string   // --egress ADDR
	services   []string // --service ADDR, repeated: host services' addresses inside the sandbox
	netChannel string   // --net-channel HOST:PORT
	pod        string   // --pod NAME: the name the hello gives
	tokenFile  string   // --token-file PATH: the channel token, read once and removed
	relay      bool     // --relay: take channel sessions from relays the host execs (relay_linux.go)
}

// parseInitArgs is parseInitFlags for the Unix channel's flags only.
func parseInitArgs(args []string) (channel, egress string, err error) {
	f, err := parseInitFlags(args)
	if err == nil && f.netChannel != "" {
		err = errors.New("--net-channel is not --channel")
	}
	return f.channel, f.egress, err
}

// parseInitFlags reads init's flags, all optional: --channel PATH (or -channel, =PATH), and --egress ADDR, the
// loopback address of the egress forwarder, which needs --channel (the proxy's socket is next to it); or
// --net-channel HOST:PORT with --pod NAME and --token-file PATH (the kubernetes driver's channel over the pod
// network, see net_linux.go).
func parseInitFlags(args []string) (f initFlags, err error) {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	fs.Func("net-channel", "the sandkeep server's channel address (host:port)", func(v string) error {
		f.netChannel = v
		return checkNetChannel(v)
	})
	fs.Func("pod", "this pod's name, for the hello", func(v string) error {
		if v == "" || len(v) > agentproto.MaxHelloName {
			return errors.New("--pod: a name of 1 to 253 bytes")
		}
		f.pod = v
		return nil
	})
	fs.Func("token-file", "the channel token's file, removed once read", func(v string) error {
		if !filepath.IsAbs(v) {
			return fmt.Errorf("--token-file %q: not an absolute path", v)
		}
		f.tokenFile = v
		return nil
	})
	fs.SetOutput(io.Discard)
	fs.BoolVar(&f.relay, "relay", false, "take channel sessions from relays the host execs as uid 0")
	fs.Func("channel", "the host's Unix socket to dial", func(v string) error {
		f.channel = v
		return checkChannelPath(v)
	})
	fs.Func("service", "a loopback address to forward to a host service's socket (repeatable)", func(v string) error {
		if err := checkServiceAddr(v); err != nil {
			return err
		}
		f.services = append(f.services, v)
		return nil
	})
	fs.Func("egress", "the loopback address to forward to the host's egress proxy", func(v string) error {
		f.egress = v
		return checkEgressAddr(v)
	})
	if err := fs.Parse(args); err != nil {
		return initFlags{}, err
	}
	switch {
	case fs.NArg() != 0:
		return initFlags{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case f.netChannel != "" && f.relay:
		return initFlags{}, errors.New("--relay goes with --channel or alone, not with --net-channel")
	case f.netChannel != "" && f.channel != "":
		return initFlags{}, errors.New("--channel and --net-channel are exclusive")
	case f.netChannel != "" && (f.pod == "" || f.tokenFile == ""):
		return initFlags{}, errors.New("--net-channel needs --pod and --token-file")
	case f.netChannel == "" && (f.pod != "" || f.tokenFile != ""):
		return initFlags{}, errors.New("--pod and --token-file go with --net-channel")
	case f.egress != "" && f.channel == "" && f.netChannel == "":
		return initFlags{}, errors.New("--egress needs --channel or --net-channel: the way to the host's proxy")
	case len(f.services) > 0 && f.channel == "":
		return initFlags{}, errors.New("--service needs --channel: the host service's socket is next to it")
	case len(f.services) > maxServices:
		return initFlags{}, fmt.Errorf("at most %d --service addresses", maxServices)
	}
	return f, nil
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: sandkeep-agent init [--channel PATH [--egress 127.0.0.1:PORT] [--service 127.0.0.1:PORT]...] [--relay | --net-channel HOST:PORT --pod NAME --token-file PATH] | serve | version | put-file PATH MODE | rm-file PATH... | fs OP | dial PORT | relay")
	os.Exit(2)
}
