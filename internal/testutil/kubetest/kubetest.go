// Package kubetest runs sandkeep's suites against a real Kubernetes node (the one scripts/k8s-up.sh starts):
// the driver selector (SANDKEEP_TEST_DRIVER=kubernetes), the test images imported into the node's containerd,
// a namespace per test, and a provisioner of workspace volumes (CI has no dynamic one).
//
// Tests opt in with SANDKEEP_REQUIRE_KUBE=1 and KUBECONFIG; then a missing or silent cluster fails them, never
// skips.
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/ociimage"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// The selector and the test node's defaults; each can be overridden for another cluster.
const (
	EnvDriver        = "SANDKEEP_TEST_DRIVER"              // "kubernetes": the library, files and API suites run on the kube driver
	EnvRequire       = "SANDKEEP_REQUIRE_KUBE"             // "1": the cluster must be there
	EnvContainerd    = "SANDKEEP_TEST_KUBE_CONTAINERD"     // the node's containerd socket, for `ctr images import`
	EnvPVRoot        = "SANDKEEP_TEST_KUBE_PV_ROOT"        // where the test volumes keep their data (a path the node sees too)
	EnvChannelListen = "SANDKEEP_TEST_KUBE_CHANNEL_LISTEN" // the agent channel's listen address; default NodeHostIP:0
	EnvNSPrefix      = "SANDKEEP_TEST_KUBE_NS_PREFIX"      // prefix of the tests' namespaces; default DefaultNSPrefix

	Driver          = "kubernetes"
	DefaultNSPrefix = "sk15b-"
	NodeHostIP      = "10.213.0.1" // the host's side of the node's veth (scripts/k8s/env.sh)
	NodeKubeconfig  = "/var/lib/sandkeep-k8s/admin.kubeconfig"
	NodeContainerd  = "/var/lib/sandkeep-k8s/run/containerd.sock"
	NodePVRoot      = "/var/lib/sandkeep-k8s/pv"
	StorageClass    = "sandkeep-test"
	WorkspaceSize   = "64Mi"
	AgentImage      = "docker.io/library/sandkeep-agent:test"
	Image           = "docker.io/library/sandkeep-test-busybox:kube"
	// ProbeImage is Image with skprobe (internal/testutil/probe, the egress suites' network client) at
	// testutil.ProbePath, as testutil.ProbeImage is on Docker.
	ProbeImage      = "docker.io/library/sandkeep-test-probe:kube"
	imageRepo       = "docker.io/library/sandkeep-test-busybox"
	probeRepo       = "docker.io/library/sandkeep-test-probe"
	agentRepo       = "docker.io/library/sandkeep-agent"
	imageListBudget = 90 * time.Second // the kubelet reports new images with its next node status
	labelTest       = "io.sandkeep.test"

	// CPUs and MemoryBytes are the tests' sandbox resources: a pod requests what it is limited to, and the test
	// node has 2 cores, so the default (1 CPU) would fit two pods at a time.
	CPUs        = 0.2
	MemoryBytes = 512 << 20
	// Spec is the same as a sandkeep.yaml, for the CLI and serve suites (SANDKEEP_SPEC).
	Spec = "sandbox:\n  resources: {cpus: 0.2, memory: 512m}\n"
)

// Selected reports whether SANDKEEP_TEST_DRIVER picks the kubernetes driver for the suites that can run on it.
func Selected() bool { return os.Getenv(EnvDriver) == Driver }

// Cluster is the real cluster the tests run against.
type Cluster struct {
	Config *rest.Config
	API    kubernetes.Interface
	Agent  string // the static agent binary
	Probe  string // the static skprobe binary (ProbeImage); "" when the cluster was made without it
	// AgentImage is the agent image the suites' drivers use (Options, the CLI's environment): AgentImage's
	// repository tagged with the agent binary's digest, so that the node's other users (another worktree's tests,
	// a CI run) importing their own agent under the shared tag never swap it under this binary's pods.
	AgentImage string

	mapperOnce sync.Once // Resource's discovery, once per cluster
	mapper     meta.RESTMapper
	dyn        dynamic.Interface
	dynErr     error
}

var (
	once       sync.Once
	theCluster *Cluster
	clusterErr error
)

// Node returns the cluster, with the test images loaded into the node. Without SANDKEEP_REQUIRE_KUBE=1 the test
// skips, saying how to run it; with it, a missing cluster fails the test.
func Node(t testing.TB) *Cluster {
	t.Helper()
	if os.Getenv(EnvRequire) != "1" {
		t.Skipf("needs a cluster: run scripts/k8s-build.sh and scripts/k8s-up.sh, then set %s=1 and KUBECONFIG", EnvRequire)
	}
	path := os.Getenv("KUBECONFIG")
	if path == "" {
		path = NodeKubeconfig
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s=1 but there is no kubeconfig at %s (run scripts/k8s-up.sh): %v", EnvRequire, path, err)
	}
	agent := testutil.AgentBinary(t)
	probe := testutil.BuildBinary(t, "./internal/testutil/probe", "skprobe", false)
	once.Do(func() { theCluster, clusterErr = setUp(path, agent, probe) })
	if clusterErr != nil {
		t.Fatalf("cluster: %v", clusterErr)
	}
	return theCluster
}

func setUp(kubeconfig, agent, probe string) (*Cluster, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 50, 100
	api, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if _, err := api.Discovery().ServerVersion(); err != nil {
		return nil, fmt.Errorf("the API server at %s does not answer: %w", cfg.Host, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), imageListBudget+time.Minute)
	defer cancel()
	c := &Cluster{Config: cfg, API: api, Agent: agent, Probe: probe, AgentImage: AgentImage}
	if b, err := os.ReadFile(agent); err == nil {
		sum := sha256.Sum256(b)
		c.AgentImage = AgentImage + "-" + hex.EncodeToString(sum[:6])
	}
	if err := c.LoadImages(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// LoadImages imports the agent image, the busybox test image (Image) and, when c.Probe is set, the probe image
// (ProbeImage) into the node's containerd, then waits until the node reports them (which is what the driver's
// ResolveImage reads).
func (c *Cluster) LoadImages(ctx context.Context) error {
	agent, err := os.ReadFile(c.Agent)
	if err != nil {
		return err
	}
	var agentTar, ownTar, testTar, probeTar bytes.Buffer
	if _, err := kube.WriteAgentImage(&agentTar, agent, AgentImage); err != nil {
		return err
	}
	own := c.AgentImage
	if own == "" {
		own = AgentImage
	}
	if _, err := kube.WriteAgentImage(&ownTar, agent, own); err != nil {
		return err
	}
	if err := BusyboxImage(&testTar, Image); err != nil {
		return err
	}
	images := []struct {
		repo string
		tar  *bytes.Buffer
	}{{agentRepo, &agentTar}, {agentRepo, &ownTar}, {imageRepo, &testTar}}
	want := []string{AgentImage, own, Image}
	if c.Probe != "" {
		probe, err := os.ReadFile(c.Probe)
		if err != nil {
			return err
		}
		if err := BusyboxImage(&probeTar, ProbeImage, ociimage.File{Path: testutil.ProbePath, Mode: 0o755, Data: probe}); err != nil {
			return err
		}
		images = append(images, struct {
			repo string
			tar  *bytes.Buffer
		}{probeRepo, &probeTar})
		want = append(want, ProbeImage)
	}
	for _, img := range images {
		if err := c.ImportImage(ctx, img.repo, img.tar); err != nil {
			return err
		}
	}
	for {
		nodes, err := c.API.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err == nil && len(nodes.Items) > 0 && !slices.ContainsFunc(want, func(ref string) bool { return !NodesHave(nodes.Items, ref) }) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the node did not report the imported images (%v, %v)", ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// NodesHave reports whether a node lists the image ref.
func NodesHave(nodes []corev1.Node, ref string) bool {
	for _, n := range nodes {
		for _, img := range n.Status.Images {
			for _, name := range img.Names {
				if name == ref {
					return true
				}
			}
		}
	}
	return false
}

// BusyboxImage writes the test image as an OCI archive tagged ref: the host's static busybox with its applets,
// /etc/passwd with `sandbox` (uid 1000), /tmp and /workspace; the same tree as testutil.TestImage, and extra
// files on top.
func BusyboxImage(w *bytes.Buffer, ref string, extra ...ociimage.File) error {
	bin, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return fmt.Errorf("static busybox: %w (install busybox-static)", err)
	}
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	files := []ociimage.File{
		{Path: "/bin/busybox", Mode: 0o755, Data: bin},
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n")},
		{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{Path: "/workspace", Mode: fs.ModeDir | 0o755, UID: 1000, GID: 1000},
		{Path: "/home/sandbox", Mode: fs.ModeDir | 0o755, UID: 1000, GID: 1000},
		{Path: "/usr/bin/env", Mode: fs.ModeSymlink | 0o777, Link: "/bin/busybox"},
	}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") && !slices.ContainsFunc(extra, func(f ociimage.File) bool { return f.Path == "/bin/"+a }) {
			files = append(files, ociimage.File{Path: "/bin/" + a, Mode: fs.ModeSymlink | 0o777, Link: "/bin/busybox"})
		}
	}
	files = append(files, extra...)
	_, err = ociimage.Write(w, ociimage.Image{Ref: ref, Files: files, Cmd: []string{"/bin/sh"}})
	return err
}

// Namespace returns a fresh namespace name for this test (SANDKEEP_TEST_KUBE_NS_PREFIX, default "sk15b-", then
// random hex) with a volume provisioner for its claims; the namespace (with its claims) and the volumes go when
// the test ends. The driver creates the namespace itself on first use.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	prefix := os.Getenv(EnvNSPrefix)
	if prefix == "" {
		prefix = DefaultNSPrefix
	}
	ns := prefix + randHex(4)
	p := c.provision(t, ns)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// The pods first, at once: their PID 1 (the agent) does not end on SIGTERM, so the namespace's own
		// deletion would wait out each pod's grace period.
		zero := int64(0)
		err := c.API.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete the pods of %s: %v", ns, err)
		}
		if err := c.API.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", ns, err)
		}
		// The claims go with the namespace; then their volumes and directories.
		for {
			_, err := c.API.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || ctx.Err() != nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		p.stop(t)
	})
	return ns
}

// Options are the kube driver's options for namespace ns on the test node, with the agent channel on
// (listening on the host's side of the node's veth, which pods reach through the node).
func (c *Cluster) Options(ns string) kube.Options {
	listen := os.Getenv(EnvChannelListen)
	if listen == "" {
		listen = NodeHostIP + ":0"
	}
	return kube.Options{REST: c.Config, Namespace: ns, AgentImage: c.AgentImage, StorageClass: StorageClass,
		WorkspaceSize: WorkspaceSize, ChannelListen: listen}
}

// Workspace is the host directory that holds the workspace claim of the sandbox named name in ns (the test
// volumes are directories under SANDKEEP_TEST_KUBE_PV_ROOT), or "" when the claim has no volume (yet, or any
// more: removing the claim removes its volume and directory).
func (c *Cluster) Workspace(t testing.TB, ns, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pvc, err := c.API.CoreV1().PersistentVolumeClaims(ns).Get(ctx, kube.ClaimName(name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ""
	}
	if err != nil {
		t.Fatalf("get claim of %s: %v", name, err)
	}
	if pvc.DeletionTimestamp != nil {
		return ""
	}
	return filepath.Join(PVRoot(), volumeName(ns, pvc.Name))
}

// PVRoot is the directory the test volumes keep their data under (SANDKEEP_TEST_KUBE_PV_ROOT, default
// NodePVRoot): a path the node sees too.
func PVRoot() string {
	if root := os.Getenv(EnvPVRoot); root != "" {
		return root
	}
	return NodePVRoot
}

// volumeName is the test volume of claim ns/claim (and its directory's name).
func volumeName(ns, claim string) string {
	return "sk-" + ns + "-" + claim
}

// provisioner makes a hostPath PersistentVolume, pre-bound, for every claim of the test class in its namespace,
// and deletes a volume (and its directory) once its claim is gone: what a dynamic provisioner with reclaim
// policy Delete does on a real cluster.
type provisioner struct {
	c      *Cluster
	ns     string
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	made   map[string]string // volume name -> the UID of the claim it was made for
	errs   []error
}

func (c *Cluster) provision(t testing.TB, ns string) *provisioner {
	ctx, cancel := context.WithCancel(context.Background())
	p := &provisioner{c: c, ns: ns, cancel: cancel, done: make(chan struct{}), made: map[string]string{}}
	go func() {
		defer close(p.done)
		for {
			p.pass(ctx)
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return p
}

func (p *provisioner) pass(ctx context.Context) {
	api := p.c.API.CoreV1()
	claims, err := api.PersistentVolumeClaims(p.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return // the namespace may not exist yet
	}
	live := map[string]string{} // volume name -> the UID of its claim (one being deleted still holds it)
	for _, pvc := range claims.Items {
		if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != StorageClass {
			continue
		}
		live[volumeName(p.ns, pvc.Name)] = string(pvc.UID)
	}
	// First the volumes whose claim is gone (or was made again: the old volume is bound to the old claim).
	p.mu.Lock()
	var gone []string
	for name, uid := range p.made {
		if live[name] != uid {
			gone = append(gone, name)
		}
	}
	p.mu.Unlock()
	for _, name := range gone {
		if err := p.remove(ctx, name); err != nil {
			p.note(err)
			continue
		}
		p.mu.Lock()
		delete(p.made, name)
		p.mu.Unlock()
	}
	for _, pvc := range claims.Items {
		name := volumeName(p.ns, pvc.Name)
		uid, ok := live[name]
		p.mu.Lock()
		_, done := p.made[name]
		p.mu.Unlock()
		if !ok || done || pvc.DeletionTimestamp != nil {
			continue
		}
		if err := p.create(ctx, name, pvc.Name, uid); err != nil {
			p.note(err)
			continue
		}
		p.mu.Lock()
		p.made[name] = uid
		p.mu.Unlock()
	}
}

func (p *provisioner) create(ctx context.Context, name, claim, uid string) error {
	dir := filepath.Join(PVRoot(), name)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o777); err != nil { // any sandbox uid writes its workspace
		return err
	}
	dirType := corev1.HostPathDirectory
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{labelTest: "true"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(WorkspaceSize)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              StorageClass,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: p.ns, Name: claim, UID: types.UID(uid)},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &dirType}},
		},
	}
	_, err := p.c.API.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create volume %s: %w", name, err)
	}
	return nil
}

func (p *provisioner) remove(ctx context.Context, name string) error {
	err := p.c.API.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete volume %s: %w", name, err)
	}
	return os.RemoveAll(filepath.Join(PVRoot(), name))
}

func (p *provisioner) note(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.errs) < 10 {
		p.errs = append(p.errs, err)
	}
}

// stop ends the provisioner and removes every volume it made.
func (p *provisioner) stop(t testing.TB) {
	p.cancel()
	<-p.done
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	for name := range p.made {
		if err := p.remove(ctx, name); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
	for _, err := range p.errs {
		if ctx.Err() == nil {
			t.Logf("volume provisioner: %v", err)
		}
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
