package agentproto

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Conn is a byte stream to one agent: Read gets the agent's frames, Write sends frames to it.
//
// When Conn also has SetReadDeadline / SetWriteDeadline (a net.Conn does), Run uses them to unblock its own
// pending I/O when it gives up on a broken channel; the deadlines are then left in the past, because a broken
// channel is not reused.
type Conn interface {
	io.Reader
	io.Writer
}

// ReportSlack is how long the host waits for the agent's report beyond the command's own bounds: after a
// cancel, GraceMS + ReportSlack; in any case, TimeoutMS + GraceMS + ReportSlack after sending the request.
const ReportSlack = 5 * time.Second

// stdinChunk is the largest 'I' payload the host sends; it matches the agent's output chunks.
const stdinChunk = 32 << 10

// Run sends req on conn, streams the command's output to stdout and stderr (either may be nil: discarded) and
// its stdin from stdin (nil: no stdin frames, and req.Stdin must then be false; when req.Stdin is false stdin is
// not read), and returns the agent's Result.
//
// The host never trusts the agent: output is re-bounded here with the same Limiter the agent uses (the
// truncation flags are the agent's OR the host's), bytes past a limit are discarded rather than buffered, and a
// frame for another command, an unknown or oversized frame, a malformed Result, or a stream that ends before
// the Result is an error wrapping ErrProtocol (and io.ErrUnexpectedEOF for a cut stream). After an ErrProtocol
// the channel is broken and must not be reused.
//
// When ctx is done, Run sends a cancel frame and waits for the Result at most GraceMS + ReportSlack; it then
// returns the agent's Result (Cancelled set) with an error wrapping context.Cause(ctx), or an ErrProtocol
// ("agent did not stop"). Without any Result TimeoutMS + GraceMS + ReportSlack after the request, Run gives up
// the same way.
//
// A write error on stdout or stderr stops the copying to that writer; Run still waits for the Result and
// returns it with that error.
//
// Goroutines: no frame write starts after Run returns, and Run waits for a write in progress, except on a
// broken channel whose conn has no SetWriteDeadline (then a write blocked on a stuck agent may end later). Run
// waits for its frame reader, except when the agent went silent on a conn without SetReadDeadline: that reader
// then stays blocked in conn.Read until the caller closes conn, and touches nothing when it wakes. The stdin
// pump may stay blocked in stdin.Read after Run returns (an io.Reader cannot be interrupted); when that Read
// returns, the pump exits without writing.
func Run(ctx context.Context, conn Conn, req Request, stdout, stderr io.Writer, stdin io.Reader) (Result, error) {
	return RunWith(ctx, conn, req, stdout, stderr, stdin, RunOptions{})
}

// ErrNotAccepted means the agent did not acknowledge the request within RunOptions.AcceptWait: the command
// never started there. The channel is broken (it wraps ErrProtocol), and the request may still sit unread in a
// frozen agent, so the sandbox must be recycled before the command is run anywhere else.
var ErrNotAccepted = fmt.Errorf("%w: the agent did not accept the request", ErrProtocol)

// ErrCutBeforeAccept means the channel failed (the request could not be sent, or the stream ended or broke)
// before the agent acknowledged the request. Unlike ErrNotAccepted nothing is known to be stuck: a driver that
// finds the sandbox itself gone may report that instead, since no command of this request ran anywhere else.
var ErrCutBeforeAccept = fmt.Errorf("%w: the channel failed before the agent accepted the request", ErrProtocol)

// RunOptions tune Run.
type RunOptions struct {
	// AcceptWait, when positive, bounds the wait for the agent's FrameAccepted; past it Run returns
	// ErrNotAccepted. Zero waits as long as the command's own bounds allow.
	AcceptWait time.Duration
	// Resize, for a TTY request, carries the caller's window size changes; each becomes a FrameResize. Run stops
	// reading it when it returns; the sender never needs to close it. Ignored without req.TTY.
	Resize <-chan WindowSize
}

// RunWith is Run with options.
func RunWith(ctx context.Context, conn Conn, req Request, stdout, stderr io.Writer, stdin io.Reader, opts RunOptions) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	if req.Stdin && stdin == nil {
		return Result{}, fmt.Errorf("%w: stdin requested but no reader given", ErrBadRequest)
	}
	if ctx.Err() != nil {
		return Result{}, fmt.Errorf("agent command %d: %w", req.ID, context.Cause(ctx))
	}
	body, err := json.Marshal(req)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	r := &run{
		req:    req,
		conn:   conn,
		fw:     NewFrameWriter(conn),
		out:    stream{w: stdout, lim: NewLimiter(req.StdoutLimit)},
		errs:   stream{w: stderr, lim: NewLimiter(req.StderrLimit)},
		frames: make(chan readItem),
		next:   make(chan struct{}),
		done:   make(chan struct{}),
		exited: make(chan struct{}),
	}
	if err := r.fw.WriteFrame(FrameRequest, req.ID, body); err != nil {
		r.fw.stop(false)
		return Result{}, fmt.Errorf("%w: send request %d: %w", ErrCutBeforeAccept, req.ID, err)
	}
	if dq, ok := conn.(interface{ direct() *muxCommands }); ok {
		r.queue = dq.direct()
	}
	if r.queue != nil { // a Mux's command queue: loop takes its frames itself
		close(r.exited)
	} else {
		go r.readFrames()
	}
	if req.Stdin {
		go pumpStdin(r.fw, req.ID, stdin) // not waited for: see the doc comment
	}
	if req.TTY != nil && opts.Resize != nil {
		r.cancel.Add(1)
		go func() { defer r.cancel.Done(); r.pumpResize(opts.Resize) }()
	}
	res, end, err := r.loop(ctx, opts.AcceptWait)
	r.finish(end)
	return res, err
}

// run is the state of one Run call.
type run struct {
	req    Request
	conn   Conn
	fw     *FrameWriter
	out    stream
	errs   stream
	frames chan readItem  // reader -> loop, one frame at a time
	queue  *muxCommands   // when set, loop reads the Mux's queue itself and there is no reader
	next   chan struct{}  // loop -> reader: the frame was handled, its buffer may be reused
	done   chan struct{}  // closed when Run returns
	exited chan struct{}  // closed when the reader has returned
	cancel sync.WaitGroup // the goroutines sending the cancel frame and resize frames
	sentC  bool           // a cancel frame was sent (or is being sent)
	acked  bool           // FrameAccepted arrived
}

type readItem struct {
	f   Frame
	err error
}

// stream is one output stream on the host side.
type stream struct {
	w   io.Writer // nil: discard
	lim *Limiter
	err error // the first write error of w; after it, w is no longer written
}

func (s *stream) write(p []byte) {
	if len(p) == 0 || s.w == nil || s.err != nil {
		return
	}
	if _, err := s.w.Write(p); err != nil {
		s.err = err
	}
}

// ending says how loop ended, which decides what finish may wait for.
type ending int

const (
	endResult  ending = iota // the agent reported: it is alive and reading, the reader has returned
	endBadData               // the agent sent garbage: the reader returns when done closes
	endTimeout               // the agent went silent: the reader may be blocked in conn.Read
)

// loop handles frames until the Result, a protocol error or a timeout.
func (r *run) loop(ctx context.Context, acceptWait time.Duration) (res Result, end ending, err error) {
	id := r.req.ID
	backstop := time.NewTimer(r.req.Timeout() + r.req.Grace() + ReportSlack)
	defer backstop.Stop()
	var acceptBound <-chan time.Time
	if acceptWait > 0 {
		t := time.NewTimer(acceptWait)
		defer t.Stop()
		acceptBound = t.C
	}
	var stopBound <-chan time.Time
	ctxDone := ctx.Done()
	var (
		queued     <-chan queued
		dead, gone <-chan struct{}
		buf        []byte
	)
	if q := r.queue; q != nil {
		queued, dead, gone = q.frames, q.m.dead, q.gone
	}
	for {
		var (
			it     readItem
			direct bool
		)
		select {
		case it = <-r.frames:
		case b := <-queued:
			it.f, it.err = r.queue.frame(b, &buf)
			direct = true
		case <-dead:
			it.f, it.err = r.queue.ended(&buf)
			direct = true
		case <-gone:
			it.f, it.err = r.queue.ended(&buf)
			direct = true
		case <-ctxDone:
			ctxDone = nil
			r.sendCancel()
			t := time.NewTimer(r.req.Grace() + ReportSlack)
			defer t.Stop()
			stopBound = t.C
			continue
		case <-acceptBound:
			return Result{}, endTimeout, fmt.Errorf("agent command %d: %w within %v", id, ErrNotAccepted, acceptWait)
		case <-stopBound:
			return Result{}, endTimeout, fmt.Errorf("agent command %d: %w: agent did not stop within %v of the cancel: %w",
				id, ErrProtocol, r.req.Grace()+ReportSlack, context.Cause(ctx))
		case <-backstop.C:
			r.sendCancel()
			return Result{}, endTimeout, fmt.Errorf("agent command %d: %w: agent did not report within timeout + grace + %v",
				id, ErrProtocol, ReportSlack)
		}
		{
			if it.err != nil && !r.acked && !errors.Is(it.err, ErrProtocol) {
				return Result{}, endBadData, fmt.Errorf("agent command %d: %w: %w", id, ErrCutBeforeAccept, unexpectedEOF(it.err))
			}
			if it.err != nil {
				return Result{}, endBadData, fmt.Errorf("agent command %d: %w", id, protocolErr(it.err))
			}
			res, final, err := r.handle(it.f)
			if !final && err != nil {
				return Result{}, endBadData, err
			}
			if final {
				if r.sentC {
					err = errors.Join(err, fmt.Errorf("agent command %d: %w", id, context.Cause(ctx)))
				}
				return res, endResult, err
			}
			if r.acked {
				acceptBound = nil
			}
			if !direct {
				r.next <- struct{}{} // the reader is waiting for this (it only returns after an error or 'R')
			}
		}
	}
}

// protocolErr makes sure a read failure (io.EOF included) counts as a broken channel.
func protocolErr(err error) error {
	if errors.Is(err, ErrProtocol) {
		return err
	}
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: stream ended before the result: %w", ErrProtocol, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("%w: %w", ErrProtocol, err)
}

// unexpectedEOF: a stream that ends before the Result ended too early.
func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// handle applies one frame from the agent; final is true for a valid Result.
func (r *run) handle(f Frame) (res Result, final bool, err error) {
	if f.ID != r.req.ID {
		return Result{}, false, fmt.Errorf("%w: frame %v for command %d during command %d", ErrProtocol, f.Type, f.ID, r.req.ID)
	}
	switch f.Type {
	case FrameAccepted:
		if r.acked {
			return Result{}, false, fmt.Errorf("%w: command %d accepted twice", ErrProtocol, r.req.ID)
		}
		r.acked = true
	case FrameStdout:
		r.out.write(r.out.lim.Write(f.Payload))
	case FrameStderr:
		r.errs.write(r.errs.lim.Write(f.Payload))
	case FrameResult:
		res, err := DecodeResult(f.Payload, r.req.ID)
		if err != nil {
			return Result{}, false, fmt.Errorf("agent command %d: %w", r.req.ID, err)
		}
		r.out.write(r.out.lim.Flush())
		r.errs.write(r.errs.lim.Flush())
		res.StdoutTruncated = res.StdoutTruncated || r.out.lim.Truncated()
		res.StderrTruncated = res.StderrTruncated || r.errs.lim.Truncated()
		return res, true, errors.Join(r.out.err, r.errs.err)
	default:
		return Result{}, false, fmt.Errorf("%w: unexpected frame %v from the agent", ErrProtocol, f.Type)
	}
	return Result{}, false, nil
}

// readFrames reads the agent's frames one at a time and hands each to loop; it stops after an error or the
// Result, so that it never consumes a frame that belongs to the next command on a shared channel.
func (r *run) readFrames() {
	defer close(r.exited)
	var buf []byte
	for {
		f, err := ReadFrame(r.conn, &buf)
		select {
		case r.frames <- readItem{f, err}:
		case <-r.done:
			return
		}
		if err != nil || f.Type == FrameResult {
			return
		}
		select {
		case <-r.next:
		case <-r.done:
			return
		}
	}
}

// sendCancel sends one cancel frame without blocking loop: the stdin pump may hold the writer.
func (r *run) sendCancel() {
	if r.sentC {
		return
	}
	r.sentC = true
	r.cancel.Add(1)
	go func() {
		defer r.cancel.Done()
		_ = r.fw.WriteFrame(FrameCancel, r.req.ID, nil) // a failure shows up on the read side
	}()
}

// pumpResize turns window size changes into FrameResize frames until Run returns. A size out of bounds is
// clamped into them: the caller's terminal is not the agent's business.
func (r *run) pumpResize(resize <-chan WindowSize) {
	for {
		select {
		case ws := <-resize:
			ws.Rows = min(max(ws.Rows, 1), MaxWindowRows)
			ws.Cols = min(max(ws.Cols, 1), MaxWindowCols)
			if r.fw.WriteFrame(FrameResize, r.req.ID, EncodeWindowSize(ws)) != nil {
				return
			}
		case <-r.done:
			return
		}
	}
}

// finish stops every writer to conn and the reader before Run returns.
//
// After a Result the agent is alive and reads its stdin, so a write in progress ends and is waited for. On a
// broken channel a write may block forever (an agent that stopped reading): Run forces it out with a write
// deadline when conn has one, and otherwise only makes sure no new write starts.
func (r *run) finish(end ending) {
	close(r.done)
	past := time.Unix(1, 0)
	wait := end == endResult
	if d, ok := r.conn.(interface{ SetWriteDeadline(time.Time) error }); ok && !wait {
		wait = d.SetWriteDeadline(past) == nil
	}
	r.fw.stop(wait)
	if wait {
		r.cancel.Wait()
	}
	if end != endTimeout {
		<-r.exited
		return
	}
	if d, ok := r.conn.(interface{ SetReadDeadline(time.Time) error }); ok && d.SetReadDeadline(past) == nil {
		<-r.exited
	}
}

// pumpStdin copies stdin into 'I' frames and ends with 'i'. It stops at the first failed write, which includes
// every write after Run returned.
func pumpStdin(fw *FrameWriter, id uint32, stdin io.Reader) {
	buf := make([]byte, stdinChunk)
	for {
		n, err := stdin.Read(buf)
		if n > 0 {
			if fw.WriteFrame(FrameStdin, id, buf[:n]) != nil {
				return
			}
		}
		if err != nil { // io.EOF or a failing reader: either way the command's stdin ends here
			_ = fw.WriteFrame(FrameStdinEOF, id, nil)
			return
		}
	}
}
