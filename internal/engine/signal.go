package engine

import (
	"strconv"
	"strings"
	"syscall"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// signals are the names ParseSignal accepts, as kill(1) spells them without SIG.
var signals = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "KILL": syscall.SIGKILL,
	"USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "TERM": syscall.SIGTERM, "CONT": syscall.SIGCONT,
	"STOP": syscall.SIGSTOP, "TSTP": syscall.SIGTSTP, "WINCH": syscall.SIGWINCH, "ALRM": syscall.SIGALRM,
	"PIPE": syscall.SIGPIPE,
}

// ParseSignal reads a signal as `docker kill -s` and kill(1) take it: a name with or without SIG, in any case
// (TERM, sigkill), or a number 1..64. Anything else is INVALID_ARGUMENT.
func ParseSignal(s string) (syscall.Signal, error) {
	name := strings.ToUpper(strings.TrimSpace(s))
	name = strings.TrimPrefix(name, "SIG")
	if sig, ok := signals[name]; ok {
		return sig, nil
	}
	if n, err := strconv.Atoi(name); err == nil && n >= 1 && n <= 64 {
		return syscall.Signal(n), nil
	}
	return 0, fault.New(fault.InvalidArgument, "use a signal name (TERM, KILL, INT, HUP, QUIT, USR1, USR2, CONT, STOP, WINCH) or a number 1..64",
		"unknown signal %q", truncateText(s, 32))
}

// truncateText cuts s to at most n bytes for a message.
func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
