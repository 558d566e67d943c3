package lifecycle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/fake"
)

func TestOpenHomeAgreesOnInstallation(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "home")
	const n = 16
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			h, err := OpenHome(dir)
			if err == nil {
				ids[i] = h.Installation
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("OpenHome %d: %v", i, errs[i])
		}
		if ids[i] != ids[0] || len(ids[i]) != 32 {
			t.Errorf("installation ids differ: %q vs %q", ids[i], ids[0])
		}
	}
	other, err := OpenHome(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	if other.Installation == ids[0] {
		t.Error("two homes share an installation id")
	}
}

func TestTouchAndLastUsed(t *testing.T) {
	e := newEnv(t)
	k := key(t, "acme", "alice")
	if !e.home.LastUsed(k).IsZero() {
		t.Fatal("LastUsed of a new key is not zero")
	}
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	e.home.Touch(k, at)
	if got := e.home.LastUsed(k); !got.Equal(at) {
		t.Errorf("LastUsed = %v, want %v", got, at)
	}
	e.home.Touch(k, at.Add(time.Hour))
	if got := e.home.LastUsed(k); !got.Equal(at.Add(time.Hour)) {
		t.Errorf("LastUsed after a second Touch = %v", got)
	}
	e.home.ForgetKey(k)
	if !e.home.LastUsed(k).IsZero() {
		t.Error("LastUsed after ForgetKey is not zero")
	}
}

func TestInstallAgentIsContentAddressed(t *testing.T) {
	e := newEnv(t)
	a, err := e.home.InstallAgent(e.agent)
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.home.InstallAgent(e.agent)
	if err != nil || again != a {
		t.Errorf("reinstalling the same agent = %q, %v; want %q", again, err, a)
	}
	want, _ := os.ReadFile(e.agent)
	got, err := os.ReadFile(filepath.Join(a, "sandkeep-agent"))
	if err != nil || string(got) != string(want) {
		t.Errorf("installed agent = %q, %v", got, err)
	}
	if fi, err := os.Stat(filepath.Join(a, "sandkeep-agent")); err != nil || fi.Mode().Perm()&0o111 == 0 {
		t.Errorf("installed agent is not executable: %v, %v", fi, err)
	}
	other := filepath.Join(t.TempDir(), "agent2")
	if err := os.WriteFile(other, []byte("different"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := e.home.InstallAgent(other)
	if err != nil || b == a {
		t.Errorf("a different agent installed to %q, %v; want a new directory", b, err)
	}
}

func TestEnsureWorkspaceOwnership(t *testing.T) {
	e := newEnv(t)
	k := key(t, "acme", "alice")
	dir, err := e.home.EnsureWorkspace(k, 1000, 1000)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("workspace %s: %v, %v", dir, fi, err)
	}
	// A file where the workspace should be is refused, not followed or replaced.
	k2 := key(t, "acme", "bob")
	if err := os.Symlink("/etc", e.home.Workspace(k2)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.home.EnsureWorkspace(k2, 1000, 1000); err == nil {
		t.Error("EnsureWorkspace accepted a symlink as the workspace")
	}
}

// cancelOnStart cancels the caller's ctx as Start begins: the caller gives up while its sandbox starts.
type cancelOnStart struct {
	*fake.Driver
	cancel atomic.Pointer[context.CancelFunc]
}

func (d *cancelOnStart) Start(ctx context.Context, sb *driver.Sandbox) error {
	if c := d.cancel.Swap(nil); c != nil {
		(*c)()
	}
	return d.Driver.Start(ctx, sb)
}

// TestCancelDuringStartKeepsSandbox: a caller that gives up while its stopped sandbox starts does not get that
// sandbox removed; the next exec starts the same one.
func TestCancelDuringStartKeepsSandbox(t *testing.T) {
	e := newEnv(t)
	drv := &cancelOnStart{Driver: e.drv}
	m := e.managerOn(drv)
	k := key(t, "acme", "alice")
	first, _ := run(t, m, k, `true`)
	if err := e.drv.SetState(k.ContainerName(), driver.StateStopped); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	drv.cancel.Store(&cancel)
	if _, err := m.Exec(ctx, k, ExecRequest{Argv: []string{"true"}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Exec = %v; want context.Canceled", err)
	}
	if n := e.drv.Calls(fake.OpRemove); n != 0 {
		t.Errorf("a cancelled start removed the sandbox (%d removes)", n)
	}
	again, _ := run(t, m, k, `true`)
	if again.Sandbox.ID != first.Sandbox.ID {
		t.Errorf("next exec ran in %s, want the same sandbox %s", again.Sandbox.ID, first.Sandbox.ID)
	}
}
