package agentproto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
)

// FrameType is the first byte of a frame header; it says what the payload carries.
type FrameType byte

// Frame types. Host to agent (the agent's stdin): FrameRequest, FrameStdin, FrameStdinEOF, FrameCancel.
// Agent to host (the agent's stdout): FrameAccepted, FrameStdout, FrameStderr, FrameResult.
const (
	FrameRequest  FrameType = 'Q' // JSON Request; payload ≤ MaxRequest
	FrameStdin    FrameType = 'I' // bytes for the command's stdin
	FrameStdinEOF FrameType = 'i' // the command's stdin ends; no payload
	FrameCancel   FrameType = 'C' // stop the command (kill its tree); no payload
	FrameResize   FrameType = 'W' // the caller's terminal changed size: rows, cols (uint16 each); TTY commands only
	FrameAccepted FrameType = 'A' // the request was read (sent before anything else of the command); no payload
	FrameStdout   FrameType = 'O' // bytes the command wrote to stdout
	FrameStderr   FrameType = 'E' // bytes the command wrote to stderr
	FrameResult   FrameType = 'R' // JSON Result; the last frame of a command
)

// HeaderSize is the size of a frame header: type (1 byte), command ID (4 bytes, big-endian), payload length
// (4 bytes, big-endian).
const HeaderSize = 9

// Frame is one decoded frame. ID is the Request.ID of the command the frame belongs to.
type Frame struct {
	Type    FrameType
	ID      uint32
	Payload []byte
}

// maxPayload returns the largest payload a frame of type t may carry, and false for an unknown type.
func maxPayload(t FrameType) (int, bool) {
	switch t {
	case FrameRequest:
		return MaxRequest, true
	case FrameStdinEOF, FrameCancel, FrameAccepted:
		return 0, true // control frames carry nothing; a payload there is garbage
	case FrameResize:
		return resizePayload, true
	case FrameStdin, FrameStdout, FrameStderr, FrameResult:
		return MaxFrame, true
	case FrameProcessOp, FrameProcessReply:
		return MaxRequest, true
	case FrameSignal:
		return 1, true
	case FrameStarted:
		return 4, true
	}
	return forwardMaxPayload(t) // port forwarding: forward.go
}

func (t FrameType) String() string {
	if t >= 0x20 && t < 0x7f {
		return fmt.Sprintf("%q", rune(t))
	}
	return fmt.Sprintf("0x%02x", byte(t))
}

// checkFrame validates a header before anything is allocated or written for it.
func checkFrame(t FrameType, n uint64) error {
	limit, ok := maxPayload(t)
	if !ok {
		return fmt.Errorf("%w: unknown frame type %v", ErrProtocol, t)
	}
	if n > uint64(limit) {
		return fmt.Errorf("%w: frame %v payload of %d bytes exceeds %d", ErrProtocol, t, n, limit)
	}
	return nil
}

// appendFrame appends the encoded frame to dst.
func appendFrame(dst []byte, t FrameType, id uint32, payload []byte) []byte {
	dst = append(dst, byte(t))
	dst = binary.BigEndian.AppendUint32(dst, id)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(payload)))
	return append(dst, payload...)
}

// WriteFrame writes one frame to w in a single Write call. It refuses (with ErrProtocol) a frame that ReadFrame
// would refuse, so that a bug on the sending side shows up where it happens.
func WriteFrame(w io.Writer, t FrameType, id uint32, payload []byte) error {
	if err := checkFrame(t, uint64(len(payload))); err != nil {
		return err
	}
	_, err := w.Write(appendFrame(make([]byte, 0, HeaderSize+len(payload)), t, id, payload))
	return err
}

// ReadFrame reads one frame from r. The payload is read into *buf, which is grown when too small and kept for
// the next call, so Frame.Payload is only valid until the next ReadFrame with the same buf.
//
// The header is checked before the payload is allocated: an unknown type or a length above the type's bound
// is an error wrapping ErrProtocol. io.EOF before the first header byte is returned as is (a clean end of
// stream); a stream cut inside a frame is an error wrapping both ErrProtocol and io.ErrUnexpectedEOF.
func ReadFrame(r io.Reader, buf *[]byte) (Frame, error) {
	var hdr [HeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return Frame{}, io.EOF
		}
		return Frame{}, cutError("frame header", err)
	}
	f := Frame{Type: FrameType(hdr[0]), ID: binary.BigEndian.Uint32(hdr[1:5])}
	n := binary.BigEndian.Uint32(hdr[5:9])
	if err := checkFrame(f.Type, uint64(n)); err != nil {
		return Frame{}, err
	}
	if cap(*buf) < int(n) {
		*buf = make([]byte, n)
	}
	f.Payload = (*buf)[:n]
	if _, err := io.ReadFull(r, f.Payload); err != nil {
		return Frame{}, cutError("frame payload", err)
	}
	return f, nil
}

// cutError reports a stream that ended or failed inside a frame.
func cutError(where string, err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: %s: %w", ErrProtocol, where, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("%w: %s: %w", ErrProtocol, where, err)
}

// FrameWriter serializes frames from several goroutines onto one stream: each frame goes out in one Write,
// never interleaved with another. It reuses one encoding buffer.
type FrameWriter struct {
	mu      sync.Mutex // guards buf and the Write calls on w
	w       io.Writer
	buf     []byte
	stopped atomic.Bool // set by stop: later frames are refused, so nothing is written after an owner has left
}

// NewFrameWriter returns a FrameWriter writing to w.
func NewFrameWriter(w io.Writer) *FrameWriter { return &FrameWriter{w: w} }

// errStopped is returned by a FrameWriter after stop.
var errStopped = errors.New("frame writer stopped")

// WriteFrame writes one frame. It is safe for concurrent use.
func (fw *FrameWriter) WriteFrame(t FrameType, id uint32, payload []byte) error {
	if err := checkFrame(t, uint64(len(payload))); err != nil {
		return err
	}
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.stopped.Load() {
		return errStopped
	}
	fw.buf = appendFrame(fw.buf[:0], t, id, payload)
	_, err := fw.w.Write(fw.buf)
	if cap(fw.buf) > 2*(HeaderSize+MaxFrame) {
		fw.buf = nil // a request-sized buffer is not worth keeping
	}
	return err
}

// stop refuses every later frame and, when wait is true, waits for a write in progress to end.
func (fw *FrameWriter) stop(wait bool) {
	fw.stopped.Store(true)
	if wait {
		// An empty critical section: taking the lock is how to wait for the writer that holds it.
		fw.mu.Lock()
		fw.mu.Unlock() //lint:ignore SA2001 see above
	}
}
