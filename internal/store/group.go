package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
)

// Writes are the writes of runs and events, made inside one transaction of an implementation (Committer.InTx).
// Each method validates nothing (the Group did) and returns the store's classified error; when one fails, the
// Group rolls the transaction back and commits the group again without that write.
type Writes interface {
	InsertRun(ctx context.Context, r Run) error
	FinishRun(ctx context.Context, id string, upd RunUpdate) error
	InsertEvent(ctx context.Context, e Event) (int64, error)
	// InsertRunLog appends l (prepared) to its run's log within RunLogLimit (FitRunLog): the entry's sequence
	// number, or 0 when the log was full and l was dropped.
	InsertRunLog(ctx context.Context, l RunLog) (int64, error)
	// CheckFences returns which of fs hold (lease f.Lease live with token f.Token) and keeps those so until the
	// transaction ends (a takeover waits for it). It takes the lease rows in name order, as RenewLeases does, so
	// a group's fence checks and a renewal of the same leases never wait for each other in a cycle (a deadlock
	// PostgreSQL breaks by failing one of them).
	CheckFences(ctx context.Context, fs []Fence) (map[Fence]bool, error)
}

// Committer runs fn in one write transaction and commits it when fn returns nil (rolls it back otherwise).
type Committer interface {
	InTx(ctx context.Context, fn func(w Writes) error) error
}

// Group commit: defaults of GroupOptions' zero fields.
const (
	// DefaultFlushDelay bounds how long an enqueued write waits for company before it is committed: a command's
	// events and its run's finish then share a transaction, and a follower of the events sees them this late at
	// worst (plus the commit). It is longer than a warm command (a few ms): when the delay ended inside the
	// command, its events' commit was still running when the finish came, which then waited for it and paid a
	// commit of its own on the command's path (issue 26: 0.6 ms against 0.25 ms for one commit).
	DefaultFlushDelay = 10 * time.Millisecond
	// DefaultMaxGroup is the most writes one transaction carries.
	DefaultMaxGroup = 512
	// DefaultQueue is how many writes may wait; an enqueue beyond it waits for room (the store is behind).
	DefaultQueue = 8192
	// DefaultGroupTimeout bounds one group's transaction.
	DefaultGroupTimeout = 30 * time.Second
)

// GroupOptions sizes a Group; zero fields take the defaults above.
type GroupOptions struct {
	FlushDelay time.Duration
	MaxGroup   int
	Queue      int
	Timeout    time.Duration
}

// ErrClosed is the error of a write made after the store was closed.
var ErrClosed = fmt.Errorf("store is closed: %w", errdefs.ErrUnavailable)

// Group writes runs and events through one writer goroutine that commits them in groups: every write that is
// waiting when a transaction begins goes into it, in the order the writes were made, so a run's events keep their
// order and their sequence numbers increase in that order. A synchronous write (CreateRun, UpdateRun,
// AppendEvent, Flush) is committed at once, taking whatever waits with it, and returns its own outcome; an
// enqueued one (EnqueueEvent, EnqueueUpdate) waits at most FlushDelay for company. A write that fails inside a
// group is taken out and the others are committed without it, so one write's error never becomes another's.
// Close commits everything enqueued before it. The SQLite and PostgreSQL stores embed a Group.
type Group struct {
	c      Committer
	o      GroupOptions
	mu     sync.RWMutex // guards closed against sends on ops after it is closed, and a caller's own commit
	closed bool
	// committing is held while a group is committed, by the writer or by a caller committing its synchronous
	// write itself (do, when nothing is pending): one transaction at a time, in the order the writes were made.
	committing sync.Mutex
	ops        chan *op
	pending    atomic.Int64 // writes enqueued and not yet done: a read with none to wait for does not flush
	stopped    chan struct{}
}

// op is one write. Exactly one of its outcomes is delivered: on result (a synchronous write) or to done.
type op struct {
	ctx   context.Context // the caller's; a synchronous write whose caller left is not made. nil when enqueued
	apply func(ctx context.Context, w Writes) error
	fence *Fence // a fenced write (Group.Fenced): applied only while it holds, refused with ErrFenced otherwise
	sync  bool
	// last marks a run's finish: nothing of its run follows, so its group is committed now (the caller does not
	// wait) rather than after FlushDelay or with the next request's run row, which would wait for it.
	last   bool
	result chan error // synchronous writes: room for one
	done   func(err error)
}

// NewGroup starts the writer goroutine of c; Close stops it.
func NewGroup(c Committer, o GroupOptions) *Group {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.MaxGroup, DefaultMaxGroup)
	def(&o.Queue, DefaultQueue)
	if o.FlushDelay <= 0 {
		o.FlushDelay = DefaultFlushDelay
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultGroupTimeout
	}
	g := &Group{c: c, o: o, ops: make(chan *op, o.Queue), stopped: make(chan struct{})}
	go g.loop()
	return g
}

// CreateRun implements Store.CreateRun: the run (and its admission verdict) is committed when it returns.
func (g *Group) CreateRun(ctx context.Context, r Run) error {
	r, err := PrepareRun(r)
	if err != nil {
		return err
	}
	return g.do(ctx, func(ctx context.Context, w Writes) error { return w.InsertRun(ctx, r) })
}

// UpdateRun implements Store.UpdateRun, committed with every write enqueued before it.
func (g *Group) UpdateRun(ctx context.Context, id string, upd RunUpdate) error {
	upd, err := PrepareUpdate(id, upd)
	if err != nil {
		return err
	}
	return g.do(ctx, func(ctx context.Context, w Writes) error { return w.FinishRun(ctx, id, upd) })
}

// AppendEvent implements Store.AppendEvent, committed with every write enqueued before it.
func (g *Group) AppendEvent(ctx context.Context, e Event) (int64, error) {
	e, err := PrepareEvent(e)
	if err != nil {
		return 0, err
	}
	return g.doSeq(ctx, func(ctx context.Context, w Writes) (int64, error) { return w.InsertEvent(ctx, e) })
}

// EnqueueEvent implements Store.EnqueueEvent.
func (g *Group) EnqueueEvent(e Event, done func(seq int64, err error)) {
	e, err := PrepareEvent(e)
	if err != nil {
		if done != nil {
			done(0, err)
		}
		return
	}
	g.enqueueSeq(func(ctx context.Context, w Writes) (int64, error) { return w.InsertEvent(ctx, e) }, done)
}

// EnqueueUpdate implements Store.EnqueueUpdate.
func (g *Group) EnqueueUpdate(id string, upd RunUpdate, done func(err error)) {
	upd, err := PrepareUpdate(id, upd)
	if err != nil {
		if done != nil {
			done(err)
		}
		return
	}
	g.enqueue(&op{
		last:  true,
		apply: func(ctx context.Context, w Writes) error { return w.FinishRun(ctx, id, upd) },
		done: func(err error) {
			if done != nil {
				done(err)
			}
		},
	})
}

// AppendRunLog implements RunLogStore.AppendRunLog, committed with every write enqueued before it.
func (g *Group) AppendRunLog(ctx context.Context, l RunLog) (int64, error) {
	l, err := PrepareRunLog(l)
	if err != nil {
		return 0, err
	}
	return g.doSeq(ctx, func(ctx context.Context, w Writes) (int64, error) { return w.InsertRunLog(ctx, l) })
}

// EnqueueRunLog implements RunLogStore.EnqueueRunLog.
func (g *Group) EnqueueRunLog(l RunLog, done func(seq int64, err error)) {
	l, err := PrepareRunLog(l)
	if err != nil {
		if done != nil {
			done(0, err)
		}
		return
	}
	g.enqueueSeq(func(ctx context.Context, w Writes) (int64, error) { return w.InsertRunLog(ctx, l) }, done)
}

// doSeq makes a synchronous insert that numbers what it writes (an event, a run log line) and returns the number.
func (g *Group) doSeq(ctx context.Context, insert func(context.Context, Writes) (int64, error)) (int64, error) {
	var seq int64
	err := g.do(ctx, func(ctx context.Context, w Writes) error {
		var err error
		seq, err = insert(ctx, w)
		return err
	})
	return seq, err
}

// enqueueSeq enqueues an insert that numbers what it writes; done (if any) gets the number once it is committed.
func (g *Group) enqueueSeq(insert func(context.Context, Writes) (int64, error), done func(seq int64, err error)) {
	var seq int64
	g.enqueue(&op{
		apply: func(ctx context.Context, w Writes) error {
			var err error
			seq, err = insert(ctx, w)
			return err
		},
		done: func(err error) {
			if done != nil {
				done(seq, err)
			}
		},
	})
}

// Flush implements Store.Flush.
func (g *Group) Flush(ctx context.Context) error {
	if g.pending.Load() == 0 {
		return nil
	}
	return g.do(ctx, func(context.Context, Writes) error { return nil })
}

// Close commits every write enqueued before it and stops the writer goroutine. Writes after it fail with
// ErrClosed. The implementation closes its database after Close returns.
func (g *Group) Close() error {
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		close(g.ops)
	}
	g.mu.Unlock()
	<-g.stopped
	return nil
}

// do makes a synchronous write and waits for its outcome (or for ctx).
func (g *Group) do(ctx context.Context, apply func(ctx context.Context, w Writes) error) error {
	return g.doFenced(ctx, nil, apply)
}

// doFenced is do of a write made under fence (none when nil).
func (g *Group) doFenced(ctx context.Context, fence *Fence, apply func(ctx context.Context, w Writes) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	o := &op{ctx: ctx, apply: apply, fence: fence, sync: true, result: make(chan error, 1)}
	if g.commitHere(o) {
		return <-o.result
	}
	g.enqueue(o)
	select {
	case err := <-o.result:
		return err
	case <-ctx.Done():
		return ctx.Err() // the writer skips it if it has not begun its group yet
	}
}

// commitHere commits the synchronous write o on its caller's goroutine, alone, when no write waits or is being
// committed (the writer is idle): o's outcome is then on o.result when it returns true. Nothing enqueued before o
// can be left behind it: pending counts a write from before it is sent until after its group is committed, so a
// caller that sees none pending has none of its own (nor any it was told of) uncommitted. It saves the two
// goroutine hand-offs of the writer on every run row and finish on a command's path, which on a loaded machine
// each cost a wait for a core (issue 26: the sched delay of the served path's trace was mostly these). Otherwise
// (false) o goes through the writer like every other write.
func (g *Group) commitHere(o *op) bool {
	if g.pending.Load() != 0 {
		return false
	}
	g.mu.RLock() // before the commit lock, as enqueue takes it: Close waits for this commit to end
	defer g.mu.RUnlock()
	if g.closed {
		o.deliver(ErrClosed)
		return true
	}
	if !g.committing.TryLock() {
		return false
	}
	defer g.committing.Unlock()
	if g.pending.Load() != 0 { // a write was enqueued between the check and the lock: it goes first
		return false
	}
	g.commit([]*op{o})
	return true
}

func (g *Group) enqueue(o *op) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		o.deliver(ErrClosed)
		return
	}
	g.pending.Add(1)
	g.ops <- o // waits for room when the store is behind; Close waits for the lock until it is given
}

func (o *op) deliver(err error) {
	if o.sync {
		o.result <- err
	} else if o.done != nil {
		o.done(err)
	}
}

// loop is the writer: it takes the first waiting write, gathers company (none to wait for when a synchronous
// write is among them), and commits the group. It returns when ops is closed and drained.
func (g *Group) loop() {
	defer close(g.stopped)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		first, ok := <-g.ops
		if !ok {
			return
		}
		group := []*op{first}
		urgent := first.sync || first.last
		if !urgent {
			timer.Reset(g.o.FlushDelay)
		}
	gather:
		for len(group) < g.o.MaxGroup {
			if urgent { // take what is waiting already, and go
				select {
				case o, ok := <-g.ops:
					if !ok {
						break gather
					}
					group = append(group, o)
				default:
					break gather
				}
				continue
			}
			select {
			case o, ok := <-g.ops:
				if !ok {
					break gather
				}
				group = append(group, o)
				urgent = o.sync || o.last
			case <-timer.C:
				break gather
			}
		}
		timer.Stop()
		g.committing.Lock()
		g.commit(group)
		g.pending.Add(-int64(len(group)))
		g.committing.Unlock()
	}
}

// commit writes group in one transaction. The fences of its fenced writes are checked first, all at once (in
// lease name order); a write whose fence does not hold is refused with ErrFenced and the others are committed. A
// write that fails is taken out with its error and the rest are committed again without it; an error of the
// transaction itself (begin, commit) is every write's.
func (g *Group) commit(group []*op) {
	live := make([]*op, 0, len(group))
	for _, o := range group {
		if o.ctx != nil && o.ctx.Err() != nil {
			o.deliver(o.ctx.Err()) // its caller has left and was told so: not made
			continue
		}
		live = append(live, o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.o.Timeout)
	defer cancel()
	for len(live) > 0 {
		failed, opErr := -1, error(nil)
		var held map[Fence]bool
		err := g.c.InTx(ctx, func(w Writes) error {
			failed, opErr = -1, nil // InTx may run this again (a transaction PostgreSQL aborted for a conflict)
			var err error
			if held, err = checkFences(ctx, w, live); err != nil {
				return err
			}
			for i, o := range live {
				if o.fence != nil && !held[*o.fence] {
					continue
				}
				if err := o.apply(ctx, w); err != nil {
					failed, opErr = i, err
					return err
				}
			}
			return nil
		})
		if failed >= 0 && errors.Is(err, opErr) {
			live[failed].deliver(opErr)
			live = append(live[:failed:failed], live[failed+1:]...)
			continue
		}
		for _, o := range live {
			if err == nil && o.fence != nil && !held[*o.fence] {
				o.deliver(ErrFenced(*o.fence))
				continue
			}
			o.deliver(err)
		}
		return
	}
}

// checkFences checks the distinct fences of ops in one call; nil when none is fenced.
func checkFences(ctx context.Context, w Writes, ops []*op) (map[Fence]bool, error) {
	var fs []Fence
	seen := map[Fence]bool{}
	for _, o := range ops {
		if o.fence != nil && !seen[*o.fence] {
			seen[*o.fence] = true
			fs = append(fs, *o.fence)
		}
	}
	if len(fs) == 0 {
		return nil, nil
	}
	return w.CheckFences(ctx, fs)
}
