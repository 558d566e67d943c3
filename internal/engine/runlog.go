package engine

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/internal/store"
)

// runLogChunk is how much of a setup step's output is gathered before it is written as one run log entry: a build
// prints many short lines, and each entry is a transaction.
const runLogChunk = 8 << 10

// runLogWrite bounds one run log write; a store that cannot take it in that time loses the line, never the run.
const runLogWrite = 10 * time.Second

// logLine adds text to the run's log (store.RunLogStore) as source, when a store records the run. The log is what
// an operator reads after the fact; a failed write is logged and never fails the run.
func (r *Run) logLine(source, text string) {
	if r.m.st == nil || r.ID == "" || text == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), runLogWrite)
	defer cancel()
	if _, err := r.m.st.AppendRunLog(ctx, store.RunLog{RunID: r.ID, Source: source, Text: text}); err != nil {
		logger(r.m.cfg.Logger).Warn("run log: append failed", "run", r.ID, "source", source, "err", err)
	}
}

// logTee returns a writer that copies what is written to out (which may be nil) into the run's log as source,
// in chunks of up to runLogChunk, and the function that writes what is left; call it when the step ends.
func (r *Run) logTee(source string, out io.Writer) (io.Writer, func()) {
	if r.m.st == nil || r.ID == "" {
		if out == nil {
			return io.Discard, func() {}
		}
		return out, func() {}
	}
	w := &runLogWriter{r: r, source: source, out: out}
	return w, w.flush
}

// runLogWriter gathers a step's output into run log entries. Safe for concurrent writers.
type runLogWriter struct {
	r      *Run
	source string
	out    io.Writer // also gets everything, as written; nil: none

	mu  sync.Mutex // guards buf
	buf []byte
}

func (w *runLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.buf = append(w.buf, p...)
	var full []byte
	if len(w.buf) >= runLogChunk {
		full, w.buf = w.buf, nil
	}
	w.mu.Unlock()
	if full != nil {
		w.r.logLine(w.source, string(full))
	}
	if w.out != nil {
		return w.out.Write(p)
	}
	return len(p), nil
}

func (w *runLogWriter) flush() {
	w.mu.Lock()
	rest := w.buf
	w.buf = nil
	w.mu.Unlock()
	w.r.logLine(w.source, string(rest))
}
