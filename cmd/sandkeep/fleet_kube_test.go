package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sdk "github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/fleet"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/postgres"
	"github.com/sandkeep/sandkeep/internal/testutil/kubetest"
)

// fleetKubeTemplate keeps the suite's 20 pods small: each reserves a hundredth of a core (the node has two).
const fleetKubeTemplate = "templates:\n  fleet: {cpus: 0.2, memory: 256m, requests: {cpus: 0.01, memory: 16m}}\ndefault_template: fleet\n"

// TestFleetKube is issue 27's fleet on the real node: three `sandkeep serve` replicas (host processes against the
// node's API server, each with its own home and agent channel port) over one PostgreSQL. 200 commands of 20 users
// go round-robin to the replicas, every result checked, while one replica is rolled (SIGTERM: it drains and
// hands its keys over; a new one takes its place): 0 failed commands, one pod per key. Then SIGKILL of the
// replica that owns a busy key mid-command: the caller gets OWNER_LOST (never a success), the key's next command
// succeeds through another replica within the lease's expiry plus 5 s, and the store holds every run once.
func TestFleetKube(t *testing.T) {
	if !kubetest.Selected() {
		t.Skipf("a kubernetes test: scripts/test.sh's kubernetes stage runs it (%s=%s)", kubetest.EnvDriver, kubetest.Driver)
	}
	dsn := postgresSchema(t)
	c := newCLI(t)
	c.env = append(c.env, "SANDKEEP_STORE="+dsn, "SANDKEEP_DAEMON=off")
	const ttl = 5 * time.Second
	reps, start := c.fleetWith(t, 3, ttl, "  leader: kubernetes\n  reap_interval: 5s\n", fleetKubeTemplate)
	tenant := c.ten("kfleet")
	tok := c.createToken(t, tenant, "kfleet", "")

	var mu sync.Mutex // guards live
	live := []*sdk.Client{reps[0].client(t, tok.Token), reps[1].client(t, tok.Token), reps[2].client(t, tok.Token)}
	order := func(i int) []*sdk.Client { // round-robin: replica i first, the others after it
		mu.Lock()
		defer mu.Unlock()
		out := make([]*sdk.Client, 0, len(live))
		for j := range live {
			out = append(out, live[(i+j)%len(live)])
		}
		return out
	}
	const users, perUser = 20, 10
	var (
		wg       sync.WaitGroup
		done     atomic.Int32
		ok       atomic.Int32
		retried  atomic.Int32
		rolled   = make(chan struct{})
		errs     = make(chan error, users*perUser)
		begin    = time.Now()
		rollOnce sync.Once
	)
	for u := range users {
		wg.Go(func() {
			for i := range perUser {
				want := fmt.Sprintf("u%d-%d", u, i)
				cmd := "echo " + want + "; echo " + want + " >> /workspace/log"
				if i%3 == 1 {
					cmd = "sleep 1; " + cmd // in flight when a replica drains
				}
				res, err := execAnywhere(t, order(u*perUser+i), fmt.Sprintf("u%d", u), sdk.ExecRequest{Command: cmd, Timeout: time.Minute}, &retried)
				if err == nil && (res.ExitCode != 0 || res.Stdout != want+"\n") {
					err = fmt.Errorf("%+v", res)
				}
				if err != nil {
					errs <- fmt.Errorf("u%d command %d: %w", u, i, err)
				} else {
					ok.Add(1)
				}
				if done.Add(1) == users*3 { // every key has its pod and the load is on: roll replica 0
					rollOnce.Do(func() { close(rolled) })
				}
			}
		})
	}
	select {
	case <-rolled:
	case <-time.After(5 * time.Minute):
		t.Fatalf("the first %d commands did not finish within 5 minutes", users*3)
	}
	rollAt := time.Since(begin)
	if err := reps[0].cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-reps[0].exited
	next := start()
	mu.Lock()
	live = []*sdk.Client{live[1], live[2], next.client(t, tok.Token)}
	mu.Unlock()
	reps = []*server{reps[1], reps[2], next}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		failed++
		t.Error(err)
	}
	t.Logf("round-robin: %d commands of %d users over 3 replicas in %s, replica 0 rolled at %s: %d failed, %d retried on another replica",
		users*perUser, users, time.Since(begin).Round(time.Millisecond), rollAt.Round(time.Millisecond), failed, retried.Load())
	if failed > 0 {
		t.FailNow()
	}
	// Every user's workspace holds its 10 lines, in order: nothing ran twice or was lost.
	cl := live[0]
	for u := range users {
		res, err := cl.Exec(bounded(t), fmt.Sprintf("u%d", u), sdk.ExecRequest{Command: "cat /workspace/log"})
		var want strings.Builder
		for i := range perUser {
			fmt.Fprintf(&want, "u%d-%d\n", u, i)
		}
		if err != nil || res.Stdout != want.String() {
			t.Fatalf("u%d's log: %+v, %v; want its %d lines once each, in order", u, res, err, perUser)
		}
		ok.Add(1)
	}
	perKey := kubePodsPerKey(t, c)
	if len(perKey) != users {
		t.Errorf("pods by key %v: want %d keys", perKey, users)
	}
	for k, n := range perKey {
		if n != 1 {
			t.Errorf("key %s has %d pods, want 1", k, n)
		}
	}

	// One replica leads the reaper through the sandbox namespace's Lease (client-go's leader election), and the
	// reaper, which has made passes all along, kept every pod of a live key.
	lease, err := c.kc.API.CoordinationV1().Leases(c.ns).Get(bounded(t), ReaperLease, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		t.Fatalf("the reaper's Lease %s/%s: %+v, %v; want one held by a replica", c.ns, ReaperLease, lease, err)
	}
	leader := -1
	for i, s := range reps {
		if strings.Contains(s.log.String(), "fleet replica "+*lease.Spec.HolderIdentity+",") {
			leader = i
		}
	}
	if leader < 0 {
		t.Errorf("the reaper's Lease is held by %q, which is no live replica", *lease.Spec.HolderIdentity)
	}

	// SIGKILL of the owner of u1 while it runs a command for u1 that another replica forwarded to it.
	st, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	key := keyOf(t, tenant, "u1")
	l, err := st.GetLease(t.Context(), fleet.LeaseName(key))
	if err != nil {
		t.Fatal(err)
	}
	victim, via := -1, -1
	for i, s := range reps {
		if strings.Contains(s.log.String(), "fleet replica "+l.Owner+",") {
			victim, via = i, (i+1)%len(reps)
		}
	}
	if victim < 0 {
		t.Fatalf("no live replica is %s, the owner of u1", l.Owner)
	}
	viaCl := reps[via].client(t, tok.Token)
	type outcome struct {
		res *sdk.ExecResult
		err error
	}
	busy := make(chan outcome, 1)
	go func() {
		res, err := viaCl.Exec(bounded(t), "u1", sdk.ExecRequest{Command: "echo started; sleep 30; echo done"})
		busy <- outcome{res, err}
	}()
	waitRunning(t, st, tenant, "u1")
	killed := time.Now()
	if err := reps[victim].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	got := <-busy
	var ae *sdk.APIError
	if !errors.As(got.err, &ae) || ae.Err.Code != fault.OwnerLost {
		t.Fatalf("the caller of the killed owner's command got %+v, %v; want OWNER_LOST", got.res, got.err)
	}
	res, tries, _ := execAfterTakeover(t, viaCl, "u1", sdk.ExecRequest{Command: "echo after"}, killed, ttl+5*time.Second, 200*time.Millisecond)
	if res.Stdout != "after\n" || res.ExitCode != 0 {
		t.Fatalf("exec after the takeover: %+v", res)
	}
	took := time.Since(killed)
	if runs, err := st.ListRuns(t.Context(), store.RunFilter{Tenant: tenant, User: "u1", Limit: 1}); err == nil && len(runs) == 1 {
		evs, _ := st.ListEvents(t.Context(), store.EventFilter{RunID: runs[0].ID})
		var line strings.Builder
		for _, e := range evs {
			fmt.Fprintf(&line, " %s@+%dms", e.Name, e.Time.Sub(killed).Milliseconds())
		}
		t.Logf("the takeover's run %s (created +%dms):%s", runs[0].ID, runs[0].CreatedAt.Sub(killed).Milliseconds(), line.String())
	}
	if took > ttl+5*time.Second {
		t.Fatalf("the takeover took %s, want at most %s", took, ttl+5*time.Second)
	}
	ok.Add(1)
	t.Logf("takeover: u1's next command succeeded through another replica %s after the kill (lease %s, %d tries)", took.Round(time.Millisecond), ttl, tries)
	if n := kubePodsPerKey(t, c)[keyLabel(t, tenant, "u1")]; n != 1 {
		t.Errorf("after the takeover u1 has %d pods, want 1", n)
	}
	checkFleetRuns(t, st, tenant, int(ok.Load()))
}

// keyLabel is the pod label value of tenant/user's key: the kube driver writes a value that is not a valid label
// value (a key's 64 hex digits are one too many) as "h-" and 40 hex digits of its SHA-256 (docs/KUBERNETES.md).
func keyLabel(t *testing.T, tenant, user string) string {
	t.Helper()
	sum := sha256.Sum256([]byte(keyOf(t, tenant, user).Hex()))
	return "h-" + hex.EncodeToString(sum[:20])
}

// kubePodsPerKey counts the pods of c's installation in its sandbox namespace by their key label (those being
// deleted aside).
func kubePodsPerKey(t *testing.T, c *cli) map[string]int {
	t.Helper()
	pods, err := c.kc.API.CoreV1().Pods(c.ns).List(bounded(t), metav1.ListOptions{
		LabelSelector: driver.LabelInstallation + "=" + c.installation})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Labels[driver.LabelKey]]++
		}
	}
	return out
}
