package engine

import (
	"io"
	"sync"

	"github.com/sandkeep/sandkeep/internal/store"
)

// runLogChunk is how much of a setup step's output is gathered before it is written as one run log entry: a build
// prints many short lines, and each entry is a row.
const runLogChunk = 8 << 10

// logLine adds text to the run's log (store.RunLogStore) as source, when a store records the run. The log is what
// an operator reads after the fact, so the line is enqueued (committed with the run's events, in order) and the
// command never waits for a transaction of its own: the driver's line of a warm command ("reuse sandbox") was
// one on every served request (issue 26). A failed write is logged and never fails the run.
func (r *Run) logLine(source, text string) {
	if r.m.st == nil || r.ID == "" || text == "" {
		return
	}
	log, id := logger(r.m.cfg.Logger), r.ID
	r.m.st.EnqueueRunLog(store.RunLog{RunID: id, Source: source, Text: text}, func(_ int64, err error) {
		if err != nil {
			log.Warn("run log: append failed", "run", id, "source", source, "err", err)
		}
	})
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
