package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/fake"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// TestEnsureDecisions changes a sandbox between two execs and checks what the second one did with it.
func TestEnsureDecisions(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		change   func(t *testing.T, e *env, m *Manager, sb *driver.Sandbox) *Manager // returns the manager of the next exec
		recreate bool                                                                // a new sandbox replaces the old one
		started  bool                                                                // the same sandbox was started again
	}{
		{name: "unchanged", change: func(*testing.T, *env, *Manager, *driver.Sandbox) *Manager { return nil }},
		{name: "image retagged", recreate: true, change: func(_ *testing.T, e *env, _ *Manager, _ *driver.Sandbox) *Manager {
			e.drv.Retag(testImage, otherImageID)
			return nil
		}},
		{name: "posture changed", recreate: true, change: func(_ *testing.T, e *env, _ *Manager, _ *driver.Sandbox) *Manager {
			return e.manager(func(c *Config) { c.PidsLimit = 100 })
		}},
		{name: "agent changed", recreate: true, change: func(t *testing.T, e *env, _ *Manager, _ *driver.Sandbox) *Manager {
			agent := filepath.Join(t.TempDir(), "sandkeep-agent")
			if err := os.WriteFile(agent, []byte("a newer agent"), 0o755); err != nil {
				t.Fatal(err)
			}
			return e.manager(func(c *Config) { c.AgentPath = agent })
		}},
		{name: "stopped by driver", started: true, change: func(t *testing.T, e *env, _ *Manager, sb *driver.Sandbox) *Manager {
			if err := e.drv.Stop(ctx, sb, time.Second); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
		{name: "stopped behind our back", started: true, change: setState(driver.StateStopped)},
		{name: "paused", recreate: true, change: setState(driver.StatePaused)},
		{name: "dead", recreate: true, change: setState(driver.StateDead)},
		{name: "restarting", recreate: true, change: setState(driver.StateRestarting)},
		{name: "removed behind our back", recreate: true, change: func(_ *testing.T, e *env, _ *Manager, sb *driver.Sandbox) *Manager {
			e.drv.ExternalRemove(sb.Name)
			return nil
		}},
		{name: "stopped, seen by another manager", started: true, change: func(t *testing.T, e *env, _ *Manager, sb *driver.Sandbox) *Manager {
			setState(driver.StateStopped)(t, e, nil, sb)
			return e.manager()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			m := e.manager()
			k := key(t, "acme", "alice")
			first, _ := run(t, m, k, `echo kept > note.txt`)
			creates, starts, removes := e.drv.Calls(fake.OpCreate), e.drv.Calls(fake.OpStart), e.drv.Calls(fake.OpRemove)

			if next := tt.change(t, e, m, first.Sandbox); next != nil {
				m = next
			}
			second, out := run(t, m, k, `cat note.txt`)

			if out != "kept\n" {
				t.Errorf("workspace not kept: read %q", out)
			}
			now := e.inspect(k)
			if now.ID != second.Sandbox.ID || now.State != driver.StateRunning {
				t.Errorf("engine has %s (%s), exec ran in %s", now.ID, now.State, second.Sandbox.ID)
			}
			if got := e.count(); got != 1 {
				t.Errorf("%d sandboxes exist, want 1", got)
			}
			wantCreates, wantStarts, wantRemoves := creates, starts, removes
			switch {
			case tt.recreate:
				if second.Sandbox.ID == first.Sandbox.ID {
					t.Errorf("sandbox %s was reused, want a new one", first.Sandbox.ID)
				}
				wantCreates, wantStarts = creates+1, starts+1
				if tt.name != "removed behind our back" {
					wantRemoves = removes + 1
				}
			case tt.started:
				wantStarts = starts + 1
				fallthrough
			default:
				if second.Sandbox.ID != first.Sandbox.ID {
					t.Errorf("sandbox replaced (%s -> %s), want the same one", first.Sandbox.ID, second.Sandbox.ID)
				}
			}
			if got := e.drv.Calls(fake.OpCreate); got != wantCreates {
				t.Errorf("Create calls = %d, want %d", got, wantCreates)
			}
			if got := e.drv.Calls(fake.OpStart); got != wantStarts {
				t.Errorf("Start calls = %d, want %d", got, wantStarts)
			}
			if got := e.drv.Calls(fake.OpRemove); got != wantRemoves {
				t.Errorf("Remove calls = %d, want %d", got, wantRemoves)
			}
		})
	}
}

func setState(s driver.State) func(*testing.T, *env, *Manager, *driver.Sandbox) *Manager {
	return func(t *testing.T, e *env, _ *Manager, sb *driver.Sandbox) *Manager {
		t.Helper()
		if err := e.drv.SetState(sb.Name, s); err != nil {
			t.Fatal(err)
		}
		return nil
	}
}

func TestForeignContainerIsLeftAlone(t *testing.T) {
	tests := []struct {
		name   string
		labels func(t *testing.T, want map[string]string) map[string]string
		state  driver.State
	}{
		{"no labels", func(*testing.T, map[string]string) map[string]string { return nil }, driver.StateStopped},
		{"no labels, running", func(*testing.T, map[string]string) map[string]string { return nil }, driver.StateRunning},
		{"another installation", func(_ *testing.T, want map[string]string) map[string]string {
			want[driver.LabelInstallation] = "00000000000000000000000000000000"
			return want
		}, driver.StateStopped},
		{"another key's labels", func(t *testing.T, want map[string]string) map[string]string {
			want[driver.LabelKey] = key(t, "acme", "mallory").Hex()
			return want
		}, driver.StateRunning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			m := e.manager()
			k := key(t, "acme", "alice")
			ours := map[string]string{
				driver.LabelTenant: k.Tenant, driver.LabelUser: k.User, driver.LabelKey: k.Hex(),
				driver.LabelImageID: testImageID, driver.LabelInstallation: e.home.Installation,
			}
			foreign, err := e.drv.ExternalCreate(&driver.CreateSpec{
				Key: k, Name: k.ContainerName(), Image: testImage, ImageID: testImageID, Labels: tt.labels(t, ours),
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := e.drv.SetState(foreign.Name, tt.state); err != nil {
				t.Fatal(err)
			}

			ops := []struct {
				name string
				call func() error
			}{
				{"exec", func() error { _, err := m.Exec(t.Context(), k, ExecRequest{Argv: []string{"true"}}); return err }},
				{"stop", func() error { return m.Stop(t.Context(), k) }},
				{"remove keeping workspace", func() error { return m.Remove(t.Context(), k, true) }},
				{"remove with workspace", func() error { return m.Remove(t.Context(), k, false) }},
			}
			for _, op := range ops {
				if err := op.call(); !fault.Is(err, fault.ForeignContainer) {
					t.Errorf("%s = %v; want FOREIGN_CONTAINER", op.name, err)
				}
			}
			for _, op := range []fake.Op{fake.OpCreate, fake.OpStart, fake.OpStop, fake.OpRemove, fake.OpExec} {
				if n := e.drv.Calls(op); n != 0 {
					t.Errorf("driver %s called %d times on a foreign container", op, n)
				}
			}
			now := e.inspect(k)
			if now.ID != foreign.ID || now.State != tt.state {
				t.Errorf("foreign container is now %s (%s), was %s (%s)", now.ID, now.State, foreign.ID, tt.state)
			}
			infos, err := m.List(t.Context())
			if err != nil || len(infos) != 0 {
				t.Errorf("List = %+v, %v; a foreign container is not ours to list", infos, err)
			}
		})
	}
}

// TestCreateConflictAdopts: another process creates the sandbox between our Inspect and our Create.
func TestCreateConflictAdopts(t *testing.T) {
	for _, state := range []driver.State{driver.StateStopped, driver.StateRunning} {
		t.Run(fmt.Sprintf("winner %s", state), func(t *testing.T) {
			e := newEnv(t)
			m := e.manager()
			k := key(t, "acme", "alice")
			var winner atomic.Pointer[driver.Sandbox]
			e.drv.SetHooks(fake.Hooks{BeforeCreate: func(spec *driver.CreateSpec) {
				if winner.Load() != nil {
					return
				}
				theirs := *spec
				theirs.Labels = maps.Clone(spec.Labels)
				sb, err := e.drv.ExternalCreate(&theirs)
				if err != nil {
					t.Errorf("ExternalCreate: %v", err)
					return
				}
				if err := e.drv.SetState(sb.Name, state); err != nil {
					t.Error(err)
				}
				winner.Store(sb)
			}})

			res, _ := run(t, m, k, `echo adopted`)
			w := winner.Load()
			if w == nil {
				t.Fatal("the hook never ran")
			}
			if res.Sandbox.ID != w.ID {
				t.Errorf("exec ran in %s, want the winner's %s", res.Sandbox.ID, w.ID)
			}
			if got := e.count(); got != 1 {
				t.Errorf("%d sandboxes exist, want 1", got)
			}
			if n := e.drv.Calls(fake.OpRemove); n != 0 {
				t.Errorf("Remove called %d times; the winner must be adopted, not replaced", n)
			}
			wantStarts := 1
			if state == driver.StateRunning {
				wantStarts = 0
			}
			if n := e.drv.Calls(fake.OpStart); n != wantStarts {
				t.Errorf("Start called %d times, want %d", n, wantStarts)
			}
			again, _ := run(t, m, k, `true`)
			if again.Sandbox.ID != w.ID || e.drv.Calls(fake.OpCreate) != 1 {
				t.Errorf("after adoption: ran in %s, %d creates", again.Sandbox.ID, e.drv.Calls(fake.OpCreate))
			}
		})
	}
}

// TestRestartAdopts: a new Manager over the same home (a restarted process) reuses the sandbox and reads the
// key's last use from the home.
func TestRestartAdopts(t *testing.T) {
	e := newEnv(t)
	k := key(t, "acme", "alice")
	first, _ := run(t, e.manager(), k, `echo before > note.txt`)
	usedAt := e.clock.Now()

	later := e.clock.Advance(10 * time.Minute)
	m2 := e.manager()
	infos, err := m2.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 {
		t.Fatalf("List = %+v, want one sandbox", infos)
	}
	got := infos[0]
	if got.Key.Hex() != k.Hex() || got.ID != first.Sandbox.ID || got.State != driver.StateRunning || got.Image != testImage {
		t.Errorf("List = %+v", got)
	}
	if !got.LastUsed.Equal(usedAt) {
		t.Errorf("LastUsed = %v, want %v from the home", got.LastUsed, usedAt)
	}
	if got.IdleFor != 10*time.Minute {
		t.Errorf("IdleFor = %v, want 10m", got.IdleFor)
	}
	if !got.CreatedAt.Equal(usedAt) {
		t.Errorf("CreatedAt = %v, want %v", got.CreatedAt, usedAt)
	}

	second, out := run(t, m2, k, `cat note.txt`)
	if second.Sandbox.ID != first.Sandbox.ID || out != "before\n" {
		t.Errorf("restart: ran in %s (was %s), read %q", second.Sandbox.ID, first.Sandbox.ID, out)
	}
	if n := e.drv.Calls(fake.OpCreate); n != 1 {
		t.Errorf("Create called %d times, want 1", n)
	}
	if used := e.home.LastUsed(k); !used.Equal(later) {
		t.Errorf("LastUsed after the new exec = %v, want %v", used, later)
	}
}

func TestBrokenChannelRecycles(t *testing.T) {
	tests := []struct {
		name  string
		spoil func(t *testing.T, e *env, dir string) (script string, wait func())
	}{
		{"exec reports protocol error", func(_ *testing.T, e *env, _ string) (string, func()) {
			e.drv.FailNext(fake.OpExec, fmt.Errorf("%w: garbage frame", agentproto.ErrProtocol))
			return "true", func() {}
		}},
		{"sandbox stopped under the command", func(t *testing.T, e *env, dir string) (string, func()) {
			var wg sync.WaitGroup
			e.drv.SetHooks(fake.Hooks{BeforeExec: func(sb *driver.Sandbox, _ agentproto.Request) {
				wg.Go(func() { // stops the sandbox once the command runs; the test waits for it
					deadline := time.Now().Add(bound)
					for !exists(filepath.Join(dir, "started")) && time.Now().Before(deadline) {
						time.Sleep(5 * time.Millisecond)
					}
					_ = e.drv.Stop(context.Background(), sb, 0)
				})
			}})
			return `touch "$D/started"; sleep 60`, wg.Wait
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			m := e.manager()
			k := key(t, "acme", "alice")
			first, _ := run(t, m, k, `echo kept > note.txt`)

			dir := t.TempDir()
			script, wait := tt.spoil(t, e, dir)
			req, _ := sh(script, "D="+dir)
			res, err := m.Exec(t.Context(), k, req)
			wait()
			if !fault.Is(err, fault.AgentProtocol) || !errors.Is(err, agentproto.ErrProtocol) {
				t.Fatalf("Exec = %+v, %v; want AGENT_PROTOCOL wrapping ErrProtocol", res, err)
			}
			e.absent(k) // removed before Exec returned
			e.drv.SetHooks(fake.Hooks{})

			next, out := run(t, m, k, `cat note.txt`)
			if next.Sandbox.ID == first.Sandbox.ID {
				t.Errorf("next exec reused the broken sandbox %s", first.Sandbox.ID)
			}
			if out != "kept\n" {
				t.Errorf("workspace lost in the recycle: read %q", out)
			}
			if n := e.drv.Calls(fake.OpCreate); n != 2 {
				t.Errorf("Create called %d times, want 2", n)
			}
		})
	}
}

func TestNotRunningIsRetriedOnce(t *testing.T) {
	tests := []struct {
		name    string
		spoil   func(e *env, sb *driver.Sandbox)
		times   int32 // how many execs the hook spoils
		wantErr bool
		newBox  bool
	}{
		{"stopped once", func(e *env, sb *driver.Sandbox) { _ = e.drv.Stop(context.Background(), sb, 0) }, 1, false, false},
		{"removed once", func(e *env, sb *driver.Sandbox) { e.drv.ExternalRemove(sb.Name) }, 1, false, true},
		{"stopped every time", func(e *env, sb *driver.Sandbox) { _ = e.drv.Stop(context.Background(), sb, 0) }, 100, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			m := e.manager()
			k := key(t, "acme", "alice")
			first, _ := run(t, m, k, `true`)
			var spoiled atomic.Int32
			e.drv.SetHooks(fake.Hooks{BeforeExec: func(sb *driver.Sandbox, _ agentproto.Request) {
				if spoiled.Add(1) <= tt.times {
					tt.spoil(e, sb)
				}
			}})
			execs := e.drv.Calls(fake.OpExec)

			req, out := sh(`echo ran`)
			res, err := m.Exec(t.Context(), k, req)
			if got := e.drv.Calls(fake.OpExec) - execs; got != 2 {
				t.Errorf("driver Exec called %d times, want 2 (one retry)", got)
			}
			if tt.wantErr {
				if err == nil || !cerrdefs.IsConflict(err) {
					t.Errorf("Exec = %+v, %v; want the not-running error after one retry", res, err)
				}
				return
			}
			if err != nil || res.ExitCode != 0 || out.String() != "ran\n" {
				t.Fatalf("Exec = %+v, %v, %q; want a transparent retry", res, err, out.String())
			}
			if same := res.Sandbox.ID == first.Sandbox.ID; same == tt.newBox {
				t.Errorf("retry ran in %s (first %s), want new sandbox = %v", res.Sandbox.ID, first.Sandbox.ID, tt.newBox)
			}
		})
	}
}
