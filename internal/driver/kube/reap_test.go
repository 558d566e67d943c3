package kube_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/events"
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

// TestReaperKube: the reaper over the node's sandbox namespace. A dead replica's sandbox (its key's lease
// expired, its run terminal) loses its running pod, its record, its workspace claim and the replica's channel
// NetworkPolicy, which no pod dials any more; the key's lease is taken for the removal and released after. Kept:
// a live replica's sandboxes whose key has a live lease, a running run, an injected lease or store error, another
// installation's labels; objects of ours without labels; a workspace kept on purpose (Remove, as a suspend or
// rm --keep-workspace does); the live replica's channel policy.
func TestReaperKube(t *testing.T) {
	kc := kubetest.Node(t)
	ns := kc.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	deadD, err := kube.New(kc.Options(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer deadD.Close()
	liveD, err := kube.New(kc.Options(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer liveD.Close()
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
	img, err := liveD.ResolveImage(ctx, kubetest.Image)
	if err != nil {
		t.Fatal(err)
	}
	sandboxes := map[string]*driver.Sandbox{}
	mk := func(d *kube.Driver, user, installation string) identity.Key {
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
		if err := d.Start(ctx, sb); err != nil {
			t.Fatalf("start %s: %v", user, err)
		}
		sandboxes[user] = sb
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
	policy := func(d *kube.Driver) string {
		return kube.ChannelPolicyPrefix + policySuffix(t, ctx, kc, ns, d.ChannelAddr())
	}

	// dead: its replica died (SIGKILL: nothing released) while its sandbox ran; the lease expired, the run ended.
	dead := mk(deadD, "dead", inst)
	deadPolicy := policy(deadD)
	run(dead, store.StatusSucceeded)
	if _, err := st.AcquireLease(ctx, reaper.LeaseName(dead), "gone-replica", "", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := deadD.Close(); err != nil {
		t.Fatal(err)
	}
	leased := mk(liveD, "leased", inst)
	if _, err := st.AcquireLease(ctx, reaper.LeaseName(leased), "live-replica", "", time.Hour); err != nil {
		t.Fatal(err)
	}
	busy := mk(liveD, "busy", inst)
	run(busy, store.StatusRunning)
	leaseErr, storeErr := mk(liveD, "leaseerr", inst), mk(liveD, "storeerr", inst)
	other := mk(liveD, "other", foreign)
	// kept: removed on purpose with its workspace kept (what a suspend and rm --keep-workspace do); no lease, its
	// run over.
	kept := mk(liveD, "kept", inst)
	run(kept, store.StatusSucceeded)
	if err := liveD.Remove(ctx, sandboxes["kept"]); err != nil {
		t.Fatal(err)
	}
	livePolicy := policy(liveD)
	// Objects of ours (managed-by) whose exact labels are missing: not ours to judge.
	bare := "sandkeep-u-bare-" + randHex(t, 4)
	if _, err := kc.API.CoreV1().ConfigMaps(ns).Create(ctx, configMapManagedBy(ns, bare), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bareClaim := bareClaimManagedBy(t, ctx, kc, ns)
	time.Sleep(10 * time.Millisecond) // the dead owner's 1 ms lease is over

	owner := "reaper-of-" + randHex(t, 4)
	r := reaper.New(reaper.Config{Installation: inst, Owner: owner,
		Source: kube.ReapSource{API: kc.API, Namespace: ns, ClaimGrace: -1, PolicyGrace: -1},
		Store:  reapStore{Store: st, leaseFails: leaseErr, runFails: storeErr}})
	rep, err := r.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	removed := map[string]int{}
	for _, n := range rep.Removed {
		removed[n]++
	}
	deadName := dead.ContainerName()
	want := map[string]int{deadName: 2, kube.ClaimName(deadName): 1, deadPolicy: 1} // record and pod share the name
	if len(removed) != len(want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	for n, c := range want {
		if removed[n] != c {
			t.Errorf("%s removed %d times, want %d (removed %v)", n, removed[n], c, rep.Removed)
		}
	}
	gone := func(what string, err error, deleting bool) {
		t.Helper()
		if !apierrors.IsNotFound(err) && !(err == nil && deleting) {
			t.Errorf("the dead sandbox's %s after the pass: %v, deleting %v; want it removed", what, err, deleting)
		}
	}
	_, err = kc.API.CoreV1().ConfigMaps(ns).Get(ctx, deadName, metav1.GetOptions{})
	gone("record", err, false)
	pod, err := kc.API.CoreV1().Pods(ns).Get(ctx, deadName, metav1.GetOptions{})
	gone("pod", err, err == nil && pod.DeletionTimestamp != nil)
	claim, err := kc.API.CoreV1().PersistentVolumeClaims(ns).Get(ctx, kube.ClaimName(deadName), metav1.GetOptions{})
	gone("claim", err, err == nil && claim.DeletionTimestamp != nil) // the pvc-protection finalizer waits for the pod
	_, err = kc.API.NetworkingV1().NetworkPolicies(ns).Get(ctx, deadPolicy, metav1.GetOptions{})
	gone("replica's channel policy", err, false)

	for name, want := range map[string]string{leased.ContainerName(): reaper.ReasonLeased, busy.ContainerName(): reaper.ReasonRunActive,
		leaseErr.ContainerName(): reaper.ReasonLeaseUnknown, storeErr.ContainerName(): reaper.ReasonStoreUnknown,
		other.ContainerName(): reaper.ReasonForeign} {
		if got := rep.Kept[name]; got != want {
			t.Errorf("%s kept for %q, want %q", name, got, want)
		}
		if _, err := kc.API.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("%s's record after the pass: %v, want it kept", name, err)
		}
		if p, err := kc.API.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
			t.Errorf("%s's running pod after the pass: %v; want it kept", name, err)
		}
		if got := rep.Kept[kube.ClaimName(name)]; got != reaper.ReasonInUse && got != reaper.ReasonForeign {
			t.Errorf("%s's claim kept for %q, want in use (or another installation's)", name, got)
		}
	}
	for name, want := range map[string]string{bare: reaper.ReasonUnlabelled, bareClaim: reaper.ReasonUnlabelled,
		kube.ClaimName(kept.ContainerName()): reaper.ReasonWorkspaceKept, livePolicy: reaper.ReasonInUse} {
		if got := rep.Kept[name]; got != want {
			t.Errorf("%s kept for %q, want %q", name, got, want)
		}
	}
	if _, err := kc.API.CoreV1().PersistentVolumeClaims(ns).Get(ctx, kube.ClaimName(kept.ContainerName()), metav1.GetOptions{}); err != nil {
		t.Errorf("the workspace kept on purpose: %v, want it kept", err)
	}
	if _, err := kc.API.NetworkingV1().NetworkPolicies(ns).Get(ctx, livePolicy, metav1.GetOptions{}); err != nil {
		t.Errorf("the live replica's channel policy: %v, want it kept", err)
	}
	// The dead key's lease was the reaper's for the removal, and is released.
	l, err := st.GetLease(ctx, reaper.LeaseName(dead))
	if err != nil || l.Owner != owner || l.Live {
		t.Errorf("the dead key's lease after the pass: %+v, %v; want the reaper's (%s), released", l, err, owner)
	}
	evs, err := st.ListEvents(ctx, store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	removedEv := map[string]int{}
	for _, e := range evs {
		if e.Name == events.NameReaperRemoved {
			v, err := e.Decode()
			if err != nil {
				t.Fatal(err)
			}
			removedEv[v.(events.ReaperDecision).Kind+"/"+v.(events.ReaperDecision).Resource]++
		}
	}
	for _, k := range []string{kube.KindPod + "/" + deadName, kube.KindRecord + "/" + deadName, kube.KindClaim + "/" + kube.ClaimName(deadName), kube.KindPolicy + "/" + deadPolicy} {
		if removedEv[k] != 1 {
			t.Errorf("reaper_removed events of %s: %d, want 1 (all: %v)", k, removedEv[k], removedEv)
		}
	}
}

// policySuffix finds the channel policy that allows addr (its annotation), and returns its name's suffix.
func policySuffix(t *testing.T, ctx context.Context, kc *kubetest.Cluster, ns, addr string) string {
	t.Helper()
	nps, err := kc.API.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, np := range nps.Items {
		if np.Annotations[kube.AnnotationChannel] == addr {
			return strings.TrimPrefix(np.Name, kube.ChannelPolicyPrefix)
		}
	}
	t.Fatalf("no channel policy for %s", addr)
	return ""
}

// bareClaimManagedBy makes a claim labelled as sandkeep's, with none of a sandbox's labels.
func bareClaimManagedBy(t *testing.T, ctx context.Context, kc *kubetest.Cluster, ns string) string {
	t.Helper()
	name := "sandkeep-u-bare-" + randHex(t, 4) + "-workspace"
	sc := kubetest.StorageClass
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kube.LabelManagedBy: kube.ManagedBy}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &sc,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}}}
	if _, err := kc.API.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// configMapManagedBy is a ConfigMap labelled as sandkeep's, with none of a sandbox's labels.
func configMapManagedBy(ns, name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
		Labels: map[string]string{kube.LabelManagedBy: kube.ManagedBy}}}
}
