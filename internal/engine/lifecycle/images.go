package lifecycle

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/internal/driver"
)

// A watch counts as live once its stream has stayed up this long: events from then on reach us within the
// stream's latency, and the watch replays from before it started, so nothing in between is lost.
const (
	watchSettle = 250 * time.Millisecond
	watchReplay = 2 * time.Second
	watchRetry  = time.Second
)

// images resolves image refs. With a driver that reports image events it keeps resolved IDs while its watch is
// live and drops them all on any image event, so a warm command does not ask the engine; a retag is seen as
// soon as its event arrives. Without a live watch, every resolution asks the engine.
type images struct {
	drv driver.Driver
	log *slog.Logger

	mu        sync.Mutex        // guards the fields below
	ids       map[string]string // ref -> image ID, resolved while the watch was live
	gen       uint64            // bumped by every event and every change of the watch: older resolutions are not kept
	liveSince time.Time         // when the current watch started; zero when there is none

	stop func()        // ends the watch
	done chan struct{} // closed when the watch goroutine is gone
}

func newImages(drv driver.Driver, log *slog.Logger) *images {
	im := &images{drv: drv, log: log, ids: map[string]string{}, stop: func() {}, done: make(chan struct{})}
	w, ok := drv.(driver.ImageWatcher)
	if !ok {
		close(im.done)
		return im
	}
	ctx, cancel := context.WithCancel(context.Background())
	im.stop = cancel
	go im.watch(ctx, w)
	return im
}

func (im *images) resolve(ctx context.Context, ref string) (string, error) {
	im.mu.Lock()
	id, ok := im.ids[ref]
	live := !im.liveSince.IsZero() && time.Since(im.liveSince) >= watchSettle
	gen := im.gen
	im.mu.Unlock()
	if ok && live {
		return id, nil
	}
	id, err := im.drv.ResolveImage(ctx, ref)
	if err != nil {
		return "", err
	}
	im.mu.Lock()
	if gen == im.gen && !im.liveSince.IsZero() {
		im.ids[ref] = id
	}
	im.mu.Unlock()
	return id, nil
}

// invalidate forgets every resolved ID; live says whether a watch is running from now on.
func (im *images) invalidate(live bool, since time.Time) {
	im.mu.Lock()
	defer im.mu.Unlock()
	im.gen++
	clear(im.ids)
	if live {
		im.liveSince = since
	} else {
		im.liveSince = time.Time{}
	}
}

func (im *images) watch(ctx context.Context, w driver.ImageWatcher) {
	defer close(im.done)
	for {
		start := time.Now()
		im.invalidate(true, start)
		err := w.WatchImages(ctx, start.Add(-watchReplay), func() { im.invalidate(true, start) })
		im.invalidate(false, time.Time{})
		if ctx.Err() != nil {
			return
		}
		im.log.Debug("image watch ended; resolving images on every command until it is back", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(watchRetry):
		}
	}
}

func (im *images) close() {
	im.stop()
	<-im.done
}
