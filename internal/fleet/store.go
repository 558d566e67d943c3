package fleet

import (
	"context"
	"fmt"
	"sync"

	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/store"
)

// FencedStore is the store a replica's engine records into: every run it creates, and every write of that run
// after it (events, the finish), carries the fence of the key's lease as the replica held it when the run was
// created, so a replica that lost the key (expired, taken over) has its writes refused (store.ErrLeaseLost)
// instead of interleaving them with the new owner's. A run of a key this replica does not hold is refused at
// once. Events of no run are not fenced.
type FencedStore struct {
	store.Store
	r *Replica

	mu   sync.Mutex
	runs map[string]store.Fence // run id -> the fence it was created under; dropped when the run finishes
}

// NewFencedStore wraps st for replica r.
func NewFencedStore(st store.Store, r *Replica) *FencedStore {
	return &FencedStore{Store: st, r: r, runs: map[string]store.Fence{}}
}

var _ store.Store = (*FencedStore)(nil)

// errNotHeld is the error of a write for a key this replica does not hold.
func errNotHeld(tenant, user string) error {
	return fmt.Errorf("record a run of %s/%s: this replica does not hold its key: %w", tenant, user, store.ErrLeaseLost)
}

func (s *FencedStore) fenceOfKey(tenant, user string) (store.Fence, error) {
	key, err := identity.New(tenant, user)
	if err != nil {
		return store.Fence{}, err
	}
	f, ok := s.r.Fence(key)
	if !ok {
		return store.Fence{}, errNotHeld(tenant, user)
	}
	return f, nil
}

// fenceOfRun is the fence run id was created under here, or, for a run created elsewhere (by a previous owner),
// the key's current one.
func (s *FencedStore) fenceOfRun(ctx context.Context, id string) (store.Fence, error) {
	s.mu.Lock()
	f, ok := s.runs[id]
	s.mu.Unlock()
	if ok {
		return f, nil
	}
	r, err := s.Store.GetRun(ctx, id)
	if err != nil {
		return store.Fence{}, err
	}
	return s.fenceOfKey(r.Tenant, r.User)
}

func (s *FencedStore) forget(id string) {
	s.mu.Lock()
	delete(s.runs, id)
	s.mu.Unlock()
}

// CreateRun implements store.Store under the key's fence.
func (s *FencedStore) CreateRun(ctx context.Context, r store.Run) error {
	f, err := s.fenceOfKey(r.Tenant, r.User)
	if err != nil {
		return err
	}
	if err := s.Store.Fenced(f).CreateRun(ctx, r); err != nil {
		return err
	}
	if r.Status == "" || r.Status == store.StatusRunning {
		s.mu.Lock()
		s.runs[r.ID] = f
		s.mu.Unlock()
	}
	return nil
}

// UpdateRun implements store.Store under the run's fence.
func (s *FencedStore) UpdateRun(ctx context.Context, id string, upd store.RunUpdate) error {
	f, err := s.fenceOfRun(ctx, id)
	if err != nil {
		return err
	}
	defer s.forget(id)
	return s.Store.Fenced(f).UpdateRun(ctx, id, upd)
}

// AppendEvent implements store.Store under the fence of the event's run.
func (s *FencedStore) AppendEvent(ctx context.Context, e store.Event) (int64, error) {
	if e.RunID == "" {
		return s.Store.AppendEvent(ctx, e)
	}
	f, err := s.fenceOfRun(ctx, e.RunID)
	if err != nil {
		return 0, err
	}
	return s.Store.Fenced(f).AppendEvent(ctx, e)
}

// EnqueueEvent implements store.Store under the fence of the event's run.
func (s *FencedStore) EnqueueEvent(e store.Event, done func(seq int64, err error)) {
	if e.RunID == "" {
		s.Store.EnqueueEvent(e, done)
		return
	}
	f, err := s.fenceOfRun(context.Background(), e.RunID)
	if err != nil {
		if done != nil {
			done(0, err)
		}
		return
	}
	s.Store.Fenced(f).EnqueueEvent(e, done)
}

// EnqueueUpdate implements store.Store under the run's fence.
func (s *FencedStore) EnqueueUpdate(id string, upd store.RunUpdate, done func(err error)) {
	f, err := s.fenceOfRun(context.Background(), id)
	if err != nil {
		if done != nil {
			done(err)
		}
		return
	}
	s.forget(id)
	s.Store.Fenced(f).EnqueueUpdate(id, upd, done)
}
