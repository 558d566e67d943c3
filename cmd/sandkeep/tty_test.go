package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
)

// terminal is a sandkeep process whose stdin, stdout and stderr are a pseudo-terminal this test holds the
// master of, as when a person runs it in a terminal emulator.
type terminal struct {
	t    *testing.T
	cmd  *exec.Cmd
	ptmx *os.File

	mu   sync.Mutex
	out  bytes.Buffer  // everything sandkeep wrote to the terminal
	more chan struct{} // closed and replaced on every read
	read sync.WaitGroup
}

func (c *cli) terminal(t *testing.T, rows, cols uint16, args ...string) *terminal {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), processBound)
	t.Cleanup(cancel)
	cmd := c.command(ctx, nil, args...)
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	if err != nil {
		t.Fatal(err)
	}
	term := &terminal{t: t, cmd: cmd, ptmx: ptmx, more: make(chan struct{})}
	term.read.Add(1)
	go func() {
		defer term.read.Done()
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			term.mu.Lock()
			term.out.Write(buf[:n])
			close(term.more)
			term.more = make(chan struct{})
			term.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		ptmx.Close()
		term.read.Wait()
	})
	return term
}

// expect waits until the terminal shows want after from (an offset into the output) and returns the offset
// just past it.
func (term *terminal) expect(from int, want string) int {
	term.t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		term.mu.Lock()
		out, more := term.out.String(), term.more
		term.mu.Unlock()
		if from <= len(out) {
			if i := strings.Index(out[from:], want); i >= 0 {
				return from + i + len(want)
			}
		}
		select {
		case <-more:
		case <-deadline:
			term.t.Fatalf("the terminal never showed %q; it shows:\n%q", want, out[min(from, len(out)):])
		}
	}
}

func (term *terminal) offset() int {
	term.mu.Lock()
	defer term.mu.Unlock()
	return term.out.Len()
}

func (term *terminal) typ(s string) {
	term.t.Helper()
	if _, err := io.WriteString(term.ptmx, s); err != nil {
		term.t.Fatal(err)
	}
}

// exitCode waits for sandkeep to exit and returns its status.
func (term *terminal) exitCode() int {
	term.t.Helper()
	err := term.cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee) && ee.Exited():
		return ee.ExitCode()
	}
	term.t.Fatalf("sandkeep: %v", err)
	return -1
}

// alive reports whether sandkeep still runs.
func (term *terminal) alive() bool {
	return term.cmd.ProcessState == nil && term.cmd.Process.Signal(syscall.Signal(0)) == nil
}

// TestExecTTY drives `sandkeep exec -it -- sh` through a real terminal: the shell runs on a terminal of the
// caller's size, a typed command runs, a resize reaches the sandbox, Ctrl-C interrupts the command in the
// sandbox and not sandkeep, and the shell's exit status is sandkeep's.
func TestExecTTY(t *testing.T) {
	c := newCLI(t)
	tenant := c.ten("tty")
	// Warm the sandbox, so that the terminal part is not timed against a create.
	c.run(t, "exec", "--tenant", tenant, "--user", "u", "--", "true").want(t, 0)

	term := c.terminal(t, 30, 90, "exec", "--tenant", tenant, "--user", "u", "-it", "--", "sh")
	term.typ("[ -t 0 ] && echo on-a-\"tty\"; stty size; echo sum-$((6*7))\r") // quotes: the echo of the typed line differs
	at := term.expect(0, "on-a-tty")
	at = term.expect(at, "30 90")
	at = term.expect(at, "sum-42")

	if err := pty.Setsize(term.ptmx, &pty.Winsize{Rows: 41, Cols: 132}); err != nil { // SIGWINCH to sandkeep
		t.Fatal(err)
	}
	// The resize travels on its own; ask until the sandbox's terminal has it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		from := term.offset()
		term.typ("echo size-$(stty size | tr ' ' x)-e\"nd\"\r")
		term.expect(from, "-end\r\n")
		if strings.Contains(term.outputFrom(from), "size-41x132-end") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the resize never reached the sandbox: %q", term.outputFrom(from))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Ctrl-C: a byte on the raw terminal, turned into SIGINT by the sandbox's own terminal for its foreground
	// command; sandkeep neither dies nor stops the shell. Not under gVisor: its terminal inside the sandbox
	// passes the byte through and signals no one (a known gap, docs/SECURITY.md "gVisor").
	at = term.offset()
	if !gvisor() {
		term.typ("echo sleeping; sleep 100\r")
		at = term.expect(at, "sleeping\r\n")
		time.Sleep(300 * time.Millisecond) // sleep is running
		start := time.Now()
		term.typ("\x03")
		at = term.expect(at, "^C")
		term.typ("echo status-$?\r") // the interactive shell abandons the rest of an interrupted line
		at = term.expect(at, "status-130")
		if el := time.Since(start); el > 30*time.Second {
			t.Fatalf("Ctrl-C took %v to stop sleep", el)
		}
		if !term.alive() {
			t.Fatal("sandkeep died on Ctrl-C")
		}
	}
	term.typ("echo still-\"here\"\r")
	term.expect(at, "still-here")

	term.typ("exit 3\r")
	if code := term.exitCode(); code != 3 {
		t.Fatalf("sandkeep exit %d, want the shell's 3; terminal:\n%q", code, term.outputFrom(0))
	}
}

func (term *terminal) outputFrom(from int) string {
	term.mu.Lock()
	defer term.mu.Unlock()
	return term.out.String()[min(from, term.out.Len()):]
}

// TestExecTTYDeadline: a TTY command keeps its deadline and tree kill; sandkeep restores the terminal and says so.
func TestExecTTYDeadline(t *testing.T) {
	c := newCLI(t)
	tenant := c.ten("ttyd")
	term := c.terminal(t, 24, 80, "exec", "--tenant", tenant, "--user", "u", "-it", "--timeout", "2s", "--",
		"sh", "-c", "sleep 300 & echo started; wait")
	term.expect(0, "started")
	if code := term.exitCode(); code != exitTimeout {
		t.Fatalf("exit %d, want %d:\n%q", code, exitTimeout, term.outputFrom(0))
	}
	term.expect(0, "timed out")
	// The sandbox's terminal is gone with its tree: no sleep 300 survives the deadline.
	r := c.run(t, "exec", "--tenant", tenant, "--user", "u", "--", "sh", "-c", "ps -o args | grep -c '[s]leep 300' || true")
	if strings.TrimSpace(r.want(t, 0).stdout) != "0" {
		t.Fatalf("sleep 300 survived: %q", r.stdout)
	}
}
