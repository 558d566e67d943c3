package kube_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/drivertest"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/policy"
)

// TestConformance runs the driver conformance suite against the real node (API server, kubelet, containerd),
// with the posture the lifecycle really builds, and checks every pod the suite made against "restricted".
func TestConformance(t *testing.T) {
	c := theNode(t)
	ns := c.namespace(t)
	d := c.driver(t, ns)
	c.recordPods(t, ns, checkRestricted)
	drivertest.Run(t, drivertest.Harness{
		New:          func(*testing.T) driver.Driver { return d },
		Image:        testImage,
		MissingImage: "localhost:1/sandkeep-missing:none",
		Spec: func(t *testing.T, key identity.Key, installation string) *driver.CreateSpec {
			return c.spec(t, ns, key, installation)
		},
	})
}

// checkRestricted fails the test unless every pod is one sandkeep made and meets Pod Security "restricted"
// (and sandkeep's own rules: no service-account token, no host namespaces or paths).
func checkRestricted(t *testing.T, pods []*corev1.Pod) {
	t.Helper()
	if len(pods) == 0 {
		t.Error(errNoPods)
	}
	for _, p := range pods {
		where := "pod " + p.Name
		if p.Labels[kube.LabelManagedBy] != kube.ManagedBy {
			t.Errorf("%s: not labelled %s=%s: %v", where, kube.LabelManagedBy, kube.ManagedBy, p.Labels)
		}
		want := []string{driver.LabelInstallation, driver.LabelTenant, driver.LabelUser, driver.LabelKey, driver.LabelPosture}
		if _, probe := p.Labels[kube.LabelProbe]; probe {
			want = []string{kube.LabelProbe} // the NetworkPolicy probe's pod (egress.go): no sandbox's, checked the same otherwise
		}
		for _, k := range want {
			if p.Labels[k] == "" {
				t.Errorf("%s: label %s missing", where, k)
			}
		}
		s := p.Spec
		if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
			t.Errorf("%s: the service-account token is mounted", where)
		}
		if s.HostNetwork || s.HostPID || s.HostIPC {
			t.Errorf("%s: host namespaces", where)
		}
		psc := s.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil ||
			psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: pod security context %+v, want runAsNonRoot and seccomp RuntimeDefault", where, psc)
		}
		for _, v := range s.Volumes {
			if v.HostPath != nil {
				t.Errorf("%s: hostPath volume %s", where, v.Name)
			}
		}
		for _, ctr := range append(append([]corev1.Container{}, s.InitContainers...), s.Containers...) {
			sc := ctr.SecurityContext
			w := where + " container " + ctr.Name
			switch {
			case sc == nil:
				t.Errorf("%s: no security context", w)
				continue
			case sc.RunAsUser == nil || *sc.RunAsUser == 0 || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
				t.Errorf("%s: not a numeric non-root user: %+v", w, sc)
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Errorf("%s: privilege escalation allowed", w)
			case sc.Privileged != nil && *sc.Privileged:
				t.Errorf("%s: privileged", w)
			case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
				t.Errorf("%s: writable root file system", w)
			case sc.Capabilities == nil || len(sc.Capabilities.Add) > 0 || !dropsAll(sc.Capabilities.Drop):
				t.Errorf("%s: capabilities %+v, want drop ALL and add none", w, sc.Capabilities)
			case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
				t.Errorf("%s: seccomp %+v", w, sc.SeccompProfile)
			}
			if ctr.ImagePullPolicy != corev1.PullIfNotPresent {
				t.Errorf("%s: image pull policy %s, want IfNotPresent", w, ctr.ImagePullPolicy)
			}
		}
	}
}

func dropsAll(caps []corev1.Capability) bool {
	for _, c := range caps {
		if c == "ALL" {
			return true
		}
	}
	return false
}

// TestPodSecurity: the namespace the driver creates refuses a pod that violates "restricted"; a sandbox's
// commands run as the numeric sandbox user with no capabilities, seccomp filtering, no new privileges, a
// read-only root and agent, and no service-account token.
func TestPodSecurity(t *testing.T) {
	c := theNode(t)
	ns := c.namespace(t)
	d := c.driver(t, ns)
	c.recordPods(t, ns, checkRestricted)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if err := d.Ping(ctx); err != nil { // creates the namespace
		t.Fatal(err)
	}
	got, err := c.api.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil || got.Labels[kube.PodSecurityLabel] != "restricted" {
		t.Fatalf("namespace %s: %v labels %v; want %s=restricted", ns, err, got.Labels, kube.PodSecurityLabel)
	}

	// Refused by the cluster: root, privilege escalation allowed, no seccomp, capabilities kept.
	bad := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "not-restricted"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Image: testImage, Command: []string{"sleep", "60"}, ImagePullPolicy: corev1.PullNever,
		}}},
	}
	_, err = c.api.CoreV1().Pods(ns).Create(ctx, bad, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "violates PodSecurity") {
		t.Fatalf("creating a non-restricted pod: %v; want Forbidden, violates PodSecurity \"restricted\"", err)
	}

	key, err := identity.New("acme", "pod-security")
	if err != nil {
		t.Fatal(err)
	}
	spec := c.spec(t, ns, key, "kube-podsecurity-"+randHex(t, 4))
	sb := createStarted(t, ctx, d, spec)
	if !strings.Contains(sb.ImageID, "@sha256:") {
		t.Errorf("ImageID %q: want the image pinned by digest", sb.ImageID)
	}
	script := `id -u; id -g; grep -E '^(CapEff|CapPrm|CapBnd|Seccomp|NoNewPrivs):' /proc/self/status | tr -s '\t ' ' ';
		touch /rootfile 2>/dev/null && echo root-writable; touch /.sandkeep/x 2>/dev/null && echo agent-writable;
		test -e /var/run/secrets/kubernetes.io/serviceaccount/token && echo token; echo w > /workspace/f && cat /workspace/f`
	r := run(t, ctx, d, sb, "sh", "-c", script)
	want := "1000\n1000\nCapPrm: 0000000000000000\nCapEff: 0000000000000000\nCapBnd: 0000000000000000\nNoNewPrivs: 1\nSeccomp: 2\nw\n"
	if r.exit != 0 || r.stdout != want {
		t.Errorf("inside the sandbox: exit %d stdout\n%s\nstderr %q; want\n%s", r.exit, r.stdout, r.stderr, want)
	}
}

// TestWorkspacePersists: /workspace is the key's claim, so it outlives the pod deleted behind the driver's
// back and the sandbox removed and created again (a recycle); RemoveWorkspace deletes the claim.
func TestWorkspacePersists(t *testing.T) {
	c := theNode(t)
	ns := c.namespace(t)
	d := c.driver(t, ns)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	key, err := identity.New("acme", "persist")
	if err != nil {
		t.Fatal(err)
	}
	spec := c.spec(t, ns, key, "kube-persist-"+randHex(t, 4))
	sb := createStarted(t, ctx, d, spec)
	if r := run(t, ctx, d, sb, "sh", "-c", "echo kept > state.txt"); r.exit != 0 {
		t.Fatalf("write: exit %d %q", r.exit, r.stderr)
	}

	// The pod deleted behind sandkeep's back: the sandbox is stopped, and starts again with its workspace.
	if err := c.api.CoreV1().Pods(ns).Delete(ctx, sb.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitState(t, ctx, d, sb.Name, driver.StateStopped)
	if _, err := d.Exec(ctx, sb, request("true"), driver.Output{}); !cerrdefs.IsConflict(err) {
		t.Fatalf("Exec with the pod gone = %v; want errdefs.ErrConflict (not running)", err)
	}
	if err := d.Start(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if r := run(t, ctx, d, sb, "cat", "state.txt"); r.stdout != "kept\n" {
		t.Fatalf("after the pod was recreated: %q %q; want kept", r.stdout, r.stderr)
	}

	// Removed and created again: a new sandbox (ID), the same claim.
	if err := d.Remove(ctx, sb); err != nil {
		t.Fatal(err)
	}
	again := createStarted(t, ctx, d, spec)
	if again.ID == sb.ID {
		t.Fatalf("the recreated sandbox has the old ID %s", sb.ID)
	}
	if _, err := d.Exec(ctx, sb, request("true"), driver.Output{}); !cerrdefs.IsNotFound(err) {
		t.Errorf("Exec through the removed sandbox's value = %v; want errdefs.ErrNotFound", err)
	}
	if r := run(t, ctx, d, again, "cat", "state.txt"); r.stdout != "kept\n" {
		t.Fatalf("after remove and create: %q %q; want kept", r.stdout, r.stderr)
	}
	if err := d.Remove(ctx, again); err != nil {
		t.Fatal(err)
	}
	if err := d.RemoveWorkspace(ctx, sb.Name); err != nil {
		t.Fatal(err)
	}
	pvc, err := c.api.CoreV1().PersistentVolumeClaims(ns).Get(ctx, kube.ClaimName(sb.Name), metav1.GetOptions{})
	if err == nil && pvc.DeletionTimestamp == nil {
		t.Errorf("claim %s is still there after RemoveWorkspace", pvc.Name)
	}
}

// TestRefusals: postures the cluster cannot apply are refused before anything is created.
func TestRefusals(t *testing.T) {
	c := theNode(t)
	ns := c.namespace(t)
	d := c.driver(t, ns)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	key, err := identity.New("acme", "refusals")
	if err != nil {
		t.Fatal(err)
	}
	spec := c.spec(t, ns, key, "kube-refusals-"+randHex(t, 4))
	spec.Image, spec.ImageID = testImage, testImage
	hostBind := *spec
	hostBind.Posture.Mounts = append(append([]driver.Mount{}, spec.Posture.Mounts...), driver.Mount{Source: "/etc", Target: "/host-etc", ReadOnly: true})
	named := *spec
	named.Posture.User = "sandbox"
	root := *spec
	root.Posture.User = "0:0"
	for name, s := range map[string]*driver.CreateSpec{"host bind": &hostBind, "user name": &named, "root": &root} {
		if _, err := d.Create(ctx, s); err == nil {
			t.Errorf("%s: Create succeeded", name)
		} else if _, ierr := d.Inspect(ctx, s.Name); !cerrdefs.IsNotFound(ierr) {
			t.Errorf("%s: refused (%v) but Inspect = %v; want nothing created", name, err, ierr)
		}
	}
}

func createStarted(t *testing.T, ctx context.Context, d *kube.Driver, spec *driver.CreateSpec) *driver.Sandbox {
	t.Helper()
	if spec.Image == "" {
		spec.Image = testImage
	}
	if spec.ImageID == "" {
		id, err := d.ResolveImage(ctx, spec.Image)
		if err != nil {
			t.Fatal(err)
		}
		spec.ImageID = id
	}
	sb, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Remove(cctx, sb); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := d.Start(ctx, sb); err != nil {
		t.Fatalf("Start: %v", err)
	}
	got, err := d.Inspect(ctx, sb.Name)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func waitState(t *testing.T, ctx context.Context, d *kube.Driver, name string, want driver.State) {
	t.Helper()
	for {
		sb, err := d.Inspect(ctx, name)
		if err == nil && sb.State == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("sandbox %s never %s (last %+v, %v)", name, want, sb, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

type result struct {
	exit           int
	stdout, stderr string
}

func request(argv ...string) agentproto.Request {
	return agentproto.Request{
		Version: agentproto.Version, ID: 1, Argv: argv, Workdir: driver.WorkspaceDir,
		TimeoutMS: 60_000, GraceMS: 500, StdoutLimit: agentproto.DefaultLimit, StderrLimit: agentproto.DefaultLimit,
	}
}

func run(t *testing.T, ctx context.Context, d *kube.Driver, sb *driver.Sandbox, argv ...string) result {
	t.Helper()
	r, _ := runVia(t, ctx, d, sb, argv...)
	return r
}

// runVia runs argv as the lifecycle would: over the pod's agent channel when the driver offers one and it is
// up within a few seconds, else through the API server's exec (Driver.Exec). overChannel says which.
func runVia(t *testing.T, ctx context.Context, d *kube.Driver, sb *driver.Sandbox, argv ...string) (r result, overChannel bool) {
	t.Helper()
	var out, errb bytes.Buffer
	res, overChannel, err := execVia(ctx, d, sb, request(argv...), driver.Output{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("Exec(%q): %v", argv, err)
	}
	return result{exit: res.ExitCode, stdout: out.String(), stderr: errb.String()}, overChannel
}

// channelWait is how long execVia waits for the pod's agent to connect (a new pod's agent is dialling).
const channelWait = 3 * time.Second

func execVia(ctx context.Context, d *kube.Driver, sb *driver.Sandbox, req agentproto.Request, out driver.Output) (agentproto.Result, bool, error) {
	if slot := d.AgentChannel(sb); slot != nil {
		if mux, err := slot.Take(ctx, channelWait); err == nil {
			res, err := agentproto.RunWith(ctx, mux.Commands(), req, out.Stdout, out.Stderr, out.Stdin,
				agentproto.RunOptions{AcceptWait: 2 * time.Second, Resize: out.Resize})
			if errors.Is(err, agentproto.ErrProtocol) {
				slot.Broken(mux)
			}
			return res, true, err
		}
	}
	res, err := d.Exec(ctx, sb, req, out)
	return res, false, err
}

// TestUnschedulableIsCapacity: on the real node, a pod that asks for more CPU and memory than any node has stays
// unschedulable; at the start bound the driver says SANDBOX_CAPACITY (not a setup timeout), which the run records
// failed_resumable/infrastructure, and leaves no pod behind.
func TestUnschedulableIsCapacity(t *testing.T) {
	c := theNode(t)
	ns := c.namespace(t)
	d := c.newDriver(t, kube.Options{Namespace: ns, StartTimeout: 10 * time.Second})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	key, err := identity.New("acme", "unschedulable")
	if err != nil {
		t.Fatal(err)
	}
	spec := c.spec(t, ns, key, "kube-capacity-"+randHex(t, 4))
	spec.Image, spec.ImageID = testImage, testImage
	spec.Posture.NanoCPUs, spec.Posture.MemoryBytes, spec.Posture.MemorySwapBytes = 512e9, 4<<40, 4<<40
	sb, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		_ = d.Remove(cctx, sb)
	})
	err = d.Start(ctx, sb)
	if fault.CodeOf(err) != fault.SandboxCapacity {
		t.Fatalf("Start of a pod no node has room for: %v, want SANDBOX_CAPACITY", err)
	}
	if f := policy.SetupFailure(err); f.Status != policy.StatusFailedResumable || f.Disposition != policy.Infrastructure {
		t.Errorf("recorded %s/%s", f.Status, f.Disposition)
	}
	pods, err := c.api.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) != 0 {
		t.Errorf("pods left behind: %d, %v", len(pods.Items), err)
	}
}
