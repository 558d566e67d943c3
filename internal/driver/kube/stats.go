package kube

// Resource stats of a sandbox's pod (driver.StatsReporter), read from the kubelet's stats summary of the pod's
// node through the API server's node proxy (GET /api/v1/nodes/<node>/proxy/stats/summary). The summary is what
// the kubelet's own cAdvisor counts, the same cgroup counters `docker stats` reads: cumulative CPU time
// (usageCoreNanoSeconds) and memory usage with its working set (usage less the inactive page cache), and the
// workspace claim's volume stats where its volume plugin measures them. The
// metrics API (metrics.k8s.io) is not used: it reports a rate over a window, not the cumulative time a sample
// since the last one needs, and needs metrics-server. The proxy needs `get` on nodes/proxy, which the deploy
// manifests do not grant (it reaches the whole kubelet API); without it stats are refused with the fix.

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandkeep/sandkeep/internal/driver"
)

var _ driver.StatsReporter = (*Driver)(nil)

// summary is the part of the kubelet's stats summary (k8s.io/kubelet/pkg/apis/stats/v1alpha1) read here.
type summary struct {
	Pods []struct {
		PodRef struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
			UID       string `json:"uid"`
		} `json:"podRef"`
		Containers []struct {
			Name string `json:"name"`
			CPU  *struct {
				Time                 time.Time `json:"time"`
				UsageCoreNanoSeconds *uint64   `json:"usageCoreNanoSeconds"`
			} `json:"cpu"`
			Memory *struct {
				Time            time.Time `json:"time"`
				UsageBytes      *uint64   `json:"usageBytes"`
				WorkingSetBytes *uint64   `json:"workingSetBytes"`
			} `json:"memory"`
		} `json:"containers"`
		Volume []struct {
			Name          string  `json:"name"`
			UsedBytes     *uint64 `json:"usedBytes"`
			CapacityBytes *uint64 `json:"capacityBytes"`
		} `json:"volume"`
	} `json:"pods"`
}

// Stats reads one sample of sb's sandbox container from its node's kubelet summary, and its CPU and memory
// limits from the pod (else the node's capacity). A sandbox whose pod does not run is ErrConflict; a pod the
// summary does not list yet (the kubelet samples every few seconds) is ErrConflict too: ask again.
func (d *Driver) Stats(ctx context.Context, sb *driver.Sandbox) (driver.Stats, error) {
	pod, err := d.api.CoreV1().Pods(d.opts.Namespace).Get(ctx, sb.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || (err == nil && !ownedBy(pod, types.UID(sb.ID))):
		return driver.Stats{}, fmt.Errorf("stats of %s: %w", sb.Name, cerrdefs.ErrNotFound)
	case err != nil:
		return driver.Stats{}, fmt.Errorf("stats of %s: %w", sb.Name, err)
	case !isRunning(pod) || pod.Spec.NodeName == "":
		return driver.Stats{}, fmt.Errorf("stats of %s: %w: it is not running", sb.Name, cerrdefs.ErrConflict)
	}
	raw, err := d.api.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", pod.Spec.NodeName, "proxy", "stats", "summary").DoRaw(ctx)
	if apierrors.IsForbidden(err) {
		return driver.Stats{}, fmt.Errorf("stats of %s: the credentials may not read node %s's kubelet summary (grant get on nodes/proxy): %w",
			sb.Name, pod.Spec.NodeName, cerrdefs.ErrPermissionDenied)
	}
	if err != nil {
		return driver.Stats{}, fmt.Errorf("stats of %s: the kubelet summary of node %s: %w", sb.Name, pod.Spec.NodeName, err)
	}
	var sum summary
	if err := json.Unmarshal(raw, &sum); err != nil {
		return driver.Stats{}, fmt.Errorf("stats of %s: the kubelet summary of node %s: %w", sb.Name, pod.Spec.NodeName, err)
	}
	st, ok := statsOf(sum, pod)
	if !ok {
		return driver.Stats{}, fmt.Errorf("stats of %s: %w: the kubelet has no sample of it yet", sb.Name, cerrdefs.ErrConflict)
	}
	cpus, mem := limits(pod)
	if cpus == 0 || mem == 0 {
		if node, err := d.api.CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metav1.GetOptions{}); err == nil {
			if cpus == 0 {
				cpus = float64(node.Status.Capacity.Cpu().MilliValue()) / 1000
			}
			if mem == 0 {
				mem = node.Status.Capacity.Memory().Value()
			}
		}
	}
	st.CPUs, st.MemoryLimit = cpus, mem
	return st, nil
}

// statsOf finds pod's sandbox container in sum: its cumulative CPU time, its memory less the inactive page
// cache (the working set, as `docker stats` counts it) and that cache. ok is false when the summary has no
// sample of it (a pod the kubelet has not sampled yet, or another pod of the same name).
func statsOf(sum summary, pod *corev1.Pod) (driver.Stats, bool) {
	for _, p := range sum.Pods {
		if p.PodRef.Name != pod.Name || p.PodRef.Namespace != pod.Namespace || (p.PodRef.UID != "" && p.PodRef.UID != string(pod.UID)) {
			continue
		}
		for _, c := range p.Containers {
			if c.Name != ContainerName || c.CPU == nil || c.CPU.UsageCoreNanoSeconds == nil || c.Memory == nil || c.Memory.UsageBytes == nil {
				continue
			}
			st := driver.Stats{At: c.CPU.Time, CPUTime: time.Duration(bounded(*c.CPU.UsageCoreNanoSeconds))}
			used := *c.Memory.UsageBytes
			if ws := c.Memory.WorkingSetBytes; ws != nil && *ws <= used {
				st.MemoryCache = bounded(used - *ws)
				used = *ws
			}
			st.MemoryUsed = bounded(used)
			if st.At.IsZero() {
				st.At = time.Now()
			}
			for _, v := range p.Volume { // the workspace claim's file system, where its plugin measures it
				if v.Name == workspaceVolume && v.UsedBytes != nil && v.CapacityBytes != nil {
					st.DiskUsed, st.DiskTotal = bounded(*v.UsedBytes), bounded(*v.CapacityBytes)
				}
			}
			return st, true
		}
	}
	return driver.Stats{}, false
}

// limits are the sandbox container's CPU and memory limits (zero: none).
func limits(pod *corev1.Pod) (cpus float64, mem int64) {
	for _, c := range pod.Spec.Containers {
		if c.Name != ContainerName {
			continue
		}
		if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
			cpus = float64(q.MilliValue()) / 1000
		}
		if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
			mem = q.Value()
		}
	}
	return cpus, mem
}

// bounded is n as an int64, at most math.MaxInt64: the kubelet's counters are data, not trusted to fit.
func bounded(n uint64) int64 { return int64(min(n, math.MaxInt64)) }
