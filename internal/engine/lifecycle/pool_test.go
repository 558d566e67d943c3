package lifecycle

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/fake"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/identity"
)

// poolShape is template tpl's shape in m, with env added.
func poolShape(t *testing.T, m *Manager, tpl string, env ...string) *Shape {
	t.Helper()
	sh, err := m.NewShape(tpl, func(c *Config) { c.Env = append(c.Env, env...) })
	if err != nil {
		t.Fatal(err)
	}
	return sh
}

func startPool(t *testing.T, m *Manager, sh *Shape, n int) {
	t.Helper()
	ok, err := m.StartPools(t.Context(), []PoolSpec{{Shape: sh, Size: n}}, 0)
	if err != nil || !ok {
		t.Fatalf("StartPools = %v, %v", ok, err)
	}
	waitReady(t, m, sh.Template, n)
}

func waitReady(t *testing.T, m *Manager, tpl string, n int) {
	t.Helper()
	waitReadyFor(t, m, tpl, n, time.Minute)
}

// waitReadyFor waits up to d for tpl's pool in m to hold exactly n ready members.
func waitReadyFor(t *testing.T, m *Manager, tpl string, n int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		for _, st := range m.Pools() {
			if st.Template == tpl && st.Ready == n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s did not hold %d ready members within %s: %+v", tpl, n, d, m.Pools())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// claimedBy runs script for k in shape sh and returns the result and whether the sandbox was claimed.
func claimedBy(t *testing.T, m *Manager, k identity.Key, sh *Shape, script string) (*ExecResult, bool) {
	res, claimed, _ := claimedOut(t, m, k, sh, script)
	return res, claimed
}

func claimedOut(t *testing.T, m *Manager, k identity.Key, sh *Shape, script string) (*ExecResult, bool, string) {
	t.Helper()
	var mu sync.Mutex
	claimed := false
	req, out := sh2(script)
	req.Shape = sh
	req.OnEvent = func(name string, _ any) {
		if name == events.NameSandboxClaimed {
			mu.Lock()
			claimed = true
			mu.Unlock()
		}
	}
	res, err := m.Exec(t.Context(), k, req)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Exec(%q) = %+v, %v; output %q", script, res, err, out.String())
	}
	mu.Lock()
	defer mu.Unlock()
	return res, claimed, out.String()
}

func sh2(script string) (ExecRequest, *syncBuffer) {
	var out syncBuffer
	return ExecRequest{Argv: []string{"sh", "-c", script}, Stdout: &out, Stderr: &out}, &out
}

type syncBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b = append(s.b, p...)
	return len(p), nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.b)
}

// TestPoolClaim: a new key's first command takes a ready member (no create on its path), whose posture hash is
// the template's for that key; the pool refills; the key's next command reuses it; its files are the member's
// fresh workspace, apart from the key's own path and from the other members'.
func TestPoolClaim(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	sh := poolShape(t, m, "small")
	startPool(t, m, sh, 2)
	k := key(t, "acme", "alice")
	members := map[string]bool{}
	for _, sb := range e.list() {
		members[sb.ID] = true
	}
	// The claim itself asks nothing of the engine but whether the key has a sandbox: no create, no start, no
	// rename (Docker renames running containers one at a time, so a burst of claims queued on it).
	engineBefore := map[fake.Op]int{}
	for _, op := range []fake.Op{fake.OpCreate, fake.OpStart, fake.OpRename, fake.OpStop, fake.OpRemove} {
		engineBefore[op] = e.drv.Calls(op)
	}
	res, claimed, out := claimedOut(t, m, k, sh, "ls -A; echo hi > mine")
	if !claimed || !members[res.Sandbox.ID] || out != "" {
		t.Fatalf("first command of a new key: claimed %v, a member %v, workspace listing %q", claimed, members[res.Sandbox.ID], out)
	}
	for op, n := range engineBefore {
		if op == fake.OpCreate || op == fake.OpStart {
			continue // the refill makes a member at once
		}
		if got := e.drv.Calls(op); got != n {
			t.Errorf("the claim called the engine's %s %d times", op, got-n)
		}
	}
	if res.Sandbox.Labels[driver.LabelPool] != "small" {
		t.Fatalf("claimed sandbox %s (labels %v), want a pool label", res.Sandbox.Name, res.Sandbox.Labels)
	}
	_, hash, err := m.postureOf(k, poolShape(t, m, "small"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.inspectKey(t.Context(), k)
	if err != nil || got.ID != res.Sandbox.ID || got.Labels[driver.LabelPosture] != hash {
		t.Fatalf("the key's sandbox as the lifecycle finds it: %+v (%v), want %s with the template's posture hash for the key %s",
			got, err, res.Sandbox.ID, hash)
	}
	ws := m.home.Workspace(k)
	if filepath.Base(ws) == k.Hex() {
		t.Fatal("the key's workspace is not the member's")
	}
	if b, err := os.ReadFile(filepath.Join(ws, "mine")); err != nil || string(b) != "hi\n" {
		t.Fatalf("the key's file in its workspace: %q, %v", b, err)
	}
	waitReady(t, m, "small", 2)
	for _, st := range m.Pools() {
		if st.Ready != 2 {
			t.Fatalf("pool after a claim: %+v", st)
		}
	}
	res2, claimed2 := claimedBy(t, m, k, sh, "cat mine")
	if claimed2 || res2.Sandbox.ID != res.Sandbox.ID {
		t.Fatalf("second command: claimed %v, sandbox %s (first %s)", claimed2, res2.Sandbox.ID, res.Sandbox.ID)
	}
	// Another process (a new Manager) sees the key's sandbox and files as the key's.
	m2 := e.manager()
	infos, err := m2.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].Key.Hex() != k.Hex() {
		t.Fatalf("List = %+v, want the one claimed key (members are nobody's)", infos)
	}
	if got := m2.home.Workspace(k); got != ws {
		t.Fatalf("another process finds the key's workspace at %s, want %s", got, ws)
	}
	// Removing the key removes the member's files and its claim: the key is new again.
	if err := m.Remove(t.Context(), k, false); err != nil {
		t.Fatal(err)
	}
	if exists(ws) {
		t.Fatal("the claimed workspace outlived the key's removal")
	}
	_, claimed3, out3 := claimedOut(t, m, k, sh, "ls -A")
	if !claimed3 || out3 != "" {
		t.Fatalf("after removal: claimed %v, workspace listing %q", claimed3, out3)
	}
}

// TestPoolConcurrentClaims: as many new keys at once as the pool has members each get a member of their own.
func TestPoolConcurrentClaims(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	sh := poolShape(t, m, "small")
	const n = 20
	startPool(t, m, sh, n)
	ids := make([]string, n)
	claimed := make([]bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			k := key(t, "acme", "user-"+string(rune('a'+i)))
			var res *ExecResult
			res, claimed[i] = claimedBy(t, m, k, sh, "true")
			ids[i] = res.Sandbox.ID
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for i := range n {
		if !claimed[i] || seen[ids[i]] {
			t.Fatalf("key %d: claimed %v, sandbox %s shared %v", i, claimed[i], ids[i], seen[ids[i]])
		}
		seen[ids[i]] = true
	}
}

// TestPoolDrainsOnTemplateChange: members made for a template's old shape are removed when a process starts the
// pool with the new one, and a claim gets the new posture.
func TestPoolDrainsOnTemplateChange(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	startPool(t, m, poolShape(t, m, "small", "V=1"), 2)
	old := map[string]bool{}
	for _, sb := range e.list() {
		old[sb.ID] = true
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m2 := e.manager()
	sh2 := poolShape(t, m2, "small", "V=2")
	startPool(t, m2, sh2, 2)
	waitFor(t, "the old members to drain", func() bool {
		for _, sb := range e.list() {
			if old[sb.ID] {
				return false
			}
		}
		return len(e.list()) == 2
	})
	k := key(t, "acme", "bob")
	_, claimed, out := claimedOut(t, m2, k, sh2, "echo $V")
	if !claimed || out != "2\n" {
		t.Fatalf("claim after the change: claimed %v, V=%q", claimed, out)
	}
}

// TestPoolRestartAdopts: members survive a restart as nobody's; a claim left pending before the rename is
// undone (the member stays in the pool), one left pending after it is completed (the key keeps it).
func TestPoolRestartAdopts(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	startPool(t, m, poolShape(t, m, "small"), 3)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	members := e.list()
	// Killed after writing the record, before the rename.
	before := key(t, "acme", "before")
	recB := claimRecord{Tenant: before.Tenant, User: before.User, Template: "small", Member: memberIDOf(members[0].Labels[driver.LabelUser])}
	if err := e.home.writeClaim(before, recB); err != nil {
		t.Fatal(err)
	}
	// Killed after the rename, before the record was done.
	after := key(t, "acme", "after")
	recA := claimRecord{Tenant: after.Tenant, User: after.User, Template: "small", Member: memberIDOf(members[1].Labels[driver.LabelUser])}
	if err := e.home.writeClaim(after, recA); err != nil {
		t.Fatal(err)
	}
	if err := e.drv.Rename(t.Context(), members[1], after.ContainerName()); err != nil {
		t.Fatal(err)
	}
	m2 := e.manager()
	sh := poolShape(t, m2, "small")
	ok, err := m2.StartPools(t.Context(), []PoolSpec{{Shape: sh, Size: 3}}, 0)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, ok := e.home.readClaim(before); ok {
		t.Fatal("a claim cut before its rename left its record")
	}
	if rec, ok := e.home.readClaim(after); !ok || !rec.Done {
		t.Fatalf("a claim cut after its rename: record %+v %v, want done", rec, ok)
	}
	waitReady(t, m2, "small", 3)
	adopted := false
	for _, sb := range e.list() {
		if sb.ID == members[0].ID && sb.Name == members[0].Name {
			adopted = true
		}
	}
	if !adopted {
		t.Fatal("the member of the undone claim was not kept in the pool")
	}
	res, claimed := claimedBy(t, m2, after, sh, "true")
	if claimed || res.Sandbox.ID != members[1].ID {
		t.Fatalf("the completed claim's key: claimed again %v, sandbox %s, want %s", claimed, res.Sandbox.ID, members[1].ID)
	}
}

func (e *env) list() []*driver.Sandbox {
	e.t.Helper()
	sbs, err := e.drv.List(context.Background(), e.home.Installation)
	if err != nil {
		e.t.Fatal(err)
	}
	return sbs
}

// TestPoolClaimedRecreated: a claimed key whose template changed gets a new sandbox under its own name, over the
// member's files (its claim record stays), and its next commands and another process find that one, not a
// second; List shows the key once.
func TestPoolClaimedRecreated(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	startPool(t, m, poolShape(t, m, "small", "V=1"), 1)
	k := key(t, "acme", "carol")
	first, claimed, _ := claimedOut(t, m, k, poolShape(t, m, "small", "V=1"), "echo kept > f")
	if !claimed {
		t.Fatal("not claimed")
	}
	sh2 := poolShape(t, m, "small", "V=2")
	res, claimed2, out := claimedOut(t, m, k, sh2, "cat f; echo $V")
	if claimed2 || res.Sandbox.ID == first.Sandbox.ID || res.Sandbox.Name != k.ContainerName() || out != "kept\n2\n" {
		t.Fatalf("after the template changed: claimed %v, sandbox %s %s (first %s), output %q",
			claimed2, res.Sandbox.Name, res.Sandbox.ID, first.Sandbox.ID, out)
	}
	if _, err := e.drv.Inspect(t.Context(), first.Sandbox.Name); err == nil {
		t.Fatalf("the claimed member %s outlived its recreation", first.Sandbox.Name)
	}
	m2 := e.manager()
	res2, claimed3, out2 := claimedOut(t, m2, k, sh2, "cat f")
	if claimed3 || res2.Sandbox.ID != res.Sandbox.ID || out2 != "kept\n" {
		t.Fatalf("another process: claimed %v, sandbox %s (want %s), output %q", claimed3, res2.Sandbox.ID, res.Sandbox.ID, out2)
	}
	infos, err := m2.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, in := range infos {
		if in.Key.Hex() == k.Hex() {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("List shows the key %d times: %+v", n, infos)
	}
}
