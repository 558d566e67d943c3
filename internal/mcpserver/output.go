package mcpserver

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/sandkeep/sandkeep/internal/files"
)

// DefaultResultLimit bounds each of stdout and stderr in an exec tool result. The SDK encodes a tool result
// whole (as structured content and again as its JSON text, both escaped), so what the result holds is what
// the server holds per call, several times over; the rest of the output goes to a file in the workspace.
const DefaultResultLimit = 64 << 10

// OutputDir is where, inside /workspace, exec keeps the whole output of a stream that passed the result limit.
const OutputDir = ".sandkeep/output"

// capture is one exec stream: it keeps the first limit bytes for the result and, once the stream passes them,
// sends all of it (those bytes again, then the rest) through a pipe into a file of the workspace, so the server
// holds a bounded amount whatever the command prints. A failing spill never fails the command: the result
// then says the rest was lost.
type capture struct {
	ctx   context.Context
	open  func() (*files.FS, error) // the workspace, opened on the first spill
	path  string                    // relative to /workspace
	limit int

	mu       sync.Mutex // guards what follows; the library may write from its own goroutine
	head     []byte
	total    int64
	pw       *io.PipeWriter
	done     chan error // the spill's result, once pw is closed
	spillErr error
}

func newCapture(ctx context.Context, open func() (*files.FS, error), path string, limit int) *capture {
	return &capture{ctx: ctx, open: open, path: path, limit: limit}
}

func (c *capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total += int64(len(p))
	if room := c.limit - len(c.head); room > 0 {
		take := min(room, len(p))
		c.head = append(c.head, p[:take]...)
		if take == len(p) {
			return len(p), nil
		}
		if c.pw == nil && c.spillErr == nil {
			c.startSpill()
		}
		c.spill(p[take:])
		return len(p), nil
	}
	if c.pw == nil && c.spillErr == nil {
		c.startSpill()
	}
	c.spill(p)
	return len(p), nil
}

// startSpill opens the file and sends it the head kept so far. Called with mu held.
func (c *capture) startSpill() {
	ws, err := c.open()
	if err != nil {
		c.spillErr = err
		return
	}
	pr, pw := io.Pipe()
	c.pw, c.done = pw, make(chan error, 1)
	go func() { // owned by finish, which waits on done
		_, err := ws.Write(c.ctx, c.path, pr, 0o644)
		pr.CloseWithError(err) // unblocks a writer when the file failed
		ws.Close()
		c.done <- err
	}()
	c.spill(c.head)
}

// spill sends p to the file. Called with mu held.
func (c *capture) spill(p []byte) {
	if c.pw == nil || c.spillErr != nil {
		return
	}
	if _, err := c.pw.Write(p); err != nil {
		c.spillErr = err
	}
}

// finish ends the spill and returns the stream's kept text, and the file holding the whole stream ("" when it
// all fits, or the file could not be written). truncated is the library's: output past its own limit.
func (c *capture) finish(truncated bool) (text, file string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pw != nil {
		c.pw.Close()
		if err := <-c.done; err != nil && c.spillErr == nil {
			c.spillErr = err
		}
		c.pw = nil
	}
	text = strings.ToValidUTF8(string(c.head), "\uFFFD")
	if c.total <= int64(c.limit) {
		return text, ""
	}
	switch {
	case c.spillErr != nil:
		text += fmt.Sprintf("\n[sandkeep: output cut at %d of %d bytes; the rest could not be kept: redirect it to a file (cmd > out.txt) and read that]", c.limit, c.total)
	default:
		file = "/workspace/" + c.path
		more := ""
		if truncated {
			more = ", itself cut at the output limit"
		}
		text += fmt.Sprintf("\n[sandkeep: output cut at %d of %d bytes; all of it is in %s%s]", c.limit, c.total, file, more)
	}
	return text, file
}

// outputName is a fresh name for one exec's output files.
func outputName() string { return OutputDir + "/" + rand.Text() }
