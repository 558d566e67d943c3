package main

import (
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/term"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/agentproto"
)

// callerTTY is `exec -t` on the caller's side: the size of sandkeep's terminal, SIGWINCH turned into resizes,
// and raw mode while the command runs, so that every key (Ctrl-C included) goes to the command's terminal in
// the sandbox rather than to sandkeep. When stdin is not a terminal the command still gets one (24x80, no
// resizes) and sandkeep's own terminal is left alone.
type callerTTY struct {
	fd     int // sandkeep's stdin when it is a terminal; -1 otherwise
	resize chan agentproto.WindowSize

	stop chan struct{}  // closed by end: the SIGWINCH watcher returns
	wg   sync.WaitGroup // the SIGWINCH watcher
	old  *term.State    // the terminal's state before raw mode; nil when not in raw mode
}

// newCallerTTY looks at stdin and returns the TTY request for the command.
func newCallerTTY(stdin io.Reader) (*callerTTY, *sandkeep.TTY) {
	c := &callerTTY{fd: -1, resize: make(chan agentproto.WindowSize, 1), stop: make(chan struct{})}
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		c.fd = int(f.Fd())
	}
	return c, &sandkeep.TTY{Size: c.size(), Resize: c.resize}
}

// size is the caller's terminal size, or zero (the default) when it is not a terminal or does not say.
func (c *callerTTY) size() agentproto.WindowSize {
	if c.fd < 0 {
		return agentproto.WindowSize{}
	}
	cols, rows, err := term.GetSize(c.fd)
	if err != nil || rows <= 0 || cols <= 0 {
		return agentproto.WindowSize{}
	}
	return agentproto.WindowSize{Rows: uint16(min(rows, agentproto.MaxWindowRows)), Cols: uint16(min(cols, agentproto.MaxWindowCols))}
}

// begin puts the caller's terminal in raw mode and starts passing size changes on. end undoes both; it must be
// called once begin has been.
func (c *callerTTY) begin() error {
	if c.fd < 0 {
		return nil
	}
	old, err := term.MakeRaw(c.fd)
	if err != nil {
		return err
	}
	c.old = old
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer signal.Stop(winch)
		for {
			select {
			case <-winch:
				ws := c.size()
				if ws == (agentproto.WindowSize{}) {
					continue
				}
				select { // keep only the newest size when the command is slow to take it
				case <-c.resize:
				default:
				}
				c.resize <- ws // room: this goroutine is the only sender and just made some
			case <-c.stop:
				return
			}
		}
	}()
	return nil
}

// end stops the SIGWINCH watcher and restores the caller's terminal.
func (c *callerTTY) end() {
	close(c.stop)
	c.wg.Wait()
	if c.old != nil {
		_ = term.Restore(c.fd, c.old)
		c.old = nil
	}
}
