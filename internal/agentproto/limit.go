package agentproto

import "unicode/utf8"

// Limiter bounds one output stream to a number of bytes without ever ending it in the middle of a UTF-8
// sequence: when the limit falls inside a multi-byte rune, the cut is made before that rune. The agent and the
// host use the same Limiter, so the host re-applies exactly the bound the agent should have applied.
//
// Bytes are passed through as soon as they cannot be affected by a later cut. Only when a rune that is still
// incomplete at the end of a chunk could end past the limit are its (at most 3) bytes held back, until the
// next chunk or Flush. Input that is not UTF-8 is passed through unchanged and cut at the limit.
//
// A Limiter is not safe for concurrent use.
type Limiter struct {
	limit     int64
	sent      int64  // bytes returned so far
	held      []byte // ≤ 3 bytes of an incomplete trailing rune that might straddle the limit
	truncated bool   // input went past the limit; everything from then on is discarded
}

// NewLimiter returns a Limiter that lets through at most limit bytes (limit < 0 counts as 0).
func NewLimiter(limit int64) *Limiter {
	return &Limiter{limit: max(limit, 0)}
}

// Write takes the next chunk of the stream and returns the bytes to pass on now. The result may alias p and
// is valid until the next call. Once the limit was passed, Write returns nil and the chunk is discarded.
func (l *Limiter) Write(p []byte) (keep []byte) {
	if l.truncated || len(p) == 0 {
		return nil
	}
	data := p
	if len(l.held) > 0 {
		// Rare: only near the limit. The room left is < 4 bytes, so at most 4 bytes of p matter.
		data = append(l.held[:len(l.held):len(l.held)], p[:min(len(p), 4)]...)
	}
	total := int64(len(l.held)) + int64(len(p))
	room := l.limit - l.sent
	l.held = nil
	if total > room {
		cut := cutPoint(data, int(room))
		l.truncated = true
		l.sent += int64(cut)
		return data[:cut]
	}
	// Everything fits so far; hold back an incomplete trailing rune only if it could end past the limit.
	end := len(data)
	if start, size := incompleteTail(data); size > 0 && int64(start+size) > room {
		l.held = append([]byte(nil), data[start:]...)
		end = start
	}
	l.sent += int64(end)
	return data[:end]
}

// Flush ends the stream and returns the bytes still held back (which fit: the stream ended within the limit).
func (l *Limiter) Flush() []byte {
	h := l.held
	l.held = nil
	l.sent += int64(len(h))
	return h
}

// Truncated reports whether the stream went past the limit.
func (l *Limiter) Truncated() bool { return l.truncated }

// cutPoint returns where to cut data so that it keeps at most room bytes and does not end inside a rune that
// continues past room.
func cutPoint(data []byte, room int) int {
	for i := room - 1; i >= 0 && i >= room-3; i-- {
		if utf8.RuneStart(data[i]) {
			if i+seqLen(data[i]) > room {
				return i
			}
			break
		}
	}
	return room
}

// incompleteTail finds a multi-byte sequence at the end of data that is cut short (a valid lead byte followed
// only by continuation bytes, fewer than it needs). It returns its start and full size, or size 0.
func incompleteTail(data []byte) (start, size int) {
	for i := len(data) - 1; i >= 0 && i >= len(data)-3; i-- {
		if utf8.RuneStart(data[i]) {
			if n := seqLen(data[i]); n > 1 && i+n > len(data) {
				return i, n
			}
			return 0, 0
		}
	}
	return 0, 0
}

// seqLen is the length of the UTF-8 sequence a lead byte announces (1 for ASCII and invalid bytes).
func seqLen(b byte) int {
	switch {
	case b >= 0xF0 && b <= 0xF4:
		return 4
	case b >= 0xE0 && b <= 0xEF:
		return 3
	case b >= 0xC2 && b <= 0xDF:
		return 2
	}
	return 1
}
