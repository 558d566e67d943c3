package kube

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sandkeep/sandkeep/internal/agentproto"
	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// Egress of the sandbox pods. A pod's only allowed egress (by NetworkPolicy: the isolation policy denies
// everything, the channel policy allows one IP and one TCP port) is the channel's address. Its agent forwards
// the pod's 127.0.0.1:3128 there: each connection opens with the pod's egress hello (the channel's name and
// token under another magic), the channel listener believes it exactly as it believes a channel (token, peer
// IP, the informer's pod) and hands it to the pod's egress listener, on which the lifecycle serves the key's
// egress proxy with each command's policy. So the same proxy, allowlist, inspection, credential injection and
// network_blocked events apply as on Docker, and no port is opened beyond the channel's.
//
// All of it rests on the cluster enforcing NetworkPolicy, which the API server accepts whether or not anything
// enforces it. The driver finds out with a probe pod (probeNetworkPolicy) before it serves a network, and
// refuses (NETWORK_UNENFORCED) where it is not enforced: a command with a network block never runs with the
// pod network open.
const (
	// egressForward is the agent's forwarder address in the pod (lifecycle.EgressListen names the same).
	egressForward = "127.0.0.1:3128"
	// egressBacklog bounds the connections believed and not yet accepted by the proxy, per pod; past it they
	// are closed (the agent bounds its own forwarded connections at 256).
	egressBacklog = 64
	// ProbePrefix names the probe pod and its NetworkPolicy.
	ProbePrefix = "sandkeep-probe-"
	// LabelProbe marks the probe pod; its policy selects it by this label.
	LabelProbe = driver.LabelPrefix + "probe"
	// probeSeconds is how long the probe pod dials; probeBudget bounds the whole probe (pod start included).
	probeSeconds = 60
	probeBudget  = 90 * time.Second
	// probeQuiet: the denied port must stay silent this long, while the allowed one is reached, to count as
	// enforced. probeSettle: the plugin gets this long after the pod first reached the allowed port to start
	// enforcing (kube-router re-syncs within about 2 s); a denied connection after it means not enforced.
	probeQuiet  = 3 * time.Second
	probeSettle = 15 * time.Second
	probeUID    = 65532
	// probeRetry: an inconclusive probe (the pod never ran or never reached the allowed port) is tried again
	// after this long; a verdict holds for the driver's life.
	probeRetry = time.Minute
)

// egressListener is one pod's egress endpoint: what the channel listener believed for it.
type egressListener struct {
	s     *chanServer
	name  string
	owner types.UID
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

var _ net.Listener = (*egressListener)(nil)

// Accept returns the next believed egress connection of the pod.
func (l *egressListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops handing connections to l; those waiting are closed.
func (l *egressListener) Close() error {
	l.s.mu.Lock()
	if l.s.egress[l.name] == l {
		delete(l.s.egress, l.name)
	}
	l.s.mu.Unlock()
	l.shut()
	return nil
}

func (l *egressListener) shut() {
	l.once.Do(func() {
		close(l.done)
		for {
			select {
			case c := <-l.conns:
				c.Close()
			default:
				return
			}
		}
	})
}

// Addr is the channel's listening address.
func (l *egressListener) Addr() net.Addr { return l.s.ln.Addr() }

// handEgress gives c (a believed egress hello of pod name, sandbox owner) to the pod's egress listener, or
// closes it when there is none for that sandbox or its backlog is full.
func (s *chanServer) handEgress(name string, owner types.UID, c *net.TCPConn) {
	s.mu.Lock()
	l := s.egress[name]
	if l == nil || l.owner != owner || s.closed {
		s.stats.EgressRefused++
		s.mu.Unlock()
		c.Close()
		return
	}
	select {
	case l.conns <- c:
		s.stats.Egress++
	default:
		s.stats.EgressRefused++
		c.Close()
	}
	s.mu.Unlock()
}

// ListenEgress returns the egress endpoint of sb's pod (driver.EgressListener): the connections its agent's
// forwarder opens, believed like its channel. It refuses when the driver has no channel (the pods have no way to
// sandkeep), and when the cluster does not enforce NetworkPolicy (the probe runs on the first call): the pod
// could then go around the proxy.
func (d *Driver) ListenEgress(ctx context.Context, sb *driver.Sandbox) (net.Listener, error) {
	if d.ch == nil {
		return nil, fault.New(fault.NetworkUnenforced,
			"set "+EnvChannelListen+" (and "+EnvChannelAddr+"): the pods reach sandkeep's egress proxy over the agent channel's address",
			"the kubernetes driver has no egress path without the agent channel, so sandbox %s cannot have a network", sb.Name)
	}
	if ok, detail := d.ProbeNetworkPolicy(ctx); !ok {
		return nil, fault.New(fault.NetworkUnenforced,
			"install a network plugin that enforces NetworkPolicy (Calico, Cilium, kube-router) and check with `sandkeep doctor`",
			"the cluster's NetworkPolicy enforcement is not proven (%s), so sandbox %s cannot be confined to sandkeep's egress proxy; the command was not run", detail, sb.Name)
	}
	l := &egressListener{s: d.ch, name: sb.Name, owner: types.UID(sb.ID), conns: make(chan net.Conn, egressBacklog), done: make(chan struct{})}
	d.ch.mu.Lock()
	defer d.ch.mu.Unlock()
	if d.ch.closed {
		return nil, net.ErrClosed
	}
	if old := d.ch.egress[sb.Name]; old != nil {
		old.shut() // a listener of an earlier sandbox of that name, or one its owner forgot: the newest serves
	}
	d.ch.egress[sb.Name] = l
	return l, nil
}

// CheckNoNetwork (driver.NoNetworkChecker) lets a command whose network block says none run in sb only where
// that is true: where the cluster enforces NetworkPolicy (the probe, run on the first call), so the isolation
// policy keeps the pod off the network. Elsewhere the pod has the cluster's pod network, and the command is
// refused with NETWORK_UNENFORCED, unless the operator accepted that (Options.AllowUnenforcedNone).
func (d *Driver) CheckNoNetwork(ctx context.Context, sb *driver.Sandbox) error {
	if d.opts.AllowUnenforcedNone {
		return nil
	}
	const accept = ", or set " + EnvAllowUnenforcedNone + "=1 to run such commands with the cluster's pod network"
	if d.ch == nil {
		return fault.New(fault.NetworkUnenforced,
			"set "+EnvChannelListen+" (and "+EnvChannelAddr+") so sandkeep can prove the cluster enforces NetworkPolicy"+accept,
			"the kubernetes driver cannot prove NetworkPolicy is enforced without the agent channel, so network none is not known to hold for sandbox %s; the command was not run", sb.Name)
	}
	if ok, detail := d.ProbeNetworkPolicy(ctx); !ok {
		return fault.New(fault.NetworkUnenforced,
			"install a network plugin that enforces NetworkPolicy (Calico, Cilium, kube-router) and check with `sandkeep doctor`"+accept,
			"the cluster's NetworkPolicy enforcement is not proven (%s), so sandbox %s would have the pod network although the command asked for network none; the command was not run", detail, sb.Name)
	}
	return nil
}

// npVerdict is what the probe found.
type npVerdict struct {
	done     bool // a verdict (either way); false: never probed, or inconclusive
	enforced bool
	detail   string
	at       time.Time
}

// NetworkPolicy reports what the driver knows of NetworkPolicy enforcement without probing: whether it was
// proved, and how (or why not). Capabilities().NetworkPolicy is the same bool.
func (d *Driver) NetworkPolicy() (enforced bool, detail string) {
	d.npMu.Lock()
	defer d.npMu.Unlock()
	if !d.np.done && d.np.detail == "" {
		return false, "not probed yet"
	}
	return d.np.enforced, d.np.detail
}

// ProbeNetworkPolicy proves whether the cluster enforces NetworkPolicy for the sandbox namespace, once per
// driver (an inconclusive probe is retried after a minute): a probe pod, selected like every sandbox pod by the
// isolation policy and allowed by one policy of its own to reach one port of sandkeep's, dials that port and
// another port of sandkeep's that nothing allows. Both are fresh listeners of this process on the channel's
// IP, so the verdict comes from what reaches them, not from the pod: enforced when the allowed port keeps
// being reached while the denied one stays silent; not enforced when the denied one is still reached after the
// plugin had time to act. Concurrent callers wait for one probe.
func (d *Driver) ProbeNetworkPolicy(ctx context.Context) (bool, string) {
	d.probeMu.Lock()
	defer d.probeMu.Unlock()
	d.npMu.Lock()
	v := d.np
	d.npMu.Unlock()
	if v.done || (!v.at.IsZero() && time.Since(v.at) < probeRetry) {
		return v.enforced, v.detail
	}
	if d.ch == nil {
		v = npVerdict{done: true, detail: "no agent channel (" + EnvChannelListen + " unset): the probe needs the address pods reach sandkeep at"}
	} else if err := d.ensureNamespace(ctx); err != nil {
		v = npVerdict{detail: "the probe could not run: " + err.Error()}
	} else {
		v = d.probe(ctx)
	}
	v.at = time.Now()
	d.npMu.Lock()
	d.np = v
	d.npMu.Unlock()
	return v.enforced, v.detail
}

// hits counts the connections one probe listener accepted.
type hits struct {
	mu          sync.Mutex
	n           int
	first, last time.Time
}

func (h *hits) get() (int, time.Time, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n, h.first, h.last
}

// count accepts on ln until it is closed, noting each connection's time and closing it unread.
func (h *hits) count(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		c.Close()
		now := time.Now()
		h.mu.Lock()
		if h.n == 0 {
			h.first = now
		}
		h.n++
		h.last = now
		h.mu.Unlock()
	}
}

func (d *Driver) probe(ctx context.Context) npVerdict {
	ctx, cancel := context.WithTimeout(ctx, probeBudget)
	defer cancel()
	host, _, err := net.SplitHostPort(d.ch.addr)
	if err != nil {
		return npVerdict{detail: "the probe could not run: " + err.Error()}
	}
	var lns [2]net.Listener // allowed, denied
	var hs [2]hits
	var wg sync.WaitGroup
	defer func() {
		for _, ln := range lns {
			if ln != nil {
				ln.Close()
			}
		}
		wg.Wait()
	}()
	for i := range lns {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return npVerdict{detail: fmt.Sprintf("the probe could not listen on the channel's IP %s: %v", host, err)}
		}
		lns[i] = ln
		wg.Go(func() { hs[i].count(ln) })
	}
	allowed, denied := lns[0].Addr().(*net.TCPAddr), lns[1].Addr().(*net.TCPAddr)
	id, err := newToken()
	if err != nil {
		return npVerdict{detail: "the probe could not run: " + err.Error()}
	}
	id = id[:12]
	name := ProbePrefix + id
	ns := d.opts.Namespace
	cleanup := func() {
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer ccancel()
		zero := int64(0)
		_ = d.api.CoreV1().Pods(ns).Delete(cctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		_ = d.api.NetworkingV1().NetworkPolicies(ns).Delete(cctx, name, metav1.DeleteOptions{})
	}
	defer cleanup()
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(int32(allowed.Port))
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelManagedBy: ManagedBy, LabelProbe: id}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelProbe: id}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: hostCIDR(allowed.IP)}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
		},
	}
	if _, err := d.api.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		return npVerdict{detail: "the probe could not create its NetworkPolicy: " + err.Error()}
	}
	if _, err := d.api.CoreV1().Pods(ns).Create(ctx, d.probePod(name, id, allowed.String(), denied.String()), metav1.CreateOptions{}); err != nil {
		return npVerdict{detail: "the probe could not create its pod: " + err.Error()}
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			na, _, _ := hs[0].get()
			nd, _, _ := hs[1].get()
			if na == 0 {
				return npVerdict{detail: fmt.Sprintf("inconclusive: the probe pod never reached the port its policy allows (denied port reached %d times)", nd)}
			}
			return npVerdict{detail: "inconclusive: the probe ran out of time"}
		case <-tick.C:
		}
		na, firstA, lastA := hs[0].get()
		nd, _, lastD := hs[1].get()
		now := time.Now()
		switch {
		case na == 0:
			continue
		case nd > 0 && lastD.Sub(firstA) > probeSettle:
			return npVerdict{done: true, detail: fmt.Sprintf("not enforced: a probe pod reached a port no policy allows (%d connections, the last %s after it first reached the allowed port)",
				nd, lastD.Sub(firstA).Round(time.Second))}
		case now.Sub(firstA) >= probeQuiet && now.Sub(lastD) >= probeQuiet && now.Sub(lastA) < time.Second:
			return npVerdict{done: true, enforced: true, detail: fmt.Sprintf("enforced: a probe pod reached only the port its policy allows (%d connections; the denied port got %d before the policy took hold)", na, nd)}
		}
	}
}

// probePod is the probe's pod: the agent image only, Pod Security restricted, no token, no volume.
func (d *Driver) probePod(name, id, allowed, denied string) *corev1.Pod {
	f, t := false, true
	uid := int64(probeUID)
	zero := int64(0)
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("32Mi")}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelManagedBy: ManagedBy, LabelProbe: id}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &f,
			EnableServiceLinks:            &f,
			TerminationGracePeriodSeconds: &zero,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsUser: &uid, RunAsGroup: &uid, RunAsNonRoot: &t,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "probe",
				Image:           d.opts.AgentImage,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{agentImagePath, "probe-net", strconv.Itoa(probeSeconds), allowed, denied},
				Resources:       corev1.ResourceRequirements{Requests: res, Limits: res},
				SecurityContext: &corev1.SecurityContext{
					RunAsUser: &uid, RunAsGroup: &uid, RunAsNonRoot: &t,
					AllowPrivilegeEscalation: &f, ReadOnlyRootFilesystem: &t, Privileged: &f,
					Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
			}},
		},
	}
}

// hostCIDR is ip's one-address CIDR.
func hostCIDR(ip net.IP) string {
	if ip.To4() != nil {
		return ip.String() + "/32"
	}
	return ip.String() + "/128"
}

// A new pod's NetworkPolicy may take hold only after the pod runs: the plugin programs it when it sees the pod
// (kube-router within a second or two; the probe above sees it as connections to the denied port before the
// policy took hold). A command in that window would have the pod network. So before Start returns a pod it made,
// where enforcement is proven, the driver has the pod's agent dial the canary (a port of this process on the
// channel's IP that no policy allows) once, and again, until a round reaches nothing; a pod that is still open
// after isolationWait is removed and Start fails with NETWORK_UNENFORCED.
const (
	isolationWait  = 30 * time.Second
	isolationRetry = 200 * time.Millisecond
)

// canary counts, by peer IP, the connections that reach a port no policy allows.
type canary struct {
	ln   net.Listener
	mu   sync.Mutex
	hits map[string]int
	wg   sync.WaitGroup
}

func listenCanary(host string) (*canary, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, err
	}
	k := &canary{ln: ln, hits: map[string]int{}}
	k.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
				k.mu.Lock()
				k.hits[a.IP.String()]++
				k.mu.Unlock()
			}
			c.Close()
		}
	})
	return k, nil
}

func (k *canary) count(ip string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.hits[ip]
}

func (k *canary) close() {
	k.ln.Close()
	k.wg.Wait()
}

// canaryOf returns the driver's canary, listening from the first call on.
func (d *Driver) canaryOf() (*canary, error) {
	d.npMu.Lock()
	defer d.npMu.Unlock()
	if d.canary != nil {
		return d.canary, nil
	}
	host, _, err := net.SplitHostPort(d.ch.addr)
	if err != nil {
		return nil, err
	}
	k, err := listenCanary(host)
	if err != nil {
		return nil, err
	}
	d.canary = k
	return k, nil
}

// awaitIsolated returns once pod name (of sandbox sb, at ip) reaches nothing its policy denies, as seen by the
// canary; it does nothing where enforcement is not proven (commands with a network are refused there, and doctor
// says network none is not isolated).
func (d *Driver) awaitIsolated(ctx context.Context, sb *driver.Sandbox, ip string) error {
	if d.ch == nil {
		return nil
	}
	if enforced, _ := d.NetworkPolicy(); !enforced {
		return nil
	}
	k, err := d.canaryOf()
	if err != nil {
		return fault.Wrap(err, fault.NetworkUnenforced, "check that sandkeep may listen on the channel's IP",
			"cannot check that the NetworkPolicy of sandbox %s took hold", sb.Name)
	}
	req := agentproto.Request{Version: agentproto.Version, ID: 1, Argv: []string{driver.AgentPath, "probe-net", "0", k.ln.Addr().String()},
		Workdir: driver.WorkspaceDir, TimeoutMS: 10_000, GraceMS: 100, StdoutLimit: 4096, StderrLimit: 4096}
	deadline := time.Now().Add(isolationWait)
	for round := 1; ; round++ {
		before := k.count(ip)
		res, err := d.Exec(ctx, sb, req, driver.Output{})
		if err != nil {
			return fmt.Errorf("check the isolation of %s: %w", sb.Name, err)
		}
		if res.ExitCode != 0 {
			return fault.New(fault.SandboxFailed, "check the agent image matches this sandkeep",
				"the agent of sandbox %s could not run the isolation check (exit %d)", sb.Name, res.ExitCode)
		}
		time.Sleep(20 * time.Millisecond) // an accepted connection is counted by now: the host is the peer
		if k.count(ip) == before {
			return nil
		}
		if time.Now().After(deadline) {
			return fault.New(fault.NetworkUnenforced, "check the network plugin's health (its pods and logs); sandkeep runs nothing in a pod it cannot isolate",
				"the NetworkPolicy of sandbox %s did not take hold within %s (%d checks reached a denied port)", sb.Name, isolationWait, round)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("check the isolation of %s: %w", sb.Name, ctx.Err())
		case <-time.After(isolationRetry):
		}
	}
}
