package agentproto

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// MuxConn is the channel a Mux reads and writes: a net.Conn (the agent's Unix connection).
type MuxConn interface {
	io.ReadWriteCloser
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// commandQueue bounds the command frames the Mux holds for a command that has not read them yet. A command's
// output has no credit of its own (the agent's pumps wait on the channel): when its reader falls this far
// behind, the Mux stops reading the channel until it catches up, which holds up the forwarded streams too.
// Run's reader only stops for as long as its stdout and stderr writers block. So a command that floods its
// output while its reader stalls stays bounded without credit (TestMuxOutputStalledReader measures it), at the
// price of holding up the channel's streams meanwhile.
const commandQueue = 64

// Mux is the host's side of a channel that carries commands and forwarded streams at once. Its reader owns the
// channel's reads: forward frames go to their streams (each within its window, so that reader never waits for a
// stream), every other frame to Commands, the Conn a command's Run reads as it would read the channel itself.
// Writes from Run and from the streams go to the channel whole, one frame per Write (net.Conn does not
// interleave concurrent Writes).
type Mux struct {
	conn  MuxConn
	fw    *FrameWriter
	table *ForwardTable
	cmd   *muxCommands

	mu      sync.Mutex
	nextID  uint32
	pending map[uint32]chan error // forward opens waiting for the agent's reply

	routes routes // command IDs whose frames go to a Conn of their own (Route), beside Commands

	// midCmd is the sequence number of the frame the reader is inside when that frame is for Commands (not a
	// forward frame, not a routed one, or not known yet), else 0. It stays set until the reader has queued the
	// frame, which Commands' reader may already have taken by then: Idle compares it with cmd.taken.
	midCmd  atomic.Uint64
	closing chan struct{} // closed by closeConn: a reader waiting on a full command queue gives up
	dead    chan struct{} // closed when the reader has ended
	deadErr error         // why; set before dead is closed
	once    sync.Once     // closeConn
}

// NewMux starts reading conn. The caller must not read conn itself; Close closes it.
func NewMux(conn MuxConn) *Mux {
	m := &Mux{conn: conn, fw: NewFrameWriter(conn), pending: map[uint32]chan error{},
		closing: make(chan struct{}), dead: make(chan struct{})}
	m.table = NewForwardTable(m.fw, func(error) { m.closeConn() })
	m.cmd = &muxCommands{m: m, frames: make(chan queued, commandQueue), wake: make(chan struct{})}
	go m.read()
	return m
}

// Commands is the Conn a command runs on (Run, RunWith): its reads are the channel's command frames, its
// writes go to the channel.
func (m *Mux) Commands() Conn { return m.cmd }

// Alive reports whether the channel is still up.
func (m *Mux) Alive() bool {
	select {
	case <-m.dead:
		return false
	default:
		return true
	}
}

// Idle reports whether the channel is up and no command frame waits to be read: between commands the agent sends
// none, so a waiting one means a broken protocol. A frame the last command already took (its result) does not
// count, even while the reader has not yet noted that it queued it: the next command may come that fast.
func (m *Mux) Idle() bool {
	mid := m.midCmd.Load() // before taken: a frame marked here and taken since is not waiting
	return m.Alive() && (mid == 0 || mid <= m.cmd.taken.Load()) && m.cmd.empty()
}

// watch is the channel as the Mux's reader reads it: it notes the type byte of each frame as it arrives, so that
// a command frame (or garbage) the agent sent while idle shows before the whole frame is in. While routes are
// open it waits for the frame's ID too: a frame for a routed command (a concurrent one, a process operation) is
// not a frame for Commands.
type watch struct {
	m     *Mux
	seq   uint64  // the frame's sequence number on the channel, from 1
	start bool    // the next byte read is a frame's first
	hdr   [5]byte // the frame's type and ID, as far as read
	n     int
}

func (w *watch) Read(p []byte) (int, error) {
	n, err := w.m.conn.Read(p)
	if w.start {
		w.n = 0
	}
	for i := 0; i < n && w.n < len(w.hdr); i++ {
		w.hdr[w.n] = p[i]
		w.n++
		forward := IsForwardFrame(FrameType(w.hdr[0]))
		switch {
		case w.n == 1 && (forward || w.m.routes.count() == 0):
			w.mark(!forward)
		case w.n == len(w.hdr) && !forward:
			w.mark(!w.m.routes.has(binary.BigEndian.Uint32(w.hdr[1:5])))
		}
	}
	if n > 0 {
		w.start = false
	}
	return n, err
}

// mark notes whether the frame being read is for Commands.
func (w *watch) mark(cmd bool) {
	if cmd {
		w.m.midCmd.Store(w.seq)
	} else {
		w.m.midCmd.Store(0)
	}
}

// Done is closed when the channel has ended.
func (m *Mux) Done() <-chan struct{} { return m.dead }

// Streams is the number of forwarded streams open now.
func (m *Mux) Streams() int { return m.table.Len() }

// Close closes the channel, ends every stream, and waits for the reader.
func (m *Mux) Close() error {
	err := m.closeConn()
	<-m.dead
	return err
}

// closeConn closes the channel once; the reader then ends.
func (m *Mux) closeConn() error {
	var err error
	m.once.Do(func() {
		close(m.closing)
		err = m.conn.Close()
	})
	return err
}

// Dial opens a forwarded stream to target, which the agent connects to from inside the sandbox. The agent
// refuses anything but a loopback address (ErrForwardRefused); a port nothing accepts on is
// ErrForwardUnreachable. ctx bounds the wait for the agent's answer only.
func (m *Mux) Dial(ctx context.Context, target netip.AddrPort) (*Stream, error) {
	if err := CheckForwardTarget(target); err != nil {
		return nil, err // the agent would refuse it too; no need to ask
	}
	return m.dial(ctx, target)
}

// dial is Dial without the host's own check (tests use it to show that the agent refuses by itself).
func (m *Mux) dial(ctx context.Context, target netip.AddrPort) (*Stream, error) {
	reply := make(chan error, 1)
	m.mu.Lock()
	m.nextID++
	id := m.nextID
	m.pending[id] = reply
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.pending, id)
		m.mu.Unlock()
	}()
	s, err := m.table.Add(id)
	if err != nil {
		return nil, err
	}
	if err := m.fw.WriteFrame(FrameForwardOpen, id, EncodeForwardOpen(target)); err != nil {
		s.Close()
		return nil, fmt.Errorf("%w: forward open: %w", ErrProtocol, err)
	}
	select {
	case err := <-reply:
		if err != nil {
			m.table.Drop(id)
			return nil, err
		}
		return s, nil
	case <-ctx.Done():
		s.Close() // the agent drops the stream, connected or not
		return nil, context.Cause(ctx)
	case <-m.dead:
		return nil, fmt.Errorf("forward to %s: %w", target, m.deadErr)
	}
}

// read owns the channel's reads until it ends.
func (m *Mux) read() {
	var buf []byte
	w := &watch{m: m}
	err := func() error {
		for {
			w.start = true
			w.seq++
			f, err := ReadFrame(w, &buf)
			if err != nil {
				return err
			}
			switch {
			case f.Type == FrameForwardReply:
				rerr := DecodeForwardReply(f.Payload)
				if errors.Is(rerr, ErrProtocol) {
					return rerr
				}
				m.mu.Lock()
				reply := m.pending[f.ID]
				m.mu.Unlock()
				if reply != nil {
					reply <- rerr // room for one; the ID is answered once
				} else if rerr == nil {
					m.table.Drop(f.ID) // connected after the host gave up: the agent is told by the close already sent
				}
			case f.Type == FrameForwardOpen:
				return fmt.Errorf("%w: the agent opened a forward", ErrProtocol)
			case IsForwardFrame(f.Type):
				if err := m.table.Handle(f); err != nil {
					return err
				}
			default:
				q, routed := m.routes.lookup(f.ID)
				if !routed {
					q = m.cmd
				}
				if q != nil && !q.push(queued{appendFrame(nil, f.Type, f.ID, f.Payload), w.seq}, m.closing) {
					return net.ErrClosed
				}
			}
			if afterQueued != nil {
				afterQueued(f)
			}
			m.midCmd.Store(0) // a whole command frame is in the queue by now (or taken), where Idle sees it
		}
	}()
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("%w: the agent's channel ended: %w", ErrProtocol, io.ErrUnexpectedEOF)
	} else if !errors.Is(err, ErrProtocol) {
		err = fmt.Errorf("%w: agent channel: %w", ErrProtocol, err)
	}
	m.deadErr = err
	m.table.CloseAll(err)
	m.closeConn()
	close(m.dead)
}

// afterQueued, when set (by tests), runs in the reader after each frame for a command was queued and before the
// reader notes it: the moment a command may already have its result.
var afterQueued func(Frame)

// queued is one encoded command frame and its sequence number on the channel.
type queued struct {
	b   []byte
	seq uint64
}

// muxCommands is Mux.Commands.
type muxCommands struct {
	m      *Mux
	frames chan queued   // encoded command frames from the reader
	taken  atomic.Uint64 // the sequence number of the last frame its reader took from frames

	gone chan struct{} // a route's: closed by its Close, after which Read ends; nil for Commands

	mu   sync.Mutex    // guards cur, rdl and wake; one Read at a time in practice (Run's reader)
	cur  []byte        // the rest of the frame being read
	rdl  time.Time     // read deadline
	wake chan struct{} // closed and replaced when rdl changes
}

// push queues one encoded frame, waiting while the queue is full; false when the channel closed meanwhile.
func (c *muxCommands) push(b queued, dead <-chan struct{}) bool {
	select {
	case c.frames <- b:
		return true
	default:
	}
	// Full: the command's reader is behind; wait for it, or for the channel's end.
	select {
	case c.frames <- b:
		return true
	case <-c.gone: // a route closed meanwhile: its frames are dropped
		return true
	case <-dead:
		return false
	}
}

func (c *muxCommands) empty() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cur) == 0 && len(c.frames) == 0
}

func (c *muxCommands) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.cur) == 0 {
		var timeout <-chan time.Time
		if !c.rdl.IsZero() {
			d := time.Until(c.rdl)
			if d <= 0 {
				return 0, os.ErrDeadlineExceeded
			}
			t := time.NewTimer(d)
			defer t.Stop()
			timeout = t.C
		}
		wake := c.wake
		c.mu.Unlock()
		var (
			b        queued
			ok, fail bool
		)
		select {
		case b, ok = <-c.frames:
		case <-c.m.dead:
			select { // frames read before the end are still the command's
			case b, ok = <-c.frames:
			default:
				fail = true
			}
		case <-timeout:
			c.mu.Lock()
			return 0, os.ErrDeadlineExceeded
		case <-wake:
		case <-c.gone:
			fail = true
		}
		c.mu.Lock()
		switch {
		case fail:
			return 0, io.EOF // Run makes it a broken channel
		case ok:
			c.cur = b.b
			c.taken.Store(b.seq)
		}
	}
	n := copy(p, c.cur)
	c.cur = c.cur[n:]
	return n, nil
}

// direct is the queue RunWith takes its frames from itself, whole, rather than through Read and a reader
// goroutine of its own: one goroutine hand-off less per frame between the channel and the command (issue 26: the
// shared channel's extra step cost a warm kubernetes command 0.2-0.3 ms). nil while a partly read frame waits in
// cur, which only Read can finish.
func (c *muxCommands) direct() *muxCommands {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.cur) > 0 {
		return nil
	}
	return c
}

// frame decodes one queued frame for Run, as taken by its reader.
func (c *muxCommands) frame(b queued, buf *[]byte) (Frame, error) {
	c.taken.Store(b.seq)
	return ReadFrame(bytes.NewReader(b.b), buf)
}

// ended is what Run's direct read gets once the channel ended (or its route closed): a frame queued before the
// end, or io.EOF as Read would give.
func (c *muxCommands) ended(buf *[]byte) (Frame, error) {
	select {
	case b := <-c.frames:
		return c.frame(b, buf)
	default:
		return Frame{}, io.EOF
	}
}

func (c *muxCommands) Write(p []byte) (int, error) { return c.m.conn.Write(p) }

// SetReadDeadline bounds the command's reads only; the channel's own reader goes on.
func (c *muxCommands) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rdl = t
	close(c.wake)
	c.wake = make(chan struct{})
	return nil
}

// SetWriteDeadline is the channel's: Run sets one only on a channel it found broken.
func (c *muxCommands) SetWriteDeadline(t time.Time) error { return c.m.conn.SetWriteDeadline(t) }
