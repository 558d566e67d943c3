package kube_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/reaper"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/store/sqlite"
	"github.com/sandkeep/sandkeep/internal/testutil/kubetest"
)

// reapStore fails the lease lookup of one user and the run lookup of another.
type reapStore struct {
	store.Store
	leaseFails, runFails identity.Key
}

func (f reapStore) GetLease(ctx context.Context, name string) (store.Lease, error) {
	if name == reaper.LeaseName(f.leaseFails) {
		return store.Lease{}, errors.New("injected: lease lookup failed")
	}
	return f.Store.GetLease(ctx, name)
}

func (f reapStore) ListRuns(ctx context.Context, fl store.RunFilter) ([]store.Run, error) {
	if fl.User == f.runFails.User {
		return nil, errors.New("injected: store failed")
	}
	return f.Store.ListRuns(ctx, fl)
}

// TestReaperKube: the reaper over the node's sandbox records and pods. A dead replica's stopped sandbox (its key's
// lease expired, its run terminal) loses its record; its workspace claim is kept (a user's files: only rm removes
// them). A running pod (and its record) is kept, as a running container is on Docker. A sandbox with a live lease, a running run, an injected lease or store error, another
// installation's labels, or an object of ours without labels is kept.
func TestReaperKube(t *testing.T) {
	kc := kubetest.Node(t)
	ns := kc.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	d, err := kube.New(kc.Options(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "runs.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	inst, foreign := "reap-"+randHex(t, 6), "reap-"+randHex(t, 6)
	tenant := "acme-" + randHex(t, 3)
	p, err := lifecycle.BuildPosture(lifecycle.Config{Image: "unused", AgentPath: kc.Agent, NanoCPUs: 2e8, MemoryBytes: 256 << 20},
		"/unused/workspace", "/unused/agent", "")
	if err != nil {
		t.Fatal(err)
	}
	img, err := d.ResolveImage(ctx, kubetest.Image)
	if err != nil {
		t.Fatal(err)
	}
	var deadSB *driver.Sandbox
	mk := func(user, installation string, start bool) identity.Key {
		t.Helper()
		key, err := identity.New(tenant, user)
		if err != nil {
			t.Fatal(err)
		}
		sb, err := d.Create(ctx, &driver.CreateSpec{Key: key, Name: key.ContainerName(), Posture: p, Image: img, ImageID: img,
			Labels: map[string]string{driver.LabelInstallation: installation, driver.LabelKey: key.Hex(), driver.LabelTenant: key.Tenant,
				driver.LabelUser: key.User, driver.LabelPosture: p.Hash()}})
		if err != nil {
			t.Fatalf("create %s: %v", user, err)
		}
		if start {
			if err := d.Start(ctx, sb); err != nil {
				t.Fatalf("start %s: %v", user, err)
			}
		}
		if user == "dead" {
			deadSB = sb
		}
		return key
	}
	run := func(key identity.Key, status string) {
		t.Helper()
		id, _ := store.NewRunID()
		if err := st.CreateRun(ctx, store.Run{ID: id, Tenant: key.Tenant, User: key.User, Trust: store.TrustTrusted,
			Admission: store.AdmissionAdmitted, Status: status}); err != nil {
			t.Fatal(err)
		}
	}
	// dead: its replica died after the sandbox was stopped (its pod gone, its claim kept), the lease expired, the
	// run ended.
	dead := mk("dead", inst, true)
	if err := d.Stop(ctx, deadSB, time.Second); err != nil {
		t.Fatal(err)
	}
	run(dead, store.StatusSucceeded)
	if _, err := st.AcquireLease(ctx, reaper.LeaseName(dead), "gone-replica", "", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	leased := mk("leased", inst, false)
	alive := mk("alive", inst, true) // a running pod: no lease says a replica is about to use it, and it is kept
	if _, err := st.AcquireLease(ctx, reaper.LeaseName(leased), "live-replica", "", time.Hour); err != nil {
		t.Fatal(err)
	}
	busy := mk("busy", inst, false)
	run(busy, store.StatusRunning)
	leaseErr, storeErr := mk("leaseerr", inst, false), mk("storeerr", inst, false)
	other := mk("other", foreign, false)
	// An object of ours (managed-by) whose exact labels are missing: not ours to judge.
	bare := "sandkeep-u-bare-" + randHex(t, 4)
	if _, err := kc.API.CoreV1().ConfigMaps(ns).Create(ctx, configMapManagedBy(ns, bare), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // the dead owner's 1 ms lease is over

	r := reaper.New(reaper.Config{Installation: inst, Source: kube.ReapSource{API: kc.API, Namespace: ns},
		Store: reapStore{Store: st, leaseFails: leaseErr, runFails: storeErr}})
	rep, err := r.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	removed := map[string]int{}
	for _, n := range rep.Removed {
		removed[n]++
	}
	if removed[dead.ContainerName()] != 1 || len(removed) != 1 {
		t.Errorf("removed %v, want only the dead sandbox's record", rep.Removed)
	}
	for name, want := range map[string]string{leased.ContainerName(): reaper.ReasonLeased, busy.ContainerName(): reaper.ReasonRunActive,
		leaseErr.ContainerName(): reaper.ReasonLeaseUnknown, storeErr.ContainerName(): reaper.ReasonStoreUnknown,
		other.ContainerName(): reaper.ReasonForeign, bare: reaper.ReasonUnlabelled, alive.ContainerName(): reaper.ReasonActive} {
		if got := rep.Kept[name]; got != want {
			t.Errorf("%s kept for %q, want %q", name, got, want)
		}
		if _, err := kc.API.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("%s's record after the pass: %v, want it kept", name, err)
		}
	}
	if _, err := kc.API.CoreV1().Pods(ns).Get(ctx, alive.ContainerName(), metav1.GetOptions{}); err != nil {
		t.Errorf("the running sandbox's pod: %v, want it kept", err)
	}
	if _, err := kc.API.CoreV1().ConfigMaps(ns).Get(ctx, dead.ContainerName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the dead sandbox's record: %v, want it removed", err)
	}
	if _, err := kc.API.CoreV1().PersistentVolumeClaims(ns).Get(ctx, dead.ContainerName()+"-workspace", metav1.GetOptions{}); err != nil {
		t.Errorf("the dead sandbox's workspace claim: %v, want it kept", err)
	}
}

// configMapManagedBy is a ConfigMap labelled as sandkeep's, with none of a sandbox's labels.
func configMapManagedBy(ns, name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
		Labels: map[string]string{kube.LabelManagedBy: kube.ManagedBy}}}
}
