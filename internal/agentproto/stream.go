package agentproto

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// frameSender is where a stream's frames go: a FrameWriter on the channel.
type frameSender interface {
	WriteFrame(t FrameType, id uint32, payload []byte) error
}

// ErrStreamReset is what a stream's reads and writes return once the other side closed it outright
// (FrameForwardClose) while this side still expected bytes or wrote them.
var ErrStreamReset = errors.New("forwarded stream closed by the other side")

// Stream is one forwarded connection on a channel, on either side. It is a net.Conn: Read returns the bytes the
// other side sent (io.EOF after its FrameForwardEOF), Write sends within the other side's credit and blocks
// while there is none, CloseWrite half-closes, Close ends the stream. It holds at most ForwardWindow received
// bytes. Deadlines apply as for a net.Conn. It is safe for concurrent use, one reader and one writer at a time.
type Stream struct {
	id    uint32
	fw    frameSender
	table *ForwardTable

	mu       sync.Mutex
	wake     chan struct{} // closed and replaced whenever the state below changes
	buf      []byte        // received, not yet read; at most ForwardWindow bytes
	unacked  int           // bytes read since the last credit sent
	credit   int           // bytes this side may still send
	peerEOF  bool          // the other side half-closed: reads end with io.EOF after buf
	wroteEOF bool          // this side half-closed
	closed   bool          // Close was called
	err      error         // the stream is gone (reset by the other side, or the channel ended): the cause
	rdl, wdl time.Time     // deadlines; zero: none
}

var _ net.Conn = (*Stream)(nil)

// changed wakes every waiter; the caller holds mu.
func (s *Stream) changed() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// wait releases mu until the state changes or the deadline passes, and reports false for the deadline.
func (s *Stream) wait(deadline time.Time) bool {
	wake := s.wake
	s.mu.Unlock()
	defer s.mu.Lock()
	if deadline.IsZero() {
		<-wake
		return true
	}
	d := time.Until(deadline)
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-wake:
		return true
	case <-t.C:
		return false
	}
}

// Read reads what the other side sent.
func (s *Stream) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.mu.Lock()
	for {
		switch {
		case s.closed:
			s.mu.Unlock()
			return 0, net.ErrClosed
		case len(s.buf) > 0:
			n := copy(p, s.buf)
			s.buf = s.buf[n:]
			if len(s.buf) == 0 {
				s.buf = nil // the next delivery starts a fresh buffer instead of growing behind this one
			}
			s.unacked += n
			grant := 0
			if s.unacked >= ForwardWindow/4 && s.err == nil && !s.peerEOF {
				grant, s.unacked = s.unacked, 0
			}
			s.mu.Unlock()
			if grant > 0 { // outside mu: a write may wait for the channel
				s.sendOrReset(FrameForwardCredit, EncodeCredit(uint32(grant)))
			}
			return n, nil
		case s.peerEOF:
			s.mu.Unlock()
			return 0, io.EOF
		case s.err != nil:
			err := s.err
			s.mu.Unlock()
			return 0, err
		}
		if !s.wait(s.rdl) {
			s.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
	}
}

// Write sends p, in chunks of at most ForwardChunk, each within the other side's credit.
func (s *Stream) Write(p []byte) (int, error) {
	written := 0
	s.mu.Lock()
	for len(p) > 0 {
		switch {
		case s.closed:
			s.mu.Unlock()
			return written, net.ErrClosed
		case s.err != nil:
			err := s.err
			s.mu.Unlock()
			return written, err
		case s.wroteEOF:
			s.mu.Unlock()
			return written, fmt.Errorf("write after CloseWrite: %w", net.ErrClosed)
		case s.credit > 0:
			n := min(len(p), s.credit, ForwardChunk)
			s.credit -= n
			s.mu.Unlock()
			if err := s.fw.WriteFrame(FrameForwardData, s.id, p[:n]); err != nil {
				s.table.fail(fmt.Errorf("forward stream %d: %w", s.id, err))
				return written, err
			}
			written += n
			p = p[n:]
			s.mu.Lock()
			continue
		}
		if !s.wait(s.wdl) {
			s.mu.Unlock()
			return written, os.ErrDeadlineExceeded
		}
	}
	s.mu.Unlock()
	return written, nil
}

// sendOrReset sends a control frame; a channel that cannot carry it is gone for every stream.
func (s *Stream) sendOrReset(t FrameType, payload []byte) {
	if err := s.fw.WriteFrame(t, s.id, payload); err != nil {
		s.table.fail(fmt.Errorf("forward stream %d: %w", s.id, err))
	}
}

// CloseWrite half-closes: the other side reads EOF once it has read everything sent before.
func (s *Stream) CloseWrite() error {
	s.mu.Lock()
	if s.closed || s.err != nil || s.wroteEOF {
		s.mu.Unlock()
		return nil
	}
	s.wroteEOF = true
	s.changed()
	s.mu.Unlock()
	s.sendOrReset(FrameForwardEOF, nil)
	return nil
}

// Close ends the stream on both sides. It is idempotent.
func (s *Stream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	tell := s.err == nil // a stream the other side or the channel already ended needs no frame
	s.buf = nil
	s.changed()
	s.mu.Unlock()
	s.table.remove(s.id, s)
	if tell {
		s.sendOrReset(FrameForwardClose, nil)
	}
	return nil
}

// deliver takes bytes from the other side; more than its credit allows wraps ErrProtocol.
func (s *Stream) deliver(p []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed || s.err != nil:
		return nil // sent before the other side saw our close
	case s.peerEOF:
		return fmt.Errorf("%w: forward stream %d: data after EOF", ErrProtocol, s.id)
	case len(s.buf)+len(p) > ForwardWindow:
		return fmt.Errorf("%w: forward stream %d: %d bytes beyond the window of %d", ErrProtocol, s.id,
			len(s.buf)+len(p)-ForwardWindow, ForwardWindow)
	}
	s.buf = append(s.buf, p...)
	s.changed()
	return nil
}

// grant adds credit from the other side; credit beyond the window wraps ErrProtocol.
func (s *Stream) grant(n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.credit+n > ForwardWindow {
		return fmt.Errorf("%w: forward stream %d: credit of %d beyond the window of %d", ErrProtocol, s.id,
			s.credit+n, ForwardWindow)
	}
	s.credit += n
	s.changed()
	return nil
}

// halfClosed records the other side's EOF.
func (s *Stream) halfClosed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.peerEOF = true
	s.changed()
}

// end marks the stream gone with err (reads drain what was received first).
func (s *Stream) end(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
		s.changed()
	}
}

// LocalAddr and RemoteAddr name the stream; forwarded streams have no addresses of their own.
func (s *Stream) LocalAddr() net.Addr  { return streamAddr(s.id) }
func (s *Stream) RemoteAddr() net.Addr { return streamAddr(s.id) }

func (s *Stream) SetDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rdl, s.wdl = t, t
	s.changed()
	return nil
}

func (s *Stream) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rdl = t
	s.changed()
	return nil
}

func (s *Stream) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wdl = t
	s.changed()
	return nil
}

type streamAddr uint32

func (a streamAddr) Network() string { return "sandkeep-forward" }
func (a streamAddr) String() string  { return fmt.Sprintf("stream-%d", uint32(a)) }

// ForwardTable holds the open streams of one channel and applies the other side's forward frames to them. The
// host's Mux and the agent each keep one.
type ForwardTable struct {
	fw frameSender

	mu      sync.Mutex
	streams map[uint32]*Stream // open streams by ID; at most MaxForwards
	err     error              // set by fail: the channel is gone, every stream ended, no new one
	onFail  func(error)        // called once by fail
}

// NewForwardTable returns an empty table whose streams write through fw. onFail, when not nil, is called once
// when a stream finds the channel broken (a failed write).
func NewForwardTable(fw frameSender, onFail func(error)) *ForwardTable {
	return &ForwardTable{fw: fw, streams: map[uint32]*Stream{}, onFail: onFail}
}

// Add opens stream id with a full window each way. An ID in use, more than MaxForwards streams, or a table
// whose channel is gone is an error.
func (t *ForwardTable) Add(id uint32) (*Stream, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.err != nil:
		return nil, t.err
	case t.streams[id] != nil:
		return nil, fmt.Errorf("%w: forward stream %d is already open", ErrForwardRefused, id)
	case len(t.streams) >= MaxForwards:
		return nil, fmt.Errorf("%w: %d forwarded connections are open on this channel, the most it carries",
			ErrForwardRefused, MaxForwards)
	}
	s := &Stream{id: id, fw: t.fw, table: t, wake: make(chan struct{}), credit: ForwardWindow}
	t.streams[id] = s
	return s, nil
}

// Len is the number of open streams.
func (t *ForwardTable) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.streams)
}

func (t *ForwardTable) get(id uint32) *Stream {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.streams[id]
}

// remove drops id when it is still s.
func (t *ForwardTable) remove(id uint32, s *Stream) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.streams[id] == s {
		delete(t.streams, id)
	}
}

// Handle applies one frame of the other side to its stream: data, credit, EOF or close. A frame for a stream
// that is not open (closed here while the frame was on its way) is dropped. It never blocks on a stream's
// reader. An error wraps ErrProtocol: the channel is broken.
func (t *ForwardTable) Handle(f Frame) error {
	s := t.get(f.ID)
	if s == nil {
		return nil
	}
	switch f.Type {
	case FrameForwardData:
		return s.deliver(f.Payload)
	case FrameForwardCredit:
		n, err := DecodeCredit(f.Payload)
		if err != nil {
			return err
		}
		return s.grant(n)
	case FrameForwardEOF:
		s.halfClosed()
	case FrameForwardClose:
		t.remove(f.ID, s)
		s.end(ErrStreamReset)
	default:
		return fmt.Errorf("%w: frame %v is not for an open stream", ErrProtocol, f.Type)
	}
	return nil
}

// Drop ends stream id as the other side's FrameForwardClose would, without sending anything.
func (t *ForwardTable) Drop(id uint32) {
	if s := t.get(id); s != nil {
		t.remove(id, s)
		s.end(ErrStreamReset)
	}
}

// CloseAll ends every stream with err (the channel ended) and refuses new ones.
func (t *ForwardTable) CloseAll(err error) {
	t.mu.Lock()
	if t.err == nil {
		t.err = err
	}
	all := t.streams
	t.streams = map[uint32]*Stream{}
	t.mu.Unlock()
	for _, s := range all {
		s.end(err)
	}
}

// fail: a stream could not write to the channel, which is then gone for all of them.
func (t *ForwardTable) fail(err error) {
	t.mu.Lock()
	first := t.err == nil
	onFail := t.onFail
	t.mu.Unlock()
	t.CloseAll(err)
	if first && onFail != nil {
		onFail(err)
	}
}
