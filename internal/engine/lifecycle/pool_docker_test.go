package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// dockerPoolWorld is a home and a Docker driver that several Managers (processes) share.
type dockerPoolWorld struct {
	home  *Home
	drv   *docker.Driver
	image string
	agent string
}

func newDockerPoolWorld(t *testing.T, dir string) *dockerPoolWorld {
	t.Helper()
	cli := testutil.Docker(t)
	t.Cleanup(func() { _ = cli.Close() }) // drops idle connections only (goleak); the shared client keeps working
	home, err := OpenHome(dir)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Cleanup(t, home.Installation)
	return &dockerPoolWorld{home: home, drv: docker.NewWithEngine(cli, docker.Options{}),
		image: testutil.TestImage(t), agent: testutil.AgentBinary(t)}
}

func (w *dockerPoolWorld) manager(t *testing.T) *Manager {
	t.Helper()
	m, err := New(w.home, w.drv, Config{Image: w.image, AgentPath: w.agent, Runtime: os.Getenv("SANDKEEP_TEST_RUNTIME")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// TestPoolDocker is issue 23's must-show on Docker: a claimed sandbox is its key's (name, uid, an empty
// workspace of its own that no member or other key used) with its template's posture hash; 50 concurrent new keys
// each get a member of their own; a template change drains the pool.
func TestPoolDocker(t *testing.T) {
	w := newDockerPoolWorld(t, t.TempDir())
	m := w.manager(t)
	sh := poolShape(t, m, "pooled")
	startPool(t, m, sh, 2)
	for _, sb := range listPool(t, w) {
		mk := identity.Member("pooled", memberIDOf(sb.Labels[driver.LabelUser]))
		_, hash, err := m.postureOf(mk, poolShape(t, m, "pooled"))
		if err != nil || sb.Labels[driver.LabelPosture] != hash {
			t.Fatalf("member %s posture %s, its template's %s (%v)", sb.Name, sb.Labels[driver.LabelPosture], hash, err)
		}
	}

	t.Run("claimed is the key's", func(t *testing.T) {
		a, b := key(t, "acme", "a"), key(t, "acme", "b")
		_, claimed, out := claimedOut(t, m, a, sh, `ls -A /workspace; echo secret-a > /workspace/a; id -u; stat -c %u /workspace`)
		if !claimed {
			t.Fatal("not claimed")
		}
		lines := strings.Fields(out)
		if len(lines) != 2 || lines[0] != lines[1] {
			t.Fatalf("key a: workspace not empty or not its uid's: %q", out)
		}
		uidA := lines[0]
		if m.cfg.UIDs.Count > 0 {
			// The key's uid is the one recorded for the member its claim record names.
			want, err := m.home.AllocateUID(m.home.phys(a), m.cfg.UIDs, HostIDTaken)
			if err != nil || strconv.Itoa(want) != uidA || m.home.phys(a).Hex() == a.Hex() {
				t.Fatalf("key a runs as uid %s, its recorded uid is %d (%v)", uidA, want, err)
			}
			if got, _, err := m.idOf(a, sh); err != nil || strconv.Itoa(got) != uidA {
				t.Fatalf("key a's uid as the lifecycle resolves it: %d (%v), its sandbox runs as %s", got, err, uidA)
			}
		}
		_, hash, err := m.postureOf(a, poolShape(t, m, "pooled"))
		if err != nil {
			t.Fatal(err)
		}
		sb, err := m.inspectKey(t.Context(), a)
		if err != nil || sb.Labels[driver.LabelPosture] != hash {
			t.Fatalf("claimed sandbox %+v (%v): posture is not the template's for the key (%s)", sb, err, hash)
		}
		if err := m.Remove(t.Context(), a, false); err != nil {
			t.Fatal(err)
		}
		_, claimed, out = claimedOut(t, m, b, sh, `ls -A /workspace; id -u`)
		if !claimed {
			t.Fatal("b: not claimed")
		}
		if f := strings.Fields(out); len(f) != 1 || (m.cfg.UIDs.Count > 0 && f[0] == uidA) {
			t.Fatalf("key b after a was removed: %q (a ran as %s)", out, uidA)
		}
	})

	t.Run("50 concurrent claims", func(t *testing.T) {
		const n = 50
		if ok, err := m.StartPools(t.Context(), []PoolSpec{{Shape: sh, Size: n}}, 0); err != nil || !ok {
			t.Fatal(ok, err)
		}
		waitReadyFor(t, m, "pooled", n, 5*time.Minute)
		ids := make([]string, n)
		claimed := make([]bool, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				var res *ExecResult
				res, claimed[i] = claimedBy(t, m, key(t, "many", fmt.Sprint(i)), sh, "true")
				ids[i] = res.Sandbox.ID
			})
		}
		wg.Wait()
		seen := map[string]int{}
		for i, id := range ids {
			if !claimed[i] {
				t.Errorf("key %d was not served from the pool", i)
			}
			if j, dup := seen[id]; dup {
				t.Errorf("keys %d and %d share sandbox %s", j, i, id)
			}
			seen[id] = i
		}
		if _, err := m.StartPools(t.Context(), []PoolSpec{{Shape: sh, Size: 1}}, 0); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("template change drains", func(t *testing.T) {
		waitReady(t, m, "pooled", 1)
		before := listPool(t, w)
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		m2 := w.manager(t)
		sh2 := poolShape(t, m2, "pooled", "V=2")
		startPool(t, m2, sh2, 1)
		waitFor(t, "the old members to go", func() bool {
			for _, sb := range before {
				if _, err := w.drv.Inspect(context.Background(), sb.Name); !cerrdefs.IsNotFound(err) {
					return false
				}
			}
			return true
		})
		_, claimed, out := claimedOut(t, m2, key(t, "acme", "c"), sh2, "echo $V")
		if !claimed || out != "2\n" {
			t.Fatalf("claim after the change: %v %q", claimed, out)
		}
	})
}

// listPool lists the unclaimed members (a claimed one keeps its name: its claim record says whose it is).
func listPool(t *testing.T, w *dockerPoolWorld) []*driver.Sandbox {
	t.Helper()
	sbs, err := w.drv.List(t.Context(), w.home.Installation)
	if err != nil {
		t.Fatal(err)
	}
	var out []*driver.Sandbox
	for _, sb := range sbs {
		mk := identity.Member(sb.Labels[driver.LabelPool], memberIDOf(sb.Labels[driver.LabelUser]))
		if _, claimed := w.home.claimant(mk); !claimed && sb.Labels[driver.LabelPool] != "" && strings.HasPrefix(sb.Name, identity.PoolPrefix) {
			out = append(out, sb)
		}
	}
	return out
}

const envPoolHelper = "SANDKEEP_TEST_POOL_CLAIM_KILL" // home dir:step; the helper process below

// TestPoolClaimKilledDocker kills a process (SIGKILL) in the middle of a claim, at each step, and checks that the
// next process leaves no half-claimed member: cut after the member's copy of the record but before the key's, the
// member is back in the pool and the key has nothing; cut after the key's record, the key has the member (and its
// next command reuses it).
func TestPoolClaimKilledDocker(t *testing.T) {
	if spec := os.Getenv(envPoolHelper); spec != "" {
		poolClaimHelper(t, spec)
		return
	}
	for _, step := range []string{"indexed", "recorded"} {
		t.Run(step, func(t *testing.T) {
			dir := t.TempDir()
			w := newDockerPoolWorld(t, dir)
			m := w.manager(t)
			startPool(t, m, poolShape(t, m, "pooled"), 1)
			member := listPool(t, w)[0]
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestPoolClaimKilledDocker$", "-test.count=1")
			cmd.Env = append(os.Environ(), envPoolHelper+"="+dir+":"+step)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errorsAs(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("helper did not die by SIGKILL: %v\n%s", err, out)
			}
			k := key(t, "acme", "killed")
			m3 := w.manager(t)
			sh := poolShape(t, m3, "pooled")
			if ok, err := m3.StartPools(t.Context(), []PoolSpec{{Shape: sh, Size: 1}}, 0); err != nil || !ok {
				t.Fatal(ok, err)
			}
			switch step {
			case "indexed":
				if _, ok := w.home.readClaim(k); ok {
					t.Fatal("the cut claim has a record")
				}
				if _, err := m3.inspectKey(t.Context(), k); !cerrdefs.IsNotFound(err) {
					t.Fatalf("the key has a sandbox after a claim cut before its record: %v", err)
				}
				waitReady(t, m3, "pooled", 1)
				if got := listPool(t, w); len(got) != 1 || got[0].ID != member.ID {
					t.Fatalf("pool after restart %v, want the member %s adopted back", got, member.ID)
				}
			case "recorded":
				if rec, ok := w.home.readClaim(k); !ok || !rec.Done {
					t.Fatalf("record %+v %v, want the claim completed", rec, ok)
				}
				res, claimed, out := claimedOut(t, m3, k, sh, "ls -A /workspace")
				if claimed || res.Sandbox.ID != member.ID || out != "" {
					t.Fatalf("key after restart: claimed again %v, sandbox %s (member %s), files %q", claimed, res.Sandbox.ID, member.ID, out)
				}
			}
		})
	}
}

// poolClaimHelper is the process that gets killed: it keeps the pool and claims for acme/killed, dying at step.
func poolClaimHelper(t *testing.T, spec string) {
	dir, step, _ := strings.Cut(spec, ":")
	w := newDockerPoolWorld(t, dir)
	m := w.manager(t)
	sh := poolShape(t, m, "pooled")
	startPool(t, m, sh, 1)
	claimHook = func(s string) {
		if s == step {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	req, _ := sh2("true")
	req.Shape = sh
	_, err := m.Exec(t.Context(), key(t, "acme", "killed"), req)
	t.Fatalf("the claim finished (%v) without reaching step %s", err, step)
}

func errorsAs(err error, target **exec.ExitError) bool { return errors.As(err, target) }
