package kube

import (
	"context"
	"encoding/json"
	"fmt"

	cerrdefs "github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandkeep/sandkeep/internal/driver"
)

// A warm pool member's claim lives on its record (the ConfigMap): the annotation AnnotationClaim holds it whole
// and the label LabelClaim its key (labelValue), so that a key's member is found by a label selector. The record
// is updated with its resourceVersion, so of two processes claiming one member (two replicas of a fleet, each
// with its own home) the API server lets one through and answers the other Conflict: a member is claimed once.
// Nothing of the pod or the workspace claim changes: the member keeps its name, its pod and its PVC.
const (
	AnnotationClaim = driver.LabelPrefix + "claim"
	LabelClaim      = driver.LabelPrefix + "claimed-by"
)

var _ driver.ClaimKeeper = (*Driver)(nil)

// Claim marks the member sb as c's (c.Key "": drained), unless it was claimed or drained first (ErrConflict).
func (d *Driver) Claim(ctx context.Context, sb *driver.Sandbox, c driver.Claim) error {
	cms := d.api.CoreV1().ConfigMaps(d.opts.Namespace)
	cm, err := cms.Get(ctx, sb.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && string(cm.UID) != sb.ID) {
		return fmt.Errorf("claim %s: %w", sb.Name, cerrdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("claim %s: %w", sb.Name, err)
	}
	if _, taken := cm.Annotations[AnnotationClaim]; taken {
		return fmt.Errorf("claim %s: claimed first by another: %w", sb.Name, cerrdefs.ErrConflict)
	}
	raw, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("claim %s: %w", sb.Name, err)
	}
	// A merge patch that carries the record's uid and resourceVersion is applied to that very version only: a
	// compare-and-swap (a record changed since the read above, claimed by another, is Conflict).
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid": cm.UID, "resourceVersion": cm.ResourceVersion,
		"annotations": map[string]string{AnnotationClaim: string(raw)},
		"labels":      map[string]string{LabelClaim: claimLabel(c.Key)},
	}})
	if err != nil {
		return fmt.Errorf("claim %s: %w", sb.Name, err)
	}
	_, err = cms.Patch(ctx, sb.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	switch {
	case apierrors.IsConflict(err):
		return fmt.Errorf("claim %s: claimed first by another: %w", sb.Name, cerrdefs.ErrConflict)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("claim %s: %w", sb.Name, cerrdefs.ErrNotFound)
	case err != nil:
		return fmt.Errorf("claim %s: %w", sb.Name, err)
	}
	return nil
}

// claimLabel is the claim label's value of key hex k ("" for a drained member, which no key selects).
func claimLabel(k string) string {
	if k == "" {
		return "drained"
	}
	return labelValue(k)
}

// Claimed returns the member claimed by the key keyHex in installation, or ErrNotFound.
func (d *Driver) Claimed(ctx context.Context, installation, keyHex string) (*driver.Sandbox, error) {
	if keyHex == "" {
		return nil, fmt.Errorf("claimed: no key: %w", cerrdefs.ErrNotFound)
	}
	ns := d.opts.Namespace
	sel := LabelManagedBy + "=" + ManagedBy + "," + LabelClaim + "=" + claimLabel(keyHex)
	cms, err := d.api.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("claimed by %s: %w", keyHex, err)
	}
	for i := range cms.Items {
		cm := &cms.Items[i]
		c, ok := claimOf(cm)
		if !ok || c.Key != keyHex {
			continue
		}
		sb := fromObjects(cm, nil)
		if sb.Labels[driver.LabelInstallation] != installation {
			continue
		}
		pod, err := d.api.CoreV1().Pods(ns).Get(ctx, cm.Name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("claimed by %s: %w", keyHex, err)
		}
		if err == nil {
			sb = fromObjects(cm, pod)
		}
		return sb, nil
	}
	return nil, fmt.Errorf("claimed by %s: %w", keyHex, cerrdefs.ErrNotFound)
}

// claimOf reads a record's claim.
func claimOf(cm *corev1.ConfigMap) (driver.Claim, bool) {
	raw, ok := cm.Annotations[AnnotationClaim]
	if !ok {
		return driver.Claim{}, false
	}
	var c driver.Claim
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		return driver.Claim{}, true // unreadable: claimed by nobody we know, and never claimable again
	}
	return c, true
}

// Exists reports whether a sandbox record or a workspace claim named after name exists. The claim is asked about
// with a dry-run create (AlreadyExists: it is there), the only access to claims sandkeep's Role grants besides
// delete; nothing is made.
func (d *Driver) Exists(ctx context.Context, name string) (bool, error) {
	ns := d.opts.Namespace
	_, err := d.api.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		return true, nil
	}
	if !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("exists %s: %w", name, err)
	}
	pvc := d.claimFor(name, nil)
	_, err = d.api.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case apierrors.IsAlreadyExists(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("exists %s: %w", name, err)
	}
	return false, nil
}
