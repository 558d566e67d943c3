package reaper

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/sandkeep/sandkeep/internal/build"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/docker"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/sqlite"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

const ours = "0123456789abcdef0123456789abcdef"

func labels(t *testing.T, installation, tenant, user string) map[string]string {
	t.Helper()
	k, err := identity.New(tenant, user)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{driver.LabelInstallation: installation, driver.LabelTenant: tenant, driver.LabelUser: user, driver.LabelKey: k.Hex()}
}

// TestDecide is the reaper's rule as a table: only a resource of ours, with a key, inactive, no live lease and
// no running run is removed; every unknown keeps it.
func TestDecide(t *testing.T) {
	boom := errors.New("boom")
	none := Facts{}
	now := time.Date(2026, 12, 3, 19, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		res    Resource
		facts  Facts
		remove bool
		reason string
	}{
		{"orphan exited", Resource{Labels: labels(t, ours, "acme", "a"), State: "exited"}, none, true, ReasonOrphaned},
		{"orphan created", Resource{Labels: labels(t, ours, "acme", "a"), State: "created"}, none, true, ReasonOrphaned},
		{"orphan claim without state", Resource{Kind: "claim", Labels: labels(t, ours, "acme", "a")}, none, true, ReasonOrphaned},
		{"no labels", Resource{State: "exited"}, none, false, ReasonUnlabelled},
		{"another installation", Resource{Labels: labels(t, "ffffffffffffffffffffffffffffffff", "acme", "a"), State: "exited"}, none, false, ReasonForeign},
		{"key label that is not the key", Resource{Labels: func() map[string]string {
			l := labels(t, ours, "acme", "a")
			l[driver.LabelKey] = "00"
			return l
		}(), State: "exited"}, none, false, ReasonUnlabelled},
		{"running", Resource{Labels: labels(t, ours, "acme", "a"), State: "running"}, none, false, ReasonActive},
		{"paused", Resource{Labels: labels(t, ours, "acme", "a"), State: "paused"}, none, false, ReasonActive},
		{"live lease", Resource{Labels: labels(t, ours, "acme", "a"), State: "exited"}, Facts{LeaseLive: true}, false, ReasonLeased},
		{"lease error", Resource{Labels: labels(t, ours, "acme", "a"), State: "exited"}, Facts{LeaseErr: boom}, false, ReasonLeaseUnknown},
		{"lease error beats a known run", Resource{Labels: labels(t, ours, "acme", "a"), State: "exited"}, Facts{LeaseErr: boom, RunActive: false}, false, ReasonLeaseUnknown},
		{"store error", Resource{Labels: labels(t, ours, "acme", "a"), State: "exited"}, Facts{RunErr: boom}, false, ReasonStoreUnknown},
		{"running run", Resource{Labels: labels(t, ours, "acme", "a"), State: "exited"}, Facts{RunActive: true}, false, ReasonRunActive},
		{"running pod of a dead owner", Resource{Labels: labels(t, ours, "acme", "a"), State: "running", ReapRunning: true}, none, true, ReasonOrphaned},
		{"running pod of a live owner", Resource{Labels: labels(t, ours, "acme", "a"), State: "running", ReapRunning: true}, Facts{LeaseLive: true}, false, ReasonLeased},
		{"paused, even where running is reapable", Resource{Labels: labels(t, ours, "acme", "a"), State: "paused", ReapRunning: true}, none, false, ReasonActive},
		{"a hold of the source", Resource{Kind: "claim", Labels: labels(t, ours, "acme", "a"), Hold: ReasonWorkspaceKept}, none, false, ReasonWorkspaceKept},
		{"a hold does not make another installation's ours", Resource{Labels: labels(t, "ffffffffffffffffffffffffffffffff", "acme", "a"), Hold: ReasonInUse}, none, false, ReasonForeign},
		{"claim within its grace", Resource{Kind: "claim", Labels: labels(t, ours, "acme", "a"), Grace: time.Hour}, Facts{LastActive: now.Add(-time.Minute)}, false, ReasonRecent},
		{"claim past its grace", Resource{Kind: "claim", Labels: labels(t, ours, "acme", "a"), Grace: time.Hour}, Facts{LastActive: now.Add(-2 * time.Hour)}, true, ReasonOrphaned},
		{"claim never used, grace", Resource{Kind: "claim", Labels: labels(t, ours, "acme", "a"), Grace: time.Hour}, none, true, ReasonOrphaned},
		{"grace does not beat a store error", Resource{Kind: "claim", Labels: labels(t, ours, "acme", "a"), Grace: time.Hour}, Facts{RunErr: boom}, false, ReasonStoreUnknown},
		{"keyless abandoned", Resource{Kind: "networkpolicy", Keyless: true, State: "exited"}, none, true, ReasonOrphaned},
		{"keyless in use", Resource{Kind: "networkpolicy", Keyless: true, Hold: ReasonInUse}, none, false, ReasonInUse},
		{"keyless of another installation", Resource{Kind: "networkpolicy", Keyless: true, Labels: map[string]string{driver.LabelInstallation: "ff"}}, none, false, ReasonForeign},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asked := false
			v := Decide(ours, tc.res, now, func(identity.Key) Facts { asked = true; return tc.facts })
			if tc.res.Keyless && asked {
				t.Errorf("a keyless resource's key facts were asked")
			}
			if v.Remove != tc.remove || v.Reason != tc.reason {
				t.Errorf("Decide = %+v, want remove %v, reason %s", v, tc.remove, tc.reason)
			}
		})
	}
}

// faultyStore fails the lookups of the users it names.
type faultyStore struct {
	store.Store
	leaseFails, runFails string // a user
}

func (f faultyStore) GetLease(ctx context.Context, name string) (store.Lease, error) {
	k, _ := identity.New("acme", f.leaseFails)
	if name == LeaseName(k) {
		return store.Lease{}, errors.New("injected: lease lookup failed")
	}
	return f.Store.GetLease(ctx, name)
}

func (f faultyStore) ListRuns(ctx context.Context, fl store.RunFilter) ([]store.Run, error) {
	if fl.User == f.runFails {
		return nil, errors.New("injected: store failed")
	}
	return f.Store.ListRuns(ctx, fl)
}

func openStore(t *testing.T) store.Store {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "runs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func newRun(t *testing.T, user, status string) store.Run {
	t.Helper()
	id, err := store.NewRunID()
	if err != nil {
		t.Fatal(err)
	}
	return store.Run{ID: id, Tenant: "acme", User: user, Trust: store.TrustTrusted, Admission: store.AdmissionAdmitted, Status: status}
}

// TestReaperDocker: against real containers, a dead owner's container whose run is terminal (or that never had
// one) is removed; one with a live lease, a running run, an injected lease or store error, a running state or
// another installation's labels is kept; removals and keeps-on-unknown are events.
func TestReaperDocker(t *testing.T) {
	cli := testutil.Docker(t)
	image := testutil.TestImage(t)
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	inst, foreign := hex.EncodeToString(raw[:]), hex.EncodeToString(raw[:])[:31]+"x"
	testutil.Cleanup(t, inst)
	testutil.Cleanup(t, foreign)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	suffix := inst[:8]
	make := func(user, installation string, start bool) string {
		t.Helper()
		name := "sandkeep-reapertest-" + user + "-" + suffix
		c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: name,
			Config:     &container.Config{Image: image, Cmd: []string{"sleep", "3600"}, Labels: labels(t, installation, "acme", user)},
			HostConfig: &container.HostConfig{NetworkMode: "none"}})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		if start {
			if _, err := cli.ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
				t.Fatalf("start %s: %v", name, err)
			}
		}
		return name
	}
	st := openStore(t)
	// dead: its owner is gone (its lease expired) and its run finished.
	dead := make("dead", inst, false)
	if err := st.CreateRun(ctx, newRun(t, "dead", store.StatusSucceeded)); err != nil {
		t.Fatal(err)
	}
	deadKey, _ := identity.New("acme", "dead")
	if _, err := st.AcquireLease(ctx, LeaseName(deadKey), "gone-replica", "", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	never := make("never", inst, false) // no lease, no run at all
	leased := make("leased", inst, false)
	leasedKey, _ := identity.New("acme", "leased")
	if _, err := st.AcquireLease(ctx, LeaseName(leasedKey), "live-replica", "", time.Hour); err != nil {
		t.Fatal(err)
	}
	busy := make("busy", inst, false)
	if err := st.CreateRun(ctx, newRun(t, "busy", store.StatusRunning)); err != nil {
		t.Fatal(err)
	}
	leaseErr := make("leaseerr", inst, false)
	storeErr := make("storeerr", inst, false)
	running := make("running", inst, true)
	other := make("other", foreign, false)
	// Compose companions (running, with a named volume): the dead sandbox's go with it (the next rounds see its
	// sandbox gone, then the volume unused); the leased sandbox's stay.
	companion := func(of string) (string, string) {
		t.Helper()
		name, vol := of+"-c-db", of+"-v-data"
		lbl := map[string]string{docker.LabelCompanionOf: of, docker.LabelCompanionService: "db"}
		if _, err := cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: vol, Labels: lbl}); err != nil {
			t.Fatal(err)
		}
		c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: name,
			Config: &container.Config{Image: image, Cmd: []string{"sleep", "3600"}, Labels: lbl},
			HostConfig: &container.HostConfig{NetworkMode: "none",
				Mounts: []mount.Mount{{Type: mount.TypeVolume, Source: vol, Target: "/data"}}}})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		t.Cleanup(func() {
			_, _ = cli.ContainerRemove(context.Background(), c.ID, client.ContainerRemoveOptions{Force: true})
			_, _ = cli.VolumeRemove(context.Background(), vol, client.VolumeRemoveOptions{Force: true})
		})
		if _, err := cli.ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		return name, vol
	}
	deadComp, deadVol := companion(dead)
	leasedComp, leasedVol := companion(leased)
	// Build images (of a digest of this test's own: the engine is shared): one no container uses, removed (no
	// grace here); one a container was made from, kept.
	digest := "reapertest-" + inst
	src, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{Image: image, Cmd: []string{"true"}},
		HostConfig: &container.HostConfig{NetworkMode: "none"}})
	if err != nil {
		t.Fatal(err)
	}
	commit := func(tag string) string {
		t.Helper()
		res, err := cli.ContainerCommit(ctx, src.ID, client.ContainerCommitOptions{Reference: tag,
			Changes: []string{"LABEL " + build.LabelDigest + "=" + digest, "LABEL reapertest=" + tag}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = cli.ImageRemove(context.Background(), res.ID, client.ImageRemoveOptions{Force: true}) })
		return tag
	}
	unusedImg, usedImg := commit("sandkeep-reapertest-unused:"+suffix), commit("sandkeep-reapertest-used:"+suffix)
	user, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{Image: usedImg, Cmd: []string{"true"}},
		HostConfig: &container.HostConfig{NetworkMode: "none"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{src.ID, user.ID} {
		t.Cleanup(func() {
			_, _ = cli.ContainerRemove(context.Background(), id, client.ContainerRemoveOptions{Force: true})
		})
	}
	time.Sleep(10 * time.Millisecond) // the dead owner's 1ms lease is over

	r := New(Config{Installation: inst, Source: Docker{API: cli, ImageGrace: -1, onlyDigest: digest}, Store: faultyStore{Store: st, leaseFails: "leaseerr", runFails: "storeerr"}})
	rep, err := r.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	removed := map[string]bool{}
	for _, n := range rep.Removed {
		removed[n] = true
	}
	for name, want := range map[string]string{dead: ReasonOrphaned, never: ReasonOrphaned, leased: ReasonLeased, busy: ReasonRunActive,
		leaseErr: ReasonLeaseUnknown, storeErr: ReasonStoreUnknown, running: ReasonActive, other: ReasonForeign} {
		got := rep.Kept[name]
		if removed[name] {
			got = ReasonOrphaned
		}
		if got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
		_, ierr := cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
		if exists := ierr == nil; exists == (want == ReasonOrphaned) {
			t.Errorf("%s: exists %v after the pass (inspect: %v); want removed only when orphaned", name, exists, ierr)
		}
	}
	for name, want := range map[string]string{deadComp: ReasonOrphaned, deadVol: ReasonOrphaned, leasedComp: ReasonInUse, leasedVol: ReasonInUse,
		unusedImg: ReasonOrphaned, usedImg: ReasonInUse} {
		got := rep.Kept[name]
		if removed[name] {
			got = ReasonOrphaned
		}
		if got != want {
			t.Errorf("companion's %s: %q, want %q", name, got, want)
		}
	}
	if _, err := cli.ContainerInspect(ctx, deadComp, client.ContainerInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Errorf("the dead sandbox's companion after the pass: %v, want it removed", err)
	}
	if _, err := cli.VolumeInspect(ctx, deadVol, client.VolumeInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Errorf("the dead sandbox's companion volume after the pass: %v, want it removed", err)
	}
	if _, err := cli.ImageInspect(ctx, unusedImg); !cerrdefs.IsNotFound(err) {
		t.Errorf("the unused build image after the pass: %v, want it removed", err)
	}
	if _, err := cli.ImageInspect(ctx, usedImg); err != nil {
		t.Errorf("the build image a container uses after the pass: %v, want it kept", err)
	}
	if _, err := cli.ContainerInspect(ctx, leasedComp, client.ContainerInspectOptions{}); err != nil {
		t.Errorf("the leased sandbox's companion after the pass: %v, want it kept", err)
	}
	evs, err := st.ListEvents(ctx, store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range evs {
		if e.Name != events.NameReaperRemoved && e.Name != events.NameReaperKept {
			continue
		}
		v, err := e.Decode()
		if err != nil {
			t.Fatal(err)
		}
		p := v.(events.ReaperDecision)
		got[p.Resource] = e.Name + ":" + p.Reason
	}
	want := map[string]string{dead: "reaper_removed:orphaned", never: "reaper_removed:orphaned",
		leaseErr: "reaper_kept:lease_unknown", storeErr: "reaper_kept:store_unknown"}
	for n, w := range want {
		if got[n] != w {
			t.Errorf("event of %s: %q, want %q", n, got[n], w)
		}
	}
	for n := range got {
		if _, ok := want[n]; !ok && (n == leased || n == busy || n == running || n == other) {
			t.Errorf("an event for %s (%s), which was kept for a known reason", n, got[n])
		}
	}
}

// countingSource counts passes and reports when two overlap.
type countingSource struct {
	passes  atomic.Int32
	active  atomic.Int32
	overlap atomic.Bool
}

func (c *countingSource) List(context.Context) ([]Resource, error) {
	if c.active.Add(1) > 1 {
		c.overlap.Store(true)
	}
	c.passes.Add(1)
	time.Sleep(20 * time.Millisecond)
	c.active.Add(-1)
	return nil, nil
}

func (c *countingSource) Remove(context.Context, Resource) error { return nil }

// TestLeader: of two replicas, one reaps at a time (at once when it leads, then on its interval); when the
// leader stops, the other takes the lead and reaps.
func TestLeader(t *testing.T) {
	st := openStore(t)
	src := &countingSource{}
	a := New(Config{Installation: ours, Source: src, Store: st})
	b := New(Config{Installation: ours, Source: src, Store: st})
	const ttl, every = 300 * time.Millisecond, 100 * time.Millisecond
	actx, stopA := context.WithCancel(t.Context())
	bctx, stopB := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { a.RunLeader(actx, st, "a", ttl, every) })
	time.Sleep(50 * time.Millisecond) // a leads first
	wg.Go(func() { b.RunLeader(bctx, st, "b", ttl, every) })
	time.Sleep(time.Second)
	l, err := st.GetLease(t.Context(), LeaderLease)
	if err != nil || l.Owner != "a" || !l.Live {
		t.Fatalf("leader lease %+v, %v; want a's", l, err)
	}
	before := src.passes.Load()
	if before < 2 {
		t.Errorf("%d passes in a second of leading every %s", before, every)
	}
	stopA() // releases: b takes over at its next try
	time.Sleep(time.Second)
	l, err = st.GetLease(t.Context(), LeaderLease)
	if err != nil || l.Owner != "b" || !l.Live {
		t.Errorf("leader lease after a stopped: %+v, %v; want b's", l, err)
	}
	if src.passes.Load() <= before {
		t.Errorf("no pass after b took the lead")
	}
	stopB()
	wg.Wait()
	if src.overlap.Load() {
		t.Errorf("two replicas reaped at once")
	}
}

// leaseCheckingSource is one orphaned resource of key whose Remove looks at the key's lease meanwhile.
type leaseCheckingSource struct {
	t      *testing.T
	st     store.Store
	key    identity.Key
	done   bool
	during store.Lease
	claim  error // a replica's claim of the key during the removal
}

func (s *leaseCheckingSource) List(context.Context) ([]Resource, error) {
	if s.done {
		return nil, nil
	}
	return []Resource{{Kind: "pod", Name: s.key.ContainerName(), Labels: labels(s.t, ours, s.key.Tenant, s.key.User), State: "running", ReapRunning: true}}, nil
}

func (s *leaseCheckingSource) Remove(ctx context.Context, _ Resource) error {
	s.during, _ = s.st.GetLease(ctx, LeaseName(s.key))
	_, s.claim = s.st.AcquireLease(ctx, LeaseName(s.key), "replica", "10.0.0.1:7879", time.Minute)
	s.done = true
	return nil
}

// TestRemoveUnderLease: a dead owner's running resource is removed under its key's lease, taken by the reaper
// first (a replica's claim meanwhile is refused: it cannot adopt what is being removed) and released after (the
// next claim takes the key at once).
func TestRemoveUnderLease(t *testing.T) {
	st := openStore(t)
	key, _ := identity.New("acme", "dead")
	src := &leaseCheckingSource{t: t, st: st, key: key}
	r := New(Config{Installation: ours, Source: src, Store: st, Owner: "the-reaper"})
	rep, err := r.Once(t.Context())
	if err != nil || len(rep.Removed) != 1 {
		t.Fatalf("Once = %+v, %v; want the one resource removed", rep, err)
	}
	if src.during.Owner != "the-reaper" || !src.during.Live {
		t.Errorf("the key's lease during the removal: %+v; want the reaper's, live", src.during)
	}
	if !errors.Is(src.claim, store.ErrLeaseHeld) {
		t.Errorf("a replica's claim during the removal: %v; want ErrLeaseHeld", src.claim)
	}
	if l, err := st.AcquireLease(t.Context(), LeaseName(key), "replica", "10.0.0.1:7879", time.Minute); err != nil || l.Owner != "replica" {
		t.Errorf("a claim after the pass: %+v, %v; want the key taken", l, err)
	}
}
