package lifecycle

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sandkeep/sandkeep/internal/driver/fake"
	"github.com/sandkeep/sandkeep/internal/identity"
)

func TestExecReusesSandboxPerKey(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	alice := key(t, "acme", "alice")

	first, _ := run(t, m, alice, `echo hello > note.txt`)
	second, out := run(t, m, alice, `cat note.txt`)
	if out != "hello\n" {
		t.Errorf("second exec read %q, want the first's file", out)
	}
	if first.Sandbox.ID != second.Sandbox.ID {
		t.Errorf("sandbox changed between execs: %s then %s", first.Sandbox.ID, second.Sandbox.ID)
	}
	if n := e.drv.Calls(fake.OpCreate); n != 1 {
		t.Errorf("Create called %d times, want 1", n)
	}
	if _, err := os.Stat(filepath.Join(e.home.Workspace(alice), "note.txt")); err != nil {
		t.Errorf("file not in the key's workspace on the host: %v", err)
	}
}

func TestExecSeparatesKeys(t *testing.T) {
	tests := []struct {
		name  string
		owner [2]string // tenant, user of the key that writes
		other [2]string // tenant, user of the key that must not see it
	}{
		{"other user", [2]string{"acme", "alice"}, [2]string{"acme", "bob"}},
		{"other tenant", [2]string{"acme", "alice"}, [2]string{"globex", "alice"}},
		{"framing", [2]string{"a", "b:c"}, [2]string{"a:b", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			m := e.manager()
			owner, other := key(t, tt.owner[0], tt.owner[1]), key(t, tt.other[0], tt.other[1])

			a, _ := run(t, m, owner, `echo secret > mine.txt`)
			req, out := sh(`cat mine.txt 2>/dev/null; ls -A`)
			b, err := m.Exec(t.Context(), other, req)
			if err != nil {
				t.Fatal(err)
			}
			if b.ExitCode != 0 || out.String() != "" {
				t.Errorf("other key's workspace is not empty: exit %d, output %q", b.ExitCode, out.String())
			}
			if a.Sandbox.ID == b.Sandbox.ID || a.Sandbox.Name == b.Sandbox.Name {
				t.Errorf("keys share a sandbox: %s/%s", a.Sandbox.Name, b.Sandbox.Name)
			}
			if e.home.Workspace(owner) == e.home.Workspace(other) {
				t.Errorf("keys share a workspace: %s", e.home.Workspace(owner))
			}
			if n := e.drv.Calls(fake.OpCreate); n != 2 {
				t.Errorf("Create called %d times, want 2", n)
			}
		})
	}
}

func TestConcurrentFirstExecCreatesOnce(t *testing.T) {
	const n = 100
	e := newEnv(t)
	m := e.manager()
	k := key(t, "acme", "alice")

	var wg sync.WaitGroup
	results := make([]*ExecResult, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			results[i], errs[i] = m.Exec(t.Context(), k, ExecRequest{Argv: []string{"true"}})
		})
	}
	wg.Wait()

	ids := map[string]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("exec %d: %v", i, errs[i])
		}
		if results[i].ExitCode != 0 {
			t.Errorf("exec %d: exit %d", i, results[i].ExitCode)
		}
		ids[results[i].Sandbox.ID]++
	}
	if len(ids) != 1 {
		t.Errorf("execs ran in %d sandboxes, want 1: %v", len(ids), ids)
	}
	if got := e.drv.Calls(fake.OpCreate); got != 1 {
		t.Errorf("Create called %d times, want 1", got)
	}
	if got := e.count(); got != 1 {
		t.Errorf("%d sandboxes exist, want 1", got)
	}
}

// TestSameKeySerializes runs commands that fail (exit 9) when another command of the key is inside the same
// critical section: a directory only one of them can hold at a time. Any overlap fails a command.
func TestSameKeySerializes(t *testing.T) {
	for _, managers := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d managers", managers), func(t *testing.T) {
			e := newEnv(t)
			ms := make([]*Manager, managers)
			for i := range ms {
				ms[i] = e.manager()
			}
			k := key(t, "acme", "alice")
			dir := t.TempDir()
			const script = `mkdir "$D/lock" || exit 9; sleep 0.1; rmdir "$D/lock"`

			var wg sync.WaitGroup
			for i := range 6 {
				m := ms[i%managers]
				wg.Go(func() {
					for range 2 {
						req, out := sh(script, "D="+dir)
						res, err := m.Exec(t.Context(), k, req)
						if err != nil {
							t.Errorf("exec: %v", err)
							return
						}
						if res.ExitCode != 0 {
							t.Errorf("exec overlapped another of the same key: exit %d, %q", res.ExitCode, out.String())
						}
					}
				})
			}
			wg.Wait()
			if got := e.drv.Calls(fake.OpCreate); got != 1 {
				t.Errorf("Create called %d times, want 1", got)
			}
		})
	}
}

// TestKeysRunInParallel proves overlap: each key's command waits (bounded) for a marker the other key's command
// writes, so both succeed only when they ran at the same time.
func TestKeysRunInParallel(t *testing.T) {
	for _, managers := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d managers", managers), func(t *testing.T) {
			e := newEnv(t)
			ms := []*Manager{e.manager()}
			if managers == 2 {
				ms = append(ms, e.manager())
			} else {
				ms = append(ms, ms[0])
			}
			dir := t.TempDir()
			const script = `touch "$D/$ME"; i=0; while [ ! -e "$D/$PEER" ]; do sleep 0.02; i=$((i+1)); [ $i -lt 500 ] || exit 7; done`
			keys := []struct {
				me, peer string
				k        identity.Key
			}{{"alice", "bob", key(t, "acme", "alice")}, {"bob", "alice", key(t, "acme", "bob")}}

			var wg sync.WaitGroup
			for i, kk := range keys {
				wg.Go(func() {
					req, out := sh(script, "D="+dir, "ME="+kk.me, "PEER="+kk.peer)
					res, err := ms[i].Exec(t.Context(), kk.k, req)
					if err != nil {
						t.Errorf("%s: %v", kk.me, err)
						return
					}
					if res.ExitCode != 0 {
						t.Errorf("%s never saw %s's marker (keys did not overlap): exit %d, %q", kk.me, kk.peer, res.ExitCode, out.String())
					}
				})
			}
			wg.Wait()
		})
	}
}
