package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/moby/moby/client"

	sdk "github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/fleet"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/postgres"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// postgresSchema returns the DSN of a fresh schema of the test database (SANDKEEP_TEST_POSTGRES), dropped when
// the test ends. Without the variable the test skips, unless SANDKEEP_REQUIRE_POSTGRES=1: then it fails.
func postgresSchema(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv("SANDKEEP_TEST_POSTGRES")
	if dsn == "" {
		if os.Getenv("SANDKEEP_REQUIRE_POSTGRES") == "1" {
			t.Fatal("SANDKEEP_REQUIRE_POSTGRES=1 but SANDKEEP_TEST_POSTGRES is not set (run scripts/postgres-up.sh)")
		}
		t.Skip("SANDKEEP_TEST_POSTGRES is not set (scripts/postgres-up.sh prints a DSN)")
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal("SANDKEEP_TEST_POSTGRES must be a postgres:// URL")
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "fleettest_" + hex.EncodeToString(b)
	exec := func(ctx context.Context, sql string) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// fleetOf starts n `sandkeep serve` replicas of one fleet on this host: each with its own state home, all on
// the store at dsn, the same Docker engine, installation id and secret, with leases of ttl.
func (c *cli) fleetOf(t *testing.T, n int, ttl time.Duration) ([]*server, func() *server) {
	t.Helper()
	return c.fleetWith(t, n, ttl, "", "")
}

// fleetWith is fleetOf with extra lines of the fleet block (fleetLines, each indented by two spaces) and of the
// server config (extra: templates, say) in every replica's file.
func (c *cli) fleetWith(t *testing.T, n int, ttl time.Duration, fleetLines, extra string) ([]*server, func() *server) {
	t.Helper()
	var secret [24]byte
	_, _ = rand.Read(secret[:])
	env := []string{"SANDKEEP_FLEET_SECRET=" + hex.EncodeToString(secret[:])}
	started := 0
	start := func() *server {
		home := c.home
		if started > 0 {
			home = t.TempDir()
		}
		started++
		cfg := filepath.Join(t.TempDir(), "sandkeep-server.yaml")
		yaml := fmt.Sprintf("fleet:\n  listen: 127.0.0.1:0\n  secret_env: SANDKEEP_FLEET_SECRET\n  lease_ttl: %s\n  installation: %s\n%ssweep:\n  interval: \"0\"\n%s", ttl, c.installation, fleetLines, extra)
		if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		s := c.startServerEnv(t, append([]string{"SANDKEEP_HOME=" + home}, env...), "--config", cfg)
		s.waitFor(t, `sandkeep: fleet replica \S+, internal address`)
		return s
	}
	var out []*server
	for range n {
		out = append(out, start())
	}
	return out, start
}

// TestFleetDocker is issue 27's one-host fleet: two `sandkeep serve` replicas with their own homes over one
// PostgreSQL and one Docker engine. Any replica accepts any request; the key's owner runs it (the other forwards
// it, output streamed through); one container per key. Then SIGKILL of the replica that owns a busy key
// mid-command: the caller gets a typed outcome (OWNER_LOST, never a success), the next command for that key
// succeeds through the other replica within the lease's expiry plus 5 s in the same container (adopted, not
// recreated: the replicas share fleet.sandbox_dir) with its workspace, and the store holds every run once.
func TestFleetDocker(t *testing.T) {
	dsn := postgresSchema(t)
	c := newCLI(t)
	if c.kc != nil {
		t.Skip("the one-host fleet runs on Docker; the kubernetes fleet is deploy/'s")
	}
	c.env = append(c.env, "SANDKEEP_STORE="+dsn, "SANDKEEP_DAEMON=off")
	const ttl = 3 * time.Second
	// A pooled template: on Docker each replica's home alone knows its claims, so a fleet keeps no pool there
	// (two replicas could hand one member to two keys); each replica says so and makes no member.
	reps, _ := c.fleetWith(t, 2, ttl, "  sandbox_dir: "+t.TempDir()+"\n", "templates:\n  warm: {pool: 2}\n")
	for _, r := range reps {
		r.waitFor(t, `warm pools not started: .*warm pools in a fleet need a driver that records each claim`)
	}
	tenant := c.ten("fleet")
	tok := c.createToken(t, tenant, "fleet", "")
	cls := []*sdk.Client{reps[0].client(t, tok.Token), reps[1].client(t, tok.Token)}

	// Round-robin over the replicas: every command answered right, whoever owns its key.
	const users, rounds = 4, 4
	ok := 0
	defer func() {
		list, err := testutil.Docker(t).ContainerList(context.Background(), client.ContainerListOptions{All: true,
			Filters: client.Filters{}.Add("label", driver.LabelInstallation+"="+c.installation).Add("label", driver.LabelPool)})
		if err != nil || len(list.Items) != 0 {
			t.Errorf("a fleet on Docker made pool members: %d (%v)", len(list.Items), err)
		}
	}()
	for r := range rounds {
		for u := range users {
			i := (r*users + u) % 2
			want := fmt.Sprintf("u%d r%d", u, r)
			res, err := cls[i].Exec(bounded(t), fmt.Sprintf("u%d", u), sdk.ExecRequest{Command: "echo " + want + "; echo err >&2; exit 3"})
			if err != nil {
				t.Fatalf("exec u%d round %d via replica %d: %v", u, r, i, err)
			}
			if res.Stdout != want+"\n" || res.Stderr != "err\n" || res.ExitCode != 3 {
				t.Fatalf("exec u%d round %d via replica %d: %+v", u, r, i, res)
			}
			ok++
		}
	}
	// Output streams through a forward as it is produced.
	var stdout strings.Builder
	res, err := cls[1].ExecStream(bounded(t), "u0", sdk.ExecRequest{Command: "echo one; echo two"}, &stdout, nil)
	if err != nil || res.ExitCode != 0 || stdout.String() != "one\ntwo\n" {
		t.Fatalf("streamed exec via replica 1: %+v, %q, %v", res, stdout.String(), err)
	}
	ok++

	st, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	leases, err := st.ListLeases(t.Context(), "key/")
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]bool{}
	for _, l := range leases {
		owners[l.Owner] = true
	}
	if len(leases) != users || len(owners) != 1 && len(owners) != 2 {
		t.Fatalf("leases %+v: want one per user", leases)
	}
	// One replica leads the reaper (its store lease), and the reaper kept every live key's container.
	if rl, err := st.GetLease(t.Context(), "reaper"); err != nil || !rl.Live || !owners[rl.Owner] && !strings.Contains(reps[0].log.String()+reps[1].log.String(), rl.Owner) {
		t.Errorf("reaper lease %+v, %v: want a live one held by a replica", rl, err)
	}
	perKey := containersPerKey(t, c)
	if len(perKey) != users {
		t.Errorf("containers by key %v: want %d keys", perKey, users)
	}
	for k, n := range perKey {
		if n != 1 {
			t.Errorf("key %s has %d containers, want 1", k, n)
		}
	}

	// The owner of u1 is killed while it runs a command for u1 that the other replica forwarded to it.
	key := keyOf(t, tenant, "u1")
	l, err := st.GetLease(t.Context(), fleet.LeaseName(key))
	if err != nil {
		t.Fatal(err)
	}
	victim, survivor := -1, -1
	for i, s := range reps {
		if strings.Contains(s.log.String(), "fleet replica "+l.Owner+",") {
			victim, survivor = i, 1-i
		}
	}
	if victim < 0 {
		t.Fatalf("no replica is %s, the owner of u1", l.Owner)
	}
	// u1's workspace holds a file, and its container is this one.
	if res, err := cls[victim].Exec(bounded(t), "u1", sdk.ExecRequest{Command: "echo kept > before-kill.txt"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("write u1's file: %+v %v", res, err)
	}
	ok++
	before := containerIDs(t, c)[key.Hex()]
	// Its run's finish is written after the answer: waitRunning below must see the busy command's run, not this one.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		running, err := st.ListRuns(t.Context(), store.RunFilter{Tenant: tenant, User: "u1", Status: store.StatusRunning})
		if err != nil {
			t.Fatal(err)
		}
		if len(running) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("u1's runs still running 30s after their answers: %+v", running)
		}
	}
	type outcome struct {
		res *sdk.ExecResult
		err error
	}
	busy := make(chan outcome, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		res, err := cls[survivor].Exec(bounded(t), "u1", sdk.ExecRequest{Command: "echo started; sleep 30; echo done"})
		busy <- outcome{res, err}
	})
	waitRunning(t, st, tenant, "u1")
	killed := time.Now()
	if err := reps[victim].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	got := <-busy
	var ae *sdk.APIError
	if !errors.As(got.err, &ae) || ae.Err.Code != fault.OwnerLost {
		t.Fatalf("the caller of the killed owner's command got %+v, %v; want OWNER_LOST", got.res, got.err)
	}

	// The next command succeeds through the survivor within the lease's expiry plus 5 s.
	after, tries, _ := execAfterTakeover(t, cls[survivor], "u1", sdk.ExecRequest{Command: "echo after; cat before-kill.txt"},
		killed, ttl+5*time.Second, 200*time.Millisecond)
	took := time.Since(killed)
	if after.Stdout != "after\nkept\n" || after.ExitCode != 0 {
		t.Fatalf("exec after the takeover: %+v; want the workspace's file", after)
	}
	if took > ttl+5*time.Second {
		t.Fatalf("the takeover took %s, want at most %s", took, ttl+5*time.Second)
	}
	t.Logf("takeover: the next command succeeded %s after the kill (lease %s, %d tries)", took.Round(time.Millisecond), ttl, tries)
	ok++
	if n := containersPerKey(t, c)[key.Hex()]; n != 1 {
		t.Errorf("after the takeover u1 has %d containers, want 1", n)
	}
	if ids := containerIDs(t, c)[key.Hex()]; len(ids) != 1 || len(before) != 1 || ids[0] != before[0] {
		t.Errorf("u1's container was %v before the kill and %v after: want the same one, adopted", before, ids)
	}

	// The store: every answered command is one succeeded run (exit 3 is a result, not a failure of sandkeep), the
	// killed one is the one run that did not succeed, every run's command started once.
	if other, started := checkFleetRuns(t, st, tenant, ok); other != 1 || started != ok+1 {
		t.Errorf("runs: %d did not succeed, %d started; want 1 (the killed owner's) and %d", other, started, ok+1)
	}
}

// checkFleetRuns: every answered command is one succeeded run, the killed owner's is the one run left running (or
// failed by its takeover), a draining replica's refusal is a run that never started, and nothing is there twice:
// each run has at most one exec_started. It returns the runs that did not succeed and the runs whose command
// started. TestFleetDocker and TestFleetKube share it.
func checkFleetRuns(t *testing.T, st store.Store, tenant string, answered int) (other, started int) {
	t.Helper()
	var runs []store.Run
	var err error
	for wait := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if runs, err = st.ListRuns(t.Context(), store.RunFilter{Tenant: tenant}); err != nil {
			t.Fatal(err)
		}
		running := 0
		for _, r := range runs {
			if r.Status == store.StatusRunning {
				running++
			}
		}
		if running <= 1 || time.Now().After(wait) {
			break
		}
	}
	seen := map[string]bool{}
	succeeded, other := 0, 0
	for _, r := range runs {
		if seen[r.ID] {
			t.Errorf("run %s listed twice", r.ID)
		}
		seen[r.ID] = true
		switch {
		case r.Status == store.StatusSucceeded:
			succeeded++
		case r.Status == store.StatusRunning && r.User == "u1",
			r.FailureCode == string(fault.ShuttingDown), r.FailureCode == string(fault.OwnerLost):
			other++
		default:
			t.Errorf("run %s of %s: %s %s", r.ID, r.User, r.Status, r.FailureCode)
		}
	}
	if succeeded != answered {
		t.Errorf("%d succeeded runs, want %d (the answered commands)", succeeded, answered)
	}
	evs, err := st.ListEvents(t.Context(), store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	startedBy := map[string]int{}
	for _, e := range evs {
		if e.Name == "exec_started" && seen[e.RunID] {
			startedBy[e.RunID]++
		}
	}
	for id, n := range startedBy {
		if n != 1 {
			t.Errorf("run %s has %d exec_started events, want 1", id, n)
		}
	}
	t.Logf("store: %d runs, %d succeeded, %d refused or cut by a replica's end", len(runs), succeeded, other)
	return other, len(startedBy)
}

// waitRunning waits until the store has a running run of tenant/user with its command started.
func waitRunning(t *testing.T, st store.Store, tenant, user string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		runs, err := st.ListRuns(t.Context(), store.RunFilter{Tenant: tenant, User: user, Status: store.StatusRunning})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range runs {
			evs, err := st.ListEvents(t.Context(), store.EventFilter{RunID: r.ID})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range evs {
				if e.Name == "exec_started" {
					return
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no command of %s/%s started within a minute", tenant, user)
}

// containersPerKey counts this installation's containers by their key label.
func containersPerKey(t *testing.T, c *cli) map[string]int {
	t.Helper()
	out := map[string]int{}
	for k, ids := range containerIDs(t, c) {
		out[k] = len(ids)
	}
	return out
}

// containerIDs lists this installation's containers by their key label.
func containerIDs(t *testing.T, c *cli) map[string][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := testutil.Docker(t).ContainerList(ctx, client.ContainerListOptions{
		All: true, Filters: client.Filters{}.Add("label", driver.LabelInstallation+"="+c.installation),
	})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, it := range list.Items {
		out[it.Labels[driver.LabelKey]] = append(out[it.Labels[driver.LabelKey]], it.ID)
	}
	return out
}

// TestFleetRollingRestart: commands for several users go round-robin to two replicas while one of them gets
// SIGTERM (it drains, hands its keys over and exits) and a new replica takes its place: every command succeeds
// with its own output. A caller retries on another replica only what was provably never run: SHUTTING_DOWN from
// a draining replica's API, or a refused connection to one that is gone.
func TestFleetRollingRestart(t *testing.T) {
	dsn := postgresSchema(t)
	c := newCLI(t)
	if c.kc != nil {
		t.Skip("the one-host fleet runs on Docker; the kubernetes fleet is deploy/'s")
	}
	c.env = append(c.env, "SANDKEEP_STORE="+dsn, "SANDKEEP_DAEMON=off")
	const ttl = 3 * time.Second
	reps, start := c.fleetOf(t, 2, ttl)
	tenant := c.ten("roll")
	tok := c.createToken(t, tenant, "roll", "")

	var mu sync.Mutex
	live := []*sdk.Client{reps[0].client(t, tok.Token), reps[1].client(t, tok.Token)}
	pick := func(i int) []*sdk.Client {
		mu.Lock()
		defer mu.Unlock()
		out := make([]*sdk.Client, 0, len(live))
		for j := range live {
			out = append(out, live[(i+j)%len(live)])
		}
		return out
	}
	const users, perUser = 6, 12
	var wg sync.WaitGroup
	errs := make(chan error, users*perUser)
	retries := atomic.Int32{}
	for u := range users {
		wg.Go(func() {
			for i := range perUser {
				want := fmt.Sprintf("u%d-%d", u, i)
				cmd := "echo " + want
				if i%4 == 1 {
					cmd = "sleep 1; echo " + want // in flight when the replica drains
				}
				res, err := execAnywhere(t, pick(u+i), fmt.Sprintf("u%d", u), sdk.ExecRequest{Command: cmd}, &retries)
				if err == nil && (res.ExitCode != 0 || res.Stdout != want+"\n") {
					err = fmt.Errorf("u%d command %d: %+v", u, i, res)
				}
				if err != nil {
					errs <- fmt.Errorf("u%d command %d: %w", u, i, err)
				}
				time.Sleep(150 * time.Millisecond)
			}
		})
	}
	time.Sleep(2 * time.Second)
	if err := reps[0].cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-reps[0].exited
	next := start()
	mu.Lock()
	live = []*sdk.Client{live[1], next.client(t, tok.Token)}
	mu.Unlock()
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		failed++
		t.Error(err)
	}
	t.Logf("rolling restart: %d commands, %d failed, %d retried on another replica", users*perUser, failed, retries.Load())
	if !strings.Contains(reps[0].log.String(), "sandkeep: stopped") {
		t.Errorf("the restarted replica did not stop cleanly:\n%s", reps[0].log)
	}
}

// execAnywhere sends req to the replicas in order until one takes it: a caller retries on the next replica only
// what was provably never run (SHUTTING_DOWN from a draining replica's API, a refused connection to one that is
// gone), counting each retry in retried. TestFleetRollingRestart and TestFleetKube share it.
func execAnywhere(t *testing.T, replicas []*sdk.Client, user string, req sdk.ExecRequest, retried *atomic.Int32) (*sdk.ExecResult, error) {
	var res *sdk.ExecResult
	var err error
	for _, cl := range replicas {
		res, err = cl.Exec(bounded(t), user, req)
		var ae *sdk.APIError
		if err != nil && (errors.As(err, &ae) && ae.Err.Code == fault.ShuttingDown || !errors.As(err, &ae) && isRefused(err)) {
			retried.Add(1)
			continue
		}
		break
	}
	return res, err
}

// isRefused reports whether err is a connection that was never made (refused: the replica is gone; no route or a
// dial timeout: a replica pod's address is gone with it): the request never reached a replica.
func isRefused(err error) bool {
	var op *net.OpError
	return errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &op) && op.Op == "dial"
}

// execAfterTakeover sends req for user through cl until it succeeds, after the owner of user's key was killed at
// killed: until then each answer must be OWNER_UNAVAILABLE (the lease has not expired), and a success must come
// within `within` of the kill. It returns the result, how many tries it took, and how long the successful call took.
func execAfterTakeover(t *testing.T, cl *sdk.Client, user string, req sdk.ExecRequest, killed time.Time, within, pause time.Duration) (*sdk.ExecResult, int, time.Duration) {
	t.Helper()
	for tries := 1; ; tries++ {
		began := time.Now()
		res, err := cl.Exec(bounded(t), user, req)
		if err == nil {
			return res, tries, time.Since(began)
		}
		var ae *sdk.APIError
		if !errors.As(err, &ae) || ae.Err.Code != fault.OwnerUnavailable {
			t.Fatalf("exec after the kill: %v; want success, or OWNER_UNAVAILABLE until the lease expires", err)
		}
		if time.Since(killed) > within {
			t.Fatalf("no command for %s succeeded within the lease's expiry plus 5s of the kill (%d tries): %v", user, tries, err)
		}
		time.Sleep(pause)
	}
}

// twoReplicas is a one-host fleet on Docker: two `sandkeep serve` replicas over a fresh PostgreSQL schema (its
// DSN returned) with leases of 5 s, running the probe image.
func twoReplicas(t *testing.T) (*cli, []*server, string) {
	t.Helper()
	dsn := postgresSchema(t)
	c := newCLI(t)
	if c.kc != nil {
		t.Skip("the one-host fleet runs on Docker; the kubernetes fleet is deploy/'s")
	}
	c.env = append(c.env, "SANDKEEP_STORE="+dsn, "SANDKEEP_DAEMON=off", "SANDKEEP_IMAGE="+testutil.ProbeImage(t))
	reps, _ := c.fleetOf(t, 2, 5*time.Second)
	return c, reps, dsn
}
