package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandkeep/sandkeep/internal/driver"
)

// Capacity is what the cluster's sandboxes can reserve (driver.CapacityReporter): the allocatable CPU and memory
// of its Ready, schedulable nodes when the credentials may list nodes (an operator's kubeconfig), else the sandbox
// namespace's ResourceQuota on requests (sandkeep's own service account may not read nodes: deploy/'s Role is
// namespaced). Pods already there are not subtracted: it is the room for sandboxes on an empty cluster.
func (d *Driver) Capacity(ctx context.Context) (driver.Capacity, error) {
	nodes, err := d.api.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	switch {
	case err == nil:
		return nodeCapacity(nodes.Items), nil
	case !apierrors.IsForbidden(err):
		return driver.Capacity{}, fmt.Errorf("list nodes: %w", err)
	}
	qs, qerr := d.api.CoreV1().ResourceQuotas(d.opts.Namespace).List(ctx, metav1.ListOptions{})
	if qerr != nil {
		return driver.Capacity{}, fmt.Errorf("the credentials may not list nodes (%v), nor the namespace's quotas: %w", err, qerr)
	}
	for _, q := range qs.Items {
		c := driver.Capacity{Source: fmt.Sprintf("ResourceQuota %s/%s (the credentials may not list nodes)", q.Namespace, q.Name)}
		if v, ok := q.Spec.Hard[corev1.ResourceRequestsCPU]; ok {
			c.MilliCPUs = v.MilliValue()
		} else if v, ok := q.Spec.Hard[corev1.ResourceCPU]; ok {
			c.MilliCPUs = v.MilliValue()
		}
		if v, ok := q.Spec.Hard[corev1.ResourceRequestsMemory]; ok {
			c.MemoryBytes = v.Value()
		} else if v, ok := q.Spec.Hard[corev1.ResourceMemory]; ok {
			c.MemoryBytes = v.Value()
		}
		if c.MilliCPUs > 0 || c.MemoryBytes > 0 {
			return c, nil
		}
	}
	return driver.Capacity{Source: fmt.Sprintf("unknown: the credentials may not list nodes and namespace %s has no ResourceQuota on requests", d.opts.Namespace)}, nil
}

// nodeCapacity sums the allocatable CPU and memory of the nodes a sandbox pod can be scheduled on.
func nodeCapacity(nodes []corev1.Node) driver.Capacity {
	c := driver.Capacity{Source: "the cluster's Ready, schedulable nodes (allocatable)"}
	for _, n := range nodes {
		if n.Spec.Unschedulable || !nodeReady(n) {
			continue
		}
		c.Nodes++
		c.MilliCPUs += n.Status.Allocatable.Cpu().MilliValue()
		c.MemoryBytes += n.Status.Allocatable.Memory().Value()
	}
	return c
}

func nodeReady(n corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}
