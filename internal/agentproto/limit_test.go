package agentproto

import (
	"bytes"
	"syscall"
	"testing"
	"unicode/utf8"

	"pgregory.net/rapid"
)

// limitChunks feeds chunks to a Limiter and returns everything it let through.
func limitChunks(limit int64, chunks ...[]byte) ([]byte, bool) {
	l := NewLimiter(limit)
	var out []byte
	for _, c := range chunks {
		out = append(out, l.Write(c)...)
	}
	return append(out, l.Flush()...), l.Truncated()
}

func TestLimiter(t *testing.T) {
	euro := "€" // 3 bytes
	tests := []struct {
		name      string
		limit     int64
		chunks    []string
		want      string
		truncated bool
	}{
		{"under", 10, []string{"abc", "def"}, "abcdef", false},
		{"exact", 6, []string{"abc", "def"}, "abcdef", false},
		{"over ascii", 4, []string{"abc", "def"}, "abcd", true},
		{"cut inside rune", 5, []string{"abc" + euro}, "abc", true},
		{"cut after rune", 6, []string{"abc" + euro + "x"}, "abc" + euro, true},
		{"rune split across chunks, fits", 6, []string{"abc\xe2", "\x82\xac"}, "abc" + euro, false},
		{"rune split across chunks, cut", 5, []string{"abc\xe2", "\x82\xacxyz"}, "abc", true},
		{"rune split in three", 4, []string{"a\xf0\x9f", "\x98", "\x80b"}, "a", true},
		{"4-byte rune fits exactly", 5, []string{"a\xf0\x9f", "\x98", "\x80"}, "a😀", false},
		{"limit 0", 0, []string{"a"}, "", true},
		{"empty chunks", 3, []string{"", "ab", ""}, "ab", false},
		{"invalid bytes pass", 3, []string{"\xff\xfe\xfd\xfc"}, "\xff\xfe\xfd", true},
		{"incomplete rune at end of stream", 10, []string{"ab\xe2\x82"}, "ab\xe2\x82", false},
		{"discards after cut", 2, []string{"abc", "def"}, "ab", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var chunks [][]byte
			for _, c := range tt.chunks {
				chunks = append(chunks, []byte(c))
			}
			got, truncated := limitChunks(tt.limit, chunks...)
			if string(got) != tt.want || truncated != tt.truncated {
				t.Fatalf("got %q truncated=%v, want %q truncated=%v", got, truncated, tt.want, tt.truncated)
			}
		})
	}
}

// TestLimiterStreams checks that bytes far from the limit are not held back: streaming is not delayed.
func TestLimiterStreams(t *testing.T) {
	l := NewLimiter(100)
	if got := l.Write([]byte("ab\xe2\x82")); string(got) != "ab\xe2\x82" {
		t.Fatalf("far from the limit, an incomplete rune was held back: %q", got)
	}
	l = NewLimiter(4)
	if got := l.Write([]byte("ab\xe2\x82")); string(got) != "ab" {
		t.Fatalf("near the limit: got %q, want the incomplete rune held back", got)
	}
}

func TestLimiterProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var input []byte
		if rapid.Bool().Draw(t, "utf8") {
			input = []byte(rapid.String().Draw(t, "text"))
		} else {
			input = rapid.SliceOf(rapid.Byte()).Draw(t, "bytes")
		}
		limit := rapid.Int64Range(0, int64(len(input))+8).Draw(t, "limit")
		var chunks [][]byte
		rest := input
		for len(rest) > 0 {
			n := rapid.IntRange(0, len(rest)).Draw(t, "chunk")
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		got, truncated := limitChunks(limit, chunks...)
		whole, wholeTruncated := limitChunks(limit, input)
		switch {
		case !bytes.HasPrefix(input, got):
			t.Fatalf("output %q is not a prefix of %q", got, input)
		case int64(len(got)) > limit:
			t.Fatalf("output of %d bytes over limit %d", len(got), limit)
		case utf8.Valid(input) && !utf8.Valid(got):
			t.Fatalf("valid input, invalid output %q", got)
		case truncated != (int64(len(input)) > limit):
			t.Fatalf("truncated=%v for %d bytes under limit %d", truncated, len(input), limit)
		case !truncated && !bytes.Equal(got, input):
			t.Fatalf("not truncated but changed")
		case truncated && int64(len(got)) < limit-3:
			t.Fatalf("cut %d bytes before the limit %d", limit-int64(len(got)), limit)
		case !bytes.Equal(got, whole) || truncated != wholeTruncated:
			t.Fatalf("chunking changed the output: %q vs %q", got, whole)
		}
	})
}

func TestExitFromWait(t *testing.T) {
	tests := []struct {
		name         string
		ws           syscall.WaitStatus // Linux encoding: code<<8 when exited, the signal when killed
		code, signal int
	}{
		{"exit 0", 0, 0, 0},
		{"exit 1", 1 << 8, 1, 0},
		{"exit 124", 124 << 8, 124, 0},
		{"exit 255", 255 << 8, 255, 0},
		{"SIGTERM", syscall.WaitStatus(syscall.SIGTERM), 143, 15},
		{"SIGKILL", syscall.WaitStatus(syscall.SIGKILL), 137, 9},
		{"SIGSEGV with core", syscall.WaitStatus(syscall.SIGSEGV) | 0x80, 139, 11},
		{"stopped", 0x7f | syscall.WaitStatus(syscall.SIGSTOP)<<8, 255, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, sig := ExitFromWait(tt.ws)
			if code != tt.code || sig != tt.signal {
				t.Fatalf("got (%d, %d), want (%d, %d)", code, sig, tt.code, tt.signal)
			}
		})
	}
}
