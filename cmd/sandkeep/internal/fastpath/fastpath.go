// Package fastpath serves a CLI call through the home's daemon before the rest of the sandkeep binary has
// initialised: a warm `sandkeep exec -- true` then costs about what starting a small program costs, instead of
// the ~100 ms the binary's ~380 package initialisers take (compose-go's JSON schema, client-go's scheme, ...).
//
// How: Go initialises packages one at a time, each step taking the first package in import-path order whose
// imports are all initialised (the Go spec, "Package initialization", since Go 1.21). This package imports
// the standard library only (and internal/homedir, std-only itself), so its init runs after a handful of small
// std packages and before nearly everything else in the binary. cmd/sandkeep imports it for that side effect
// alone (`_ ".../fastpath"` in main.go). Its init reads os.Args and, when the command line is one it knows
// (Parse) for a command the daemon serves, SANDKEEP_DAEMON is auto or on, and the home's daemon answers and
// accepts the caller's fingerprint, it relays the whole call (the same frames and the same code as the slow
// path in cmd/sandkeep/daemon.go, which uses this package) and exits with the command's status. On anything
// else it returns having changed nothing, and main runs as it always did: no socket (auto starts a daemon
// there), a refusal (another environment: auto works in-process, on reports DAEMON_MISMATCH), --help,
// --log-level, exec -t, a flag or form it does not know, SANDKEEP_DAEMON=off, SANDKEEP_DAEMON_FASTPATH=off.
//
// What a newcomer should know: an init that may exit the process is unusual; it is here because the alternative
// is paying every package's init on every agent command (docs/DAEMON.md, "The fast path", has the figures).
// Anything added to this package must keep its imports to the standard library, or the init moves later.
package fastpath

import (
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
)

func init() {
	code, served := serve(os.Args[1:])
	if served {
		os.Exit(code)
	}
}

// serve runs the call args through the home's daemon when the fast path may; served is false when main is to
// handle it (nothing was written, nothing was read from stdin).
func serve(args []string) (code int, served bool) {
	call, ok := Parse(args)
	if !ok || call.LogLevel || call.TTY {
		return 0, false
	}
	if m := os.Getenv(EnvDaemon); m != "" && m != "auto" && m != "on" {
		return 0, false // off, or a bad value that main reports
	}
	if os.Getenv(EnvFastPath) == "off" {
		return 0, false // the operator's (or a test's) way to take main's path through the daemon
	}
	fc, err := Dial(ResolveHome(call.Globals.Home))
	if err != nil {
		return 0, false
	}
	// As main does: a closed stdout is EPIPE (told to the command as SIGPIPE), not a fatal signal; SIGINT and
	// SIGTERM go to the command, a second one only says that sandkeep is already stopping it.
	signal.Ignore(syscall.SIGPIPE)
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	fallThrough := func() (int, bool) {
		signal.Stop(sigs)
		signal.Reset(syscall.SIGPIPE)
		_ = fc.C.Close()
		select {
		case s := <-sigs: // interrupted before the call began: as main would have reported it
			sig, _ := s.(syscall.Signal)
			os.Stderr.WriteString("sandkeep: " + InterruptMessage(sig) + "\n")
			return 128 + int(sig), true
		default:
			return 0, false
		}
	}
	if call.Command == "exec" || call.Command == "doctor" {
		args = AbsoluteSpec(args, call.Spec)
	}
	hello := Hello{Args: args, Fingerprint: Fingerprint(call.Globals)}.Marshal()
	if err := fc.Write(FrameHello, hello); err != nil {
		return fallThrough()
	}
	typ, _, err := fc.Read()
	if err != nil || typ != FrameAccept {
		return fallThrough()
	}
	interrupts := make(chan syscall.Signal, 1)
	var first atomic.Int32 // the signal that interrupted the call
	go func() {            // ends with the process, which exits when the call does
		for s := range sigs {
			sig, _ := s.(syscall.Signal)
			if first.CompareAndSwap(0, int32(sig)) {
				interrupts <- sig
				continue
			}
			os.Stderr.WriteString(AlreadyStopping + "\n")
		}
	}()
	code, fail := Relay(fc, os.Stdin, os.Stdout, os.Stderr, interrupts)
	if sig := syscall.Signal(first.Load()); fail != nil && sig != 0 {
		// Whatever failed after the signal failed because of it: report the interruption (as main does).
		os.Stderr.WriteString("sandkeep: " + InterruptMessage(sig) + "\n")
		return 128 + int(sig), true
	}
	if fail != nil {
		PrintError(os.Stderr, fail.Code, fail.Message, fail.Hint)
		return 125, true
	}
	return code, true
}
