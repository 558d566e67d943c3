package kube_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/testutil/kubetest"
)

// The test node's names (internal/testutil/kubetest has them all; these are the ones the tests here spell).
const (
	nodeHostIP     = kubetest.NodeHostIP // the host's side of the node's veth (scripts/k8s/env.sh)
	storageClass   = kubetest.StorageClass
	workspaceSize  = kubetest.WorkspaceSize
	testAgentImage = kubetest.AgentImage
	testImage      = kubetest.Image
)

// cluster is the real cluster the tests run against: kubetest's, with this package's helpers.
type cluster struct {
	k     *kubetest.Cluster
	cfg   *rest.Config
	api   kubernetes.Interface
	agent string // the static agent binary
}

// theNode returns the cluster, with the test images loaded into the node (kubetest.Node: the tests opt in with
// SANDKEEP_REQUIRE_KUBE=1 and skip without it; then a missing or silent cluster fails them, never skips).
func theNode(t *testing.T) *cluster {
	t.Helper()
	k := kubetest.Node(t)
	return &cluster{k: k, cfg: k.Config, api: k.API, agent: k.Agent}
}

// namespace returns a fresh namespace name for this test, deleted (with its claims) when the test ends.
func (c *cluster) namespace(t *testing.T) string {
	t.Helper()
	return c.namespacePrefixed(t, "sandkeep-test-")
}

// namespacePrefixed is namespace with the name's prefix given.
func (c *cluster) namespacePrefixed(t *testing.T, prefix string) string {
	t.Helper()
	ns := prefix + randHex(t, 4)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.api.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", ns, err)
		}
	})
	return ns
}

// driver is a driver for ns with the agent channel on (listening on the node's host side of its veth, which
// the pods reach through the node); driverExec is one without, every command through the API server's exec.
func (c *cluster) driver(t *testing.T, ns string) *kube.Driver {
	t.Helper()
	return c.newDriver(t, kube.Options{Namespace: ns, ChannelListen: c.k.Options(ns).ChannelListen})
}

func (c *cluster) driverExec(t *testing.T, ns string) *kube.Driver {
	t.Helper()
	return c.newDriver(t, kube.Options{Namespace: ns})
}

func (c *cluster) newDriver(t *testing.T, opts kube.Options) *kube.Driver {
	t.Helper()
	opts.REST, opts.AgentImage, opts.StorageClass, opts.WorkspaceSize = c.cfg, testAgentImage, storageClass, workspaceSize
	d, err := kube.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// volume makes a static PersistentVolume of the test class, pre-bound to the claim ns/claim, backed by a
// directory on the node (CI has no dynamic provisioner). The PV, the claim and the directory go when the test
// ends.
func (c *cluster) volume(t *testing.T, ns, claim string) {
	t.Helper()
	root := kubetest.PVRoot()
	sum := sha256.Sum256([]byte(ns + "/" + claim))
	name := "sk-" + hex.EncodeToString(sum[:10])
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil { // any sandbox uid writes its workspace
		t.Fatal(err)
	}
	dirType := corev1.HostPathDirectory
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"io.sandkeep.test": "true"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(workspaceSize)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              storageClass,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: claim},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &dirType}},
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.api.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return // the same claim again (a second Spec for one key): its cleanup is registered
		}
		t.Fatalf("create PV %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.api.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, claim, metav1.DeleteOptions{})
		if err := c.api.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete PV %s: %v", name, err)
		}
		os.RemoveAll(dir)
	})
}

// spec is the CreateSpec the lifecycle would give key, with the claim's volume made.
func (c *cluster) spec(t *testing.T, ns string, key identity.Key, installation string) *driver.CreateSpec {
	t.Helper()
	c.volume(t, ns, kube.ClaimName(key.ContainerName()))
	// The mount sources are host paths on Docker; the kubernetes driver maps the targets (claim, agent volume).
	p, err := lifecycle.BuildPosture(lifecycle.Config{Image: "unused", AgentPath: c.agent}, "/unused/workspace", "/unused/agent", "")
	if err != nil {
		t.Fatal(err)
	}
	return &driver.CreateSpec{
		Key: key, Name: key.ContainerName(), Posture: p,
		Labels: map[string]string{
			driver.LabelInstallation: installation, driver.LabelKey: key.Hex(),
			driver.LabelTenant: key.Tenant, driver.LabelUser: key.User, driver.LabelPosture: p.Hash(),
		},
	}
}

// podRecorder sees every pod created in a namespace while the test runs, for checks when it ends.
type podRecorder struct {
	mu      sync.Mutex
	pods    map[string]*corev1.Pod // by UID: the last version seen
	lastErr error                  // the last watch error, for a test that saw nothing
	events  int                    // lists done
}

// recordPods lists the pods of ns until the test's other cleanups are done, then calls check with every pod seen.
func (c *cluster) recordPods(t *testing.T, ns string, check func(t *testing.T, pods []*corev1.Pod)) {
	t.Helper()
	rec := &podRecorder{pods: map[string]*corev1.Pod{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { // a List every 100 ms: every sandbox pod lives for seconds at least
		defer close(done)
		for {
			list, err := c.api.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			rec.mu.Lock()
			if err != nil {
				rec.lastErr = err
			} else {
				rec.events++
				for i := range list.Items {
					rec.pods[string(list.Items[i].UID)] = &list.Items[i]
				}
			}
			rec.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { // runs after the cleanups registered later (the sandboxes' removal)
		cancel()
		<-done
		rec.mu.Lock()
		defer rec.mu.Unlock()
		pods := make([]*corev1.Pod, 0, len(rec.pods))
		for _, p := range rec.pods {
			pods = append(pods, p)
		}
		if len(pods) == 0 {
			t.Logf("pod lists: %d, last error %v", rec.events, rec.lastErr)
		}
		check(t, pods)
	})
}

func randHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

var errNoPods = errors.New("no pod was seen")
