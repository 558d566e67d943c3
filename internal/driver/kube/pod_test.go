package kube

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/policy"
)

func posture() driver.Posture {
	return driver.Posture{
		User: "1000:1000", ReadOnlyRoot: true, CapDrop: []string{"ALL"}, NoNewPrivileges: true,
		MemoryBytes: 512 << 20, MemorySwapBytes: 512 << 20, NanoCPUs: 1_500_000_000,
		Tmpfs: map[string]string{"/tmp": "rw,noexec,size=67108864,mode=1777", "/home/sandbox": "rw,size=16m"},
		Env:   []string{"HOME=/home/sandbox", "A=b=c"},
		Mounts: []driver.Mount{
			{Source: "/host/ws", Target: driver.WorkspaceDir},
			{Source: "/host/agent", Target: driver.AgentDir, ReadOnly: true},
		},
		Init: []string{driver.AgentPath, "init"},
	}
}

// TestPodFor: the posture becomes a pod that Pod Security "restricted" admits, with the agent installed by an
// init container from the agent image and the workspace from the key's claim.
func TestPodFor(t *testing.T) {
	rec := record{Image: "img:1", ImageID: "docker.io/library/img@sha256:" + strings.Repeat("a", 64), Posture: posture()}
	labels := map[string]string{driver.LabelInstallation: "inst", driver.LabelTenant: "Acme Corp", driver.LabelPosture: strings.Repeat("f", 64)}
	pod, err := podFor("sandkeep-u-abc", "uid-1", rec, labels, "agent:1", nil, "")
	if err != nil {
		t.Fatal(err)
	}
	s := pod.Spec
	if *s.AutomountServiceAccountToken || *s.EnableServiceLinks || s.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("pod spec: token %v links %v restart %s", *s.AutomountServiceAccountToken, *s.EnableServiceLinks, s.RestartPolicy)
	}
	if len(pod.OwnerReferences) != 1 || pod.OwnerReferences[0].UID != "uid-1" || pod.OwnerReferences[0].Kind != "ConfigMap" {
		t.Errorf("owner %+v", pod.OwnerReferences)
	}
	if len(s.InitContainers) != 1 || s.InitContainers[0].Image != "agent:1" ||
		strings.Join(s.InitContainers[0].Command, " ") != "/sandkeep-agent install /.sandkeep" {
		t.Errorf("init containers %+v", s.InitContainers)
	}
	main := s.Containers[0]
	if main.Image != rec.ImageID || main.ImagePullPolicy != corev1.PullIfNotPresent || strings.Join(main.Command, " ") != driver.AgentPath+" init" {
		t.Errorf("main container image %s policy %s command %v", main.Image, main.ImagePullPolicy, main.Command)
	}
	for _, c := range append(s.InitContainers, main) {
		sc := c.SecurityContext
		if *sc.RunAsUser != 1000 || *sc.RunAsGroup != 1000 || !*sc.RunAsNonRoot || *sc.AllowPrivilegeEscalation ||
			!*sc.ReadOnlyRootFilesystem || sc.Capabilities.Drop[0] != "ALL" || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("container %s security context %+v", c.Name, sc)
		}
		if c.Resources.Limits.Memory().Value() != 512<<20 || c.Resources.Limits.Cpu().MilliValue() != 1500 ||
			c.Resources.Requests.Memory().Value() != 512<<20 {
			t.Errorf("container %s resources %+v", c.Name, c.Resources)
		}
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range main.VolumeMounts {
		mounts[m.MountPath] = m
	}
	vols := map[string]corev1.Volume{}
	for _, v := range s.Volumes {
		vols[v.Name] = v
	}
	if m := mounts[driver.WorkspaceDir]; vols[m.Name].PersistentVolumeClaim == nil || vols[m.Name].PersistentVolumeClaim.ClaimName != "sandkeep-u-abc-workspace" {
		t.Errorf("workspace mount %+v volume %+v", m, vols[m.Name])
	}
	if m := mounts[driver.AgentDir]; !m.ReadOnly || vols[m.Name].EmptyDir == nil {
		t.Errorf("agent mount %+v", m)
	}
	if m := mounts["/tmp"]; vols[m.Name].EmptyDir == nil || vols[m.Name].EmptyDir.Medium != corev1.StorageMediumMemory || vols[m.Name].EmptyDir.SizeLimit.Value() != 64<<20 {
		t.Errorf("/tmp volume %+v", vols[m.Name])
	}
	if m := mounts["/home/sandbox"]; vols[m.Name].EmptyDir.SizeLimit.Value() != 16<<20 {
		t.Errorf("/home/sandbox volume %+v", vols[m.Name])
	}
	if main.Env[1].Name != "A" || main.Env[1].Value != "b=c" {
		t.Errorf("env %+v", main.Env)
	}
	if pod.Labels[driver.LabelTenant] != labelValue("Acme Corp") || !strings.HasPrefix(pod.Labels[driver.LabelTenant], "h-") ||
		len(pod.Labels[driver.LabelPosture]) > 63 || pod.Labels[driver.LabelInstallation] != "inst" || pod.Labels[LabelManagedBy] != ManagedBy {
		t.Errorf("labels %v", pod.Labels)
	}
}

// TestPodForRefusals: what Kubernetes (or "restricted") cannot apply is refused with a code and a hint.
func TestPodForRefusals(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(p *driver.Posture)
		image string
		code  fault.Code
	}{
		{"user name", func(p *driver.Posture) { p.User = "sandbox" }, "i:1", fault.PostureRefused},
		{"root", func(p *driver.Posture) { p.User = "0:0" }, "i:1", fault.PostureRefused},
		{"caps kept", func(p *driver.Posture) { p.CapDrop = []string{"NET_RAW"} }, "i:1", fault.PostureRefused},
		{"host bind", func(p *driver.Posture) { p.Mounts = append(p.Mounts, driver.Mount{Source: "/etc", Target: "/etc2"}) }, "i:1", fault.InvalidMount},
		{"bad tmpfs size", func(p *driver.Posture) { p.Tmpfs["/x"] = "size=lots" }, "i:1", fault.InvalidMount},
		{"no image", func(p *driver.Posture) {}, "", fault.ImageUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := posture()
			tc.edit(&p)
			_, err := podFor("n", "u", record{Image: tc.image, Posture: p}, nil, "agent:1", nil, "")
			var fe *fault.Error
			if fault.CodeOf(err) != tc.code || !asFault(err, &fe) || fe.Hint == "" {
				t.Fatalf("podFor = %v; want code %s with a hint", err, tc.code)
			}
		})
	}
}

func asFault(err error, fe **fault.Error) bool {
	e, ok := err.(*fault.Error)
	*fe = e
	return ok
}

func TestLabelValue(t *testing.T) {
	for _, v := range []string{"", "a", "drivertest-0a1b", "x.y_z-1"} {
		if labelValue(v) != v {
			t.Errorf("labelValue(%q) = %q, want it unchanged", v, labelValue(v))
		}
	}
	for _, v := range []string{"Acme Corp", "-a", "a-", strings.Repeat("a", 64), "ünï", "a/b"} {
		got := labelValue(v)
		if got == v || !labelValueRE.MatchString(got) || len(got) > 63 {
			t.Errorf("labelValue(%q) = %q, want a valid hashed value", v, got)
		}
	}
}

// TestTmpfsSize: a tmpfs size reads as everywhere else (bytesize), into a binary quantity.
func TestTmpfsSize(t *testing.T) {
	for in, want := range map[string]string{"size=64m": "64Mi", "rw,size=64Mi": "64Mi", "size=64MiB,mode=1777": "64Mi", "size=67108864": "64Mi"} {
		q, err := tmpfsSize(in)
		if err != nil || q == nil || q.String() != want {
			t.Errorf("tmpfsSize(%q) = %v, %v; want %s", in, q, err, want)
		}
	}
}

// FuzzParsers: the posture's user and tmpfs strings never panic, and what they accept is well formed.
func FuzzParsers(f *testing.F) {
	for _, s := range []string{"1000:1000", "0", "a:b", "1000", "-1:5", "size=64m", "rw,size=1", "size=", "size=9999999999999g"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if uid, gid, err := numericUser(s); err == nil && (uid <= 0 || gid < 0) {
			t.Fatalf("numericUser(%q) accepted uid %d gid %d", s, uid, gid)
		}
		if q, err := tmpfsSize(s); err == nil && q != nil && q.Sign() <= 0 {
			t.Fatalf("tmpfsSize(%q) = %v", s, q)
		}
		if v := labelValue(s); len(v) > 63 || !labelValueRE.MatchString(v) {
			t.Fatalf("labelValue(%q) = %q", s, v)
		}
	})
}

// TestNotRunningInTime: a pod the scheduler found no room for is SANDBOX_CAPACITY when its start bound passes, any
// other pending pod SANDBOX_SETUP_TIMEOUT; both are recorded failed_resumable/infrastructure.
func TestNotRunningInTime(t *testing.T) {
	unsched := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
		Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
		Message: "0/1 nodes are available: 1 Insufficient cpu."}}}}
	pulling := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
		Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.ContainersReady, Status: corev1.ConditionFalse,
		Reason: "ContainersNotReady", Message: "containers with unready status: [sandbox]"}}}}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want fault.Code
	}{
		{"unschedulable", unsched, fault.SandboxCapacity},
		{"scheduled, still pulling", pulling, fault.SandboxSetupTimeout},
		{"never seen", nil, fault.SandboxSetupTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := notRunningInTime("sandkeep-u-x", time.Minute, tc.pod)
			if fault.CodeOf(err) != tc.want {
				t.Fatalf("%v, want %s", err, tc.want)
			}
			if f := policy.SetupFailure(err); f.Status != policy.StatusFailedResumable || f.Disposition != policy.Infrastructure {
				t.Errorf("recorded %s/%s", f.Status, f.Disposition)
			}
			if tc.want == fault.SandboxCapacity && !strings.Contains(err.Error(), "Insufficient cpu") {
				t.Errorf("the scheduler's reason is lost: %v", err)
			}
		})
	}
}

// TestOverQuota: a pod the namespace's ResourceQuota has no room for (pods, requests, limits) is told apart from
// one the API server forbids for another reason, by reading the quotas, not the refusal's text.
func TestOverQuota(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("256Mi")},
	}}}}}
	quota := func(hard, used corev1.ResourceList) *corev1.ResourceQuota {
		return &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "q", Namespace: "ns"},
			Status: corev1.ResourceQuotaStatus{Hard: hard, Used: used}}
	}
	for _, tc := range []struct {
		name  string
		quota *corev1.ResourceQuota
		want  bool
	}{
		{"no quota", nil, false},
		{"pods full", quota(corev1.ResourceList{"pods": resource.MustParse("2")}, corev1.ResourceList{"pods": resource.MustParse("2")}), true},
		{"pods room", quota(corev1.ResourceList{"pods": resource.MustParse("3")}, corev1.ResourceList{"pods": resource.MustParse("2")}), false},
		{"cpu requests", quota(corev1.ResourceList{"requests.cpu": resource.MustParse("1")}, corev1.ResourceList{"requests.cpu": resource.MustParse("600m")}), true},
		{"memory limits", quota(corev1.ResourceList{"limits.memory": resource.MustParse("1Gi")}, corev1.ResourceList{"limits.memory": resource.MustParse("512Mi")}), false},
		{"plain memory", quota(corev1.ResourceList{"memory": resource.MustParse("1Gi")}, corev1.ResourceList{"memory": resource.MustParse("900Mi")}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := kubefake.NewClientset()
			if tc.quota != nil {
				api = kubefake.NewClientset(tc.quota)
			}
			d := &Driver{opts: Options{Namespace: "ns"}, api: api}
			if got := d.overQuota(t.Context(), pod); got != tc.want {
				t.Errorf("overQuota = %v, want %v", got, tc.want)
			}
		})
	}
}
