package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

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

// Defaults of ReapSource's graces.
const (
	// DefaultClaimGrace: a workspace claim whose sandbox is gone is removed only once its key had no run and no
	// lease for this long, so a rolling restart (whose replicas' keys lose their leases, and whose sandboxes the
	// reaper then removes) does not take the users' files; the sweeper's retention has the same default.
	DefaultClaimGrace = 24 * time.Hour
	// DefaultPolicyGrace: a replica's channel policy that no pod dials is removed only once no Start used it for
	// this long (a live replica touches it on each Start, and makes it again when it is gone).
	DefaultPolicyGrace = 10 * time.Minute
	// probeStale: a probe runs at most probeBudget and removes its pod and policy; one older than this was
	// left by a replica that died mid-probe.
	probeStale = 10 * time.Minute
)

// ReapSource is the reaper's Source (internal/reaper) for a namespace of sandboxes: what sandkeep made there,
// with the exact labels of the keyed objects (the AnnotationLabels annotation: a key's label values are hashed).
//
//   - Records (ConfigMaps) and pods: a pod, running or not, dies with its owner (its agent dials the replica that
//     made it), so it is reapable once its key has no lease and no running run, and is removed under the key's
//     lease (reaper.Once takes it first). A warm pool's member (which no lease or run holds) is active.
//   - Workspace claims: held while their sandbox's record or pod stands (in_use), kept for good once a sandbox
//     was removed on purpose with its workspace kept (a suspend, `rm --keep-workspace`, a recycle: Remove marks
//     the claim, Create unmarks it), and otherwise removed once their key was idle for ClaimGrace.
//   - NetworkPolicies: a replica's channel policy (sandkeep-channel-<hash of its address>) once no pod of the
//     namespace dials that address and no Start touched it for PolicyGrace; a probe's policy and pod past
//     probeStale. The isolation policy is everyone's and never listed.
type ReapSource struct {
	API       kubernetes.Interface
	Namespace string
	// ClaimGrace is DefaultClaimGrace when 0; negative: none.
	ClaimGrace time.Duration
	// PolicyGrace is DefaultPolicyGrace when 0; negative: none.
	PolicyGrace time.Duration
	// Now is the clock of the graces; default time.Now.
	Now func() time.Time
}

var _ reaper.Source = ReapSource{}

// Kinds of resource ReapSource lists (reaper.Resource.Kind).
const (
	KindRecord = "configmap"
	KindPod    = "pod"
	KindClaim  = "claim"
	KindPolicy = "networkpolicy"
)

func grace(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}

// List implements reaper.Source.
func (s ReapSource) List(ctx context.Context) ([]reaper.Resource, error) {
	now := time.Now()
	if s.Now != nil {
		now = s.Now()
	}
	sel := metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedBy}
	cms, err := s.API.CoreV1().ConfigMaps(s.Namespace).List(ctx, sel)
	if err != nil {
		return nil, fmt.Errorf("list sandbox records: %w", err)
	}
	pods, err := s.API.CoreV1().Pods(s.Namespace).List(ctx, sel)
	if err != nil {
		return nil, fmt.Errorf("list sandbox pods: %w", err)
	}
	claims, err := s.API.CoreV1().PersistentVolumeClaims(s.Namespace).List(ctx, sel)
	if err != nil {
		return nil, fmt.Errorf("list workspace claims: %w", err)
	}
	nps, err := s.API.NetworkingV1().NetworkPolicies(s.Namespace).List(ctx, sel)
	if err != nil {
		return nil, fmt.Errorf("list network policies: %w", err)
	}
	out := make([]reaper.Resource, 0, len(cms.Items)+len(pods.Items)+len(claims.Items)+len(nps.Items))
	state := map[string]string{}  // sandbox pod name -> its state in the reaper's words
	standing := map[string]bool{} // sandbox names with a record or a pod
	dialed := map[string]bool{}   // channel addresses a pod that is not being deleted dials
	records := map[string]*corev1.ConfigMap{}
	for i := range cms.Items {
		records[cms.Items[i].Name] = &cms.Items[i]
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil {
			continue // on its way out: its claim and channel policy no longer held by it, and not removed twice
		}
		if p.Labels[LabelProbe] != "" {
			out = append(out, probeResource(KindPod, p.ObjectMeta, now))
			continue
		}
		state[p.Name] = reapState(p)
		standing[p.Name] = true
		if addr := dialedAddr(p, records[p.Name]); addr != "" { // the address last announced to it, if any
			dialed[addr] = true
		}
	}
	for _, cm := range cms.Items {
		standing[cm.Name] = true
		r := reaper.Resource{Kind: KindRecord, Name: cm.Name, ID: string(cm.UID), Labels: exactLabels(cm.ObjectMeta), State: state[cm.Name], ReapRunning: true}
		if r.State == "" {
			r.State = "exited" // stopped: no pod
		}
		out = append(out, r)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Labels[LabelProbe] == "" && p.DeletionTimestamp == nil {
			out = append(out, reaper.Resource{Kind: KindPod, Name: p.Name, ID: string(p.UID), Labels: exactLabels(p.ObjectMeta), State: state[p.Name], ReapRunning: true})
		}
	}
	for _, c := range claims.Items {
		r := reaper.Resource{Kind: KindClaim, Name: c.Name, ID: string(c.UID), Labels: exactLabels(c.ObjectMeta), Grace: grace(s.ClaimGrace, DefaultClaimGrace)}
		switch {
		case c.DeletionTimestamp != nil:
			continue
		case standing[strings.TrimSuffix(c.Name, claimSuffix)]:
			r.Hold = reaper.ReasonInUse
		case c.Annotations[AnnotationWorkspaceKept] != "":
			r.Hold = reaper.ReasonWorkspaceKept
		}
		out = append(out, r)
	}
	for _, np := range nps.Items {
		switch {
		case np.Labels[LabelProbe] != "":
			out = append(out, probeResource(KindPolicy, np.ObjectMeta, now))
		case strings.HasPrefix(np.Name, ChannelPolicyPrefix):
			r := reaper.Resource{Kind: KindPolicy, Name: np.Name, ID: string(np.UID), Keyless: true, State: "exited"}
			used := np.CreationTimestamp.Time
			if t, err := time.Parse(time.RFC3339Nano, np.Annotations[AnnotationUsedAt]); err == nil && t.After(used) {
				used = t
			}
			switch addr := np.Annotations[AnnotationChannel]; {
			case addr == "" || dialed[addr]: // a policy from before the annotation: which pods dial it is unknown
				r.Hold = reaper.ReasonInUse
			case now.Sub(used) < grace(s.PolicyGrace, DefaultPolicyGrace):
				r.Hold = reaper.ReasonRecent
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// probeResource is a NetworkPolicy probe's pod or policy: keyless, abandoned once older than a probe lasts.
func probeResource(kind string, m metav1.ObjectMeta, now time.Time) reaper.Resource {
	r := reaper.Resource{Kind: kind, Name: m.Name, ID: string(m.UID), Keyless: true, State: "exited"}
	if now.Sub(m.CreationTimestamp.Time) < probeStale {
		r.Hold = reaper.ReasonRecent
	}
	return r
}

// reapState: running while the pod runs or starts (a warm pool's member is paused: nothing holds it, and it
// is the pool's), exited once it ended.
func reapState(p *corev1.Pod) string {
	switch {
	case exactLabels(p.ObjectMeta)[driver.LabelPool] != "":
		return "paused"
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
	case KindRecord:
		// Its pod goes first, and is waited for, as Driver.Remove does it: a pod left behind its record for the
		// garbage collector's lag would be what the key's next command finds.
		if err := s.removePodOf(ctx, r); err != nil {
			return err
		}
		bg := metav1.DeletePropagationBackground
		opts.PropagationPolicy = &bg
		err = s.API.CoreV1().ConfigMaps(s.Namespace).Delete(ctx, r.Name, opts)
	case KindPod:
		err = s.API.CoreV1().Pods(s.Namespace).Delete(ctx, r.Name, opts)
	case KindClaim:
		err = s.API.CoreV1().PersistentVolumeClaims(s.Namespace).Delete(ctx, r.Name, opts)
	case KindPolicy:
		err = s.API.NetworkingV1().NetworkPolicies(s.Namespace).Delete(ctx, r.Name, opts)
	default:
		return fmt.Errorf("reap %s %s: not a kind this source lists", r.Kind, r.Name)
	}
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone, or replaced by a newer one (the precondition): not ours to remove
	}
	return err
}

// removePodOf deletes the pod of the record r, if it has one, and waits until it is gone.
func (s ReapSource) removePodOf(ctx context.Context, r reaper.Resource) error {
	pods := s.API.CoreV1().Pods(s.Namespace)
	pod, err := pods.Get(ctx, r.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && !ownedBy(pod, types.UID(r.ID))) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reap %s: %w", r.Name, err)
	}
	if err := deletePodAndWait(ctx, pods, pod, 0); err != nil {
		return fmt.Errorf("reap %s: %w", r.Name, err)
	}
	return nil
}
