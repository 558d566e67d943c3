package kube_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/sandkeep/sandkeep/internal/driver"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/engine/lifecycle"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/identity"
	"github.com/sandkeep/sandkeep/internal/testutil"
)

// These tests need the node's NetworkPolicy enforcement (scripts/k8s-up.sh starts kube-router when
// scripts/k8s-build.sh built it). Every target they dial is a test host: the host's side of the node's veth
// (nodeHostIP, this process's listeners), the node's side (nodeIP), and the test's own pods; the proxy's
// "internet" is a listener of this process on loopback, named allowed.test by the proxy's resolver.
const (
	nodeIP      = "10.213.0.2" // the node's side of its veth (scripts/k8s/env.sh): the API server listens there
	nodeAPIPort = "6443"
	probeBin    = "/workspace/skprobe" // the probe client, written into the workspace by the test
)

// egressNamespace is a fresh namespace for this helper's tests (prefix sk15a-), deleted with everything in it
// (the NetworkPolicies the driver made included) when the test ends.
func (c *cluster) egressNamespace(t *testing.T) string {
	t.Helper()
	return c.namespacePrefixed(t, "sk15a-")
}

// hostListener counts the TCP connections that reach one port of nodeHostIP (the sandkeep server's host).
type hostListener struct {
	ln   net.Listener
	hits atomic.Int64
}

func listenHost(t *testing.T) *hostListener {
	t.Helper()
	ln, err := net.Listen("tcp", nodeHostIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hostListener{ln: ln}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.hits.Add(1)
			c.Close()
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return h
}

func (h *hostListener) addr() string { return h.ln.Addr().String() }

// upstream is the proxy's "internet": an HTTP server on loopback that counts its requests.
type upstream struct {
	port string
	hits atomic.Int64
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{port: strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		fmt.Fprintf(w, "hello from upstream %s", r.URL.Path)
	}), ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	return u
}

type staticResolver map[string][]netip.Addr

func (r staticResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// egressWorld is a lifecycle Manager over the kubernetes driver of a fresh namespace, whose proxies resolve the
// test names to the loopback upstream.
type egressWorld struct {
	c   *cluster
	ns  string
	d   *kube.Driver
	m   *lifecycle.Manager
	up  *upstream
	mu  sync.Mutex
	evs []events.NetworkBlocked
}

func newEgressWorld(t *testing.T, c *cluster, ns string, d *kube.Driver) *egressWorld {
	t.Helper()
	w := &egressWorld{c: c, ns: ns, d: d, up: newUpstream(t)}
	home, err := lifecycle.OpenHome(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	m, err := lifecycle.New(home, d, lifecycle.Config{
		Image: testImage, AgentPath: c.agent, User: "1000:1000",
		NanoCPUs: 250_000_000, MemoryBytes: 256 << 20, // the test node has 2 CPUs, shared with the other tests' pods
		EgressResolver: staticResolver{"allowed.test": lo, "denied.test": lo},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	w.m = m
	return w
}

// key returns a key whose claim has its static volume, removed (sandbox and claim) when the test ends.
func (w *egressWorld) key(t *testing.T, user string) identity.Key {
	t.Helper()
	key, err := identity.New("acme", user+"-"+randHex(t, 3))
	if err != nil {
		t.Fatal(err)
	}
	w.c.volume(t, w.ns, kube.ClaimName(key.ContainerName()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := w.m.Remove(ctx, key, false); err != nil && !fault.Is(err, fault.NotFound) {
			t.Logf("remove %s: %v", key.Short(), err)
		}
	})
	return key
}

type outcome struct {
	exit           int
	stdout, stderr string
}

// exec runs argv in key's sandbox through the lifecycle with network pol (nil: none, no block named; else the
// command's block).
func (w *egressWorld) exec(t *testing.T, ctx context.Context, key identity.Key, pol *egress.Policy, stdin io.Reader, argv ...string) (outcome, error) {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := w.m.Exec(ctx, key, lifecycle.ExecRequest{Argv: argv, Timeout: time.Minute, Stdin: stdin, Stdout: &out, Stderr: &errb,
		Network: pol, NetworkBlock: pol != nil, OnEvent: func(name string, payload any) {
			if b, ok := payload.(events.NetworkBlocked); ok && name == events.NameNetworkBlocked {
				w.mu.Lock()
				w.evs = append(w.evs, b)
				w.mu.Unlock()
			}
		}})
	if err != nil {
		return outcome{}, err
	}
	return outcome{exit: res.ExitCode, stdout: out.String(), stderr: errb.String()}, nil
}

func (w *egressWorld) must(t *testing.T, ctx context.Context, key identity.Key, pol *egress.Policy, argv ...string) outcome {
	t.Helper()
	o, err := w.exec(t, ctx, key, pol, nil, argv...)
	if err != nil {
		t.Fatalf("%q: %v", argv, err)
	}
	return o
}

// installProbe writes skprobe (internal/testutil/probe) into key's workspace.
func (w *egressWorld) installProbe(t *testing.T, ctx context.Context, key identity.Key) {
	t.Helper()
	bin, err := os.ReadFile(testutil.BuildBinary(t, "./internal/testutil/probe", "skprobe", false))
	if err != nil {
		t.Fatal(err)
	}
	o, err := w.exec(t, ctx, key, nil, bytes.NewReader(bin), "sh", "-c", "cat > "+probeBin+" && chmod 755 "+probeBin)
	if err != nil || o.exit != 0 {
		t.Fatalf("install skprobe: %+v, %v", o, err)
	}
}

func (w *egressWorld) blocked(host string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, b := range w.evs {
		if b.Host == host {
			return true
		}
	}
	return false
}

func (w *egressWorld) podIP(t *testing.T, ctx context.Context, key identity.Key) string {
	t.Helper()
	pod, err := w.c.api.CoreV1().Pods(w.ns).Get(ctx, key.ContainerName(), metav1.GetOptions{})
	if err != nil || pod.Status.PodIP == "" {
		t.Fatalf("pod of %s: %v (ip %q)", key.Short(), err, pod.Status.PodIP)
	}
	return pod.Status.PodIP
}

func allowlist(t *testing.T, rules ...string) *egress.Policy {
	t.Helper()
	pol, err := lifecycle.ResolveNetwork(&lifecycle.Network{Mode: "allowlist", Rules: rules}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &pol
}

// TestEgress: with NetworkPolicy enforced (kube-router on the test node), the driver's probe says so; a command
// in a sandbox pod reaches an allowed host through sandkeep's proxy (the agent's 127.0.0.1:3128, carried to the
// server over the channel's address), an unlisted one is refused by the proxy with a network_blocked event, and
// directly, around the proxy, it reaches neither another port of the server's host, nor another sandbox pod,
// nor the node, while each of those targets is up and reachable from where it should be.
func TestEgress(t *testing.T) {
	c := theNode(t)
	ns := c.egressNamespace(t)
	d := c.driver(t, ns)
	c.recordPods(t, ns, checkRestricted)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	if d.Capabilities().NetworkPolicy {
		t.Fatal("Capabilities().NetworkPolicy before any probe")
	}
	start := time.Now()
	ok, detail := d.ProbeNetworkPolicy(ctx)
	t.Logf("probe (%s): %v, %s", time.Since(start).Round(time.Millisecond), ok, detail)
	if !ok || !d.Capabilities().NetworkPolicy {
		t.Fatalf("the probe did not find NetworkPolicy enforced on the test node (is kube-router running? scripts/k8s-up.sh): %s", detail)
	}
	if pods, err := c.api.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelProbe}); err != nil || len(pods.Items) != 0 {
		t.Errorf("the probe left its pod behind: %v, %d", err, len(pods.Items))
	}
	if nps, err := c.api.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelProbe}); err != nil || len(nps.Items) != 0 {
		t.Errorf("the probe left its NetworkPolicy behind: %v, %d", err, len(nps.Items))
	}

	w := newEgressWorld(t, c, ns, d)
	a, b := w.key(t, "egress-a"), w.key(t, "egress-b")
	w.installProbe(t, ctx, a)
	w.installProbe(t, ctx, b)
	pol := allowlist(t, "allowed.test", "127.0.0.1:"+w.up.port)

	// Through the proxy: the allowed host answers, the unlisted one is refused with an event, and nothing of it
	// reaches the upstream.
	o := w.must(t, ctx, a, pol, probeBin, "http", "http://allowed.test:"+w.up.port+"/x")
	if o.exit != 0 || !strings.Contains(o.stdout, "status 200") || !strings.Contains(o.stdout, "hello from upstream /x") {
		t.Fatalf("allowed host through the proxy: %+v", o)
	}
	if n := w.up.hits.Load(); n != 1 {
		t.Fatalf("upstream got %d requests, want 1", n)
	}
	o = w.must(t, ctx, a, pol, probeBin, "http", "http://denied.test:"+w.up.port+"/y")
	if !strings.Contains(o.stdout, "status 403 denied=not-allowlisted") || w.up.hits.Load() != 1 {
		t.Fatalf("unlisted host: %+v (upstream hits %d)", o, w.up.hits.Load())
	}
	if !w.blocked("denied.test") {
		t.Errorf("no network_blocked event for denied.test: %+v", w.evs)
	}
	if st := d.ChannelStats(); st.Egress < 2 {
		t.Errorf("egress connections handed to the proxy: %+v", st)
	}

	// The server's other ports: a listener next to the channel, reached by this process, never by the pod, not
	// directly and not through the proxy (the server's own addresses are refused targets).
	other := listenHost(t)
	if cc, err := net.DialTimeout("tcp", other.addr(), 2*time.Second); err != nil {
		t.Fatalf("the host listener is not reachable from the host: %v", err)
	} else {
		cc.Close()
	}
	o = w.must(t, ctx, a, pol, probeBin, "tcp", other.addr())
	if o.exit == 0 || strings.Contains(o.stdout, "connected") {
		t.Errorf("the pod reached the server's other port %s directly: %+v", other.addr(), o)
	}
	o = w.must(t, ctx, a, pol, probeBin, "http", "http://"+other.addr()+"/")
	if strings.Contains(o.stdout, "status 200") {
		t.Errorf("the pod reached the server's other port through the proxy: %+v", o)
	}
	if n := other.hits.Load(); n != 1 {
		t.Errorf("the server's other port got %d connections, want only the host's own 1", n)
	}

	// The first command of a new pod already runs under its policy: Start waited until the pod's agent reached
	// nothing the policy denies (kube-router programs a new pod's rules a moment after it runs).
	if err := w.m.Stop(ctx, a); err != nil {
		t.Fatal(err)
	}
	o = w.must(t, ctx, a, pol, driver.AgentPath, "probe-net", "0", other.addr())
	if o.exit != 0 || other.hits.Load() != 1 {
		t.Errorf("the first command of a new pod reached the server's other port: %+v, hits %d", o, other.hits.Load())
	}

	// Another sandbox pod: b serves on its pod IP and reaches itself there (a pod's own address is not
	// policed), while a, dialling meanwhile, does not reach it.
	ipB := w.podIP(t, ctx, b)
	addrB := net.JoinHostPort(ipB, "8080")
	var serving sync.WaitGroup
	var ob outcome
	var errB error
	serving.Go(func() {
		ob, errB = w.exec(t, ctx, b, nil, nil, "sh", "-c",
			probeBin+" serve 0.0.0.0:8080 pod-b & sleep 1; "+probeBin+" tcp "+addrB+"; sleep 8; kill $!")
	})
	time.Sleep(3 * time.Second)
	o = w.must(t, ctx, a, pol, probeBin, "tcp", addrB)
	if o.exit == 0 || strings.Contains(o.stdout, "connected") {
		t.Errorf("sandbox pod a reached sandbox pod b at %s directly: %+v", addrB, o)
	}
	o = w.must(t, ctx, a, pol, probeBin, "http", "http://"+addrB+"/")
	if strings.Contains(o.stdout, "status 200") {
		t.Errorf("sandbox pod a reached pod b through the proxy: %+v", o)
	}
	serving.Wait()
	if errB != nil || !strings.Contains(ob.stdout, "connected") {
		t.Errorf("pod b did not serve on %s (the check above proves nothing): %+v, %v", addrB, ob, errB)
	}

	// The node directly: its API server, which this process reaches (it is the cluster's API).
	if cc, err := net.DialTimeout("tcp", net.JoinHostPort(nodeIP, nodeAPIPort), 2*time.Second); err != nil {
		t.Fatalf("the node's API server is not reachable from the host: %v", err)
	} else {
		cc.Close()
	}
	o = w.must(t, ctx, a, pol, probeBin, "tcp", net.JoinHostPort(nodeIP, nodeAPIPort))
	if o.exit == 0 || strings.Contains(o.stdout, "connected") {
		t.Errorf("the pod reached the node %s directly: %+v", nodeIP, o)
	}

	// Network none: no proxy environment, and the forwarder leads to a proxy with no session (the last
	// command's token is void).
	o = w.must(t, ctx, a, nil, "sh", "-c", "env | grep -ci _proxy=; HTTP_PROXY=http://sandkeep:stale@"+"127.0.0.1:3128 "+probeBin+" proxied http://allowed.test:"+w.up.port+"/z")
	if !strings.HasPrefix(o.stdout, "0\n") || strings.Contains(o.stdout, "status 200") || w.up.hits.Load() != 1 {
		t.Errorf("a command with network none had a proxy, or reached the upstream: %+v", o)
	}
}

// TestEgressUnenforced: where NetworkPolicy is not enforced, a command with a network block is refused with
// NETWORK_UNENFORCED and does not run; a command without one still runs, and doctor's view (the probe's detail)
// says the pods are not isolated. Absence is made the way a cluster without an enforcing plugin behaves for
// these pods: a policy in the test's namespace that lets them reach anything, so the probe pod reaches the port
// nothing else allows. Without the channel there is no egress path at all: refused the same way, without a probe.
func TestEgressUnenforced(t *testing.T) {
	c := theNode(t)
	ns := c.egressNamespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c.recordPods(t, ns, checkRestricted)
	d := c.driver(t, ns)
	if err := d.Ping(ctx); err != nil { // creates the namespace
		t.Fatal(err)
	}
	open := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "sk15a-open-egress"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{}},
		},
	}
	if _, err := c.api.NetworkingV1().NetworkPolicies(ns).Create(ctx, open, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ok, detail := d.ProbeNetworkPolicy(ctx)
	t.Logf("probe: %v, %s", ok, detail)
	if ok || d.Capabilities().NetworkPolicy || !strings.Contains(detail, "not enforced") {
		t.Fatalf("the probe took open egress for enforcement: %v, %s", ok, detail)
	}

	w := newEgressWorld(t, c, ns, d)
	key := w.key(t, "unenforced")
	_, err := w.exec(t, ctx, key, allowlist(t, "allowed.test", "127.0.0.1:"+w.up.port), nil, "sh", "-c", "echo ran > /workspace/ran")
	var fe *fault.Error
	if !errors.As(err, &fe) || fe.Code != fault.NetworkUnenforced || fe.Hint == "" {
		t.Fatalf("a command with a network block where NetworkPolicy is not enforced: %v; want %s with a hint", err, fault.NetworkUnenforced)
	}
	t.Logf("refused: %v (hint: %s)", err, fe.Hint)
	o := w.must(t, ctx, key, nil, "sh", "-c", "cat /workspace/ran 2>/dev/null; echo none-ran")
	if o.stdout != "none-ran\n" {
		t.Errorf("the refused command ran, or network none did not: %+v", o)
	}
	if w.up.hits.Load() != 0 {
		t.Errorf("the upstream was reached")
	}

	// A block that says none: the pod would have the pod network, so none is not true: refused the same way,
	// unless the operator accepted it.
	none := &egress.Policy{Mode: egress.ModeNone}
	_, err = w.exec(t, ctx, key, none, nil, "sh", "-c", "echo ran > /workspace/ran-none")
	if !errors.As(err, &fe) || fe.Code != fault.NetworkUnenforced || !strings.Contains(fe.Hint, kube.EnvAllowUnenforcedNone) {
		t.Fatalf("network none named where NetworkPolicy is not enforced: %v; want %s naming %s", err, fault.NetworkUnenforced, kube.EnvAllowUnenforcedNone)
	}
	t.Logf("refused: %v (hint: %s)", err, fe.Hint)
	if o := w.must(t, ctx, key, nil, "sh", "-c", "cat /workspace/ran-none 2>/dev/null; echo checked"); o.stdout != "checked\n" {
		t.Errorf("the refused none command ran: %+v", o)
	}
	opts := c.k.Options(ns)
	opts.AllowUnenforcedNone = true
	accepted := newEgressWorld(t, c, ns, c.newDriver(t, opts))
	if o, err := accepted.exec(t, ctx, accepted.key(t, "accepted"), none, nil, "sh", "-c", "echo accepted"); err != nil || o.stdout != "accepted\n" {
		t.Errorf("network none with %s: %+v, %v", kube.EnvAllowUnenforcedNone, o, err)
	}

	// No channel: no way to the proxy.
	dx := c.driverExec(t, ns)
	if ok, detail := dx.ProbeNetworkPolicy(ctx); ok || !strings.Contains(detail, kube.EnvChannelListen) {
		t.Errorf("probe without the channel: %v, %s", ok, detail)
	}
	_, err = dx.ListenEgress(ctx, &driver.Sandbox{Name: key.ContainerName(), ID: "x"})
	if !errors.As(err, &fe) || fe.Code != fault.NetworkUnenforced {
		t.Errorf("ListenEgress without the channel: %v; want %s", err, fault.NetworkUnenforced)
	}
}

// TestListenEgressNoChannel needs no cluster: a driver without the agent channel refuses a network at once.
func TestListenEgressNoChannel(t *testing.T) {
	d, err := kube.New(kube.Options{REST: &rest.Config{Host: "https://127.0.0.1:1"}, AgentImage: testAgentImage})
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.ListenEgress(context.Background(), &driver.Sandbox{Name: "sandkeep-u-x", ID: "x"})
	var fe *fault.Error
	if !errors.As(err, &fe) || fe.Code != fault.NetworkUnenforced || !strings.Contains(fe.Hint, kube.EnvChannelListen) {
		t.Fatalf("ListenEgress = %v; want %s naming %s", err, fault.NetworkUnenforced, kube.EnvChannelListen)
	}
	if d.Capabilities().NetworkPolicy {
		t.Error("Capabilities().NetworkPolicy without a probe")
	}
	// Nor can it prove network none: a block that says none is refused too, unless the operator accepted it.
	err = d.CheckNoNetwork(context.Background(), &driver.Sandbox{Name: "sandkeep-u-x", ID: "x"})
	if !errors.As(err, &fe) || fe.Code != fault.NetworkUnenforced || !strings.Contains(fe.Hint, kube.EnvAllowUnenforcedNone) {
		t.Fatalf("CheckNoNetwork = %v; want %s naming %s", err, fault.NetworkUnenforced, kube.EnvAllowUnenforcedNone)
	}
	d, err = kube.New(kube.Options{REST: &rest.Config{Host: "https://127.0.0.1:1"}, AgentImage: testAgentImage, AllowUnenforcedNone: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.CheckNoNetwork(context.Background(), &driver.Sandbox{Name: "sandkeep-u-x", ID: "x"}); err != nil {
		t.Errorf("CheckNoNetwork with AllowUnenforcedNone: %v", err)
	}
}
