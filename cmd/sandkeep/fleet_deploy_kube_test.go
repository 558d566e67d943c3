package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	sdk "github.com/sandkeep/sandkeep/client"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/fleet"
	"github.com/sandkeep/sandkeep/internal/ociimage"
	"github.com/sandkeep/sandkeep/internal/store/postgres"
	"github.com/sandkeep/sandkeep/internal/testutil/kubetest"
)

// The test node's API server as pods reach it: the node runs no service proxy (scripts/k8s/node.sh), so the
// `kubernetes` Service's cluster IP, which the kubelet puts in every pod's KUBERNETES_SERVICE_HOST, routes
// nowhere there. A fact of the test node, not of the manifests (docs/KUBERNETES.md, "CI").
const (
	nodeAPIHost = "10.213.0.2"
	nodeAPIPort = "6443"
)

// TestFleetDeployedKube is issue 27's fleet deployed FROM deploy/kubernetes onto the test node: the namespaces,
// RBAC, Secret and Deployment (3 replicas, its Service, PodDisruptionBudget and NetworkPolicy) as the files say,
// with only an operator's substitutions made to them as read (the images, the namespaces' names, the Secret's
// DSN, fleet secret and installation, the storage class and size, the API server's address on this node, a
// smaller CPU request for a two-core node). sandkeep's own image (FROM scratch: the static sandkeep and
// sandkeep-agent) is imported into the node's containerd; PostgreSQL is the one scripts/postgres-up.sh starts,
// reached by the pods through the host's side of the node's veth. 200 commands of 20 users go round-robin to
// the replica pods (through the Go SDK, to their pod IPs) while the Deployment is restarted as `kubectl rollout
// restart` does: every result checked, 0 failed commands, one pod per key. Then the container of the replica
// that owns a busy key is SIGKILLed mid-command: the caller gets OWNER_LOST, the key's next command succeeds
// through another replica within the lease's expiry plus 5 s, and the store holds every run once.
func TestFleetDeployedKube(t *testing.T) {
	if !kubetest.Selected() {
		t.Skipf("a kubernetes test: scripts/test.sh's kubernetes stage runs it (%s=%s)", kubetest.EnvDriver, kubetest.Driver)
	}
	dsn := postgresSchema(t)
	c := newCLI(t)
	c.env = append(c.env, "SANDKEEP_STORE="+dsn)
	kc, sb := c.kc, c.ns
	sys := kc.Namespace(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()

	image := serverImage(ctx, t, kc, c.bin)
	dep := deployFleet(ctx, t, c, sys, image, forwardPostgres(t, dsn))
	begin := time.Now()
	waitRollout(ctx, t, kc, sys, dep.name)
	t.Logf("deployed from deploy/kubernetes: 3 replicas ready in %s", time.Since(begin).Round(time.Millisecond))

	tenant := c.ten("dfleet")
	tok := c.createToken(t, tenant, "dfleet", "")
	reps := newPodRouter(ctx, t, kc, sys, tok.Token)

	// 200 commands of 20 users round-robin over the ready replicas; once every key has its pod, the Deployment is
	// restarted, and the users go on until the rollout is done (at least 10 commands each).
	const users, perUser = 20, 10
	var (
		wg       sync.WaitGroup
		done     atomic.Int32
		ok       atomic.Int32
		retried  atomic.Int32
		rolled   atomic.Bool
		sent     [users]int
		errs     = make(chan error, users*perUser*10)
		keysUp   = make(chan struct{})
		keysOnce sync.Once
	)
	for u := range users {
		wg.Go(func() {
			for i := 0; i < perUser || !rolled.Load() && i < 10*perUser; i++ {
				want := fmt.Sprintf("u%d-%d", u, i)
				cmd := "echo " + want + "; echo " + want + " >> /workspace/log"
				if i%3 == 1 {
					cmd = "sleep 1; " + cmd // in flight when a replica drains
				}
				res, err := execAnywhere(t, reps.order(u*perUser+i), fmt.Sprintf("u%d", u), sdk.ExecRequest{Command: cmd, Timeout: time.Minute}, &retried)
				if err == nil && (res.ExitCode != 0 || res.Stdout != want+"\n") {
					err = fmt.Errorf("%+v", res)
				}
				sent[u] = i + 1
				if err != nil {
					errs <- fmt.Errorf("u%d command %d: %w", u, i, err)
				} else {
					ok.Add(1)
				}
				if done.Add(1) == users*3 {
					keysOnce.Do(func() { close(keysUp) })
				}
			}
		})
	}
	select {
	case <-keysUp:
	case <-time.After(5 * time.Minute):
		t.Fatalf("the first %d commands did not finish within 5 minutes", users*3)
	}
	rollAt := time.Since(begin)
	before := reps.names()
	restartDeployment(ctx, t, kc, sys, dep.name)
	waitRollout(ctx, t, kc, sys, dep.name)
	rolled.Store(true)
	rollTook := time.Since(begin) - rollAt
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		failed++
		t.Error(err)
	}
	after := reps.names()
	total := 0
	for _, n := range sent {
		total += n
	}
	t.Logf("round-robin: %d commands of %d users over the replicas, restarted from %v to %v (%s, under load): %d failed, %d retried on another replica",
		total, users, before, after, rollTook.Round(time.Millisecond), failed, retried.Load())
	if failed > 0 {
		t.FailNow()
	}
	if len(after) != 3 || slices.ContainsFunc(after, func(n string) bool { return slices.Contains(before, n) }) {
		t.Fatalf("replicas %v after the restart, %v before: want 3 new ones", after, before)
	}
	// Every user's workspace holds its lines once each, in order: nothing ran twice or was lost.
	for u := range users {
		res, err := execAnywhere(t, reps.order(u), fmt.Sprintf("u%d", u), sdk.ExecRequest{Command: "cat /workspace/log"}, &retried)
		var want strings.Builder
		for i := range sent[u] {
			fmt.Fprintf(&want, "u%d-%d\n", u, i)
		}
		if err != nil || res.Stdout != want.String() {
			t.Fatalf("u%d's log: %+v, %v; want its %d lines once each, in order", u, res, err, sent[u])
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
	// The reaper's leader (the Lease in the sandbox namespace) is a live replica.
	lease, err := kc.API.CoordinationV1().Leases(sb).Get(ctx, ReaperLease, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || !slices.Contains(after, replicaPod(*lease.Spec.HolderIdentity)) {
		t.Errorf("the reaper's Lease %s/%s: %+v, %v; want one held by a replica of %v", sb, ReaperLease, lease, err, after)
	}

	// SIGKILL of the container of u1's owner while it runs a command for u1 that another replica forwarded to it.
	st, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l, err := st.GetLease(ctx, fleet.LeaseName(keyOf(t, tenant, "u1")))
	if err != nil {
		t.Fatal(err)
	}
	victim := replicaPod(l.Owner)
	via := reps.other(victim)
	if via == nil {
		t.Fatalf("u1's owner %s is no ready replica of %v", l.Owner, reps.names())
	}
	type outcome struct {
		res *sdk.ExecResult
		err error
	}
	busy := make(chan outcome, 1)
	go func() {
		res, err := via.Exec(bounded(t), "u1", sdk.ExecRequest{Command: "echo started; sleep 30; echo done"})
		busy <- outcome{res, err}
	}()
	waitRunning(t, st, tenant, "u1")
	killed := time.Now()
	killContainer(ctx, t, kc, sys, victim)
	got := <-busy
	var ae *sdk.APIError
	if !errors.As(got.err, &ae) || ae.Err.Code != fault.OwnerLost {
		t.Fatalf("the caller of the killed owner's command got %+v, %v; want OWNER_LOST", got.res, got.err)
	}
	limit := dep.ttl + 5*time.Second
	res, tries, _ := execAfterTakeover(t, via, "u1", sdk.ExecRequest{Command: "echo after"}, killed, limit, 200*time.Millisecond)
	if res.Stdout != "after\n" || res.ExitCode != 0 {
		t.Fatalf("exec after the takeover: %+v", res)
	}
	took := time.Since(killed)
	if took > limit {
		t.Fatalf("the takeover took %s, want at most %s", took, limit)
	}
	ok.Add(1)
	t.Logf("takeover: u1's next command succeeded through another replica %s after the SIGKILL of %s (lease %s, %d tries)",
		took.Round(time.Millisecond), victim, dep.ttl, tries)
	if n := kubePodsPerKey(t, c)[keyLabel(t, tenant, "u1")]; n != 1 {
		t.Errorf("after the takeover u1 has %d pods, want 1", n)
	}
	checkFleetRuns(t, st, tenant, int(ok.Load()))
}

// serverImage builds sandkeep's own image, as docs/KUBERNETES.md's step 1 says (FROM scratch: the static
// sandkeep at /sandkeep, its entrypoint, and sandkeep-agent beside it), imports it into the node's containerd
// and returns its name.
func serverImage(ctx context.Context, t *testing.T, kc *kubetest.Cluster, bin string) string {
	t.Helper()
	sk, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := os.ReadFile(kc.Agent)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(append(append([]byte{}, sk...), agent...))
	const repo = "docker.io/library/sandkeep-server"
	ref := repo + ":test-" + hex.EncodeToString(sum[:6])
	var tar bytes.Buffer
	if _, err := ociimage.Write(&tar, ociimage.Image{Ref: ref, Entrypoint: []string{"/sandkeep"}, Files: []ociimage.File{
		{Path: "/sandkeep", Mode: 0o755, Data: sk},
		{Path: "/sandkeep-agent", Mode: 0o755, Data: agent},
		{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
	}}); err != nil {
		t.Fatal(err)
	}
	if err := kc.ImportImage(ctx, repo, &tar); err != nil {
		t.Fatal(err)
	}
	return ref
}

// forwardPostgres makes the test's PostgreSQL (dsn, on the host's loopback) reachable from the node's pods on
// the host's side of the node's veth, for as long as the test runs, and returns the DSN the pods use. The
// server keeps listening on loopback only (its role's password is public); the pods' connections arrive there
// from this forwarder.
func forwardPostgres(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	ln, err := net.Listen("tcp", net.JoinHostPort(kubetest.NodeHostIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	track := func(c net.Conn, add bool) {
		mu.Lock()
		defer mu.Unlock()
		if add {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer in.Close()
				out, err := net.DialTimeout("tcp", target, 10*time.Second)
				if err != nil {
					return
				}
				defer out.Close()
				track(in, true)
				track(out, true)
				defer track(in, false)
				defer track(out, false)
				var pipes sync.WaitGroup
				pipes.Go(func() { _, _ = io.Copy(out, in); out.(*net.TCPConn).CloseWrite() })
				_, _ = io.Copy(in, out)
				in.(*net.TCPConn).CloseWrite()
				pipes.Wait()
			})
		}
	})
	u.Host = ln.Addr().String()
	return u.String()
}

// deployed is the Deployment as the test applied it.
type deployed struct {
	name string
	ttl  time.Duration // fleet.lease_ttl of the Secret's config
}

// deployFleet applies deploy/kubernetes's namespace.yaml, rbac.yaml, secret.example.yaml and deployment.yaml,
// renamed to the test's namespaces, with the operator's edits: the Secret's DSN (podDSN), a fresh fleet secret,
// the installation id (the cli's, so its labels select the sandboxes) and a small template; the images, storage
// class and size; the API server's address on this node; requests a two-core node holds 4 of (a rolling
// update's surge included). The optional node reader, the seccomp DaemonSet and the example StorageClass are
// not applied (the test node's volumes are kubetest's).
func deployFleet(ctx context.Context, t *testing.T, c *cli, sys, image, podDSN string) deployed {
	t.Helper()
	kc := c.kc
	objs := kubetest.Manifests(t, kubetest.DeployDir(t), "namespace.yaml", "rbac.yaml", "secret.example.yaml", "deployment.yaml")
	kubetest.Rename(t, objs, sys, c.ns)
	var out deployed
	var secret [32]byte
	_, _ = rand.Read(secret[:])
	for _, u := range objs {
		switch u.GetKind() {
		case "Secret":
			data, _, _ := unstructured.NestedStringMap(u.Object, "stringData")
			cfg := data["sandkeep-server.yaml"]
			const placeholder = "installation: 00000000000000000000000000000000"
			if !strings.Contains(cfg, placeholder) {
				t.Fatalf("secret.example.yaml's sandkeep-server.yaml has no %q to replace:\n%s", placeholder, cfg)
			}
			cfg = strings.Replace(cfg, placeholder, "installation: "+c.installation, 1)
			m := regexp.MustCompile(`(?m)^\s+lease_ttl: (\S+)`).FindStringSubmatch(cfg)
			if m == nil {
				t.Fatalf("secret.example.yaml's config has no fleet.lease_ttl:\n%s", cfg)
			}
			ttl, err := time.ParseDuration(m[1])
			if err != nil {
				t.Fatal(err)
			}
			out.ttl = ttl
			data["sandkeep-server.yaml"] = cfg + fleetKubeTemplate
			data["store"] = podDSN
			data["fleet-secret"] = hex.EncodeToString(secret[:])
			if err := unstructured.SetNestedStringMap(u.Object, data, "stringData"); err != nil {
				t.Fatal(err)
			}
		case "Deployment":
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &d); err != nil {
				t.Fatal(err)
			}
			editDeployment(t, &d, image, kc.AgentImage)
			obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&d)
			if err != nil {
				t.Fatal(err)
			}
			u.Object = obj
			u.SetAPIVersion("apps/v1")
			u.SetKind("Deployment")
			unstructured.RemoveNestedField(u.Object, "status")
			unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
			unstructured.RemoveNestedField(u.Object, "spec", "template", "metadata", "creationTimestamp")
			out.name = d.Name
		}
	}
	if out.name == "" || out.ttl == 0 {
		t.Fatal("deploy/kubernetes has no Deployment or no Secret")
	}
	t.Cleanup(func() { // before the namespaces go (registered later, so run first): no new replica meanwhile
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if t.Failed() {
			logReplicas(ctx, t, kc, sys)
		}
		zero := int64(0)
		_ = kc.API.AppsV1().Deployments(sys).Delete(ctx, out.name, metav1.DeleteOptions{})
		_ = kc.API.CoreV1().Pods(sys).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	})
	for _, u := range objs {
		if err := kc.Apply(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// editDeployment makes the operator's edits to the Deployment: the image names, the storage class and size, the
// API server's address where the cluster routes no Service, and a CPU request sized for the test node.
func editDeployment(t *testing.T, d *appsv1.Deployment, image, agentImage string) {
	t.Helper()
	ctr := &d.Spec.Template.Spec.Containers[0]
	ctr.Image = image
	set := map[string]string{
		"SANDKEEP_IMAGE":          kubetest.Image,
		kube.EnvAgentImage:        agentImage,
		kube.EnvStorageClass:      kubetest.StorageClass,
		kube.EnvWorkspaceSize:     kubetest.WorkspaceSize,
		"KUBERNETES_SERVICE_HOST": nodeAPIHost,
		"KUBERNETES_SERVICE_PORT": nodeAPIPort,
	}
	for i, e := range ctr.Env {
		if v, ok := set[e.Name]; ok {
			ctr.Env[i].Value = v
			delete(set, e.Name)
		}
	}
	for _, name := range []string{"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"} {
		if v, ok := set[name]; ok {
			ctr.Env = append(ctr.Env, corev1.EnvVar{Name: name, Value: v})
			delete(set, name)
		}
	}
	if len(set) > 0 {
		t.Fatalf("deployment.yaml's container sets none of %v", set)
	}
	ctr.Resources.Requests[corev1.ResourceCPU] = resource.MustParse("100m")
}

// waitRollout waits until the Deployment's rollout is complete: every replica of the current template, ready.
func waitRollout(ctx context.Context, t *testing.T, kc *kubetest.Cluster, ns, name string) {
	t.Helper()
	var d *appsv1.Deployment
	var err error
	for deadline := time.Now().Add(4 * time.Minute); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		d, err = kc.API.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			continue
		}
		s, want := d.Status, *d.Spec.Replicas
		if s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == want && s.Replicas == want && s.AvailableReplicas == want &&
			s.ReadyReplicas == want {
			return
		}
	}
	pods, _ := kc.API.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	var b strings.Builder
	if pods != nil {
		for _, p := range pods.Items {
			fmt.Fprintf(&b, "\n  %s %s %+v", p.Name, p.Status.Phase, p.Status.Conditions)
			for _, cs := range p.Status.ContainerStatuses {
				fmt.Fprintf(&b, " %+v", cs.State)
			}
		}
	}
	t.Fatalf("the Deployment %s/%s did not roll out within 4 minutes: %+v, %v; pods:%s", ns, name, d, err, b.String())
}

// restartDeployment does what `kubectl rollout restart` does: a new annotation on the pod template.
func restartDeployment(ctx context.Context, t *testing.T, kc *kubetest.Cluster, ns, name string) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339))
	if _, err := kc.API.AppsV1().Deployments(ns).Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// podRouter is what a Service would be, had the node a service proxy: the ready replica pods, refreshed
// continuously, each with an SDK client of its pod IP.
type podRouter struct {
	mu      sync.Mutex
	ready   []string // pod names, sorted
	clients map[string]*sdk.Client
}

func newPodRouter(ctx context.Context, t *testing.T, kc *kubetest.Cluster, ns, token string) *podRouter {
	t.Helper()
	r := &podRouter{clients: map[string]*sdk.Client{}}
	// One connection per request: a request on a kept-alive connection that its replica closes as it exits fails
	// after it was sent, and only what provably never reached a replica may be retried on another.
	tr := &http.Transport{DisableKeepAlives: true, DialContext: (&net.Dialer{Timeout: 3 * time.Second}).DialContext}
	hc := &http.Client{Transport: tr}
	refresh := func() error {
		pods, err := kc.API.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=sandkeep"})
		if err != nil {
			return err
		}
		var ready []string
		clients := map[string]*sdk.Client{}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || p.Status.PodIP == "" || !podReady(&p) {
				continue
			}
			cl, err := sdk.New("http://"+net.JoinHostPort(p.Status.PodIP, "8080"), token, sdk.WithHTTPClient(hc))
			if err != nil {
				return err
			}
			ready = append(ready, p.Name)
			clients[p.Name] = cl
		}
		slices.Sort(ready)
		r.mu.Lock()
		r.ready, r.clients = ready, clients
		r.mu.Unlock()
		return nil
	}
	if err := refresh(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			_ = refresh() // a failed list keeps the last view
		}
	})
	t.Cleanup(func() { close(stop); wg.Wait() })
	return r
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// order is the ready replicas round-robin: the i-th first, the others after it.
func (r *podRouter) order(i int) []*sdk.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*sdk.Client, 0, len(r.ready))
	for j := range r.ready {
		out = append(out, r.clients[r.ready[(i+j)%len(r.ready)]])
	}
	return out
}

func (r *podRouter) names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ready)
}

// other is a ready replica other than pod, or nil.
func (r *podRouter) other(pod string) *sdk.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(r.ready, pod) {
		return nil
	}
	for _, n := range r.ready {
		if n != pod {
			return r.clients[n]
		}
	}
	return nil
}

// replicaPod is the pod of a replica's owner id: its host name (the pod's name), then "-" and 16 hex digits
// (fleet.NewReplicaID).
func replicaPod(owner string) string {
	i := strings.LastIndexByte(owner, '-')
	if i < 0 {
		return owner
	}
	return owner[:i]
}

// killContainer SIGKILLs every process of pod's sandkeep container, from the host (the node shares its PID
// namespace and cgroups with it): a crash, with no drain and no lease handed over. The kubelet restarts the
// container in the same pod, as a new replica.
func killContainer(ctx context.Context, t *testing.T, kc *kubetest.Cluster, ns, pod string) {
	t.Helper()
	p, err := kc.API.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Status.ContainerStatuses) == 0 {
		t.Fatalf("pod %s has no container status", pod)
	}
	_, id, _ := strings.Cut(p.Status.ContainerStatuses[0].ContainerID, "://")
	var procs []string
	for _, pattern := range []string{"/sys/fs/cgroup/pids/kubepods/pod%s/%s/cgroup.procs", "/sys/fs/cgroup/pids/kubepods/*/pod%s/%s/cgroup.procs"} {
		m, _ := filepath.Glob(fmt.Sprintf(pattern, p.UID, id))
		procs = append(procs, m...)
	}
	if len(procs) != 1 {
		t.Fatalf("the cgroup of pod %s's container %s: %v, want one", pod, id, procs)
	}
	b, err := os.ReadFile(procs[0])
	if err != nil {
		t.Fatal(err)
	}
	pids := strings.Fields(string(b))
	if len(pids) == 0 {
		t.Fatalf("pod %s's container has no process (%s)", pod, procs[0])
	}
	for _, s := range pids {
		pid, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("kill -9 %d (pod %s): %v", pid, pod, err)
		}
	}
}

// logReplicas logs the tail of every replica pod's log (this container's and the one before a restart).
func logReplicas(ctx context.Context, t *testing.T, kc *kubetest.Cluster, ns string) {
	pods, err := kc.API.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("list the replicas: %v", err)
		return
	}
	tail := int64(60)
	for _, p := range pods.Items {
		for _, previous := range []bool{true, false} {
			b, err := kc.API.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: &tail, Previous: previous}).DoRaw(ctx)
			if err == nil && len(b) > 0 {
				t.Logf("replica %s (previous %v):\n%s", p.Name, previous, b)
			}
		}
	}
}
