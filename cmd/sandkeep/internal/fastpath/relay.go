package fastpath

import (
	"io"
	"strings"
	"sync"
	"syscall"
)

// AlreadyStopping is what a second signal prints while the first one's command is being stopped.
const AlreadyStopping = "sandkeep: already stopping the command; waiting for its process tree to be gone"

// Relay passes the daemon's output to stdout and stderr, stdin once the command reads it (a command that never
// reads it never consumes the caller's), and each signal from interrupts to the command, until the daemon sends
// the exit status, which it returns. A write to stdout or stderr that fails (the reader went away) is told to the
// command as SIGPIPE, once. An error is a *Failure with the code DAEMON_LOST: the daemon went away after it
// accepted the call.
func Relay(fc *Conn, stdin io.Reader, stdout, stderr io.Writer, interrupts <-chan syscall.Signal) (int, *Failure) {
	done := make(chan struct{})
	var forwarding sync.WaitGroup
	forwarding.Go(func() {
		for {
			select {
			case sig := <-interrupts:
				_ = fc.Write(FrameSignal, []byte{byte(sig)})
			case <-done:
				return
			}
		}
	})
	defer func() { close(done); forwarding.Wait() }()
	var stdinOnce sync.Once
	piped := false // this side's stdout or stderr is gone: the command was told (SIGPIPE)
	for {
		typ, p, err := fc.Read()
		if err != nil {
			return 0, Lost(err)
		}
		switch typ {
		case FrameStdout, FrameStderr:
			w := stdout
			if typ == FrameStderr {
				w = stderr
			}
			if _, err := w.Write(p); err != nil && !piped {
				piped = true
				_ = fc.Write(FrameSignal, []byte{byte(syscall.SIGPIPE)})
			}
		case FrameWant:
			stdinOnce.Do(func() {
				go func() { // ends with the process: a stdin that never ends is this process's to abandon
					buf := make([]byte, 32<<10)
					for {
						n, err := stdin.Read(buf)
						if n > 0 && fc.WriteData(FrameStdin, buf[:n]) != nil {
							return
						}
						if err != nil {
							_ = fc.Write(FrameStdinEOF, nil)
							return
						}
					}
				}()
			})
		case FrameExit:
			if len(p) != 4 {
				return 0, &Failure{Code: LostCode, Message: "the daemon sent a malformed exit status"}
			}
			return int(int32(Uint32(p))), nil
		}
	}
}

// LostCode is fault.DaemonLost (TestFastPathCodes checks it): this package does not import internal/fault, whose
// fmt and reflect would move its init later (see the package doc).
const LostCode = "DAEMON_LOST"

// Failure is a typed error of the fast path, as internal/fault's Error has it (cmd/sandkeep turns it into one):
// a stable code, a sentence, a hint, and the error it wraps.
type Failure struct {
	Code, Message, Hint string
	Err                 error
}

// Error reads as fault.Error's: "CODE: message: hint".
func (f *Failure) Error() string {
	s := f.Code + ": " + f.Message
	if f.Hint != "" {
		s += ": " + f.Hint
	}
	return s
}

func (f *Failure) Unwrap() error { return f.Err }

// Lost is DAEMON_LOST for a daemon that went away (err) during an accepted call.
func Lost(err error) *Failure {
	return &Failure{Code: LostCode, Hint: "run the command again: a new daemon adopts the sandboxes ('sandkeep daemon status')",
		Message: "the daemon went away during the call: " + err.Error(), Err: err}
}

// InterruptMessage says which signal interrupted sandkeep.
func InterruptMessage(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGINT:
		return "interrupted (SIGINT)"
	case syscall.SIGTERM:
		return "interrupted (SIGTERM)"
	case syscall.SIGPIPE:
		return "output pipe closed (SIGPIPE)"
	}
	return "interrupted (" + sig.String() + ")"
}

// PrintError writes "sandkeep: CODE: message" and the hint on its own line, each kept on one line.
func PrintError(w io.Writer, code, message, hint string) {
	s := "sandkeep: " + code + ": " + OneLine(message) + "\n"
	if hint != "" {
		s += "hint: " + OneLine(hint) + "\n"
	}
	_, _ = io.WriteString(w, s)
}

// OneLine keeps a message on one line so that "sandkeep: CODE: message" stays greppable.
func OneLine(s string) string {
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
}
