package sandkeep_test

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/driver/fake"
	"github.com/sandkeep/sandkeep/internal/engine"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/testutil"
	"github.com/sandkeep/sandkeep/stores"
)

// lateStore stands for a process that dies right after it answered: whatever it only enqueued (a write the
// writer goroutine had not committed yet) reaches the database late, here 2 s late.
type lateStore struct{ store.Store }

func (s lateStore) EnqueueUpdate(id string, upd store.RunUpdate, done func(error)) {
	go func() {
		time.Sleep(2 * time.Second)
		s.Store.EnqueueUpdate(id, upd, done)
	}()
}

// TestFinishDurableBeforeAnswer: when Exec hands back a command's result, its run's finish and the command's
// events are already committed, as another process reading the database sees them (issue 26: a crash after the
// HTTP 200 must not lose a finish the caller was told about). Before, the finish was enqueued and committed
// behind the answer.
func TestFinishDurableBeforeAnswer(t *testing.T) {
	t.Parallel()
	drv := fake.New(fake.WithTempDir(t.TempDir()), fake.WithImage("seed-img", fakeImageID))
	dsn := filepath.Join(t.TempDir(), "runs.db")
	st, err := stores.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cfg := sandkeep.Config{Home: t.TempDir(), Image: "seed-img", AgentPath: testutil.AgentBinary(t), NoSweeper: true,
		Store: lateStore{st}, Drivers: []sandkeep.DriverOption{engine.DriverOption{Name: sandkeep.DriverDocker,
			New: func(engine.DriverEnv) (engine.Driver, error) { return drv, nil }}}}
	m, err := sandkeep.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	key, _ := sandkeep.NewKey("acme", "durable")
	if _, err := m.Exec(t.Context(), key, sandkeep.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	other, err := stores.Open(t.Context(), dsn) // another process's view: nothing of st's queue is flushed for it
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	runs, err := other.ListRuns(t.Context(), store.RunFilter{Tenant: "acme"})
	if err != nil || len(runs) != 1 || runs[0].Status != store.StatusSucceeded {
		t.Fatalf("runs seen by another process right after the answer: %+v, %v; want one, succeeded", runs, err)
	}
	evs, err := other.ListEvents(t.Context(), store.EventFilter{RunID: runs[0].ID})
	if err != nil || !slices.ContainsFunc(evs, func(e store.Event) bool { return e.Name == "exec_finished" }) {
		t.Fatalf("events seen by another process right after the answer: %+v, %v; want exec_finished", evs, err)
	}
}
