package driver

import (
	"bytes"
	"strings"
	"sync"
)

// AgentDiagLimit bounds what a driver keeps of the agent's own stderr (its diagnostics, never the command's
// output): enough for an error message.
const AgentDiagLimit = 4 << 10

// DiagBuffer keeps the first Limit bytes written to it and drops the rest, so an agent that floods its stderr
// costs the host nothing. It is safe for concurrent use; the zero Limit keeps nothing.
type DiagBuffer struct {
	Limit int
	mu    sync.Mutex // guards buf
	buf   bytes.Buffer
}

func (b *DiagBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.Limit - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// Bytes returns a copy of what was kept.
func (b *DiagBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// String returns what was kept, without surrounding white space.
func (b *DiagBuffer) String() string { return strings.TrimSpace(string(b.Bytes())) }
