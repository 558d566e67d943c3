package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandkeep/sandkeep/internal/bytesize"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// podFor translates a sandbox's record into its pod; it is the only place a posture field becomes a Kubernetes
// setting. owner is the record's UID ("" only when Create checks that the posture can be applied).
//
// What "restricted" requires is always set, whatever the posture: a numeric non-root uid, no privilege
// escalation, seccomp RuntimeDefault or sandkeep's Localhost profile, and the posture's capability drop (which must include ALL). The posture's
// host mounts have no equivalent: /workspace is the key's claim, /.sandkeep an emptyDir the init container fills
// from the agent image; any other bind mount is refused.
//
// With ch, the agent keeps a channel to the driver (channel.go): the init container writes ch's token to a
// memory volume, and the sandbox's init (when it is the agent's plain init) dials ch's address, after reading
// and removing the token.
//
// seccomp is the Localhost profile the pod's containers run under (Options.Seccomp, SeccompLocalhostProfile),
// "" for the runtime's default.
func podFor(name string, owner types.UID, rec record, labels map[string]string, agentImage string, ch *podChannel, seccomp string) (*corev1.Pod, error) {
	p := rec.Posture
	uid, gid, err := numericUser(p.User)
	if err != nil {
		return nil, err
	}
	if !hasAll(p.CapDrop) {
		return nil, fault.New(fault.PostureRefused, "drop ALL capabilities (the default posture does)",
			"the kubernetes driver runs only postures that drop all capabilities; this one drops %q", p.CapDrop)
	}
	image := rec.ImageID
	if image == "" {
		image = rec.Image
	}
	if image == "" {
		return nil, fault.New(fault.ImageUnavailable, "give the sandbox an image", "sandbox %s has no image", name)
	}
	env := make([]corev1.EnvVar, 0, len(p.Env))
	for _, kv := range p.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fault.New(fault.InvalidEnv, "write env entries as NAME=value", "env entry %q has no name", kv)
		}
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	res, err := resourcesOf(p)
	if err != nil {
		return nil, err
	}

	volumes := []corev1.Volume{
		{Name: agentVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(64<<20, resource.BinarySI)}}},
		{Name: workspaceVolume, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: ClaimName(name)}}},
	}
	mounts := []corev1.VolumeMount{
		{Name: agentVolume, MountPath: driver.AgentDir, ReadOnly: true},
		{Name: workspaceVolume, MountPath: driver.WorkspaceDir},
	}
	for _, m := range p.Mounts {
		switch m.Target {
		case driver.WorkspaceDir:
			mounts[1].ReadOnly = m.ReadOnly
		case driver.AgentDir:
		default:
			return nil, fault.New(fault.InvalidMount, "remove the mount (or run this sandbox on the docker driver)",
				"the kubernetes driver cannot bind host path %s into a sandbox (target %s)", m.Source, m.Target)
		}
	}
	targets := make([]string, 0, len(p.Tmpfs))
	for t := range p.Tmpfs {
		targets = append(targets, t)
	}
	sort.Strings(targets)
	for i, t := range targets {
		size, err := tmpfsSize(p.Tmpfs[t])
		if err != nil {
			return nil, err
		}
		vol := fmt.Sprintf("tmpfs-%d", i)
		volumes = append(volumes, corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
			Medium: corev1.StorageMediumMemory, SizeLimit: size,
		}}})
		mounts = append(mounts, corev1.VolumeMount{Name: vol, MountPath: t})
	}
	init := p.Init
	if len(init) == 0 {
		init = []string{driver.AgentPath, "init"}
	}
	installCmd := []string{agentImagePath, "install", driver.AgentDir}
	initMounts := []corev1.VolumeMount{{Name: agentVolume, MountPath: driver.AgentDir}}
	var initEnv []corev1.EnvVar
	if ch != nil && len(init) == 2 && init[0] == driver.AgentPath && init[1] == "init" {
		init = []string{driver.AgentPath, "init", "--net-channel", ch.addr, "--pod", name, "--token-file", TokenFile, "--egress", egressForward}
		installCmd = append(installCmd, "--token-file", TokenFile)
		initEnv = []corev1.EnvVar{{Name: TokenEnv, Value: ch.token}}
		volumes = append(volumes, corev1.Volume{Name: tokenVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
			Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(1<<20, resource.BinarySI),
		}}})
		tm := corev1.VolumeMount{Name: tokenVolume, MountPath: TokenDir}
		initMounts = append(initMounts, tm)
		mounts = append(mounts, tm)
	}
	f, t := false, true
	uid64, gid64 := int64(uid), int64(gid)
	profile := func() *corev1.SeccompProfile {
		if seccomp == "" {
			return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
		}
		path := seccomp
		return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: &path}
	}
	sc := func(readOnly bool) *corev1.SecurityContext {
		return &corev1.SecurityContext{
			RunAsUser: &uid64, RunAsGroup: &gid64, RunAsNonRoot: &t,
			AllowPrivilegeEscalation: &f, ReadOnlyRootFilesystem: &readOnly, Privileged: &f,
			Capabilities:   &corev1.Capabilities{Drop: capNames(p.CapDrop)},
			SeccompProfile: profile(),
		}
	}
	grace := int64(10)
	changePolicy := corev1.FSGroupChangeOnRootMismatch
	labelsJSON, _ := json.Marshal(labels)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      kubeLabels(labels),
			Annotations: map[string]string{AnnotationLabels: string(labelsJSON)},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &f,
			EnableServiceLinks:            &f,
			Hostname:                      "sandbox",
			DNSPolicy:                     corev1.DNSDefault,
			TerminationGracePeriodSeconds: &grace,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsUser: &uid64, RunAsGroup: &gid64, RunAsNonRoot: &t, FSGroup: &gid64, FSGroupChangePolicy: &changePolicy,
				SeccompProfile: profile(),
			},
			InitContainers: []corev1.Container{{
				Name:            InitName,
				Image:           agentImage,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         installCmd,
				Env:             initEnv,
				VolumeMounts:    initMounts,
				SecurityContext: sc(true),
				Resources:       res,
			}},
			Containers: []corev1.Container{{
				Name:            ContainerName,
				Image:           image,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         init,
				WorkingDir:      driver.WorkspaceDir,
				Env:             env,
				VolumeMounts:    mounts,
				SecurityContext: sc(p.ReadOnlyRoot),
				Resources:       res,
			}},
			Volumes: volumes,
		},
	}
	if owner != "" {
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: name, UID: owner}}
	}
	return pod, nil
}

// podChannelAddr is the channel address pod's agent dials (its init's --net-channel), or "".
func podChannelAddr(pod *corev1.Pod) string {
	for _, c := range pod.Spec.Containers {
		for i, arg := range c.Command {
			if arg == "--net-channel" && i+1 < len(c.Command) {
				return c.Command[i+1]
			}
		}
	}
	return ""
}

// podChannel is what a pod needs for the agent channel: the address to dial and its token.
type podChannel struct {
	addr, token string
}

// numericUser parses "uid:gid" (or "uid"); Kubernetes runs only numeric ids, and never root here.
func numericUser(user string) (uid, gid int, err error) {
	u, g, ok := strings.Cut(user, ":")
	if !ok {
		g = u
	}
	uid, uerr := strconv.Atoi(u)
	gid, gerr := strconv.Atoi(g)
	if uerr != nil || gerr != nil || uid < 0 || gid < 0 {
		return 0, 0, fault.New(fault.PostureRefused, "set user to a numeric uid:gid, e.g. 1000:1000",
			"the kubernetes driver needs a numeric user, got %q", user)
	}
	if uid == 0 {
		return 0, 0, fault.New(fault.PostureRefused, "run as a non-root uid, e.g. 1000:1000",
			"Pod Security \"restricted\" runs no container as root (user %q)", user)
	}
	return uid, gid, nil
}

func hasAll(caps []string) bool {
	for _, c := range caps {
		if strings.EqualFold(c, "ALL") {
			return true
		}
	}
	return false
}

func capNames(caps []string) []corev1.Capability {
	out := make([]corev1.Capability, 0, len(caps))
	for _, c := range caps {
		out = append(out, corev1.Capability(strings.ToUpper(strings.TrimPrefix(strings.ToUpper(c), "CAP_"))))
	}
	return out
}

// resourcesOf: the posture's memory and CPU are the limits; the requests are the posture's requests where it
// has them (a template's `requests:`, a Burstable pod that a node packs by them) and equal the limits otherwise
// (a Guaranteed pod). The posture's pids limit has no per-pod field; the kubelet's podPidsLimit bounds it
// node-wide.
func resourcesOf(p driver.Posture) (corev1.ResourceRequirements, error) {
	l := resourceList(p.MemoryBytes, p.NanoCPUs)
	if len(l) == 0 {
		return corev1.ResourceRequirements{}, nil
	}
	r := l.DeepCopy()
	for name, q := range resourceList(p.RequestMemoryBytes, p.RequestNanoCPUs) {
		r[name] = q
	}
	return corev1.ResourceRequirements{Limits: l, Requests: r}, nil
}

// resourceList is memory bytes and nano-CPUs as Kubernetes quantities (CPU in whole millicores, at least 1);
// zero values are left out.
func resourceList(memory, nanoCPUs int64) corev1.ResourceList {
	l := corev1.ResourceList{}
	if memory > 0 {
		l[corev1.ResourceMemory] = *resource.NewQuantity(memory, resource.BinarySI)
	}
	if nanoCPUs > 0 {
		l[corev1.ResourceCPU] = *resource.NewMilliQuantity(max(nanoCPUs/1_000_000, 1), resource.DecimalSI)
	}
	return l
}

// tmpfsSize reads the size= option of a tmpfs option string ("size=67108864", "size=64m"); nil for none.
func tmpfsSize(opts string) (*resource.Quantity, error) {
	for _, o := range strings.Split(opts, ",") {
		v, ok := strings.CutPrefix(o, "size=")
		if !ok {
			continue
		}
		n, err := bytesize.Parse(v)
		if err != nil {
			return nil, fault.Wrap(err, fault.InvalidMount, "write tmpfs sizes as bytes or with a unit, e.g. size=64m", "tmpfs option size=%v", err)
		}
		if n == 0 {
			return nil, fault.New(fault.InvalidMount, "give a positive size, e.g. size=64m", "tmpfs option size=0 would mean unlimited")
		}
		return resource.NewQuantity(n, resource.BinarySI), nil
	}
	return nil, nil
}

// kubeLabels are the Kubernetes labels for a sandbox's labels: the selector labels, values made valid, and
// managed-by. The exact values are in the AnnotationLabels annotation.
func kubeLabels(labels map[string]string) map[string]string {
	out := map[string]string{LabelManagedBy: ManagedBy}
	for _, k := range selectorLabels {
		if v, ok := labels[k]; ok {
			out[kubeLabelKey(k)] = labelValue(v)
		}
	}
	return out
}

// kubeLabelKey: "io.sandkeep.tenant" is already a valid label key (a name of up to 63 characters).
func kubeLabelKey(k string) string { return k }

var labelValueRE = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)

// labelValue is v when it is a valid label value, else "h-" and 40 hex digits of its SHA-256 (valid, and with
// the exact value in the annotation, unambiguous).
func labelValue(v string) string {
	if len(v) <= 63 && labelValueRE.MatchString(v) {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return "h-" + hex.EncodeToString(sum[:20])
}
