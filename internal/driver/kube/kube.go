// Package kube is the sandkeep driver for Kubernetes (k8s.io/client-go): one pod per key in one namespace that
// enforces Pod Security "restricted", a PersistentVolumeClaim per key for /workspace, and commands run through
// the agent over exec through the API server (remotecommand: WebSocket, SPDY fallback).
//
// A sandbox is two objects: a ConfigMap (the record: labels, the image and the posture it was created with; its
// UID is the sandbox ID) and, while the sandbox runs, a pod of the same name owned by it. Create writes the
// record and ensures the key's claim; Start makes the pod and waits until it runs; Stop deletes the pod (the
// claim and the record stay); Remove deletes the pod and the record (the claim stays, as a workspace on the
// host does for the Docker driver; RemoveWorkspace deletes it). It lives in its own package so that only cmd/
// links client-go.
package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/distribution/reference"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandkeep/sandkeep/internal/bytesize"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// Environment variables Options.FromEnv reads.
const (
	EnvNamespace     = "SANDKEEP_KUBE_NAMESPACE"
	EnvAgentImage    = "SANDKEEP_KUBE_AGENT_IMAGE"
	EnvStorageClass  = "SANDKEEP_KUBE_STORAGE_CLASS"
	EnvWorkspaceSize = "SANDKEEP_KUBE_WORKSPACE_SIZE"
	EnvKubeconfig    = "KUBECONFIG"
	// EnvChannelListen is the address the agent channel listens on (e.g. ":7070"); unset: no channel, every
	// command goes through the API server's exec.
	EnvChannelListen = "SANDKEEP_KUBE_CHANNEL_LISTEN"
	// EnvChannelAddr is the address pods dial (an IP and port: sandkeep's pod IP in a cluster); default: the
	// listen address when it names an IP.
	EnvChannelAddr = "SANDKEEP_KUBE_CHANNEL_ADDR"
	// EnvAllowUnenforcedNone, set to 1, lets a command that asked for network none run where the cluster does not
	// (provably) enforce NetworkPolicy, with the cluster's pod network (Options.AllowUnenforcedNone).
	EnvAllowUnenforcedNone = "SANDKEEP_KUBE_ALLOW_UNENFORCED_NONE"
	// EnvSeccomp is Options.Seccomp: "localhost" runs sandbox pods under sandkeep's profile installed on the
	// nodes (deploy/kubernetes/seccomp-profile.yaml); "" or "runtime-default" under the runtime's default.
	EnvSeccomp = "SANDKEEP_KUBE_SECCOMP"
)

// Defaults.
const (
	DefaultNamespace     = "sandkeep"
	DefaultWorkspaceSize = "1Gi"
	DefaultStartTimeout  = 2 * time.Minute
)

// Kubernetes names and keys the driver sets.
const (
	ContainerName    = "sandbox"        // the pod's main container
	InitName         = "sandkeep-agent" // the init container that installs the agent
	LabelManagedBy   = "app.kubernetes.io/managed-by"
	ManagedBy        = "sandkeep"
	AnnotationLabels = driver.LabelPrefix + "labels" // the sandbox's labels exactly, as JSON
	AnnotationRecord = driver.LabelPrefix + "record" // image, image ID and posture, as JSON
	AnnotationFinish = driver.LabelPrefix + "finished-at"
	// AnnotationWorkspaceKept marks a workspace claim whose sandbox was removed on purpose with its workspace
	// kept (a suspend, rm --keep-workspace, a recycle: Remove sets it, Create clears it): the reaper keeps it.
	AnnotationWorkspaceKept = driver.LabelPrefix + "workspace-kept"
	// AnnotationChannel is the channel address a replica's channel policy allows; AnnotationUsedAt when a Start
	// last relied on it (the reaper removes a policy no pod dials and no Start used for a while).
	AnnotationChannel = driver.LabelPrefix + "channel"
	AnnotationUsedAt  = driver.LabelPrefix + "used-at"
	PodSecurityLabel  = "pod-security.kubernetes.io/enforce"
	// IsolationPolicy is the NetworkPolicy that denies sandbox pods all ingress and egress (posture network
	// "none"); where the cluster's network plugin enforces NetworkPolicy it is what "none" means here.
	IsolationPolicy = "sandkeep-sandboxes-isolated"
	agentVolume     = "sandkeep-agent"
	workspaceVolume = "workspace"
	agentImagePath  = "/sandkeep-agent" // where `sandkeep agent image` puts the agent
)

// selectorLabels are the driver labels that become Kubernetes labels (values made valid by labelValue).
var selectorLabels = []string{driver.LabelInstallation, driver.LabelTenant, driver.LabelUser, driver.LabelKey, driver.LabelPosture, driver.LabelImage}

// Options configure a Driver. FromEnv fills them from the environment.
type Options struct {
	// Kubeconfig is the kubeconfig file; empty: $KUBECONFIG, else the in-cluster config, else ~/.kube/config.
	Kubeconfig string
	// Namespace holds every sandbox; created (Pod Security enforce=restricted) when missing. Default "sandkeep".
	Namespace string
	// AgentImage is the image `sandkeep agent image` wrote, as the nodes know it (required).
	AgentImage string
	// StorageClass of the workspace claims; empty: the cluster's default class.
	StorageClass string
	// WorkspaceSize is each claim's request, a size as bytesize.Parse reads it (10Gi, 10g); default 1Gi.
	WorkspaceSize string
	// StartTimeout bounds Start (scheduling, the claim binding, the images, the containers); default 2 minutes.
	StartTimeout time.Duration
	// ChannelListen, when set, is the TCP address of the agent channel (channel.go): each pod's agent keeps a
	// connection to it, so a warm command costs a frame round trip instead of an exec through the API server.
	ChannelListen string
	// ChannelAddr is the address pods dial; empty: the listener's address, which must then name an IP.
	ChannelAddr string
	// AllowUnenforcedNone: a command whose network block says none runs even where NetworkPolicy enforcement is
	// not proven (no channel, or the probe found it absent); its pod then has the cluster's pod network. Default:
	// refused with NETWORK_UNENFORCED (CheckNoNetwork).
	AllowUnenforcedNone bool
	// Seccomp is "localhost" for sandkeep's own profile, which must be installed on every node at
	// <kubelet root>/seccomp/SeccompLocalhostProfile() (deploy/kubernetes/seccomp-profile.yaml does it; a pod
	// on a node without it fails to start), or "" / "runtime-default" for the container runtime's default
	// (io_uring and ptrace allowed by containerd 1.6's). Issue 22, Low 11.
	Seccomp string
	// Logger receives the channel's refusals; nil discards.
	Logger *slog.Logger
	// REST, when set, is used instead of loading a kubeconfig (tests).
	REST *rest.Config
}

// FromEnv returns the options the environment gives: SANDKEEP_KUBE_NAMESPACE, SANDKEEP_KUBE_AGENT_IMAGE,
// SANDKEEP_KUBE_STORAGE_CLASS, SANDKEEP_KUBE_WORKSPACE_SIZE and KUBECONFIG.
func FromEnv() Options {
	return Options{
		Kubeconfig:    os.Getenv(EnvKubeconfig),
		Namespace:     os.Getenv(EnvNamespace),
		AgentImage:    os.Getenv(EnvAgentImage),
		StorageClass:  os.Getenv(EnvStorageClass),
		WorkspaceSize: os.Getenv(EnvWorkspaceSize),
		ChannelListen: os.Getenv(EnvChannelListen),
		ChannelAddr:   os.Getenv(EnvChannelAddr),

		AllowUnenforcedNone: os.Getenv(EnvAllowUnenforcedNone) == "1",
		Seccomp:             os.Getenv(EnvSeccomp),
	}
}

// Driver runs sandboxes as pods.
type Driver struct {
	opts  Options
	rest  *rest.Config
	api   kubernetes.Interface
	size  resource.Quantity
	nsMu  sync.Mutex
	nsOK  bool
	execs *executors
	ch    *chanServer // nil: no channel

	probeMu sync.Mutex // held by the one NetworkPolicy probe running (egress.go)
	npMu    sync.Mutex // guards np and canary
	np      npVerdict  // the probe's last verdict
	canary  *canary    // nil until the first isolation check (egress.go)
}

var _ driver.EgressListener = (*Driver)(nil)

var _ driver.Driver = (*Driver)(nil)

// New builds a driver for the cluster opts name. It does not talk to the cluster (Ping does; the namespace is
// ensured on the first Ping or Create).
func New(opts Options) (*Driver, error) {
	if err := checkSeccomp(opts.Seccomp); err != nil {
		return nil, err
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.WorkspaceSize == "" {
		opts.WorkspaceSize = DefaultWorkspaceSize
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.AgentImage == "" {
		return nil, fault.New(fault.AgentMissing,
			"write it with `sandkeep agent image --out FILE`, load it into the nodes or push it, and set "+EnvAgentImage,
			"the kubernetes driver needs the agent's image")
	}
	if _, err := reference.ParseNormalizedNamed(opts.AgentImage); err != nil {
		return nil, fault.Wrap(err, fault.InvalidArgument, "set "+EnvAgentImage+" to an image reference, e.g. registry.example/sandkeep-agent:v1",
			"%s %q is not an image reference", EnvAgentImage, opts.AgentImage)
	}
	n, err := bytesize.Parse(opts.WorkspaceSize)
	if err != nil {
		return nil, fault.Wrap(err, fault.InvalidArgument, "set "+EnvWorkspaceSize+" to a size such as 10Gi or 10g", "workspace size: %v", err)
	}
	if n == 0 {
		return nil, fault.New(fault.InvalidArgument, "set "+EnvWorkspaceSize+" to a size such as 10Gi or 10g", "workspace size 0 leaves no room")
	}
	size := *resource.NewQuantity(n, resource.BinarySI)
	cfg := opts.REST
	if cfg == nil {
		cfg, err = loadConfig(opts.Kubeconfig)
		if err != nil {
			return nil, err
		}
	}
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	api, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fault.Wrap(err, fault.DriverUnavailable, "check the kubeconfig", "cannot make a Kubernetes client")
	}
	d := &Driver{opts: opts, rest: cfg, api: api, size: size, execs: newExecutors(cfg)}
	if opts.ChannelListen != "" {
		if opts.ChannelAddr != "" {
			if err := checkChannelAddr(opts.ChannelAddr); err != nil {
				return nil, err
			}
		}
		d.ch, err = listenChannel(opts.ChannelListen, opts.ChannelAddr, api, opts.Namespace, opts.Logger)
		if err != nil {
			return nil, fault.Wrap(err, fault.DriverUnavailable, "set "+EnvChannelListen+" to a free host:port (and "+EnvChannelAddr+" to the address pods dial), or unset it",
				"the agent channel cannot listen on %s: %v", opts.ChannelListen, err)
		}
	}
	return d, nil
}

// checkChannelAddr: pods dial an IP and a port (the agent refuses anything else).
func checkChannelAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err == nil && net.ParseIP(host) == nil {
		err = errors.New("not an IP address")
	}
	if err == nil && (port == "" || port == "0") {
		err = errors.New("no port")
	}
	if err != nil {
		return fault.New(fault.InvalidArgument, "set "+EnvChannelAddr+" to the IP:port pods reach sandkeep at, e.g. 10.0.3.7:7070",
			"%s %q is not an IP:port (%v)", EnvChannelAddr, addr, err)
	}
	return nil
}

// ChannelAddr is the address pods dial for the agent channel, "" without one.
func (d *Driver) ChannelAddr() string {
	if d.ch == nil {
		return ""
	}
	return d.ch.addr
}

// ChannelStats counts what the agent channel did (all zero without one).
func (d *Driver) ChannelStats() ChannelStats {
	if d.ch == nil {
		return ChannelStats{}
	}
	return d.ch.snapshot()
}

// Close stops the agent channel's listener and closes its connections (the pods keep running; their agents dial
// the next process that serves them). The driver must not be used after.
func (d *Driver) Close() error {
	d.npMu.Lock()
	k := d.canary
	d.canary = nil
	d.npMu.Unlock()
	if k != nil {
		k.close()
	}
	if d.ch == nil {
		return nil
	}
	return d.ch.close()
}

// loadConfig: the kubeconfig file given (or $KUBECONFIG), else the in-cluster config, else ~/.kube/config.
func loadConfig(path string) (*rest.Config, error) {
	const hint = "set KUBECONFIG to the cluster's kubeconfig, or run inside the cluster"
	if path == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return cfg, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fault.Wrap(err, fault.DriverUnavailable, hint, "no Kubernetes cluster is configured (%v)", err)
	}
	return cfg, nil
}

// Name is "kubernetes".
func (d *Driver) Name() string { return "kubernetes" }

// Namespace is the namespace sandboxes live in.
func (d *Driver) Namespace() string { return d.opts.Namespace }

// Capabilities of the kubernetes driver: sandboxes persist (the claim). NetworkPolicy is true only once the
// probe (ProbeNetworkPolicy: run before the first command with a network, and by doctor) proved that the
// cluster enforces it; the isolation policy is applied regardless.
func (d *Driver) Capabilities() driver.Capabilities {
	enforced, _ := d.NetworkPolicy()
	return driver.Capabilities{Persistent: true, NetworkPolicy: enforced, Pools: true}
}

// Ping asks the API server for its version and ensures the namespace.
func (d *Driver) Ping(ctx context.Context) error {
	if _, err := d.api.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Raw(); err != nil {
		return fault.Wrap(err, fault.DriverUnavailable, "check KUBECONFIG and that the API server is reachable",
			"the Kubernetes API server at %s did not answer", d.rest.Host)
	}
	// The API server answered: the namespace and its policies are set-up, not availability, so they get their
	// own bound instead of the probe's (a loaded API server takes seconds for the few writes).
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), namespaceSetupTimeout)
	defer cancel()
	return d.ensureNamespace(nctx)
}

// namespaceSetupTimeout bounds ensuring the namespace and its NetworkPolicies from Ping.
const namespaceSetupTimeout = 30 * time.Second

// Version is the API server's version, for doctor.
func (d *Driver) Version(ctx context.Context) (string, error) {
	v, err := d.api.Discovery().ServerVersion()
	if err != nil {
		return "", fmt.Errorf("kubernetes version: %w", err)
	}
	return "Kubernetes " + v.GitVersion + " at " + d.rest.Host, nil
}

// ensureNamespace creates the namespace with Pod Security "restricted" enforced when it is missing, and refuses
// one that exists without it. It also ensures the isolation NetworkPolicy.
func (d *Driver) ensureNamespace(ctx context.Context) error {
	d.nsMu.Lock()
	defer d.nsMu.Unlock()
	if d.nsOK {
		return nil
	}
	ns := d.opts.Namespace
	got, err := d.api.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		got, err = d.api.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: ns,
			Labels: map[string]string{
				PodSecurityLabel: "restricted", PodSecurityLabel + "-version": "latest",
				"pod-security.kubernetes.io/warn": "restricted", "pod-security.kubernetes.io/audit": "restricted",
				LabelManagedBy: ManagedBy,
			},
		}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			got, err = d.api.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		}
	}
	if err != nil {
		return fault.Wrap(err, fault.DriverUnavailable, "give sandkeep's service account get and create on namespaces, or create the namespace yourself",
			"cannot read or create the sandbox namespace %s", ns)
	}
	if got.Labels[PodSecurityLabel] != "restricted" {
		return fault.New(fault.PostureRefused,
			fmt.Sprintf("label it: kubectl label namespace %s %s=restricted", ns, PodSecurityLabel),
			"namespace %s does not enforce Pod Security \"restricted\"; sandkeep runs sandboxes only where it does", ns)
	}
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: IsolationPolicy, Labels: map[string]string{LabelManagedBy: ManagedBy}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedBy}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
	if _, err := d.api.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fault.Wrap(err, fault.DriverUnavailable, "give sandkeep create on networkpolicies in "+ns,
			"cannot create the isolation NetworkPolicy in %s", ns)
	}
	if d.ch != nil {
		if err := d.ensureChannelPolicy(ctx); err != nil {
			return err
		}
	}
	d.nsOK = true
	return nil
}

// ChannelPolicyPrefix names the NetworkPolicy that lets sandbox pods reach the agent channel's address (and
// nothing else of the server): the isolation policy denies them everything else.
const ChannelPolicyPrefix = "sandkeep-channel-"

// ensureChannelPolicy allows the sandbox pods' egress to the channel's address, one IP and one TCP port, so that
// where NetworkPolicy is enforced the agent still reaches sandkeep and nothing else does.
func (d *Driver) ensureChannelPolicy(ctx context.Context) error {
	host, port, err := net.SplitHostPort(d.ch.addr)
	if err != nil {
		return fmt.Errorf("channel address %q: %w", d.ch.addr, err)
	}
	pn, err := strconv.Atoi(port)
	if err != nil {
		return fmt.Errorf("channel address %q: %w", d.ch.addr, err)
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return fmt.Errorf("channel address %q: not an IP", d.ch.addr)
	}
	cidr := ip.String() + "/32"
	if ip.To4() == nil {
		cidr = ip.String() + "/128"
	}
	tcp := corev1.ProtocolTCP
	portVal := intstr.FromInt32(int32(pn))
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: ChannelPolicyPrefix + addrName(d.ch.addr),
			Labels:      map[string]string{LabelManagedBy: ManagedBy},
			Annotations: map[string]string{AnnotationChannel: d.ch.addr, AnnotationUsedAt: time.Now().UTC().Format(time.RFC3339Nano)}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedBy}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: cidr}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &portVal}},
			}},
		},
	}
	if _, err := d.api.NetworkingV1().NetworkPolicies(d.opts.Namespace).Create(ctx, np, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fault.Wrap(err, fault.DriverUnavailable, "give sandkeep create on networkpolicies in "+d.opts.Namespace,
			"cannot create the agent channel's NetworkPolicy in %s", d.opts.Namespace)
	}
	return nil
}

// touchChannelPolicy says a Start relies on the channel policy now (AnnotationUsedAt), and makes it again when
// it is gone (the reaper removes a policy no pod dials and no Start used for a while).
func (d *Driver) touchChannelPolicy(ctx context.Context) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		AnnotationChannel: d.ch.addr, AnnotationUsedAt: time.Now().UTC().Format(time.RFC3339Nano)}}})
	_, err := d.api.NetworkingV1().NetworkPolicies(d.opts.Namespace).Patch(ctx, ChannelPolicyPrefix+addrName(d.ch.addr),
		types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return d.ensureChannelPolicy(ctx)
	}
	if err != nil {
		return fault.Wrap(err, fault.DriverUnavailable, "give sandkeep patch on networkpolicies in "+d.opts.Namespace,
			"cannot update the agent channel's NetworkPolicy in %s", d.opts.Namespace)
	}
	return nil
}

// addrName is a DNS-label form of a channel address: its SHA-256, 16 hex digits.
func addrName(addr string) string {
	sum := sha256.Sum256([]byte(addr))
	return hex.EncodeToString(sum[:8])
}

// ResolveImage returns the ref the pod is created from. A digest-pinned ref is used as given (the kubelet pulls
// it when absent). A tag must be present on a node (the nodes' image lists): it resolves to the node's
// digest-pinned name when the node reports one, so a later retag cannot change what a sandbox runs; a tag no
// node has is IMAGE_UNAVAILABLE. Where the driver may not list nodes, a tag is used as given.
func (d *Driver) ResolveImage(ctx context.Context, ref string) (string, error) {
	const hint = "load it into the nodes (ctr -n k8s.io images import FILE) or pin it by digest (repo@sha256:...) so the kubelet pulls it"
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", fault.Wrap(err, fault.ImageUnavailable, "pass an image reference such as registry.example/team/image:tag",
			"%q is not an image reference", ref)
	}
	if _, ok := named.(reference.Digested); ok {
		return named.String(), nil
	}
	name, n, err := d.nodeImage(ctx, named)
	switch {
	case apierrors.IsForbidden(err):
		return reference.TagNameOnly(named).String(), nil
	case err != nil:
		if ctx.Err() != nil {
			return "", fmt.Errorf("resolve image %q: %w", ref, ctx.Err())
		}
		return "", fault.Wrap(err, fault.DriverUnavailable, "check that the API server is reachable", "cannot list the nodes to resolve image %q", ref)
	case name == "":
		return "", fault.New(fault.ImageUnavailable, hint, "image %q is on none of the cluster's %d nodes", reference.TagNameOnly(named).String(), n)
	}
	return name, nil
}

// LocalImage returns the name a node has ref under (its digest-pinned name when it reports one), without
// the kubelet pulling anything; errdefs.ErrNotFound when no node has it, a digest-pinned ref included, and
// when the driver may not list nodes (it cannot tell, so a caller that refuses absent images refuses it).
func (d *Driver) LocalImage(ctx context.Context, ref string) (string, error) {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", fmt.Errorf("%q is not an image reference: %w", ref, cerrdefs.ErrNotFound)
	}
	name, _, err := d.nodeImage(ctx, named)
	switch {
	case apierrors.IsForbidden(err):
		return "", fmt.Errorf("image %q: the driver may not list the nodes' images: %w", ref, cerrdefs.ErrNotFound)
	case err != nil:
		return "", fmt.Errorf("image %q: list nodes: %w", ref, err)
	case name == "":
		return "", fmt.Errorf("image %q is on no node: %w", ref, cerrdefs.ErrNotFound)
	}
	return name, nil
}

// nodeImage looks named up in the nodes' image lists: its digest-pinned name on the first node that has it
// (the tag itself when that node reports no digest), "" when none has it; n is the number of nodes.
func (d *Driver) nodeImage(ctx context.Context, named reference.Named) (name string, n int, err error) {
	nodes, err := d.api.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", 0, err
	}
	want := reference.TagNameOnly(named).String()
	if dg, ok := named.(reference.Digested); ok {
		want = named.Name() + "@" + dg.Digest().String()
	}
	for _, node := range nodes.Items {
		for _, img := range node.Status.Images {
			if !contains(img.Names, want) {
				continue
			}
			for _, name := range img.Names {
				if repo, _, ok := strings.Cut(name, "@sha256:"); ok && repo == named.Name() {
					return name, len(nodes.Items), nil
				}
			}
			return want, len(nodes.Items), nil
		}
	}
	return "", len(nodes.Items), nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// record is what the ConfigMap keeps of a sandbox's creation.
type record struct {
	Image   string         `json:"image"`
	ImageID string         `json:"image_id"`
	Posture driver.Posture `json:"posture"`
}

// ClaimName is the name of the workspace claim of the sandbox with this name (one per key).
func ClaimName(sandbox string) string { return sandbox + claimSuffix }

const claimSuffix = "-workspace"

// Inspect returns the sandbox named name: its record and pod, or a foreign pod or ConfigMap of that name.
func (d *Driver) Inspect(ctx context.Context, name string) (*driver.Sandbox, error) {
	ns := d.opts.Namespace
	cm, err := d.api.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("inspect %s: %w", name, err)
	}
	pod, perr := d.api.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if perr != nil && !apierrors.IsNotFound(perr) {
		return nil, fmt.Errorf("inspect %s: %w", name, perr)
	}
	if apierrors.IsNotFound(perr) {
		pod = nil
	}
	if err != nil { // no record
		if pod == nil || orphanedPod(pod) {
			return nil, fmt.Errorf("inspect %s: %w", name, cerrdefs.ErrNotFound)
		}
		// A pod sandkeep did not record: report it with its own labels, so the caller sees it is not ours.
		return &driver.Sandbox{ID: string(pod.UID), Name: name, State: podState(pod), Labels: pod.Labels, ImageID: pod.Spec.Containers[0].Image}, nil
	}
	return fromObjects(cm, pod), nil
}

// fromObjects builds the Sandbox of a record and its pod (nil, or a pod of another owner, when not running).
func fromObjects(cm *corev1.ConfigMap, pod *corev1.Pod) *driver.Sandbox {
	sb := &driver.Sandbox{ID: string(cm.UID), Name: cm.Name, State: driver.StateStopped, Labels: map[string]string{}}
	if raw, ok := cm.Annotations[AnnotationLabels]; ok {
		_ = json.Unmarshal([]byte(raw), &sb.Labels)
	} else {
		sb.Labels = cm.Labels // not ours
	}
	var rec record
	if raw, ok := cm.Annotations[AnnotationRecord]; ok && json.Unmarshal([]byte(raw), &rec) == nil {
		sb.ImageID = rec.ImageID
	}
	if t, err := time.Parse(time.RFC3339Nano, cm.Annotations[AnnotationFinish]); err == nil {
		sb.FinishedAt = t
	}
	if c, ok := claimOf(cm); ok { // claim.go
		sb.Labels[driver.LabelClaimedBy] = c.Key
		sb.Labels[driver.LabelClaimTenant] = c.Tenant
		sb.Labels[driver.LabelClaimUser] = c.User
	}
	if pod != nil && ownedBy(pod, cm.UID) {
		sb.State = podState(pod)
		if st := containerStatus(pod, ContainerName); st != nil {
			if st.State.Running != nil {
				sb.StartedAt = st.State.Running.StartedAt.Time
			} else if st.State.Terminated != nil {
				sb.StartedAt = st.State.Terminated.StartedAt.Time
				if sb.FinishedAt.Before(st.State.Terminated.FinishedAt.Time) {
					sb.FinishedAt = st.State.Terminated.FinishedAt.Time
				}
			}
		}
	}
	return sb
}

// orphanedPod: a pod whose record is gone is one the garbage collector is removing (its owner reference names
// the record of its name). It is no sandbox, not a foreign one: Start replaces it when the key's next record is made.
func orphanedPod(pod *corev1.Pod) bool {
	for _, o := range pod.OwnerReferences {
		if o.Kind == "ConfigMap" && o.Name == pod.Name {
			return true
		}
	}
	return false
}

func ownedBy(pod *corev1.Pod, uid types.UID) bool {
	for _, o := range pod.OwnerReferences {
		if o.UID == uid {
			return true
		}
	}
	return false
}

func containerStatus(pod *corev1.Pod, name string) *corev1.ContainerStatus {
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == name {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// podState: running once the sandbox container runs; a pod on its way (pending) or done (succeeded, failed) is
// stopped, so Start takes it over or replaces it; a pod being deleted is removing.
func podState(pod *corev1.Pod) driver.State {
	if pod.DeletionTimestamp != nil {
		return driver.StateRemoving
	}
	switch pod.Status.Phase {
	case corev1.PodRunning:
		if st := containerStatus(pod, ContainerName); st != nil && st.State.Running != nil {
			return driver.StateRunning
		}
		return driver.StateStopped
	case corev1.PodPending, corev1.PodSucceeded, corev1.PodFailed:
		return driver.StateStopped
	default:
		return driver.StateDead
	}
}

func isRunning(pod *corev1.Pod) bool { return podState(pod) == driver.StateRunning }

// Create writes the sandbox's record (a name that is taken is errdefs.ErrConflict) and ensures the key's
// workspace claim. The pod is made by Start.
func (d *Driver) Create(ctx context.Context, spec *driver.CreateSpec) (*driver.Sandbox, error) {
	if _, err := podFor(spec.Name, "", record{Image: spec.Image, ImageID: spec.ImageID, Posture: spec.Posture}, spec.Labels, d.opts.AgentImage, nil, d.seccomp()); err != nil {
		return nil, err // a posture this driver cannot apply: nothing is created
	}
	if err := d.ensureNamespace(ctx); err != nil {
		return nil, err
	}
	labelsJSON, err := json.Marshal(spec.Labels)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", spec.Name, err)
	}
	recJSON, err := json.Marshal(record{Image: spec.Image, ImageID: spec.ImageID, Posture: spec.Posture})
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", spec.Name, err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name:        spec.Name,
		Labels:      kubeLabels(spec.Labels),
		Annotations: map[string]string{AnnotationLabels: string(labelsJSON), AnnotationRecord: string(recJSON)},
	}}
	if spec.Claim != nil { // claim.go: born claimed
		raw, err := json.Marshal(spec.Claim)
		if err != nil {
			return nil, fmt.Errorf("create %s: %w", spec.Name, err)
		}
		cm.Annotations[AnnotationClaim] = string(raw)
		cm.Labels[LabelClaim] = claimLabel(spec.Claim.Key)
	}
	ns := d.opts.Namespace
	created, err := d.api.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
	if err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create %s: %w", spec.Name, cerrdefs.ErrConflict)
		}
		return nil, fault.Wrap(err, fault.SandboxFailed, "check the API server and sandkeep's RBAC on configmaps in "+ns,
			"the cluster could not record sandbox %s", spec.Name)
	}
	if err := d.ensureClaim(ctx, spec); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		uid := created.UID
		_ = d.api.CoreV1().ConfigMaps(ns).Delete(cctx, spec.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		return nil, err
	}
	return fromObjects(created, nil), nil
}

// ensureClaim creates the key's workspace claim unless it exists.
func (d *Driver) ensureClaim(ctx context.Context, spec *driver.CreateSpec) error {
	ns, pvc := d.opts.Namespace, d.claimFor(spec.Name, spec.Labels)
	_, err := d.api.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) && d.claimGoing(ctx, pvc.Name) {
		// A claim being deleted (an rm, or a restore that replaces a workspace, just before) would hold its pod
		// Pending until it is gone, then leave it without its volume: wait it out and make a new one.
		_, err = d.api.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
	}
	if apierrors.IsAlreadyExists(err) {
		// A kept workspace is this sandbox's again: no longer kept on purpose (the reaper judges it by its sandbox
		// and its key again); a claim from before the labels annotation gets it.
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
			AnnotationWorkspaceKept: nil, AnnotationLabels: pvc.Annotations[AnnotationLabels]}}})
		_, err = d.api.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, pvc.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	}
	if err == nil {
		return nil
	}
	return fault.Wrap(err, fault.SandboxFailed, "check sandkeep's RBAC on persistentvolumeclaims in "+ns+" and the storage class",
		"the cluster could not make the workspace claim %s", pvc.Name)
}

// claimGoing reports whether the claim called name is being deleted, and then waits (within ctx) until it is
// gone.
func (d *Driver) claimGoing(ctx context.Context, name string) bool {
	pvcs := d.api.CoreV1().PersistentVolumeClaims(d.opts.Namespace)
	pvc, err := pvcs.Get(ctx, name, metav1.GetOptions{})
	if err != nil || pvc.DeletionTimestamp == nil {
		return false
	}
	for {
		select {
		case <-ctx.Done():
			return true
		case <-time.After(100 * time.Millisecond):
		}
		if _, err := pvcs.Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return true
		}
	}
}

// claimFor is the workspace claim of the sandbox named name, labelled with its identity labels (and, exactly, in
// the AnnotationLabels annotation: the reaper reads them there).
func (d *Driver) claimFor(name string, labels map[string]string) *corev1.PersistentVolumeClaim {
	ids := map[string]string{
		driver.LabelInstallation: labels[driver.LabelInstallation], driver.LabelKey: labels[driver.LabelKey],
		driver.LabelTenant: labels[driver.LabelTenant], driver.LabelUser: labels[driver.LabelUser],
	}
	labelsJSON, _ := json.Marshal(ids) // a map of strings always marshals
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: ClaimName(name), Labels: kubeLabels(ids),
			Annotations: map[string]string{AnnotationLabels: string(labelsJSON)}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: d.size}},
		},
	}
	if d.opts.StorageClass != "" {
		sc := d.opts.StorageClass
		pvc.Spec.StorageClassName = &sc
	}
	return pvc
}

// RemoveWorkspace deletes the workspace claim of the sandbox named name (what `rm` without keeping the workspace
// does); an absent claim is not an error.
func (d *Driver) RemoveWorkspace(ctx context.Context, name string) error {
	err := d.api.CoreV1().PersistentVolumeClaims(d.opts.Namespace).Delete(ctx, ClaimName(name), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove workspace of %s: %w", name, err)
	}
	return nil
}

// record reads the record of sb; an absent one, or one of a newer sandbox of that name, is ErrNotFound.
func (d *Driver) record(ctx context.Context, sb *driver.Sandbox) (*corev1.ConfigMap, record, error) {
	cm, err := d.api.CoreV1().ConfigMaps(d.opts.Namespace).Get(ctx, sb.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && string(cm.UID) != sb.ID) {
		return nil, record{}, fmt.Errorf("%s: %w", sb.Name, cerrdefs.ErrNotFound)
	}
	if err != nil {
		return nil, record{}, fmt.Errorf("%s: %w", sb.Name, err)
	}
	var rec record
	if err := json.Unmarshal([]byte(cm.Annotations[AnnotationRecord]), &rec); err != nil {
		return nil, record{}, fault.New(fault.ForeignContainer, "remove it, or pick another namespace",
			"configmap %s/%s is not a sandkeep record", d.opts.Namespace, sb.Name)
	}
	return cm, rec, nil
}

// Start makes the sandbox's pod (replacing a finished one) and waits until its container runs.
func (d *Driver) Start(ctx context.Context, sb *driver.Sandbox) error {
	cm, rec, err := d.record(ctx, sb)
	if err != nil {
		return fmt.Errorf("start %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, d.opts.StartTimeout)
	defer cancel()
	pods := d.api.CoreV1().Pods(d.opts.Namespace)
	pod, err := pods.Get(ctx, sb.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		pod = nil
	case err != nil:
		return fmt.Errorf("start %s: %w", sb.Name, err)
	case ownedBy(pod, cm.UID) && pod.DeletionTimestamp == nil && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed:
		if isRunning(pod) {
			return nil
		}
		return d.waitRunning(ctx, sb.Name, pod.UID) // a Start in progress (this process's or another's)
	default: // finished, being deleted, or another sandbox's: replace it
		if err := d.deletePod(ctx, pod, 0); err != nil {
			return fmt.Errorf("start %s: %w", sb.Name, err)
		}
		pod = nil
	}
	var pc *podChannel
	if d.ch != nil {
		if err := d.touchChannelPolicy(ctx); err != nil {
			return fmt.Errorf("start %s: %w", sb.Name, err)
		}
		token, err := newToken()
		if err != nil {
			return fmt.Errorf("start %s: channel token: %w", sb.Name, err)
		}
		pc = &podChannel{addr: d.ch.addr, token: token}
	}
	want, err := podFor(sb.Name, cm.UID, rec, sb.Labels, d.opts.AgentImage, pc, d.seccomp())
	if err != nil {
		return err
	}
	created, err := pods.Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, gerr := pods.Get(ctx, sb.Name, metav1.GetOptions{})
		if gerr == nil && ownedBy(got, cm.UID) {
			return d.waitRunning(ctx, sb.Name, got.UID)
		}
		return fmt.Errorf("start %s: a pod of that name appeared: %w", sb.Name, cerrdefs.ErrConflict)
	}
	if err != nil {
		if apierrors.IsForbidden(err) && d.overQuota(ctx, want) {
			return fault.Wrap(err, fault.SandboxCapacity, "raise the namespace's ResourceQuota, free what it counts, or retry later",
				"the namespace's quota has no room for the pod of sandbox %s", sb.Name)
		}
		if apierrors.IsForbidden(err) {
			return fault.Wrap(err, fault.PostureRefused, "check the namespace's Pod Security labels and sandkeep's RBAC on pods",
				"the cluster refused the pod of sandbox %s: %s", sb.Name, apierrors.ReasonForError(err))
		}
		if ctx.Err() != nil {
			return fmt.Errorf("start %s: %w", sb.Name, ctx.Err())
		}
		return fault.Wrap(err, fault.SandboxFailed, "check the API server", "the cluster could not create the pod of sandbox %s", sb.Name)
	}
	if err := d.waitRunning(ctx, sb.Name, created.UID); err != nil {
		// Nothing half-made: a pod that cannot run is removed (the record stays; Start may be retried).
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer ccancel()
		_ = d.deletePod(cctx, created, 0)
		return err
	}
	if d.ch != nil {
		if err := d.startIsolated(ctx, sb, created.UID); err != nil {
			cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer ccancel()
			_ = d.deletePod(cctx, created, 0)
			return err
		}
	}
	return nil
}

// startIsolated waits until the new pod's NetworkPolicy holds (awaitIsolated) before the pod is handed out.
func (d *Driver) startIsolated(ctx context.Context, sb *driver.Sandbox, uid types.UID) error {
	if enforced, _ := d.NetworkPolicy(); !enforced {
		return nil
	}
	pod, err := d.api.CoreV1().Pods(d.opts.Namespace).Get(ctx, sb.Name, metav1.GetOptions{})
	if err != nil || pod.UID != uid || pod.Status.PodIP == "" {
		return fault.New(fault.SandboxFailed, "retry; check the cluster's events for the pod", "the pod of sandbox %s has no IP or was replaced (%v)", sb.Name, err)
	}
	return d.awaitIsolated(ctx, sb, pod.Status.PodIP)
}

// waitRunning polls the pod until its sandbox container runs, it fails, or ctx (bounded by StartTimeout) ends.
func (d *Driver) waitRunning(ctx context.Context, name string, uid types.UID) error {
	pods := d.api.CoreV1().Pods(d.opts.Namespace)
	delay := 50 * time.Millisecond
	var last *corev1.Pod
	for {
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err) || (err == nil && pod.UID != uid):
			return fault.New(fault.SandboxFailed, "retry; check the cluster's events for the pod", "the pod of sandbox %s was deleted while starting", name)
		case err == nil:
			last = pod
			if isRunning(pod) {
				return nil
			}
			if why := podFailure(pod); why != "" {
				return fault.New(fault.SandboxFailed, "check the image and agent image are on the nodes (or pullable) and the pod's events",
					"the pod of sandbox %s cannot run: %s", name, why)
			}
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return notRunningInTime(name, d.opts.StartTimeout, last)
			}
			return fmt.Errorf("start %s: %w", name, ctx.Err())
		case <-time.After(delay):
		}
		if delay < 250*time.Millisecond {
			delay *= 2
		}
	}
}

// overQuota says whether one of the namespace's ResourceQuotas has no room for pod: the quota admission's refusal
// is a plain Forbidden, so this reads the quotas themselves (hard against used plus the pod's own requests and
// limits) instead of the refusal's text. Quotas it cannot read count as no quota.
func (d *Driver) overQuota(ctx context.Context, pod *corev1.Pod) bool {
	qs, err := d.api.CoreV1().ResourceQuotas(d.opts.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false
	}
	want := podUsage(pod)
	for _, q := range qs.Items {
		for name, hard := range q.Status.Hard {
			add, ok := want[name]
			if !ok {
				continue
			}
			used := q.Status.Used[name].DeepCopy()
			used.Add(add)
			if used.Cmp(hard) > 0 {
				return true
			}
		}
	}
	return false
}

// podUsage is what pod counts against a ResourceQuota.
func podUsage(pod *corev1.Pod) corev1.ResourceList {
	one := resource.MustParse("1")
	use := corev1.ResourceList{corev1.ResourcePods: one, "count/pods": one}
	add := func(name corev1.ResourceName, q resource.Quantity) {
		cur := use[name]
		cur.Add(q)
		use[name] = cur
	}
	for _, c := range pod.Spec.Containers {
		for n, q := range c.Resources.Requests {
			add(corev1.ResourceName("requests."+string(n)), q)
			if n == corev1.ResourceCPU || n == corev1.ResourceMemory {
				add(n, q)
			}
		}
		for n, q := range c.Resources.Limits {
			add(corev1.ResourceName("limits."+string(n)), q)
		}
	}
	return use
}

// notRunningInTime is the failure of a pod still not running at its start bound: SANDBOX_CAPACITY when the
// scheduler found no node with room for it (insufficient CPU or memory, too many pods), else
// SANDBOX_SETUP_TIMEOUT. Both may succeed later: the run is failed_resumable.
func notRunningInTime(name string, bound time.Duration, last *corev1.Pod) error {
	if why, ok := unschedulable(last); ok {
		return fault.New(fault.SandboxCapacity, "free capacity on the cluster's nodes (or add nodes), lower the template's cpus or memory, or retry later",
			"no node of the cluster has room for the pod of sandbox %s (still unschedulable after %v): %s", name, bound, why)
	}
	return fault.New(fault.SandboxSetupTimeout, "check the pod's events: scheduling, the workspace claim binding, image pulls",
		"the pod of sandbox %s was not running after %v: %s", name, bound, pendingReason(last))
}

// unschedulable says whether the scheduler last found no node for pod, and the scheduler's reason.
func unschedulable(pod *corev1.Pod) (string, bool) {
	if pod == nil {
		return "", false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message, true
		}
	}
	return "", false
}

// podFailure says why a pod will never run, or "" while it may still.
func podFailure(pod *corev1.Pod) string {
	if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		return fmt.Sprintf("pod %s: %s %s%s", pod.Status.Phase, pod.Status.Reason, pod.Status.Message, terminated(pod))
	}
	statuses := append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...)
	for _, st := range statuses {
		if w := st.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName",
				"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff":
				return fmt.Sprintf("container %s: %s: %s", st.Name, w.Reason, w.Message)
			}
		}
		if t := st.State.Terminated; t != nil && t.ExitCode != 0 {
			return fmt.Sprintf("container %s exited %d: %s %s", st.Name, t.ExitCode, t.Reason, t.Message)
		}
	}
	return ""
}

func terminated(pod *corev1.Pod) string {
	var b strings.Builder
	for _, st := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		if t := st.State.Terminated; t != nil {
			fmt.Fprintf(&b, "; container %s exited %d (%s) %s", st.Name, t.ExitCode, t.Reason, strings.TrimSpace(t.Message))
		}
	}
	return b.String()
}

func pendingReason(pod *corev1.Pod) string {
	if pod == nil {
		return "the pod was never seen"
	}
	for _, c := range pod.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			return fmt.Sprintf("%s: %s %s", c.Type, c.Reason, c.Message)
		}
	}
	return "phase " + string(pod.Status.Phase)
}

// deletePod deletes pod (this very one: UID precondition) with grace and waits until it is gone.
func (d *Driver) deletePod(ctx context.Context, pod *corev1.Pod, grace time.Duration) error {
	return deletePodAndWait(ctx, d.api.CoreV1().Pods(d.opts.Namespace), pod, grace)
}

// deletePodAndWait deletes pod (that very pod: a newer one of its name stays) and waits until it is gone.
func deletePodAndWait(ctx context.Context, pods typedcorev1.PodInterface, pod *corev1.Pod, grace time.Duration) error {
	secs := int64((grace + time.Second - 1) / time.Second)
	uid := pod.UID
	err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &secs, Preconditions: &metav1.Preconditions{UID: &uid}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete pod %s: %w", pod.Name, err)
	}
	for {
		got, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && got.UID != uid) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s still terminating: %w", pod.Name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop deletes the sandbox's pod, giving its processes grace; the record and the claim stay.
func (d *Driver) Stop(ctx context.Context, sb *driver.Sandbox, grace time.Duration) error {
	ns := d.opts.Namespace
	pod, err := d.api.CoreV1().Pods(ns).Get(ctx, sb.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stop %s: %w", sb.Name, err)
	}
	if !ownedBy(pod, types.UID(sb.ID)) {
		return nil // another sandbox's pod: ours is gone
	}
	wctx, cancel := context.WithTimeout(ctx, grace+time.Minute)
	defer cancel()
	if d.ch != nil {
		d.ch.forget(sb.Name, false)
	}
	if err := d.deletePod(wctx, pod, grace); err != nil {
		return fmt.Errorf("stop %s: %w", sb.Name, err)
	}
	// A merge patch that names the UID is applied only to that very record.
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid": sb.ID, "annotations": map[string]string{AnnotationFinish: time.Now().UTC().Format(time.RFC3339Nano)},
	}})
	_, err = d.api.CoreV1().ConfigMaps(ns).Patch(ctx, sb.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("stop %s: %w", sb.Name, err)
	}
	return nil
}

// Remove deletes the sandbox's pod at once and its record; the workspace claim stays (RemoveWorkspace).
func (d *Driver) Remove(ctx context.Context, sb *driver.Sandbox) error {
	ns := d.opts.Namespace
	pod, err := d.api.CoreV1().Pods(ns).Get(ctx, sb.Name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove %s: %w", sb.Name, err)
	}
	if err == nil && ownedBy(pod, types.UID(sb.ID)) {
		if d.ch != nil {
			d.ch.forget(sb.Name, true)
		}
		if err := d.deletePod(ctx, pod, 0); err != nil {
			return fmt.Errorf("remove %s: %w", sb.Name, err)
		}
	}
	// The workspace stays on purpose (RemoveWorkspace deletes it when the caller does not keep it): marked before
	// the record goes, so the reaper never sees it without a sandbox and unmarked.
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		AnnotationWorkspaceKept: time.Now().UTC().Format(time.RFC3339Nano)}}})
	_, err = d.api.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, ClaimName(sb.Name), types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove %s: keep its workspace: %w", sb.Name, err)
	}
	uid := types.UID(sb.ID)
	err = d.api.CoreV1().ConfigMaps(ns).Delete(ctx, sb.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("remove %s: %w", sb.Name, err)
	}
	return nil
}

// List returns the sandboxes labelled with installation.
func (d *Driver) List(ctx context.Context, installation string) ([]*driver.Sandbox, error) {
	ns := d.opts.Namespace
	sel := LabelManagedBy + "=" + ManagedBy + "," + kubeLabelKey(driver.LabelInstallation) + "=" + labelValue(installation)
	cms, err := d.api.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	pods, err := d.api.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	byName := map[string]*corev1.Pod{}
	for i := range pods.Items {
		byName[pods.Items[i].Name] = &pods.Items[i]
	}
	out := make([]*driver.Sandbox, 0, len(cms.Items))
	for i := range cms.Items {
		sb := fromObjects(&cms.Items[i], byName[cms.Items[i].Name])
		if sb.Labels[driver.LabelInstallation] == installation { // exact, past the label's hashing
			out = append(out, sb)
		}
	}
	return out, nil
}
