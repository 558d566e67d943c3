package kube

import (
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandkeep/sandkeep/internal/reaper"
)

// TestOrphanedPodIsNoSandbox: a pod whose record is gone (the garbage collector has not removed it yet) is no
// sandbox, so the key's next command makes a new one; a pod nobody's record ever owned is still reported, with
// its own labels, for lifecycle to refuse as foreign. The fleet test saw FOREIGN_CONTAINER in that window.
func TestOrphanedPodIsNoSandbox(t *testing.T) {
	orphan := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sandkeep-u-1", Namespace: "ns",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "sandkeep-u-1", UID: "gone"}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: ContainerName, Image: "img"}}}}
	stranger := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sandkeep-u-2", Namespace: "ns", Labels: map[string]string{"app": "theirs"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "img"}}}}
	d := &Driver{opts: Options{Namespace: "ns"}, api: kubefake.NewClientset(orphan, stranger)}
	if sb, err := d.Inspect(t.Context(), orphan.Name); !cerrdefs.IsNotFound(err) {
		t.Errorf("Inspect of a pod whose record is gone = %+v, %v; want not found", sb, err)
	}
	sb, err := d.Inspect(t.Context(), stranger.Name)
	if err != nil || sb.Labels["app"] != "theirs" {
		t.Errorf("Inspect of a pod no record owns = %+v, %v; want it reported with its own labels", sb, err)
	}
}

// TestReapRecordTakesItsPodFirst: the reaper removes a record's pod, and waits for it, before the record, so that
// no moment shows the pod without its record.
func TestReapRecordTakesItsPodFirst(t *testing.T) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "sandkeep-u-1", Namespace: "ns", UID: "rec-1"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sandkeep-u-1", Namespace: "ns", UID: "pod-1",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "sandkeep-u-1", UID: "rec-1"}}}}
	api := kubefake.NewClientset(cm, pod)
	var deleted []string
	api.PrependReactor("delete", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		deleted = append(deleted, a.GetResource().Resource)
		return false, nil, nil
	})
	s := ReapSource{API: api, Namespace: "ns"}
	if err := s.Remove(t.Context(), reaper.Resource{Kind: KindRecord, Name: cm.Name, ID: string(cm.UID)}); err != nil {
		t.Fatal(err)
	}
	if len(deleted) != 2 || deleted[0] != "pods" || deleted[1] != "configmaps" {
		t.Fatalf("deletes = %v, want the pod, then its record", deleted)
	}
}
