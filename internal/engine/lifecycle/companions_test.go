package lifecycle

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/fake"
)

// companionDriver is the fake driver with companions: it counts EnsureCompanions calls, the engine round trips
// a command would otherwise pay per companion.
type companionDriver struct {
	*fake.Driver
	ensures atomic.Int32
}

func (d *companionDriver) EnsureCompanions(ctx context.Context, sb *driver.Sandbox, p driver.Posture, cs []driver.Companion) error {
	d.ensures.Add(1)
	return nil
}

// TestCompanionsPosture: a shape's companions are part of its posture, so a changed service definition recycles
// the sandbox (and its companions with it) as a changed image does; commands on a sandbox this process already
// ensured with the same companions do not ensure them again, and a recycled or restarted one does.
func TestCompanionsPosture(t *testing.T) {
	e := newEnv(t)
	drv := &companionDriver{Driver: e.drv}
	m := e.managerOn(drv)
	k := key(t, "acme", "compose")
	shape := func(env string) *Shape {
		s, err := m.NewShape("", func(c *Config) {
			c.Companions = []driver.Companion{{Service: "db", Image: testImage, Env: []string{"MODE=" + env}}}
		})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	exec := func(s *Shape) *ExecResult {
		t.Helper()
		req, out := sh("true")
		req.Shape = s
		res, err := m.Exec(t.Context(), k, req)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("Exec: %v, %+v, %q", err, res, out)
		}
		return res
	}

	one := shape("a")
	first := exec(one)
	for range 3 {
		exec(one)
	}
	if n := drv.ensures.Load(); n != 1 {
		t.Errorf("companions ensured %d times for four commands on one sandbox, want 1", n)
	}
	if again := exec(shape("a")); again.Sandbox.ID != first.Sandbox.ID {
		t.Errorf("an equal shape recycled the sandbox: %s then %s", first.Sandbox.ID, again.Sandbox.ID)
	}

	changed := exec(shape("b"))
	if changed.Sandbox.ID == first.Sandbox.ID {
		t.Errorf("a changed companion did not recycle the sandbox (%s)", first.Sandbox.ID)
	}
	if n := drv.ensures.Load(); n != 2 {
		t.Errorf("companions ensured %d times after the change, want 2", n)
	}

	if err := m.Stop(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	exec(shape("b"))
	if n := drv.ensures.Load(); n != 3 {
		t.Errorf("companions ensured %d times after a stop and a command, want 3", n)
	}
}
