package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sync/errgroup"

	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/postgres"
)

// TestFenceAndRenewDoNotDeadlock: one replica's fenced writes (a group commit checks the fences of several keys
// in one transaction) and its batch renewal of the same leases, hammered at once, never deadlock. Both take the
// lease rows in name order; when the fence checks took them in the writes' order and the renewal in its plan's,
// PostgreSQL broke the cycle with 40P01 and a command's writes came back STORE_UNAVAILABLE (seen in
// TestFleetKube).
func TestFenceAndRenewDoNotDeadlock(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, err := postgres.Open(ctx, freshSchema(t, testDSN(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	const keys = 24
	held := make([]store.Lease, keys)
	for i := range held {
		if held[i], err = s.AcquireLease(ctx, fmt.Sprintf("key/%02d", i), "replica-a", "", time.Minute); err != nil {
			t.Fatal(err)
		}
	}

	var (
		mu       sync.Mutex
		failures = map[string]int{}
		rounds   int
	)
	fail := func(what string, err error) {
		var pe *pgconn.PgError
		code := "other"
		if errors.As(err, &pe) {
			code = pe.Code
		}
		mu.Lock()
		failures[what+" "+code]++
		if failures[what+" "+code] == 1 {
			t.Logf("%s: %v", what, err)
		}
		mu.Unlock()
	}
	stop := time.Now().Add(4 * time.Second)
	var g errgroup.Group
	for w := range 2 {
		g.Go(func() error { // the renewal, as fleet.Replica makes it (here without pause)
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for time.Now().Before(stop) {
				order := append([]store.Lease(nil), held...)
				r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
				renewed, err := s.RenewLeases(ctx, "replica-a", order, time.Minute)
				if err != nil {
					fail("renew", err)
				} else if len(renewed) != keys {
					return fmt.Errorf("renewed %d of %d leases", len(renewed), keys)
				}
			}
			return nil
		})
	}
	for w := range 4 {
		g.Go(func() error { // commands' events of every key, in a random order: one group, one transaction
			r := rand.New(rand.NewPCG(uint64(w), 2))
			for time.Now().Before(stop) {
				var wg sync.WaitGroup
				for _, i := range r.Perm(keys) {
					wg.Add(1)
					f := store.Fence{Lease: held[i].Name, Token: held[i].Token}
					e, err := events.New("", events.NameExecStarted, events.ExecStarted{Command: fmt.Sprint("echo ", i)})
					if err != nil {
						return err
					}
					s.Fenced(f).EnqueueEvent(e,
						func(_ int64, err error) {
							defer wg.Done()
							if err != nil {
								fail("fenced write", err)
							}
						})
				}
				wg.Wait()
				mu.Lock()
				rounds++
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rounds of %d fenced writes beside the renewals", rounds, keys)
	if len(failures) > 0 {
		t.Fatalf("failures (operation and SQLSTATE: count): %v; want none (40P01 is a deadlock)", failures)
	}
}
