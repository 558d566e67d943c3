package kube_test

import (
	"bytes"
	"context"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/testutil/kubetest"
)

// deploySA is the manifests' service account, as deploy/kubernetes names it.
const deploySA = "sandkeep"

// access is one request sandkeep's service account makes (or must not be able to make).
type access struct {
	verb, group, resource, sub, name string
	inSystem                         bool // in the system namespace rather than the sandbox namespace
}

// driverAccess is every call internal/driver/kube (and the fleet's leader election) makes, in the sandbox namespace: the Role must allow these and
// nothing else (TestDeployManifests compares the Role's rules with this list too).
var driverAccess = []access{
	{verb: "get", resource: "pods"}, {verb: "list", resource: "pods"}, {verb: "watch", resource: "pods"},
	{verb: "create", resource: "pods"}, {verb: "delete", resource: "pods"},
	{verb: "create", resource: "pods", sub: "exec"}, {verb: "get", resource: "pods", sub: "exec"}, // the WebSocket exec: both
	{verb: "get", resource: "configmaps"}, {verb: "list", resource: "configmaps"}, {verb: "create", resource: "configmaps"},
	{verb: "patch", resource: "configmaps"}, {verb: "delete", resource: "configmaps"},
	{verb: "create", resource: "persistentvolumeclaims"}, {verb: "delete", resource: "persistentvolumeclaims"},
	{verb: "patch", resource: "persistentvolumeclaims"}, // a kept workspace's mark (kube.go Remove, ensureClaim)
	{verb: "list", resource: "persistentvolumeclaims"},  // the fleet's reaper (reap.go)
	{verb: "create", group: "networking.k8s.io", resource: "networkpolicies"},
	{verb: "delete", group: "networking.k8s.io", resource: "networkpolicies"},
	{verb: "patch", group: "networking.k8s.io", resource: "networkpolicies"}, // the channel policy touched at Start
	{verb: "list", group: "networking.k8s.io", resource: "networkpolicies"},  // the fleet's reaper (reap.go)
	{verb: "get", resource: "namespaces", name: "@sandbox"},
	{verb: "list", resource: "resourcequotas"}, // SANDBOX_CAPACITY: which quota refused a pod (kube.go overQuota)
	// the fleet's reaper leader election (cmd/sandkeep servefleet_kube.go, client-go's LeaseLock)
	{verb: "get", group: "coordination.k8s.io", resource: "leases"}, {verb: "create", group: "coordination.k8s.io", resource: "leases"},
	{verb: "update", group: "coordination.k8s.io", resource: "leases"},
}

// deniedAccess must be refused: secrets, other verbs, other namespaces, anything cluster-wide.
var deniedAccess = []access{
	{verb: "get", resource: "secrets"}, {verb: "list", resource: "secrets"},
	{verb: "update", resource: "pods"}, {verb: "patch", resource: "pods"}, {verb: "deletecollection", resource: "pods"},
	{verb: "create", resource: "pods", sub: "attach"}, {verb: "create", resource: "pods", sub: "portforward"},
	{verb: "get", resource: "pods", sub: "log"}, {verb: "create", resource: "pods", sub: "ephemeralcontainers"},
	{verb: "update", resource: "configmaps"}, {verb: "get", resource: "persistentvolumeclaims"},
	{verb: "get", group: "networking.k8s.io", resource: "networkpolicies"},
	{verb: "create", resource: "serviceaccounts", sub: "token"},
	{verb: "create", group: "rbac.authorization.k8s.io", resource: "roles"},
	{verb: "create", resource: "pods", inSystem: true}, {verb: "create", resource: "pods", sub: "exec", inSystem: true},
	{verb: "get", resource: "secrets", inSystem: true}, {verb: "get", resource: "configmaps", inSystem: true},
	{verb: "delete", resource: "namespaces", name: "@sandbox"}, {verb: "create", resource: "namespaces"},
	{verb: "get", resource: "namespaces", name: "default"},
	{verb: "list", resource: "nodes"}, {verb: "create", resource: "persistentvolumes"},
	{verb: "delete", group: "coordination.k8s.io", resource: "leases"},
	{verb: "update", group: "coordination.k8s.io", resource: "leases", inSystem: true},
}

// TestDeployManifests applies deploy/kubernetes to the test cluster (its namespaces renamed to the test's): the
// namespaces, the service account and its Role for real, everything else (Deployment, Service, Secret, the
// StorageClass, the optional node reader) with server-side dry run, and the Deployment's pod template as a pod
// (dry run) where "restricted" is enforced. Then it checks with SubjectAccessReviews that the service account
// may make exactly the driver's calls and no others, and runs a sandbox with the driver as that service account.
func TestDeployManifests(t *testing.T) {
	kc := kubetest.Node(t)
	sys, sb := kc.Namespace(t), kc.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	objs := kubetest.Manifests(t, kubetest.DeployDir(t))
	kubetest.Rename(t, objs, sys, sb)

	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(kc.API.Discovery()))
	dyn, err := dynamic.NewForConfig(kc.Config)
	if err != nil {
		t.Fatal(err)
	}
	real := map[string]bool{"Namespace": true, "ServiceAccount": true, "Role": true, "RoleBinding": true}
	var deployment *appsv1.Deployment
	var role *rbacv1.Role
	for _, u := range objs { // namespaces first: kubetest.Manifests sorts them so
		m, err := mapper.RESTMapping(u.GroupVersionKind().GroupKind(), u.GroupVersionKind().Version)
		if err != nil {
			t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if ns := u.GetNamespace(); ns != "" {
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		opts := metav1.CreateOptions{FieldValidation: "Strict"}
		if !real[u.GetKind()] {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		if _, err := ri.Create(ctx, u, opts); err != nil {
			t.Errorf("apply %s %s/%s (dry run %v): %v", u.GetKind(), u.GetNamespace(), u.GetName(), opts.DryRun != nil, err)
		}
		switch u.GetKind() {
		case "Deployment":
			deployment = &appsv1.Deployment{}
			fromUnstructured(t, u, deployment)
		case "Role":
			role = &rbacv1.Role{}
			fromUnstructured(t, u, role)
		}
	}
	if deployment == nil || role == nil {
		t.Fatalf("deploy/kubernetes has no Deployment or no Role")
	}

	// The Deployment's pod as "restricted" admits it, in the system namespace (which enforces it).
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sandkeep-template", Namespace: sys, Labels: deployment.Spec.Template.Labels},
		Spec: deployment.Spec.Template.Spec}
	if _, err := kc.API.CoreV1().Pods(sys).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("the Deployment's pod template is refused in %s: %v", sys, err)
	}
	env := map[string]string{}
	for _, e := range deployment.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env[kube.EnvNamespace] != sb || env[kube.EnvAgentImage] == "" || env[kube.EnvChannelListen] == "" ||
		deployment.Spec.Template.Spec.ServiceAccountName != deploySA || deployment.Spec.Template.Spec.Containers[0].ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("the Deployment: env %v, service account %q, readiness %+v", env, deployment.Spec.Template.Spec.ServiceAccountName,
			deployment.Spec.Template.Spec.Containers[0].ReadinessProbe)
	}

	// The Role is the driver's calls, exactly.
	var granted []string
	for _, r := range role.Rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					granted = append(granted, v+" "+g+"/"+res+strings.Join(r.ResourceNames, ","))
				}
			}
		}
	}
	var want []string
	for _, a := range driverAccess {
		res := a.resource
		if a.sub != "" {
			res += "/" + a.sub
		}
		name := ""
		if a.name == "@sandbox" {
			name = sb
		}
		want = append(want, a.verb+" "+a.group+"/"+res+name)
	}
	sort.Strings(granted)
	sort.Strings(want)
	if !slices.Equal(granted, want) {
		t.Errorf("the Role grants\n  %v\nthe driver makes\n  %v", granted, want)
	}

	user := "system:serviceaccount:" + sys + ":" + deploySA
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + sys, "system:authenticated"}
	for _, list := range []struct {
		accesses []access
		allowed  bool
	}{{driverAccess, true}, {deniedAccess, false}} {
		for _, a := range list.accesses {
			ns, name := sb, a.name
			if a.inSystem {
				ns = sys
			}
			switch name {
			case "@sandbox":
				name = sb
			case "default":
				ns = "default"
			}
			if a.resource == "nodes" || a.resource == "persistentvolumes" || (a.resource == "namespaces" && a.verb == "create") {
				ns = ""
			}
			sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{User: user, Groups: groups,
				ResourceAttributes: &authzv1.ResourceAttributes{Namespace: ns, Verb: a.verb, Group: a.group, Resource: a.resource,
					Subresource: a.sub, Name: name}}}
			got, err := kc.API.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Status.Allowed != list.allowed {
				t.Errorf("%s %s %s/%s name %q in %q: allowed %v, want %v (%s)", user, a.verb, a.resource, a.sub, name, ns,
					got.Status.Allowed, list.allowed, got.Status.Reason)
			}
		}
	}

	// And in practice: the driver, as the service account, runs a sandbox through its whole life.
	saCfg := rest.CopyConfig(kc.Config)
	saCfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	opts := kc.Options(sb)
	opts.REST = saCfg
	d, err := kube.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	runAsServiceAccount(ctx, t, d, kc)
}

// runAsServiceAccount: ping, create, start, a command over the channel, one through the API server's exec,
// list, stop, remove, remove the workspace.
func runAsServiceAccount(ctx context.Context, t *testing.T, d *kube.Driver, kc *kubetest.Cluster) {
	t.Helper()
	if err := d.Ping(ctx); err != nil {
		t.Fatalf("Ping as the service account: %v", err)
	}
	key, err := identity.New("deploy-"+randHex(t, 4), "alice")
	if err != nil {
		t.Fatal(err)
	}
	p, err := lifecycle.BuildPosture(lifecycle.Config{Image: "unused", AgentPath: kc.Agent, NanoCPUs: 2e8, MemoryBytes: 256 << 20},
		"/unused/workspace", "/unused/agent", "")
	if err != nil {
		t.Fatal(err)
	}
	inst := "deploy-" + randHex(t, 4)
	img, err := d.ResolveImage(ctx, kubetest.Image)
	if err != nil {
		t.Fatalf("ResolveImage as the service account (no nodes list: the tag as given): %v", err)
	}
	spec := &driver.CreateSpec{Key: key, Name: key.ContainerName(), Posture: p, Image: img, ImageID: img,
		Labels: map[string]string{driver.LabelInstallation: inst, driver.LabelKey: key.Hex(), driver.LabelTenant: key.Tenant,
			driver.LabelUser: key.User, driver.LabelPosture: p.Hash()}}
	sb, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create as the service account: %v", err)
	}
	if err := d.Start(ctx, sb); err != nil {
		t.Fatalf("Start as the service account: %v", err)
	}
	// A command over the pod's channel (which needs the pods watch).
	r, overChannel := runVia(t, ctx, d, sb, "sh", "-c", "echo hi > /workspace/f; cat /workspace/f")
	var out bytes.Buffer
	if r.exit != 0 || r.stdout != "hi\n" {
		t.Fatalf("a command as the service account: %+v", r)
	}
	if !overChannel || d.ChannelStats() == (kube.ChannelStats{}) {
		t.Errorf("no command went over the agent channel as the service account (stats %+v)", d.ChannelStats())
	}
	// And through the API server's exec, what every command falls back to when the pod's channel is down (a pod
	// made by a replica that is gone dials its old address): the WebSocket exec needs get and create.
	res, err := d.Exec(ctx, sb, request("cat", "/workspace/f"), driver.Output{Stdout: &out})
	if err != nil || res.ExitCode != 0 || out.String() != "hi\n" {
		t.Fatalf("a command through the API server's exec as the service account: %+v, %q, %v", res, out.String(), err)
	}
	list, err := d.List(ctx, inst)
	if err != nil || len(list) != 1 {
		t.Fatalf("List as the service account: %v, %v", list, err)
	}
	if err := d.Stop(ctx, sb, time.Second); err != nil {
		t.Fatalf("Stop as the service account: %v", err)
	}
	if err := d.Remove(ctx, sb); err != nil {
		t.Fatalf("Remove as the service account: %v", err)
	}
	if err := d.RemoveWorkspace(ctx, sb.Name); err != nil {
		t.Fatalf("RemoveWorkspace as the service account: %v", err)
	}
}

func fromUnstructured(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatal(err)
	}
}
