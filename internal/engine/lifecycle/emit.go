package lifecycle

import (
	"context"
	"fmt"
	"io"

	"github.com/sandkeep/sandkeep/internal/events"
)

// Sink receives what the lifecycle did, as an event name and a typed payload of package events. It is called on
// the goroutine that did it, under the key's gate; it must not block for long.
type Sink func(name string, payload any)

type sinkKey struct{}

// withSink routes the events of one Exec to its caller's sink (the caller's run).
func withSink(ctx context.Context, s Sink) context.Context {
	if s == nil {
		return ctx
	}
	return context.WithValue(ctx, sinkKey{}, s)
}

// emit sends an event to the request's sink, else to the manager's (events with no run: the sweeper's).
func (m *Manager) emit(ctx context.Context, name string, payload any) {
	if s, ok := ctx.Value(sinkKey{}).(Sink); ok {
		s(name, payload)
		return
	}
	if m.cfg.OnEvent != nil {
		m.cfg.OnEvent(name, payload)
	}
}

// Sources of the lines a LogSink receives: the run log's (store.Log*).
const (
	LogDriver     = "driver"      // what the driver did for the command's run, and the engine's answers
	LogPostCreate = "post_create" // post_create's output
	LogPostStart  = "post_start"  // postStartCommand's output
)

// LogSink receives the lines of a run's log as the lifecycle produces them: its driver actions and its setup
// commands' output (source: Log*). Called from the command's goroutine and from a setup command's output
// copiers (both streams at once): it must be safe for concurrent use and not block for long.
type LogSink func(source, text string)

type logKey struct{}

// withLog routes the run log lines of one Exec to its caller's sink.
func withLog(ctx context.Context, s LogSink) context.Context {
	if s == nil {
		return ctx
	}
	return context.WithValue(ctx, logKey{}, s)
}

// logf adds one line to the run log of the request in ctx (nothing when the request has none).
func logf(ctx context.Context, source, format string, args ...any) {
	if s, ok := ctx.Value(logKey{}).(LogSink); ok {
		s(source, fmt.Sprintf(format, args...))
	}
}

// logWriter is an io.Writer into the run log of the request in ctx, as source; nil when the request has none.
func logWriter(ctx context.Context, source string) io.Writer {
	s, ok := ctx.Value(logKey{}).(LogSink)
	if !ok {
		return nil
	}
	return sinkWriter{s: s, source: source}
}

type sinkWriter struct {
	s      LogSink
	source string
}

func (w sinkWriter) Write(p []byte) (int, error) {
	w.s(w.source, string(p))
	return len(p), nil
}

// recycleReason says why a sandbox that exists cannot be reused as it is.
func recycleReason(compatibleNow, imageMatches bool) string {
	switch {
	case compatibleNow:
		return events.RecycleState
	case !imageMatches:
		return events.RecycleImage
	}
	return events.RecyclePosture
}
