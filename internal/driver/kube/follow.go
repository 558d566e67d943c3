package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
)

// Agents follow their key's owner. A pod's agent dials the channel address it was made with (its init's
// --net-channel); when the replica at that address dies and another takes the pod's key over, the new owner
// announces its own address to the agent: one exec of `sandkeep-agent announce` writes an announcement
// (agentproto.Announcement, authenticated with the pod's channel token, which every replica reads in the pod's
// init container) into the pod's token directory and signals the agent's init, which dials the new address as
// soon as it is not connected. The record keeps what was announced to which pod (AnnotationAnnounced), so the
// reaper knows which channel policy the pod relies on, and the next announcement's sequence number exceeds it.
const (
	// AnnounceFile is where announcements are written: next to the token file, in the pod's memory volume
	// (cmd/sandkeep-agent's announceName).
	AnnounceFile = TokenDir + "/announce"
	// AnnotationAnnounced on a sandbox's record: the last announcement made to its pod, as JSON (announced).
	AnnotationAnnounced = driver.LabelPrefix + "channel-announced"
	announceTimeout     = 30 * time.Second
)

// announced is AnnotationAnnounced's value: the pod it was made to, its sequence number and address.
type announced struct {
	Pod  types.UID `json:"pod"`
	Seq  uint64    `json:"seq"`
	Addr string    `json:"addr"`
}

// announcedTo is what cm records as announced to pod, if anything.
func announcedTo(cm *corev1.ConfigMap, pod *corev1.Pod) (announced, bool) {
	var a announced
	if cm == nil || json.Unmarshal([]byte(cm.Annotations[AnnotationAnnounced]), &a) != nil || a.Pod != pod.UID || a.Addr == "" {
		return announced{}, false
	}
	return a, true
}

// dialedAddr is the channel address pod's agent dials: the last announced to it (its record cm, nil when
// unknown), else the one it was made with; "" for a pod without the agent's channel.
func dialedAddr(pod *corev1.Pod, cm *corev1.ConfigMap) string {
	base := podChannelAddr(pod)
	if base == "" {
		return ""
	}
	if a, ok := announcedTo(cm, pod); ok {
		return a.Addr
	}
	return base
}

// AnnounceChannel implements driver.AgentAnnouncer: when sb's pod runs with the agent's channel and its agent
// dials another address than this driver's, the agent is told to dial this one (the channel policy first
// allows it). It reports whether it announced; false, nil when there is nothing to do (no channel here, a pod
// without one, an agent that dials this driver already).
func (d *Driver) AnnounceChannel(ctx context.Context, sb *driver.Sandbox) (bool, error) {
	if d.ch == nil {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, announceTimeout)
	defer cancel()
	cm, _, err := d.record(ctx, sb)
	if cerrdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("announce channel to %w", err)
	}
	pod, err := d.api.CoreV1().Pods(d.opts.Namespace).Get(ctx, sb.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("announce channel to %s: %w", sb.Name, err)
	}
	trust, ok := trustOf(pod)
	if !ok || !ownedBy(pod, cm.UID) || !isRunning(pod) {
		return false, nil
	}
	if cur := dialedAddr(pod, cm); cur == "" || cur == d.ch.addr {
		return false, nil
	}
	if d.AgentChannel(sb).Up() { // connected here already (announced by this process a moment ago)
		return false, nil
	}
	if err := d.touchChannelPolicy(ctx); err != nil { // where NetworkPolicy holds, the pod may reach this address
		return false, fmt.Errorf("announce channel to %s: %w", sb.Name, err)
	}
	// Newer than any before: the last recorded plus one, or this clock's nanoseconds when a replica's record
	// patch was lost (replicas' clocks agree to far better than the gaps between takeovers of one key).
	seq := uint64(time.Now().UnixNano())
	if a, ok := announcedTo(cm, pod); ok && a.Seq >= seq {
		seq = a.Seq + 1
	}
	line, err := agentproto.FormatAnnouncement(agentproto.Announcement{Seq: seq, Addr: d.ch.addr}, pod.Name, trust.token)
	if err != nil {
		return false, fmt.Errorf("announce channel to %s: %w", sb.Name, err)
	}
	if err := d.execIn(ctx, pod.Name, []string{driver.AgentPath, "announce", AnnounceFile, string(bytes.TrimSpace(line))}); err != nil {
		return false, fmt.Errorf("announce channel to %s: %w", sb.Name, err)
	}
	raw, _ := json.Marshal(announced{Pod: pod.UID, Seq: seq, Addr: d.ch.addr}) // plain strings and numbers
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid": cm.UID, "annotations": map[string]string{AnnotationAnnounced: string(raw)}}})
	if _, err := d.api.CoreV1().ConfigMaps(d.opts.Namespace).Patch(ctx, sb.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		// The agent follows all the same; the reaper may judge the channel policies by the pod's first address.
		return true, fmt.Errorf("announce channel to %s: record it: %w", sb.Name, err)
	}
	return true, nil
}

var _ driver.AgentAnnouncer = (*Driver)(nil)

// execIn runs argv in pod's sandbox container through the API server's exec and fails unless it exits 0; what
// it wrote to stderr is in the error.
func (d *Driver) execIn(ctx context.Context, pod string, argv []string) error {
	req := d.api.CoreV1().RESTClient().Post().Namespace(d.opts.Namespace).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: ContainerName, Command: argv, Stdout: true, Stderr: true},
			scheme.ParameterCodec)
	ex, err := d.executorFor(req.URL())
	if err != nil {
		return err
	}
	stderr := &driver.DiagBuffer{Limit: driver.AgentDiagLimit}
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: io.Discard, Stderr: stderr}); err != nil {
		return fmt.Errorf("%s: %w (stderr %q)", argv[1], err, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}
