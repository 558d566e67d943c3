package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"pgregory.net/rapid"

	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/store"
)

const (
	longTTL  = time.Minute
	shortTTL = 300 * time.Millisecond
)

func mustAcquire(t *testing.T, s store.Store, name, owner, address string, ttl time.Duration) store.Lease {
	t.Helper()
	l, err := s.AcquireLease(ctxOf(t), name, owner, address, ttl)
	if err != nil {
		t.Fatalf("AcquireLease(%s, %s): %v", name, owner, err)
	}
	if l.Name != name || l.Owner != owner || l.Address != address || !l.Live || l.Token <= 0 {
		t.Fatalf("AcquireLease(%s, %s, %s) = %+v", name, owner, address, l)
	}
	return l
}

// waitExpired sleeps until lease l has expired by the store's clock (GetLease says so).
func waitExpired(t *testing.T, s store.Store, l store.Lease) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := s.GetLease(ctxOf(t), l.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Live {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease %s still live 10s after it should have expired: %+v", l.Name, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// testLeaseLifecycle: acquire, a second owner refused with the holder, renewal keeps the token, release lets
// another owner in with a greater token, and a lost lease is not renewed.
func testLeaseLifecycle(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	a := mustAcquire(t, s, "key/aa", "replica-a", "10.0.0.1:7879", longTTL)
	if until := time.Until(a.Expires); until < longTTL-10*time.Second || until > longTTL+10*time.Second {
		t.Errorf("lease expires in %s, want about %s", until, longTTL)
	}
	holder, err := s.AcquireLease(ctx, "key/aa", "replica-b", "10.0.0.2:7879", longTTL)
	if !errors.Is(err, store.ErrLeaseHeld) || !errdefs.IsConflict(err) {
		t.Fatalf("a second owner acquired a live lease: %+v, %v; want ErrLeaseHeld", holder, err)
	}
	if holder.Owner != "replica-a" || holder.Address != "10.0.0.1:7879" || holder.Token != a.Token || !holder.Live {
		t.Errorf("refused acquire returned %+v, want the holder %+v", holder, a)
	}

	again := mustAcquire(t, s, "key/aa", "replica-a", "10.0.0.9:7879", longTTL)
	if again.Token != a.Token {
		t.Errorf("the holder acquiring again changed the token %d -> %d; a renewal keeps it", a.Token, again.Token)
	}
	got, err := s.GetLease(ctx, "key/aa")
	if err != nil || got.Address != "10.0.0.9:7879" || got.Token != a.Token || !got.Live {
		t.Errorf("GetLease = %+v, %v; want the new address and token %d", got, err, a.Token)
	}

	renewed, err := s.RenewLeases(ctx, "replica-a", []store.Lease{again}, longTTL)
	if err != nil || len(renewed) != 1 || renewed[0].Token != a.Token || renewed[0].Expires.Before(again.Expires) {
		t.Fatalf("RenewLeases = %+v, %v; want one lease, same token, expiring no earlier than %v", renewed, err, again.Expires)
	}

	if err := s.ReleaseLease(ctx, renewed[0]); err != nil {
		t.Fatalf("ReleaseLease: %v", err)
	}
	if got, err := s.GetLease(ctx, "key/aa"); err != nil || got.Live {
		t.Errorf("released lease reads %+v, %v; want not live", got, err)
	}
	b := mustAcquire(t, s, "key/aa", "replica-b", "10.0.0.2:7879", longTTL)
	if b.Token <= a.Token {
		t.Errorf("takeover after release: token %d, want more than %d", b.Token, a.Token)
	}
	if lost, err := s.RenewLeases(ctx, "replica-a", []store.Lease{renewed[0]}, longTTL); err != nil || len(lost) != 0 {
		t.Errorf("the old owner renewed a released lease: %+v, %v", lost, err)
	}
	if err := s.ReleaseLease(ctx, renewed[0]); err != nil {
		t.Errorf("releasing a lost lease: %v, want nil", err)
	}
	if got, _ := s.GetLease(ctx, "key/aa"); !got.Live || got.Owner != "replica-b" {
		t.Errorf("the old owner's release of a lost lease changed it: %+v", got)
	}
}

// testLeaseTakeover: an expired lease is taken over by another owner with a greater token; the old owner can
// neither renew it nor write under its fence, the new owner can; the old owner taking it back gets yet another.
func testLeaseTakeover(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	r := newRun(t, "acme", "alice")
	mustCreate(t, s, r)
	a := mustAcquire(t, s, "key/bb", "replica-a", "a:1", shortTTL)
	if _, err := s.Fenced(store.FenceOf(a)).AppendEvent(ctx, store.Event{RunID: r.ID, Name: events.NameExecStarted, RequestID: "a-live"}); err != nil {
		t.Fatalf("a write under a live fence: %v", err)
	}
	waitExpired(t, s, a)
	if _, err := s.Fenced(store.FenceOf(a)).AppendEvent(ctx, store.Event{RunID: r.ID, Name: events.NameExecStarted, RequestID: "a-expired"}); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("a write under an expired fence: %v, want ErrLeaseLost", err)
	}
	if renewed, err := s.RenewLeases(ctx, "replica-a", []store.Lease{a}, longTTL); err != nil || len(renewed) != 0 {
		t.Errorf("an expired lease was renewed: %+v, %v", renewed, err)
	}
	b := mustAcquire(t, s, "key/bb", "replica-b", "b:1", longTTL)
	if b.Token <= a.Token {
		t.Fatalf("takeover token %d, want more than %d", b.Token, a.Token)
	}
	stale := s.Fenced(store.FenceOf(a))
	if err := stale.CreateRun(ctx, newRun(t, "acme", "alice")); !errors.Is(err, store.ErrLeaseLost) || !errdefs.IsFailedPrecondition(err) {
		t.Errorf("the stale owner created a run: %v, want ErrLeaseLost", err)
	}
	if err := stale.UpdateRun(ctx, r.ID, store.RunUpdate{Status: store.StatusSucceeded}); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("the stale owner finished a run: %v, want ErrLeaseLost", err)
	}
	// Enqueued: the stale write fails alone, the new owner's around it are committed.
	var wg sync.WaitGroup
	var staleErr, newErr error
	wg.Add(2)
	stale.EnqueueEvent(store.Event{RunID: r.ID, Name: events.NameExecStarted, RequestID: "a-stale"}, func(_ int64, err error) { staleErr = err; wg.Done() })
	s.Fenced(store.FenceOf(b)).EnqueueEvent(store.Event{RunID: r.ID, Name: events.NameExecStarted, RequestID: "b-owner"}, func(_ int64, err error) { newErr = err; wg.Done() })
	wg.Wait()
	if !errors.Is(staleErr, store.ErrLeaseLost) || newErr != nil {
		t.Errorf("enqueued: stale owner's write %v (want ErrLeaseLost), new owner's %v (want nil)", staleErr, newErr)
	}
	if err := s.Fenced(store.FenceOf(b)).UpdateRun(ctx, r.ID, store.RunUpdate{Status: store.StatusSucceeded}); err != nil {
		t.Errorf("the new owner finished the run: %v", err)
	}
	evs, err := s.ListEvents(ctx, store.EventFilter{RunID: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got := requestIDs(evs); fmt.Sprint(got) != "[a-live b-owner]" {
		t.Errorf("events stored %v, want [a-live b-owner]: a stale owner's write got through, or a live one was lost", got)
	}
	if err := s.ReleaseLease(ctx, b); err != nil {
		t.Fatal(err)
	}
	back := mustAcquire(t, s, "key/bb", "replica-a", "a:2", shortTTL)
	waitExpired(t, s, back)
	again := mustAcquire(t, s, "key/bb", "replica-a", "a:2", longTTL)
	if back.Token <= b.Token || again.Token <= back.Token {
		t.Errorf("tokens %d, %d, %d after %d: every new acquisition needs a greater one", back.Token, again.Token, again.Token, b.Token)
	}
}

// testLeaseRace: owners racing for one free lease: exactly one wins, the others see it as the holder.
func testLeaseRace(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	const owners = 8
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []string
		holders = map[string]bool{}
	)
	for i := range owners {
		wg.Go(func() {
			owner := fmt.Sprintf("replica-%d", i)
			l, err := s.AcquireLease(ctx, "key/race", owner, owner, longTTL)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				winners = append(winners, owner)
			case errors.Is(err, store.ErrLeaseHeld):
				holders[l.Owner] = true
			default:
				t.Errorf("%s: %v", owner, err)
			}
		})
	}
	wg.Wait()
	if len(winners) != 1 {
		t.Fatalf("winners %v, want exactly one", winners)
	}
	for h := range holders {
		if h != winners[0] {
			t.Errorf("a refused owner was told %s holds it; %s does", h, winners[0])
		}
	}
}

// testLeaseList: ListLeases returns the live leases of a prefix, sorted; GetLease of none is ErrNotFound;
// malformed arguments are ErrInvalidArgument.
func testLeaseList(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	if _, err := s.GetLease(ctx, "key/none"); !errdefs.IsNotFound(err) {
		t.Errorf("GetLease of a lease never taken: %v, want ErrNotFound", err)
	}
	mustAcquire(t, s, "key/2", "r1", "", longTTL)
	mustAcquire(t, s, "key/1", "r2", "", longTTL)
	mustAcquire(t, s, "reaper", "r1", "", longTTL)
	gone := mustAcquire(t, s, "key/3", "r1", "", longTTL)
	if err := s.ReleaseLease(ctx, gone); err != nil {
		t.Fatal(err)
	}
	ls, err := s.ListLeases(ctx, "key/")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range ls {
		names = append(names, l.Owner+"@"+l.Name)
		if !l.Live {
			t.Errorf("ListLeases returned a lease that is not live: %+v", l)
		}
	}
	if fmt.Sprint(names) != "[r2@key/1 r1@key/2]" {
		t.Errorf("ListLeases(key/) = %v, want [r2@key/1 r1@key/2]", names)
	}
	for _, bad := range []struct {
		name, owner string
		ttl         time.Duration
	}{
		{"", "r", time.Second}, {"x", "", time.Second}, {"x", "r", 0}, {string(make([]byte, store.MaxLeaseName+1)), "r", time.Second},
	} {
		if _, err := s.AcquireLease(ctx, bad.name, bad.owner, "", bad.ttl); !errdefs.IsInvalidArgument(err) {
			t.Errorf("AcquireLease(%.10q, %q, %s): %v, want ErrInvalidArgument", bad.name, bad.owner, bad.ttl, err)
		}
	}
	if _, err := s.RenewLeases(ctx, "r1", []store.Lease{{Name: "key/1", Owner: "r2", Token: 1}}, time.Second); !errdefs.IsInvalidArgument(err) {
		t.Errorf("renewing another owner's lease: %v, want ErrInvalidArgument", err)
	}
}

// testLeaseOrdering is a property: whatever the interleaving of owners acquiring, renewing, releasing and
// writing under their fences (with leases expiring on their own), tokens never go back, a lease that changes
// owner gets a token greater than any before, and a write under a fence older than the newest token is refused.
func testLeaseOrdering(t *testing.T, s store.Store) {
	ctx := ctxOf(t)
	r := newRun(t, "acme", "prop")
	mustCreate(t, s, r)
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		name := fmt.Sprintf("prop/%d", n)
		owners := []string{"a", "b", "c"}
		held := map[string]store.Lease{} // each owner's last acquisition
		var newest store.Lease           // the last successful acquisition by anyone
		steps := rapid.IntRange(1, 12).Draw(rt, "steps")
		for range steps {
			owner := rapid.SampledFrom(owners).Draw(rt, "owner")
			switch rapid.IntRange(0, 4).Draw(rt, "op") {
			case 0, 1: // acquire, with a ttl that may run out during the sequence
				ttl := time.Duration(rapid.IntRange(20, 400).Draw(rt, "ttl_ms")) * time.Millisecond
				l, err := s.AcquireLease(ctx, name, owner, owner, ttl)
				if errors.Is(err, store.ErrLeaseHeld) {
					if l.Owner == owner {
						rt.Fatalf("%s refused its own lease %+v", owner, l)
					}
					if l.Token < newest.Token {
						rt.Fatalf("holder's token %d is older than the newest %d", l.Token, newest.Token)
					}
					continue
				}
				if err != nil {
					rt.Fatal(err)
				}
				switch {
				case l.Token < newest.Token:
					rt.Fatalf("token went back: %d after %d", l.Token, newest.Token)
				case newest.Token != 0 && newest.Owner != owner && l.Token == newest.Token:
					rt.Fatalf("owner changed %s -> %s with the same token %d", newest.Owner, owner, l.Token)
				}
				held[owner], newest = l, l
			case 2: // renew
				if l, ok := held[owner]; ok {
					renewed, err := s.RenewLeases(ctx, owner, []store.Lease{l}, 200*time.Millisecond)
					if err != nil {
						rt.Fatal(err)
					}
					if len(renewed) == 1 && renewed[0].Token != newest.Token {
						rt.Fatalf("%s renewed token %d, but %d is the newest", owner, renewed[0].Token, newest.Token)
					}
				}
			case 3: // release
				if l, ok := held[owner]; ok {
					if err := s.ReleaseLease(ctx, l); err != nil {
						rt.Fatal(err)
					}
				}
			case 4: // write under the owner's fence
				if l, ok := held[owner]; ok {
					_, err := s.Fenced(store.FenceOf(l)).AppendEvent(ctx, store.Event{RunID: r.ID, Name: events.NameExecStarted})
					if err == nil && l.Token != newest.Token {
						rt.Fatalf("a write under stale token %d got through (newest %d)", l.Token, newest.Token)
					}
					if err != nil && !errors.Is(err, store.ErrLeaseLost) {
						rt.Fatal(err)
					}
				}
			}
			if rapid.Bool().Draw(rt, "sleep") {
				time.Sleep(time.Duration(rapid.IntRange(0, 60).Draw(rt, "sleep_ms")) * time.Millisecond)
			}
		}
	})
}
