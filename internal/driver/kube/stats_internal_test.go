package kube

import (
	"encoding/json"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandkeep/sandkeep/internal/driver"
)

func statsPod(uid string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sandkeep-u-1", Namespace: "sb", UID: "u-1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: ContainerName, Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("2Gi")}}}}}}
}

// TestStatsOf: the sandbox container of the pod (by name, namespace and uid) is read from a kubelet summary:
// cumulative CPU time, the working set as memory used and the rest of the usage as cache, the workspace
// claim's volume as the disk; the init container, another pod and other volumes are not.
func TestStatsOf(t *testing.T) {
	raw, err := os.ReadFile("testdata/summary.json")
	if err != nil {
		t.Fatal(err)
	}
	var sum summary
	if err := json.Unmarshal(raw, &sum); err != nil {
		t.Fatal(err)
	}
	got, ok := statsOf(sum, statsPod("u-1"))
	want := driver.Stats{At: time.Date(2026, 12, 4, 0, 0, 5, 0, time.UTC), CPUTime: 2500 * time.Millisecond,
		MemoryUsed: 3000000, MemoryCache: 1000000, DiskUsed: 1048576, DiskTotal: 10737418240}
	if !ok || got != want {
		t.Errorf("statsOf = %+v, %v; want %+v", got, ok, want)
	}
	other := statsPod("u-1")
	other.UID = "u-9" // a pod of the same name made again: the summary's sample is the old one's
	if st, ok := statsOf(sum, other); ok {
		t.Errorf("statsOf a newer pod of the same name = %+v", st)
	}
	if cpus, mem := limits(statsPod("u-1")); cpus != 1.5 || mem != 2<<30 {
		t.Errorf("limits = %v, %d", cpus, mem)
	}
}

// FuzzStatsOf: whatever the kubelet answers, reading it never panics and never reports negative use.
func FuzzStatsOf(f *testing.F) {
	raw, err := os.ReadFile("testdata/summary.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(raw)
	f.Add([]byte(`{"pods":[{"podRef":{"name":"sandkeep-u-1","namespace":"sb"},"containers":[{"name":"sandbox","cpu":{"usageCoreNanoSeconds":1},"memory":{"usageBytes":1,"workingSetBytes":5}}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var sum summary
		if json.Unmarshal(b, &sum) != nil {
			return
		}
		st, ok := statsOf(sum, statsPod("u-1"))
		if ok && (st.MemoryUsed < 0 || st.MemoryCache < 0 || st.At.IsZero()) {
			t.Fatalf("statsOf(%s) = %+v", b, st)
		}
	})
}
