package store

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeWrites records the writes of the transactions it is given; one mutex guards it, as a database would.
type fakeWrites struct {
	mu  sync.Mutex
	txs [][]string
	cur []string
}

func (f *fakeWrites) InsertRun(_ context.Context, r Run) error {
	f.cur = append(f.cur, "run "+r.ID)
	return nil
}

func (f *fakeWrites) FinishRun(_ context.Context, id string, _ RunUpdate) error {
	f.cur = append(f.cur, "finish "+id)
	return nil
}

func (f *fakeWrites) InsertEvent(_ context.Context, e Event) (int64, error) {
	f.cur = append(f.cur, "event "+e.Name)
	return int64(len(f.cur)), nil
}

func (f *fakeWrites) InsertRunLog(_ context.Context, l RunLog) (int64, error) {
	f.cur = append(f.cur, "log "+l.Text)
	return int64(len(f.cur)), nil
}
func (f *fakeWrites) CheckFences(_ context.Context, fs []Fence) (map[Fence]bool, error) {
	held := make(map[Fence]bool, len(fs))
	for _, x := range fs {
		held[x] = true
	}
	return held, nil
}

func (f *fakeWrites) InTx(_ context.Context, fn func(w Writes) error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cur = nil
	if err := fn(f); err != nil {
		return err
	}
	f.txs = append(f.txs, f.cur)
	return nil
}

// TestGroupCommitsAFinishAtOnce: a run's finish is its last write, so its group (the command's events and the
// finish) is committed when it is enqueued, not FlushDelay later or together with the next request's run row,
// which would then wait for it on the request's path (issue 26's served path). Events alone still wait for
// company.
func TestGroupCommitsAFinishAtOnce(t *testing.T) {
	f := &fakeWrites{}
	g := NewGroup(f, GroupOptions{FlushDelay: time.Hour})
	defer g.Close()

	eventDone := make(chan struct{})
	g.EnqueueEvent(Event{RunID: "r1", Name: "exec_started"}, func(int64, error) { close(eventDone) })
	g.EnqueueEvent(Event{RunID: "r1", Name: "exec_finished"}, nil)
	select {
	case <-eventDone:
		t.Fatal("an event was committed before FlushDelay without a finish or a synchronous write")
	case <-time.After(50 * time.Millisecond):
	}
	finished := make(chan error, 1)
	g.EnqueueUpdate("r1", RunUpdate{Status: StatusSucceeded}, func(err error) { finished <- err })
	select {
	case err := <-finished:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second): // FlushDelay is an hour: only the finish's own commit ends this
		t.Fatal("the finish waited for FlushDelay")
	}
	<-eventDone
	f.mu.Lock()
	defer f.mu.Unlock()
	want := []string{"event exec_started", "event exec_finished", "finish r1"}
	if len(f.txs) != 1 || len(f.txs[0]) != len(want) {
		t.Fatalf("transactions %q, want one: %q", f.txs, want)
	}
	for i := range want {
		if f.txs[0][i] != want[i] {
			t.Fatalf("transactions %q, want one: %q", f.txs, want)
		}
	}
}

// TestGroupCommitsRunLogsWithTheFinish: the driver's run log line of a command is enqueued like its events and
// goes into the finish's transaction, in order: one commit for all of it (issue 26: the line was a transaction of
// its own on every command's path).
func TestGroupCommitsRunLogsWithTheFinish(t *testing.T) {
	f := &fakeWrites{}
	g := NewGroup(f, GroupOptions{FlushDelay: time.Hour})
	defer g.Close()
	g.EnqueueEvent(Event{RunID: "r1", Name: "sandbox_shared"}, nil)
	g.EnqueueRunLog(RunLog{RunID: "r1", Source: LogDriver, Text: "reuse sandbox"}, nil)
	g.EnqueueEvent(Event{RunID: "r1", Name: "exec_finished"}, nil)
	if err := g.UpdateRun(t.Context(), "r1", RunUpdate{Status: StatusSucceeded}); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	want := []string{"event sandbox_shared", "log reuse sandbox", "event exec_finished", "finish r1"}
	if len(f.txs) != 1 || len(f.txs[0]) != len(want) {
		t.Fatalf("transactions %q, want one: %q", f.txs, want)
	}
	for i := range want {
		if f.txs[0][i] != want[i] {
			t.Fatalf("transactions %q, want one: %q", f.txs, want)
		}
	}
}

// TestGroupKeepsOrderWhenCallersCommit: a synchronous write is committed on its caller's goroutine when nothing
// waits (issue 26), and through the writer otherwise; either way, what a goroutine enqueued before its
// synchronous write is committed no later than that write, while other goroutines' writes come and go.
func TestGroupKeepsOrderWhenCallersCommit(t *testing.T) {
	const callers, runs = 8, 50
	f := &fakeWrites{}
	g := NewGroup(f, GroupOptions{FlushDelay: time.Millisecond})
	ids := make([][]string, callers)
	run := func(id string) Run {
		return Run{ID: id, Tenant: "acme", User: "alice", Trust: TrustTrusted, ResolvedMode: "auto", Source: "default",
			Driver: "docker", Admission: AdmissionAdmitted, Status: StatusRunning, CreatedAt: time.Now()}
	}
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for range runs {
				id, err := NewRunID()
				if err == nil {
					err = g.CreateRun(t.Context(), run(id))
				}
				if err != nil {
					t.Error(err)
					return
				}
				ids[i] = append(ids[i], id)
				g.EnqueueEvent(Event{RunID: id, Name: "exec_started", Time: time.Now()}, nil)
				if err := g.UpdateRun(t.Context(), id, RunUpdate{Status: StatusSucceeded}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	late, err := NewRunID()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.CreateRun(t.Context(), run(late)); !errors.Is(err, ErrClosed) {
		t.Fatalf("CreateRun after Close: %v, want ErrClosed", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	at, events := map[string]int{}, 0 // each run's row and finish: their position over all transactions
	for _, tx := range f.txs {
		for _, w := range tx {
			if strings.HasPrefix(w, "event ") {
				events++
				continue
			}
			if _, dup := at[w]; dup {
				t.Fatalf("%s committed twice", w)
			}
			at[w] = len(at)
		}
	}
	for _, list := range ids {
		for _, id := range list {
			r, okRun := at["run "+id]
			fin, okFin := at["finish "+id]
			if !okRun || !okFin || r > fin {
				t.Fatalf("run %s: row at %d (%v), finish at %d (%v)", id, r, okRun, fin, okFin)
			}
		}
	}
	if events != callers*runs {
		t.Fatalf("%d events committed, want %d", events, callers*runs)
	}
}
