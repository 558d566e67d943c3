package agentproto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Port forwarding on the agent channel. The host opens a stream with FrameForwardOpen naming a loopback address
// and port inside the sandbox; the agent connects to it from the sandbox's own network namespace (the sandbox
// keeps network mode none) and answers FrameForwardReply. The stream's bytes then go both ways in
// FrameForwardData frames, each side sending only as many bytes as the other side granted: every stream starts
// with ForwardWindow bytes of credit per direction, and the receiver grants more (FrameForwardCredit) as its
// reader consumes what it holds. A receiver therefore never holds more than ForwardWindow bytes of a stream, and
// the reader of the channel never waits for a slow stream: a slow reader stops only its own stream's sender.
// FrameForwardEOF half-closes the sender's direction (a TCP FIN); FrameForwardClose ends the stream at once,
// from either side, with no answer.
//
// Forward frames carry the stream's ID in the header's ID field; the host picks the IDs. They are told apart
// from a command's frames by their types, so the two kinds share the channel without sharing an ID space, and
// any number of streams run alongside (and between) commands.
const (
	FrameForwardOpen   FrameType = 'P' // host -> agent: open a stream to the address in the payload (EncodeForwardOpen)
	FrameForwardReply  FrameType = 'p' // agent -> host: one code byte (ForwardOK...), then a reason in UTF-8 text
	FrameForwardData   FrameType = 'D' // both ways: bytes of the stream, within the receiver's credit
	FrameForwardCredit FrameType = 'K' // both ways: uint32, big-endian: the receiver consumed that many more bytes
	FrameForwardEOF    FrameType = 'H' // both ways: the sender writes no more on this stream; no payload
	FrameForwardClose  FrameType = 'x' // both ways: the stream is gone; no payload, no answer
)

// Bounds of port forwarding.
const (
	// ForwardWindow is the credit each side starts a stream with, per direction, and the most a receiver holds.
	ForwardWindow = 256 << 10
	// MaxForwards is the most streams one channel carries at once; the agent refuses an open beyond it. With
	// ForwardWindow it bounds what forwarding holds in memory on either side: MaxForwards * ForwardWindow.
	MaxForwards = 128
	// ForwardChunk is the largest FrameForwardData payload a sender makes.
	ForwardChunk = 32 << 10
	// maxForwardReason bounds a refusal's text.
	maxForwardReason = 512
)

// Reply codes, the first byte of a FrameForwardReply payload.
const (
	ForwardOK          byte = 0 // connected; the stream is open
	ForwardRefused     byte = 1 // the agent will not connect there (not a loopback address, too many streams, a reused ID)
	ForwardUnreachable byte = 2 // nothing accepted the connection
)

// ErrForwardRefused and ErrForwardUnreachable are the agent's two ways of saying no to a stream.
var (
	ErrForwardRefused     = errors.New("forward refused by the agent")
	ErrForwardUnreachable = errors.New("forward target unreachable")
)

// forwardMaxPayload is maxPayload for the forward frame types.
func forwardMaxPayload(t FrameType) (int, bool) {
	switch t {
	case FrameForwardOpen:
		return forwardOpen6, true
	case FrameForwardReply:
		return 1 + maxForwardReason, true
	case FrameForwardData:
		return MaxFrame, true
	case FrameForwardCredit:
		return 4, true
	case FrameForwardEOF, FrameForwardClose:
		return 0, true
	}
	return 0, false
}

// IsForwardFrame reports whether t is one of the port forwarding frame types.
func IsForwardFrame(t FrameType) bool {
	_, ok := forwardMaxPayload(t)
	return ok
}

// The open payload: the port (2 bytes, big-endian) then the address (4 bytes for IPv4, 16 for IPv6).
const (
	forwardOpen4 = 2 + 4
	forwardOpen6 = 2 + 16
)

// EncodeForwardOpen is the payload of a FrameForwardOpen frame for target.
func EncodeForwardOpen(target netip.AddrPort) []byte {
	b := binary.BigEndian.AppendUint16(nil, target.Port())
	return append(b, target.Addr().Unmap().AsSlice()...)
}

// DecodeForwardOpen parses a FrameForwardOpen payload. A payload of another length, port 0 or an address with
// a zone wraps ErrProtocol. It does not judge the address: CheckForwardTarget does.
func DecodeForwardOpen(p []byte) (netip.AddrPort, error) {
	if len(p) != forwardOpen4 && len(p) != forwardOpen6 {
		return netip.AddrPort{}, fmt.Errorf("%w: forward open payload of %d bytes, want %d or %d", ErrProtocol, len(p),
			forwardOpen4, forwardOpen6)
	}
	port := binary.BigEndian.Uint16(p[:2])
	if port == 0 {
		return netip.AddrPort{}, fmt.Errorf("%w: forward to port 0", ErrProtocol)
	}
	addr, ok := netip.AddrFromSlice(p[2:])
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%w: forward address of %d bytes", ErrProtocol, len(p)-2)
	}
	return netip.AddrPortFrom(addr, port), nil
}

// CheckForwardTarget reports whether the agent may connect to target: only a loopback address inside the
// sandbox (127.0.0.0/8 or ::1). The check is on the address as given, before any connect, so a forward can
// never be pointed at another host, even one the sandbox could not reach anyway.
func CheckForwardTarget(target netip.AddrPort) error {
	a := target.Addr().Unmap()
	if !a.IsLoopback() || a.Zone() != "" || target.Port() == 0 {
		return fmt.Errorf("%w: %s is not a loopback address and port inside the sandbox", ErrForwardRefused, target)
	}
	return nil
}

// EncodeForwardReply is the payload of a FrameForwardReply frame; the reason is cut to its bound.
func EncodeForwardReply(code byte, reason string) []byte {
	if len(reason) > maxForwardReason {
		reason = reason[:maxForwardReason]
	}
	return append([]byte{code}, reason...)
}

// DecodeForwardReply parses a FrameForwardReply payload into nil (connected) or an error wrapping
// ErrForwardRefused or ErrForwardUnreachable with the agent's reason (data from the sandbox: quoted, never
// trusted). An empty payload or an unknown code wraps ErrProtocol.
func DecodeForwardReply(p []byte) error {
	if len(p) == 0 {
		return fmt.Errorf("%w: empty forward reply", ErrProtocol)
	}
	reason := fmt.Sprintf("%q", p[1:])
	switch p[0] {
	case ForwardOK:
		return nil
	case ForwardRefused:
		return fmt.Errorf("%w: %s", ErrForwardRefused, reason)
	case ForwardUnreachable:
		return fmt.Errorf("%w: %s", ErrForwardUnreachable, reason)
	}
	return fmt.Errorf("%w: forward reply code %d", ErrProtocol, p[0])
}

// EncodeCredit is the payload of a FrameForwardCredit frame.
func EncodeCredit(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }

// DecodeCredit parses a FrameForwardCredit payload; a grant of 0, above ForwardWindow, or of another length
// wraps ErrProtocol.
func DecodeCredit(p []byte) (int, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("%w: credit payload of %d bytes", ErrProtocol, len(p))
	}
	n := binary.BigEndian.Uint32(p)
	if n == 0 || n > ForwardWindow {
		return 0, fmt.Errorf("%w: credit of %d bytes outside 1..%d", ErrProtocol, n, ForwardWindow)
	}
	return int(n), nil
}
