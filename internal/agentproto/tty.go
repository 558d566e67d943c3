package agentproto

import (
	"encoding/binary"
	"fmt"
)

// WindowSize is a terminal's size in character cells. The host sends it in a TTY Request and in FrameResize
// frames when the caller's terminal changes size.
type WindowSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Bounds on a window size: at least one cell, at most what any real terminal has.
const (
	MaxWindowRows = 1000
	MaxWindowCols = 1000
)

// DefaultWindowSize is the size of a pseudo-terminal whose caller did not say (not a terminal itself).
var DefaultWindowSize = WindowSize{Rows: 24, Cols: 80}

// Check reports whether the size is within bounds.
func (ws WindowSize) Check() error {
	if ws.Rows == 0 || ws.Cols == 0 || ws.Rows > MaxWindowRows || ws.Cols > MaxWindowCols {
		return fmt.Errorf("%w: window size %dx%d outside 1x1..%dx%d", ErrBadRequest, ws.Rows, ws.Cols,
			MaxWindowRows, MaxWindowCols)
	}
	return nil
}

// resizePayload is the size of a FrameResize payload: rows and columns, 2 bytes each, big-endian.
const resizePayload = 4

// EncodeWindowSize is the payload of a FrameResize frame.
func EncodeWindowSize(ws WindowSize) []byte {
	b := make([]byte, 0, resizePayload)
	b = binary.BigEndian.AppendUint16(b, ws.Rows)
	return binary.BigEndian.AppendUint16(b, ws.Cols)
}

// DecodeWindowSize parses a FrameResize payload; a payload of another length or a size out of bounds wraps
// ErrProtocol.
func DecodeWindowSize(p []byte) (WindowSize, error) {
	if len(p) != resizePayload {
		return WindowSize{}, fmt.Errorf("%w: resize payload of %d bytes, want %d", ErrProtocol, len(p), resizePayload)
	}
	ws := WindowSize{Rows: binary.BigEndian.Uint16(p[0:2]), Cols: binary.BigEndian.Uint16(p[2:4])}
	if err := ws.Check(); err != nil {
		return WindowSize{}, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return ws, nil
}
