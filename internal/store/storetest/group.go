package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/store"
)

// enqueued collects the outcomes EnqueueEvent and EnqueueUpdate report.
type enqueued struct {
	mu   sync.Mutex // guards the fields below
	seqs map[string]int64
	errs map[string]error
	n    int
}

func newEnqueued() *enqueued { return &enqueued{seqs: map[string]int64{}, errs: map[string]error{}} }

func (q *enqueued) event(s store.Store, t *testing.T, runID, requestID string) {
	t.Helper()
	e := store.Event{RunID: runID, Name: events.NameExecStarted, Payload: []byte(`{}`), RequestID: requestID}
	s.EnqueueEvent(e, func(seq int64, err error) {
		q.mu.Lock()
		defer q.mu.Unlock()
		q.n++
		q.seqs[requestID], q.errs[requestID] = seq, err
	})
}

func (q *enqueued) outcome(id string) (int64, error, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	seq, ok := q.seqs[id]
	return seq, q.errs[id], ok
}

func (q *enqueued) count() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// testEnqueuedEvents: enqueued events of two runs, interleaved, come back in the order they were enqueued with the
// seqs their done reported, and a read right after (no Flush) sees all of them: the store's reads flush first.
func testEnqueuedEvents(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	a, b := newRun(t, "acme", "alice"), newRun(t, "acme", "bob")
	mustCreate(t, s, a)
	mustCreate(t, s, b)
	q := newEnqueued()
	const n = 300
	var order []string
	for i := range n {
		r := a
		if i%3 == 0 {
			r = b
		}
		id := fmt.Sprintf("%s-%03d", r.User, i)
		order = append(order, id)
		q.event(s, t, r.ID, id)
	}
	s.EnqueueUpdate(a.ID, store.RunUpdate{Status: store.StatusSucceeded}, nil)
	evs, err := s.ListEvents(ctx, store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != n {
		t.Fatalf("a read right after enqueueing %d events sees %d", n, len(evs))
	}
	for i, e := range evs {
		if e.RequestID != order[i] {
			t.Fatalf("event %d is %s, want %s: enqueued events lost their order", i, e.RequestID, order[i])
		}
		if i > 0 && e.Seq <= evs[i-1].Seq {
			t.Errorf("seq %d after %d", e.Seq, evs[i-1].Seq)
		}
		seq, err, ok := q.outcome(e.RequestID)
		if !ok || err != nil || seq != e.Seq {
			t.Errorf("%s: done reported seq %d, err %v (reported: %v); stored as %d", e.RequestID, seq, err, ok, e.Seq)
		}
	}
	if got := mustGet(t, s, a.ID); got.Status != store.StatusSucceeded {
		t.Errorf("run finished by EnqueueUpdate reads back %s", got.Status)
	}
}

// testEnqueuedFailure: an enqueued write the store refuses (an event of no run, the finish of a finished run)
// reports its own error, and the writes around it, in the same group, are committed all the same.
func testEnqueuedFailure(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	r := newRun(t, "acme", "alice")
	mustCreate(t, s, r)
	if err := s.UpdateRun(ctx, r.ID, store.RunUpdate{Status: store.StatusSucceeded}); err != nil {
		t.Fatal(err)
	}
	q := newEnqueued()
	q.event(s, t, r.ID, "before")
	q.event(s, t, "01900000-0000-7000-8000-000000000000", "orphan")
	updErr := make(chan error, 1)
	s.EnqueueUpdate(r.ID, store.RunUpdate{Status: store.StatusFailed, FailureCode: "X"}, func(err error) { updErr <- err })
	q.event(s, t, r.ID, "after")
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err, _ := q.outcome("orphan"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("event of no run: %v, want %v", err, errdefs.ErrNotFound)
	}
	if err := <-updErr; !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("finish of a finished run: %v, want %v", err, errdefs.ErrFailedPrecondition)
	}
	evs, err := s.ListEvents(ctx, store.EventFilter{RunID: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].RequestID != "before" || evs[1].RequestID != "after" {
		t.Errorf("events around the refused ones: %v, want before and after", requestIDs(evs))
	}
	if got := mustGet(t, s, r.ID); got.Status != store.StatusSucceeded {
		t.Errorf("refused finish changed the run to %s", got.Status)
	}
}

func requestIDs(evs []store.Event) []string {
	var ids []string
	for _, e := range evs {
		ids = append(ids, e.RequestID)
	}
	return ids
}

// testWrittenThrough checks what another process sees, through a second store on the same database (whose reads
// cannot flush the first's queue): a created run at once, when CreateRun returns, so an admission verdict is
// durable before anything runs; an enqueued event without anyone flushing, within the flush delay (polled here
// for up to 10 s: the test asserts that it comes, not how fast); and after a clean Close of the writer, every
// event it enqueued and the finish enqueued after them.
func testWrittenThrough(t *testing.T, c config) {
	ctx := ctxOf(t)
	loc := c.location(t)
	w, err := c.openAt(ctx, loc)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = w.Close()
		}
	}()
	other, err := c.openAt(ctx, loc)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	r := newRun(t, "acme", "alice")
	q := newEnqueued()
	q.event(w, t, "", "before-run") // waiting in the queue when the run is created: goes with it
	mustCreate(t, w, r)
	if got := mustGet(t, other, r.ID); got.Admission != store.AdmissionAdmitted {
		t.Fatalf("the verdict read by another process: %+v", got)
	}
	q.event(w, t, r.ID, "first")
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs, err := other.ListEvents(ctx, store.EventFilter{RunID: r.ID})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("an enqueued event never became visible to another process without a flush")
		}
		time.Sleep(time.Millisecond)
	}

	const n = 500
	for i := range n {
		q.event(w, t, r.ID, fmt.Sprintf("e%03d", i))
	}
	finished := make(chan error, 1)
	w.EnqueueUpdate(r.ID, store.RunUpdate{Status: store.StatusSucceeded}, func(err error) { finished <- err })
	closed = true
	if err := w.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if q.count() != n+2 {
		t.Errorf("Close returned with %d of %d enqueued events reported", q.count(), n+2)
	}
	if err := <-finished; err != nil {
		t.Errorf("finish enqueued before Close: %v", err)
	}
	evs, err := other.ListEvents(ctx, store.EventFilter{RunID: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != n+1 {
		t.Fatalf("after a clean Close another process reads %d of the run's %d events", len(evs), n+1)
	}
	for i, e := range evs[1:] {
		if want := fmt.Sprintf("e%03d", i); e.RequestID != want {
			t.Fatalf("event %d is %s, want %s", i+1, e.RequestID, want)
		}
	}
	if got := mustGet(t, other, r.ID); got.Status != store.StatusSucceeded {
		t.Errorf("finish enqueued before Close reads back %s", got.Status)
	}
	if _, err, _ := q.outcome("before-run"); err != nil {
		t.Errorf("event enqueued before the run's creation: %v", err)
	}
	var seq int64
	var late error
	w.EnqueueEvent(store.Event{RunID: r.ID, Name: events.NameExecStarted}, func(s int64, err error) { seq, late = s, err })
	if !errors.Is(late, store.ErrClosed) || seq != 0 {
		t.Errorf("event enqueued after Close: seq %d, err %v, want %v", seq, late, store.ErrClosed)
	}
	if err := w.Flush(context.Background()); err != nil {
		t.Errorf("Flush after Close with nothing pending: %v", err)
	}
}
