package lifecycle

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/testutil/kubetest"
)

// Warm pools on the test node (scripts/test.sh's kubernetes stage runs these with SANDKEEP_REQUIRE_KUBE=1). The
// node holds 60 pods and is shared, so the members request little (10m CPU, 16 MiB) and the concurrent claims
// are kubePoolBurst, not the 50 of the Docker test: a claimed member's refill doubles the pods of a burst.
const kubePoolBurst = 20

// kubePoolWorld is one namespace of the test node and the replicas (homes of their own, one installation)
// that share it, as a fleet's serve replicas do.
type kubePoolWorld struct {
	c            *kubetest.Cluster
	ns           string
	installation string
}

func newKubePoolWorld(t *testing.T, ns string) *kubePoolWorld {
	t.Helper()
	c := kubetest.Node(t)
	if ns == "" {
		ns = c.Namespace(t)
	}
	return &kubePoolWorld{c: c, ns: ns}
}

// replica opens a home in dir with the world's installation id (the first replica's) and a manager on it.
func (w *kubePoolWorld) replica(t *testing.T, dir string) (*Manager, *Home, *kube.Driver) {
	t.Helper()
	if w.installation != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(dir, "installation-id")); os.IsNotExist(err) {
			if err := os.WriteFile(filepath.Join(dir, "installation-id"), []byte(w.installation+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	home, err := OpenHome(dir)
	if err != nil {
		t.Fatal(err)
	}
	if w.installation == "" {
		w.installation = home.Installation
	}
	drv, err := kube.New(w.c.Options(w.ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drv.Close() })
	m, err := New(home, drv, Config{Image: kubetest.Image, AgentPath: w.c.Agent,
		NanoCPUs: 200e6, MemoryBytes: 128 << 20, RequestNanoCPUs: 10e6, RequestMemoryBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m, home, drv
}

// members lists the pool members in the namespace that no key claimed.
func (w *kubePoolWorld) members(t *testing.T, drv *kube.Driver) []*driver.Sandbox {
	t.Helper()
	sbs, err := drv.List(t.Context(), w.installation)
	if err != nil {
		t.Fatal(err)
	}
	var out []*driver.Sandbox
	for _, sb := range sbs {
		if _, claimed := driver.ClaimOf(sb); !claimed && sb.Labels[driver.LabelPool] != "" {
			out = append(out, sb)
		}
	}
	return out
}

// hasClaim says whether the workspace claim (PVC) of the sandbox named name exists.
func (w *kubePoolWorld) hasClaim(t *testing.T, name string) bool {
	t.Helper()
	pvc, err := w.c.API.CoreV1().PersistentVolumeClaims(w.ns).Get(t.Context(), kube.ClaimName(name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return pvc.DeletionTimestamp == nil
}

// TestPoolKube is issue 23's must-show on Kubernetes: members are pods with their workspace claims made ahead,
// with their template's posture hash; a claimed sandbox is its key's (the key's uid, an empty workspace, the
// claim on the member's record where another replica finds it) with no new pod; concurrent claims through two
// replicas that both keep the pool never share a member; a template change drains the pool, each member with
// its workspace claim.
func TestPoolKube(t *testing.T) {
	w := newKubePoolWorld(t, "")
	m, _, drv := w.replica(t, t.TempDir())
	sh := poolShape(t, m, "pooled")
	startPoolFor(t, m, sh, 2, 3*time.Minute)
	for _, sb := range w.members(t, drv) {
		mk := identity.Member("pooled", memberIDOf(sb.Labels[driver.LabelUser]))
		_, hash, err := m.postureOf(mk, poolShape(t, m, "pooled"))
		if err != nil || sb.Labels[driver.LabelPosture] != hash {
			t.Fatalf("member %s posture %s, its template's %s (%v)", sb.Name, sb.Labels[driver.LabelPosture], hash, err)
		}
		if sb.State != driver.StateRunning || !w.hasClaim(t, sb.Name) {
			t.Fatalf("member %s is %s, workspace claim %v: want running with its claim made ahead", sb.Name, sb.State, w.hasClaim(t, sb.Name))
		}
	}

	t.Run("claimed is the key's", func(t *testing.T) {
		before := map[string]string{} // member name -> pod UID
		for _, sb := range w.members(t, drv) {
			pod, err := w.c.API.CoreV1().Pods(w.ns).Get(t.Context(), sb.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			before[sb.Name] = string(pod.UID)
		}
		a := key(t, "acme", "a")
		res, claimed, out := claimedOut(t, m, a, sh, `ls -A /workspace; echo secret-a > /workspace/a; id -u`)
		if !claimed {
			t.Fatal("not claimed")
		}
		uid, _, err := m.idOf(a, sh)
		if err != nil {
			t.Fatal(err)
		}
		if out != strconv.Itoa(uid)+"\n" {
			t.Fatalf("key a: want an empty workspace and uid %d, got %q", uid, out)
		}
		podUID, member := before[res.Sandbox.Name]
		if !member {
			t.Fatalf("key a runs in %s, not one of the members %v", res.Sandbox.Name, before)
		}
		pod, err := w.c.API.CoreV1().Pods(w.ns).Get(t.Context(), res.Sandbox.Name, metav1.GetOptions{})
		if err != nil || string(pod.UID) != podUID {
			t.Fatalf("the claim replaced the member's pod (%v): a claim must not need a new pod", err)
		}
		_, hash, err := m.postureOf(a, poolShape(t, m, "pooled"))
		if err != nil || res.Sandbox.Labels[driver.LabelPosture] != hash {
			t.Fatalf("claimed sandbox posture %s, the template's for the key %s (%v)", res.Sandbox.Labels[driver.LabelPosture], hash, err)
		}

		// Another replica (its own home, no pool of its own) finds a's sandbox through the member's record.
		m2, _, _ := w.replica(t, t.TempDir())
		res2, claimed2, out2 := claimedOut(t, m2, a, sh, `cat /workspace/a`)
		if claimed2 || res2.Sandbox.ID != res.Sandbox.ID || out2 != "secret-a\n" {
			t.Fatalf("key a through another replica: claimed again %v, sandbox %s (want %s), file %q", claimed2, res2.Sandbox.ID, res.Sandbox.ID, out2)
		}

		// Removing the key removes the member's pod, record and workspace claim.
		if err := m2.Remove(t.Context(), a, false); err != nil {
			t.Fatal(err)
		}
		if _, err := drv.Inspect(t.Context(), res.Sandbox.Name); !cerrdefs.IsNotFound(err) {
			t.Fatalf("the removed key's member is still there: %v", err)
		}
		if w.hasClaim(t, res.Sandbox.Name) {
			t.Fatalf("the removed key's member kept its workspace claim %s", kube.ClaimName(res.Sandbox.Name))
		}
		waitReadyFor(t, m, "pooled", 2, 3*time.Minute)
		b := key(t, "acme", "b")
		_, claimed, out = claimedOut(t, m, b, sh, `ls -A /workspace`)
		if !claimed || out != "" {
			t.Fatalf("key b: claimed %v, workspace %q", claimed, out)
		}
	})

	t.Run("concurrent claims through two replicas", func(t *testing.T) {
		const n = kubePoolBurst
		if ok, err := m.StartPools(t.Context(), []PoolSpec{{Shape: sh, Size: n}}, 0); err != nil || !ok {
			t.Fatal(ok, err)
		}
		waitReadyFor(t, m, "pooled", n, 5*time.Minute)
		// A second replica keeps the same pool: it adopts the same members, so both hold each as ready.
		m3, _, _ := w.replica(t, t.TempDir())
		sh3 := poolShape(t, m3, "pooled")
		if ok, err := m3.StartPools(t.Context(), []PoolSpec{{Shape: sh3, Size: n}}, 0); err != nil || !ok {
			t.Fatal(ok, err)
		}
		waitReadyFor(t, m3, "pooled", n, time.Minute)
		ids := make([]string, n)
		claimed := make([]bool, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				mm, s := m, sh
				if i%2 == 1 {
					mm, s = m3, sh3
				}
				res, c := claimedBy(t, mm, key(t, "many", fmt.Sprint(i)), s, "true")
				ids[i], claimed[i] = res.Sandbox.ID, c
			})
		}
		wg.Wait()
		seen := map[string]int{}
		fromPool := 0
		for i, id := range ids {
			if claimed[i] {
				fromPool++
			}
			if j, dup := seen[id]; dup {
				t.Errorf("keys %d and %d share sandbox %s", j, i, id)
			}
			seen[id] = i
			sb, err := drv.Claimed(t.Context(), w.installation, key(t, "many", fmt.Sprint(i)).Hex())
			if claimed[i] && (err != nil || sb.ID != id) {
				t.Errorf("key %d: the member's record does not name it: %+v (%v), want sandbox %s", i, sb, err, id)
			}
		}
		// The two replicas race for the same members: each member goes to one key (the record's
		// compare-and-swap), and a replica that loses takes its next one or creates.
		if fromPool < n/2 {
			t.Errorf("only %d of %d keys were served from the pool", fromPool, n)
		}
		t.Logf("%d of %d concurrent keys served from the pool, through two replicas", fromPool, n)
		if _, err := m.StartPools(t.Context(), []PoolSpec{{Shape: sh, Size: 1}}, 0); err != nil {
			t.Fatal(err)
		}
		m3.Close() // its members stay, as a replica's that stopped do
		for i := range n {
			if err := m.Remove(t.Context(), key(t, "many", fmt.Sprint(i)), false); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("template change drains", func(t *testing.T) {
		// The member StartPools asked for above is a pod being made: a node's time, not the process's.
		waitForWithin(t, "the members being made", 3*time.Minute, func() bool { st := m.Pools(); return len(st) == 1 && st[0].Making == 0 })
		before := w.members(t, drv) // m's, and those m3 left when it closed
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		m2, _, _ := w.replica(t, m.home.Dir)
		sh2 := poolShape(t, m2, "pooled", "V=2")
		startPoolFor(t, m2, sh2, 1, 3*time.Minute)
		waitForWithin(t, "the old member and its workspace claim to go", 3*time.Minute, func() bool {
			for _, sb := range before {
				if _, err := drv.Inspect(context.Background(), sb.Name); !cerrdefs.IsNotFound(err) || w.hasClaim(t, sb.Name) {
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

func startPoolFor(t *testing.T, m *Manager, sh *Shape, n int, d time.Duration) {
	t.Helper()
	ok, err := m.StartPools(t.Context(), []PoolSpec{{Shape: sh, Size: n}}, 0)
	if err != nil || !ok {
		t.Fatalf("StartPools = %v, %v", ok, err)
	}
	waitReadyFor(t, m, sh.Template, n, d)
}

const envPoolKubeHelper = "SANDKEEP_TEST_POOL_CLAIM_KILL_KUBE" // home dir:step:namespace; the helper below

// TestPoolClaimKilledKube kills a process (SIGKILL) in the middle of a claim on the node and checks that the next
// process leaves no half-claimed member: cut before the member's record is claimed ("taken": out of the pool in
// memory only), the member is back in the pool as nobody's; cut after it ("claimed": the engine's record is
// written, the home's not), the member is the key's and the key's next command reuses it, workspace and all.
func TestPoolClaimKilledKube(t *testing.T) {
	if spec := os.Getenv(envPoolKubeHelper); spec != "" {
		poolClaimKubeHelper(t, spec)
		return
	}
	for _, step := range []string{"taken", "claimed"} {
		t.Run(step, func(t *testing.T) {
			w := newKubePoolWorld(t, "")
			dir := t.TempDir()
			m, home, drv := w.replica(t, dir)
			startPoolFor(t, m, poolShape(t, m, "pooled"), 1, 3*time.Minute)
			member := w.members(t, drv)[0]
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestPoolClaimKilledKube$", "-test.count=1")
			cmd.Env = append(os.Environ(), envPoolKubeHelper+"="+dir+":"+step+":"+w.ns)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errorsAs(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("helper did not die by SIGKILL: %v\n%s", err, out)
			}
			k := key(t, "acme", "killed")
			m3, _, _ := w.replica(t, dir)
			sh := poolShape(t, m3, "pooled")
			if ok, err := m3.StartPools(t.Context(), []PoolSpec{{Shape: sh, Size: 1}}, 0); err != nil || !ok {
				t.Fatal(ok, err)
			}
			switch step {
			case "taken":
				if _, ok := home.readClaim(k); ok {
					t.Fatal("the cut claim has a record")
				}
				if _, err := m3.inspectKey(t.Context(), k); !cerrdefs.IsNotFound(err) {
					t.Fatalf("the key has a sandbox after a claim cut before it: %v", err)
				}
				waitReady(t, m3, "pooled", 1)
				if got := w.members(t, drv); len(got) != 1 || got[0].ID != member.ID {
					t.Fatalf("pool after restart %v, want the member %s adopted back", got, member.ID)
				}
			case "claimed":
				if rec, ok := home.readClaim(k); !ok || !rec.Done {
					t.Fatalf("record %+v %v, want the claim completed from the member's record", rec, ok)
				}
				res, claimed, out := claimedOut(t, m3, k, sh, "ls -A /workspace")
				if claimed || res.Sandbox.ID != member.ID || out != "" {
					t.Fatalf("key after restart: claimed again %v, sandbox %s (member %s), files %q", claimed, res.Sandbox.ID, member.ID, out)
				}
			}
		})
	}
}

// poolClaimKubeHelper is the process that gets killed: it keeps the pool and claims for acme/killed, dying at
// step.
func poolClaimKubeHelper(t *testing.T, spec string) {
	parts := strings.SplitN(spec, ":", 3)
	dir, step, ns := parts[0], parts[1], parts[2]
	w := newKubePoolWorld(t, ns)
	m, home, _ := w.replica(t, dir)
	w.installation = home.Installation
	sh := poolShape(t, m, "pooled")
	startPoolFor(t, m, sh, 1, 3*time.Minute)
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
