package fastpath

import (
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// AlreadyStopping is what a second signal prints while the first one's command is being stopped.
const AlreadyStopping = "sandkeep: already stopping the command; waiting for its process tree to be gone"

// Relay passes the daemon's output to stdout and stderr, stdin once the command reads it (a command that never
// reads it never consumes the caller's), and each signal from interrupts to the command, until the daemon sends
// the exit status, which it returns. A write to stdout or stderr that fails (the reader went away) is told to the
// command as SIGPIPE, once. An error is DAEMON_LOST: the daemon went away after it accepted the call.
func Relay(fc *Conn, stdin io.Reader, stdout, stderr io.Writer, interrupts <-chan syscall.Signal) (int, error) {
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
				return 0, fault.New(fault.DaemonLost, "", "the daemon sent a malformed exit status")
			}
			return int(int32(binary.BigEndian.Uint32(p))), nil
		}
	}
}

// Lost is DAEMON_LOST for a daemon that went away (err) during an accepted call.
func Lost(err error) error {
	return fault.Wrap(err, fault.DaemonLost, "run the command again: a new daemon adopts the sandboxes ('sandkeep daemon status')",
		"the daemon went away during the call: %v", err)
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
func PrintError(w io.Writer, fe *fault.Error) {
	fmt.Fprintf(w, "sandkeep: %s: %s\n", fe.Code, OneLine(fe.Message))
	if fe.Hint != "" {
		fmt.Fprintf(w, "hint: %s\n", OneLine(fe.Hint))
	}
}

// OneLine keeps a message on one line so that "sandkeep: CODE: message" stays greppable.
func OneLine(s string) string {
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
}
