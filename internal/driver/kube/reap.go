package kube

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/reaper"
)

// LoadConfig is the cluster the driver would use for kubeconfig path: the file (or $KUBECONFIG), else the
// in-cluster config, else ~/.kube/config. The fleet's leader election reads it.
func LoadConfig(path string) (*rest.Config, error) { return loadConfig(path) }

// ReapSource is the reaper's Source (internal/reaper) for a namespace of sandboxes: the records (ConfigMaps) and
// the pods sandkeep made, with their exact labels (the AnnotationLabels annotation: a key's label values are
// hashed). A pod that is running or starting is active (kept, as a running container is on Docker): a live
// replica may be about to run a command in it, and nothing but the key's lease says otherwise; a record is as
// active as its pod. So the reaper removes a dead owner's stopped sandbox (a record without a pod) and its pods
// that ended (failed, succeeded), and a record removed takes its pod with it (owner reference).
//
// Workspace claims are never listed: a claim is the user's files, which outlive the record on purpose (a recycle,
// `rm --keep-workspace`, a suspend keep it), and nothing in the cluster tells a kept claim from an orphaned one;
// only `rm` removes it. NetworkPolicies are shared by every sandbox (isolation, the channel's allow) or deleted
// with their probe pod, so none is a key's to reap.
type ReapSource struct {
	API       kubernetes.Interface
	Namespace string
}

var _ reaper.Source = ReapSource{}

// List implements reaper.Source.
func (s ReapSource) List(ctx context.Context) ([]reaper.Resource, error) {
	sel := metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedBy}
	cms, err := s.API.CoreV1().ConfigMaps(s.Namespace).List(ctx, sel)
	if err != nil {
		return nil, fmt.Errorf("list sandbox records: %w", err)
	}
	pods, err := s.API.CoreV1().Pods(s.Namespace).List(ctx, sel)
	if err != nil {
		return nil, fmt.Errorf("list sandbox pods: %w", err)
	}
	state := map[string]string{} // pod name -> its state in the reaper's words
	for _, p := range pods.Items {
		state[p.Name] = reapState(&p)
	}
	out := make([]reaper.Resource, 0, len(cms.Items)+len(pods.Items))
	for _, cm := range cms.Items {
		r := reaper.Resource{Kind: "configmap", Name: cm.Name, ID: string(cm.UID), Labels: exactLabels(cm.ObjectMeta), State: state[cm.Name]}
		if r.State == "" {
			r.State = "exited" // stopped: no pod
		}
		out = append(out, r)
	}
	for _, p := range pods.Items {
		out = append(out, reaper.Resource{Kind: "pod", Name: p.Name, ID: string(p.UID), Labels: exactLabels(p.ObjectMeta), State: state[p.Name]})
	}
	return out, nil
}

// reapState: running while the pod runs or starts (or is a warm pool's member, which no lease or run holds),
// exited once it ended or is being deleted.
func reapState(p *corev1.Pod) string {
	switch {
	case p.DeletionTimestamp != nil:
		return "exited"
	case exactLabels(p.ObjectMeta)[driver.LabelPool] != "":
		return "running"
	case p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodPending:
		return "running"
	}
	return "exited"
}

// exactLabels are an object's sandbox labels as sandkeep wrote them (the annotation); an object without a
// readable annotation has none, so reaper.Decide keeps it as unlabelled.
func exactLabels(m metav1.ObjectMeta) map[string]string {
	var labels map[string]string
	if raw, ok := m.Annotations[AnnotationLabels]; ok && json.Unmarshal([]byte(raw), &labels) == nil {
		return labels
	}
	return map[string]string{}
}

// Remove implements reaper.Source: the object, by name and UID (a newer object of the same name is not touched).
func (s ReapSource) Remove(ctx context.Context, r reaper.Resource) error {
	uid := types.UID(r.ID)
	opts := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
	var err error
	switch r.Kind {
	case "configmap":
		bg := metav1.DeletePropagationBackground
		opts.PropagationPolicy = &bg // its pod goes with it
		err = s.API.CoreV1().ConfigMaps(s.Namespace).Delete(ctx, r.Name, opts)
	case "pod":
		err = s.API.CoreV1().Pods(s.Namespace).Delete(ctx, r.Name, opts)
	default:
		return fmt.Errorf("reap %s %s: not a kind this source lists", r.Kind, r.Name)
	}
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone, or replaced by a newer one (the precondition): not ours to remove
	}
	return err
}
