package lifecycle

import (
	"context"

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
