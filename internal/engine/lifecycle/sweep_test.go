package lifecycle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/fake"
)

func sweep(t *testing.T, m *Manager) SweepReport {
	t.Helper()
	rep, err := m.SweepOnce(t.Context())
	if err != nil {
		t.Fatalf("SweepOnce: %v", err)
	}
	return rep
}

func TestSweepStopsIdleAndRestarts(t *testing.T) {
	e := newEnv(t)
	m := e.manager(func(c *Config) { c.IdleTimeout = 30 * time.Minute })
	k := key(t, "acme", "alice")
	first, _ := run(t, m, k, `true`)

	e.clock.Advance(29 * time.Minute)
	if rep := sweep(t, m); len(rep.Stopped)+len(rep.Removed)+len(rep.Skipped) != 0 {
		t.Errorf("sweep before the idle timeout did %+v", rep)
	}
	e.clock.Advance(2 * time.Minute)
	rep := sweep(t, m)
	if !slices.Equal(rep.Stopped, []string{k.ContainerName()}) || len(rep.Removed) != 0 {
		t.Errorf("sweep past the idle timeout = %+v; want %s stopped", rep, k.ContainerName())
	}
	if st := e.inspect(k).State; st != driver.StateStopped {
		t.Errorf("idle sandbox is %s after the sweep, want stopped", st)
	}

	again, _ := run(t, m, k, `true`)
	if again.Sandbox.ID != first.Sandbox.ID {
		t.Errorf("exec after the sweep ran in %s, want the same sandbox %s started again", again.Sandbox.ID, first.Sandbox.ID)
	}
	if n := e.drv.Calls(fake.OpCreate); n != 1 {
		t.Errorf("Create called %d times, want 1", n)
	}
	if st := e.inspect(k).State; st != driver.StateRunning {
		t.Errorf("sandbox is %s after the exec, want running", st)
	}
}

func TestSweepSkipsBusyKey(t *testing.T) {
	for _, tt := range []struct {
		name        string
		sameManager bool // the command runs in the sweeping manager; otherwise in another one (process)
	}{{"same manager", true}, {"other manager", false}} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			m := e.manager()
			k, idle := key(t, "acme", "alice"), key(t, "acme", "bob")
			run(t, m, idle, `true`)
			runner := m
			if !tt.sameManager {
				runner = e.manager()
			}
			release := holder(t, runner, k)

			e.clock.Advance(time.Hour)
			rep := sweep(t, m)
			if !slices.Equal(rep.Skipped, []string{k.ContainerName()}) {
				t.Errorf("Skipped = %v, want the busy %s", rep.Skipped, k.ContainerName())
			}
			if !slices.Equal(rep.Stopped, []string{idle.ContainerName()}) {
				t.Errorf("Stopped = %v, want the idle %s", rep.Stopped, idle.ContainerName())
			}
			if st := e.inspect(k).State; st != driver.StateRunning {
				t.Errorf("busy sandbox is %s, want running", st)
			}
			release() // the command finishes undisturbed
		})
	}
}

// TestSweepSkipsQueuedWaiter: a key someone queues for is left alone even in the instant nobody holds it.
func TestSweepSkipsQueuedWaiter(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	k := key(t, "acme", "alice")
	run(t, m, k, `true`)
	e.clock.Advance(time.Hour)

	gt, err := m.gates.join(k) // a caller between counting itself and taking the semaphore
	if err != nil {
		t.Fatal(err)
	}
	rep := sweep(t, m)
	m.gates.leave(k, gt)
	if !slices.Equal(rep.Skipped, []string{k.ContainerName()}) || len(rep.Stopped) != 0 {
		t.Errorf("sweep with a queued waiter = %+v; want it skipped", rep)
	}
	if rep := sweep(t, m); !slices.Equal(rep.Stopped, []string{k.ContainerName()}) {
		t.Errorf("sweep once the waiter left = %+v; want it stopped", rep)
	}
}

func TestSweepRemovesPastRetention(t *testing.T) {
	for _, removeWorkspace := range []bool{false, true} {
		name := "workspace kept"
		if removeWorkspace {
			name = "workspace removed"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			m := e.manager(func(c *Config) { c.RemoveWorkspace = removeWorkspace })
			k := key(t, "acme", "alice")
			run(t, m, k, `echo data > note.txt`)
			ws := e.home.Workspace(k)

			e.clock.Advance(time.Hour)
			if rep := sweep(t, m); len(rep.Stopped) != 1 {
				t.Fatalf("first sweep = %+v, want one stopped", rep)
			}
			e.clock.Advance(time.Hour) // stopped, not yet past the 24h retention
			if rep := sweep(t, m); len(rep.Stopped)+len(rep.Removed) != 0 {
				t.Errorf("sweep within retention did %+v", rep)
			}
			e.inspect(k)

			e.clock.Advance(24 * time.Hour)
			rep := sweep(t, m)
			if !slices.Equal(rep.Removed, []string{k.ContainerName()}) {
				t.Errorf("sweep past retention = %+v, want %s removed", rep, k.ContainerName())
			}
			e.absent(k)
			if !e.home.LastUsed(k).IsZero() {
				t.Errorf("last-used record kept after removal")
			}
			if _, err := os.Stat(filepath.Join(ws, "note.txt")); (err == nil) == removeWorkspace {
				t.Errorf("workspace file after removal: %v (RemoveWorkspace=%v)", err, removeWorkspace)
			}

			res, out := run(t, m, k, `cat note.txt 2>/dev/null || echo none`)
			want := "data\n"
			if removeWorkspace {
				want = "none\n"
			}
			if out != want {
				t.Errorf("new sandbox read %q, want %q", out, want)
			}
			if res.Sandbox.State != driver.StateRunning || e.drv.Calls(fake.OpCreate) != 2 {
				t.Errorf("after removal: %+v, %d creates", res.Sandbox, e.drv.Calls(fake.OpCreate))
			}
		})
	}
}

func TestSweepReportsEngineErrors(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	k := key(t, "acme", "alice")
	run(t, m, k, `true`)
	e.clock.Advance(time.Hour)

	e.drv.FailNext(fake.OpInspect, errEngine)
	rep, err := m.SweepOnce(t.Context())
	if !errors.Is(err, errEngine) {
		t.Errorf("SweepOnce = %+v, %v; want the engine error reported", rep, err)
	}
	if st := e.inspect(k).State; st != driver.StateRunning {
		t.Errorf("sandbox is %s after a failed sweep", st)
	}
	e.drv.FailNext(fake.OpList, errEngine)
	if _, err := m.SweepOnce(t.Context()); !errors.Is(err, errEngine) {
		t.Errorf("SweepOnce with a failing List = %v", err)
	}
	if rep := sweep(t, m); len(rep.Stopped) != 1 {
		t.Errorf("sweep after the engine recovered = %+v", rep)
	}
}

var errEngine = errors.New("engine hiccup")

func TestTrySweeper(t *testing.T) {
	e := newEnv(t)
	m1, m2 := e.manager(), e.manager()

	s1, ok, err := m1.TrySweeper()
	if err != nil || !ok {
		t.Fatalf("first TrySweeper = %v, %v", ok, err)
	}
	for name, m := range map[string]*Manager{"other manager": m2, "same manager": m1} {
		if s, ok, err := m.TrySweeper(); err != nil || ok {
			t.Errorf("%s: TrySweeper while held = %v, %v; want false", name, ok, err)
			if ok {
				_ = s.Release()
			}
		}
	}
	if err := s1.Release(); err != nil {
		t.Fatal(err)
	}
	s2, ok, err := m2.TrySweeper()
	if err != nil || !ok {
		t.Fatalf("TrySweeper after release = %v, %v", ok, err)
	}
	if err := s2.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestRunSweeperTakesOver: a RunSweeper that cannot get the home's sweeper lock does not sweep, and takes
// over once the holder releases it.
func TestRunSweeperTakesOver(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	k := key(t, "acme", "alice")
	run(t, m, k, `true`)
	e.clock.Advance(time.Hour)

	other, ok, err := e.manager().TrySweeper()
	if err != nil || !ok {
		t.Fatalf("TrySweeper = %v, %v", ok, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.RunSweeper(ctx, 10*time.Millisecond) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("RunSweeper = %v", err)
			}
		case <-time.After(bound):
			t.Error("RunSweeper did not return after its ctx ended")
		}
	}()

	time.Sleep(100 * time.Millisecond) // several ticks without the lock
	if n := e.drv.Calls(fake.OpList); n != 0 {
		t.Errorf("RunSweeper swept (%d lists) while another held the sweeper lock", n)
	}
	if st := e.inspect(k).State; st != driver.StateRunning {
		t.Fatalf("sandbox is %s while another held the sweeper lock", st)
	}
	if err := other.Release(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "RunSweeper to stop the idle sandbox", func() bool {
		sb, err := e.drv.Inspect(context.Background(), k.ContainerName())
		return err == nil && sb.State == driver.StateStopped
	})
	if s, ok, _ := e.manager().TrySweeper(); ok {
		t.Error("the sweeper lock is free while RunSweeper runs")
		_ = s.Release()
	}
}
