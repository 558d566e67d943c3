package sandkeep_test

// Egress, end to end against the real engine: a sandbox reaches the network only through its own proxy, which
// lets out what the policy allows and refuses (and reports) the rest. "The internet" is made of recording servers
// on the host's loopback, reached by test names through a test resolver; nothing leaves the machine.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandkeep/sandkeep"
	"github.com/sandkeep/sandkeep/internal/driver/kube"
	"github.com/sandkeep/sandkeep/internal/events"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/internal/testutil"
	"github.com/sandkeep/sandkeep/internal/testutil/kubetest"
	"github.com/sandkeep/sandkeep/processes"
	"github.com/sandkeep/sandkeep/stores"
)

// recorder is an upstream that counts and keeps what reached it.
type recorder struct {
	mu   sync.Mutex
	reqs []*http.Request
	auth []string
	body []string
	srv  *httptest.Server
}

func newRecorder(t *testing.T, tlsOn bool) *recorder {
	r := &recorder{}
	h := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(req.Body, 1<<20))
		r.mu.Lock()
		r.reqs = append(r.reqs, req)
		r.auth = append(r.auth, req.Header.Get("Authorization"))
		r.body = append(r.body, string(b))
		r.mu.Unlock()
		fmt.Fprintf(w, "hello from upstream, proto %s", req.Proto)
	})
	if tlsOn {
		r.srv = httptest.NewUnstartedServer(h)
		r.srv.EnableHTTP2 = true
		r.srv.TLS = &tls.Config{Certificates: []tls.Certificate{testCert(t, "allowed.test", "other.test")}}
		r.srv.StartTLS()
	} else {
		r.srv = httptest.NewServer(h)
	}
	t.Cleanup(r.srv.Close)
	return r
}

// testCert is a self-signed certificate for names (the test upstream's: the proxy verifies it by name).
func testCert(t *testing.T, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (r *recorder) port() string {
	_, p, _ := net.SplitHostPort(r.srv.Listener.Addr().String())
	return p
}

func (r *recorder) hits() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reqs)
}

// testResolver maps test names to addresses and remembers every name it was asked for.
type testResolver struct {
	mu    sync.Mutex
	names map[string][]netip.Addr
	asked []string
}

func (r *testResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, host)
	if a, ok := r.names[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (r *testResolver) wasAsked(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.asked, name)
}

// tcpRecorder counts TCP connections and UDP datagrams on one port of every host address.
type tcpRecorder struct {
	mu   sync.Mutex
	hits int
	port int
}

func newTCPRecorder(t *testing.T) *tcpRecorder {
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &tcpRecorder{port: ln.Addr().(*net.TCPAddr).Port}
	pc, err := net.ListenPacket("udp", "0.0.0.0:"+strconv.Itoa(r.port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); pc.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.hits++
			r.mu.Unlock()
			c.Close()
		}
	}()
	go func() {
		b := make([]byte, 512)
		for {
			if _, _, err := pc.ReadFrom(b); err != nil {
				return
			}
			r.mu.Lock()
			r.hits++
			r.mu.Unlock()
		}
	}()
	return r
}

func (r *tcpRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hits
}

type egressWorld struct {
	*suite
	plain, secure *recorder
	resolver      *testResolver
	blocked       []events.NetworkBlocked
	mu            sync.Mutex
}

// newEgressWorld opens a manager over the probe image whose proxies resolve through a test resolver and trust
// the TLS recorder's certificate; network is the Config's block.
func newEgressWorld(t *testing.T, network *sandkeep.Network, silent ...string) *egressWorld {
	t.Helper()
	w := &egressWorld{plain: newRecorder(t, false), secure: newRecorder(t, true)}
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	w.resolver = &testResolver{names: map[string][]netip.Addr{
		"allowed.test": lo, "other.test": lo, "denied.test": lo, "telemetry.test": lo,
		"rebind.test": lo, "localhost": lo, "metadata.test": {netip.MustParseAddr("169.254.169.254")},
	}}
	roots := x509.NewCertPool()
	roots.AddCert(w.secure.srv.Certificate())
	cfg := baseConfig(t)
	if onKube {
		cfg.Image = kubetest.ProbeImage // imported into the node with the other test images
	} else {
		cfg.Image = testutil.ProbeImage(t)
	}
	cfg.Network = network
	cfg.NetworkSilent = silent
	sandkeep.SetEgressHooks(&cfg, w.resolver, roots)
	w.suite = newSuite(t, cfg)
	return w
}

// run runs req and collects its network_blocked events.
func (w *egressWorld) run(key sandkeep.Key, req sandkeep.ExecRequest) *sandkeep.ExecResult {
	w.t.Helper()
	return w.runNet(key, nil, req)
}

// runNet runs req in a run with the network block net over the run's, and collects its network_blocked events.
func (w *egressWorld) runNet(key sandkeep.Key, net *sandkeep.Network, req sandkeep.ExecRequest) *sandkeep.ExecResult {
	w.t.Helper()
	obs := sandkeep.Observer{Event: func(name string, payload any) {
		if b, ok := payload.(events.NetworkBlocked); ok && name == events.NameNetworkBlocked {
			w.mu.Lock()
			w.blocked = append(w.blocked, b)
			w.mu.Unlock()
		}
	}}
	return w.execRun(w.m, sandkeep.RunRequest{Key: key, Network: net, Observer: obs}, req)
}

func (w *egressWorld) probe(key sandkeep.Key, args ...string) *sandkeep.ExecResult {
	w.t.Helper()
	return w.run(key, sandkeep.ExecRequest{Argv: append([]string{testutil.ProbePath}, args...), Timeout: time.Minute})
}

func (w *egressWorld) blocks() []events.NetworkBlocked {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.blocked)
}

func (w *egressWorld) blockedFor(host string) (events.NetworkBlocked, bool) {
	for _, b := range w.blocks() {
		if b.Host == host {
			return b, true
		}
	}
	return events.NetworkBlocked{}, false
}

// TestEgressAllowlist: an allowed host is reached through the proxy from inside the sandbox; an unlisted one gets
// 403 with the reason and a network_blocked event carrying the key, and no request reaches it.
func TestEgressAllowlist(t *testing.T) {
	t.Parallel()
	w := newEgressWorld(t, nil)
	dsn := filepath.Join(t.TempDir(), "runs.db")
	w.m = w.open(withStore(t, w.cfg, dsn))
	p := w.plain.port()
	key := w.key("acme", "egress")
	net := &sandkeep.Network{Mode: "allowlist", Rules: []string{"allowed.test", "127.0.0.1:" + p}}

	res := w.runNet(key, net, sandkeep.ExecRequest{Argv: []string{testutil.ProbePath, "http", "http://allowed.test:" + p + "/x"}})
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "status 200") || !strings.Contains(res.Stdout, "hello from upstream") {
		t.Fatalf("allowed host: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	if w.plain.hits() != 1 {
		t.Fatalf("upstream got %d requests, want 1", w.plain.hits())
	}

	res = w.runNet(key, net, sandkeep.ExecRequest{Argv: []string{testutil.ProbePath, "http", "http://denied.test:" + p + "/x"}})
	if !strings.Contains(res.Stdout, "status 403 denied=not-allowlisted") {
		t.Fatalf("unlisted host: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	if w.plain.hits() != 1 {
		t.Fatalf("the refused request reached the upstream (%d hits)", w.plain.hits())
	}
	if w.resolver.wasAsked("denied.test") {
		t.Error("the proxy resolved a name the allowlist refuses: a DNS query leaves for every refused name")
	}
	b, ok := w.blockedFor("denied.test")
	if !ok {
		t.Fatalf("no network_blocked event for denied.test; got %+v", w.blocks())
	}
	if b.Reason != "not-allowlisted" || b.Key != key.Short() || b.Sandbox != key.ContainerName() || b.Port == 0 {
		t.Errorf("network_blocked = %+v", b)
	}
	// The event is recorded in the run of the command that made the request.
	st, err := stores.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	evs, err := st.ListEvents(t.Context(), store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var recorded bool
	for _, ev := range evs {
		if ev.Name != events.NameNetworkBlocked || !strings.Contains(string(ev.Payload), `"denied.test"`) {
			continue
		}
		// The run's finish is written by the store's group commit, after Exec returned: wait for it, briefly.
		run, err := st.GetRun(t.Context(), ev.RunID)
		for deadline := time.Now().Add(10 * time.Second); err == nil && run.Status == store.StatusRunning && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
			run, err = st.GetRun(t.Context(), ev.RunID)
		}
		if err != nil || run.Tenant != key.Tenant || run.User != key.User || run.Status != store.StatusSucceeded {
			t.Errorf("network_blocked recorded in run %q: %+v, %v", ev.RunID, run, err)
		}
		recorded = true
	}
	if !recorded {
		t.Error("no network_blocked event in the store")
	}

	// Without a network block the command has no network at all: no proxy in its environment.
	res = w.run(key, sandkeep.ExecRequest{Argv: []string{"sh", "-c", "echo proxy=$HTTP_PROXY; " + testutil.ProbePath + " http http://allowed.test:" + p + "/"}})
	if !strings.Contains(res.Stdout, "proxy=\n") || res.ExitCode == 0 {
		t.Errorf("mode none: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	if w.plain.hits() != 1 {
		t.Errorf("mode none reached the upstream")
	}
}

// TestEgressNoBypass: nothing but the proxy is reachable. Direct TCP and UDP to the host's addresses (the
// recording server listens on all of them, the bridge gateway included) fail with zero hits; the sandbox has no
// interface but loopback and no route; DNS through any server fails and reaches no recording resolver.
func TestEgressNoBypass(t *testing.T) {
	t.Parallel()
	w := newEgressWorld(t, &sandkeep.Network{Mode: "open"})
	rec := newTCPRecorder(t)
	key := w.key("acme", "bypass")
	port := strconv.Itoa(rec.port)

	targets := []string{"127.0.0.1", "172.17.0.1"}
	if onKube {
		// A pod has the pod network, confined by NetworkPolicy: the server's host as the pod reaches it (the
		// host's side of the node's veth, a test host) and the pod's own loopback. The host's other addresses are
		// not test hosts; internal/driver/kube's TestEgress covers another pod and the node.
		targets = []string{"127.0.0.1", kubetest.NodeHostIP}
	} else {
		if gw := bridgeGateway(t, w.cli); gw != "" && gw != "172.17.0.1" {
			targets = append(targets, gw)
		}
		targets = append(targets, hostIPv4s(t)...)
	}
	for _, host := range targets {
		addr := net.JoinHostPort(host, port)
		if res := w.probe(key, "tcp", addr); res.ExitCode == 0 {
			t.Errorf("direct TCP to %s connected from inside the sandbox: %s", addr, res.Stdout)
		}
		w.probe(key, "udp", addr, "hello")
		// A DNS query to a resolver on the host (the recording server on the same port).
		w.probe(key, "dns", "unique-"+w.id+".test", addr)
	}
	time.Sleep(200 * time.Millisecond) // a datagram in flight would land by now
	if n := rec.count(); n != 0 {
		t.Errorf("the recording server on the host got %d connections or datagrams from the sandbox", n)
	}
	// Docker: no interface but loopback, no route. A pod has its interface and route (its confinement is the
	// NetworkPolicy, which the direct dials above just met).
	if !onKube {
		checkNoInterfaces(t, w.sh(key, "cat /proc/net/dev; echo routes; cat /proc/net/route; echo v6; cat /proc/net/ipv6_route 2>/dev/null; echo end"))
	}
	if res := w.probe(key, "dns", "unique2-"+w.id+".test"); res.ExitCode == 0 {
		t.Errorf("a name resolved inside the sandbox: %s", res.Stdout)
	}
	if w.resolver.wasAsked("unique-"+w.id+".test") || w.resolver.wasAsked("unique2-"+w.id+".test") {
		t.Error("a DNS query made inside the sandbox reached the proxy's resolver")
	}
	// The proxy itself, dialled as a target, is refused (no chaining through its own listener).
	res := w.probe(key, "proxied", "http://127.0.0.1:3128/")
	if !strings.Contains(res.Stdout, "status 403") {
		t.Errorf("request to the proxy's own address: %s%s", res.Stdout, res.Stderr)
	}
}

// checkNoInterfaces fails t when out (/proc/net/dev, "routes", /proc/net/route, "v6", ...) shows an interface
// besides lo or an IPv4 route.
func checkNoInterfaces(t *testing.T, out string) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if name, _, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.Contains(name, "|") && name != "lo" && name != "Inter-" {
			t.Errorf("the sandbox has a network interface besides lo: %q", line)
		}
	}
	routes := out[strings.Index(out, "routes"):]
	if lines := strings.Count(strings.TrimSpace(routes[:strings.Index(routes, "v6")]), "\n"); lines > 1 {
		t.Errorf("the sandbox has IPv4 routes:\n%s", routes)
	}
}

// TestEgressAddressClasses: numeric spellings of loopback and metadata addresses, IPv6-mapped forms, and names
// that resolve to them (rebinding) are all refused, even in open mode, and nothing is dialled.
func TestEgressAddressClasses(t *testing.T) {
	t.Parallel()
	w := newEgressWorld(t, &sandkeep.Network{Mode: "open"})
	p := w.plain.port()
	key := w.key("acme", "classes")
	for _, host := range []string{"127.0.0.1", "127.1", "0x7f.1", "2130706433", "0177.0.0.1", "[::1]", "[::ffff:127.0.0.1]",
		"[::ffff:7f00:1]", "169.254.169.254", "[::ffff:a9fe:a9fe]", "rebind.test", "metadata.test", "localhost"} {
		res := w.probe(key, "proxied", "http://"+host+":"+p+"/")
		if !strings.Contains(res.Stdout, "status 403") {
			t.Errorf("%s: want 403, got exit %d: %s%s", host, res.ExitCode, res.Stdout, res.Stderr)
		}
	}
	if n := w.plain.hits(); n != 0 {
		t.Errorf("refused addresses reached the upstream %d times", n)
	}
	for _, name := range []string{"rebind.test", "metadata.test"} {
		b, ok := w.blockedFor(name)
		if !ok || (b.Reason != "loopback" && b.Reason != "metadata") || b.Addr == "" {
			t.Errorf("%s: network_blocked = %+v, %v", name, b, ok)
		}
	}
}

// TestEgressSilent: a host on the silent list is refused without an event.
func TestEgressSilent(t *testing.T) {
	t.Parallel()
	w := newEgressWorld(t, &sandkeep.Network{Mode: "open"}, "telemetry.test")
	key := w.key("acme", "silent")
	res := w.probe(key, "http", "http://telemetry.test:"+w.plain.port()+"/")
	if !strings.Contains(res.Stdout, "status 403") {
		t.Fatalf("silent host: %s%s", res.Stdout, res.Stderr)
	}
	if _, ok := w.blockedFor("telemetry.test"); ok || w.plain.hits() != 0 {
		t.Errorf("silent host: event %v, upstream hits %d", ok, w.plain.hits())
	}
}

// TestEgressCredentials: a credential is injected for its host only. Inside the sandbox it is a placeholder; the
// upstream of its host gets the real value, over TLS the proxy inspects; a request carrying it to any other host
// is refused and never arrives; the real value appears nowhere the sandbox or an operator's tools can see it.
func TestEgressCredentials(t *testing.T) {
	t.Parallel()
	sentinel := "sk-live-" + randHex(16)
	w := newEgressWorld(t, &sandkeep.Network{
		Mode:        "allowlist",
		Rules:       []string{"allowed.test", "other.test", "127.0.0.1"},
		Credentials: []sandkeep.Credential{{Name: "API_TOKEN", Value: sentinel, Hosts: []string{"allowed.test"}}},
	})
	key := w.key("acme", "creds")
	sp := w.secure.port()

	res := w.probe(key, "http", "https://allowed.test:"+sp+"/api", "Authorization=Bearer $API_TOKEN")
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "status 200") {
		t.Fatalf("credential host: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	w.secure.mu.Lock()
	got := slices.Clone(w.secure.auth)
	w.secure.mu.Unlock()
	if len(got) != 1 || got[0] != "Bearer "+sentinel {
		t.Fatalf("upstream Authorization = %q, want the real value", got)
	}
	// The body too.
	res = w.probe(key, "post", "https://allowed.test:"+sp+"/api", "token=${API_TOKEN}")
	if !strings.Contains(res.Stdout, "status 200") {
		t.Fatalf("POST with the placeholder in the body: %s%s", res.Stdout, res.Stderr)
	}

	placeholder := strings.TrimSpace(w.sh(key, "echo $API_TOKEN"))
	if placeholder == "" || strings.Contains(placeholder, sentinel) {
		t.Fatalf("the sandbox sees %q as API_TOKEN", placeholder)
	}
	before := w.secure.hits()
	res = w.probe(key, "http", "https://other.test:"+sp+"/steal", "Authorization=Bearer $API_TOKEN")
	if !strings.Contains(res.Stdout, "status 403 denied=credential-leak") {
		t.Errorf("placeholder to another host: %s%s", res.Stdout, res.Stderr)
	}
	res = w.probe(key, "http", "http://other.test:"+w.plain.port()+"/steal", "X-Leak="+sentinel)
	if !strings.Contains(res.Stdout, "status 403") {
		t.Errorf("the real value to another host: %s%s", res.Stdout, res.Stderr)
	}
	if w.secure.hits() != before || w.plain.hits() != 0 {
		t.Errorf("a refused credential request reached an upstream")
	}
	if b, ok := w.blockedFor("other.test"); !ok || b.Reason != "credential-leak" || b.Rule != "API_TOKEN" {
		t.Errorf("network_blocked for the leak = %+v, %v", b, ok)
	}

	// TLS inspection: an SNI that differs from the CONNECT host is refused.
	res = w.probe(key, "sni", "allowed.test:"+sp, "other.test")
	if res.ExitCode == 0 {
		t.Errorf("SNI mismatch was let through: %s", res.Stdout)
	}
	if !slices.ContainsFunc(w.blocks(), func(b events.NetworkBlocked) bool { return b.Reason == "sni-mismatch" }) {
		t.Errorf("no network_blocked event for the SNI mismatch: %+v", w.blocks())
	}

	// The value is nowhere to be seen: not in the sandbox's environment or files, docker inspect, logs, events.
	if out := w.sh(key, "cat /proc/1/environ /proc/self/environ | tr '\\0' '\\n'; ls -R /workspace /.sandkeep-chan; cat /.sandkeep-chan/*.pem | head -c 0"); strings.Contains(out, sentinel) {
		t.Error("the real value is visible inside the sandbox")
	}
	if onKube {
		// What `kubectl get -o yaml` and `kubectl logs` show of the sandbox: its pod and record, its logs.
		if js := w.kubeObjects(key); strings.Contains(js, sentinel) {
			t.Error("the real value is in the sandbox's pod or record")
		}
		if strings.Contains(w.kubeLogs(key), sentinel) {
			t.Error("the real value is in the pod's logs")
		}
	} else if raw, err := w.cli.ContainerInspect(context.Background(), key.ContainerName(), client.ContainerInspectOptions{}); err != nil {
		t.Fatal(err)
	} else if js, _ := json.Marshal(raw.Container); strings.Contains(string(js), sentinel) {
		t.Error("the real value is in docker inspect")
	}
	logs, err := w.logs(key)
	if err == nil {
		b, _ := io.ReadAll(logs)
		logs.Close()
		if strings.Contains(string(b), sentinel) {
			t.Error("the real value is in the container's logs")
		}
	}
	for _, b := range w.blocks() {
		if js, _ := json.Marshal(b); strings.Contains(string(js), sentinel) {
			t.Errorf("the real value is in an event: %s", js)
		}
	}
}

// TestEgressPresetAndInherit: a command's block appends to the Config's (its rules win) or replaces it.
func TestEgressPresetAndInherit(t *testing.T) {
	t.Parallel()
	p := ""
	w := newEgressWorld(t, &sandkeep.Network{Mode: "allowlist", Preset: "default"})
	p = w.plain.port()
	key := w.key("acme", "inherit")
	url := "http://allowed.test:" + p + "/"
	if res := w.probe(key, "http", url); !strings.Contains(res.Stdout, "status 403 denied=not-allowlisted") {
		t.Fatalf("preset only: %s%s", res.Stdout, res.Stderr)
	}
	add := &sandkeep.Network{Rules: []string{"allowed.test", "127.0.0.1:" + p}}
	if res := w.runNet(key, add, sandkeep.ExecRequest{Argv: []string{testutil.ProbePath, "http", url}}); !strings.Contains(res.Stdout, "status 200") {
		t.Fatalf("appended rules: %s%s", res.Stdout, res.Stderr)
	}
	deny := &sandkeep.Network{Rules: []string{"!allowed.test"}}
	if res := w.runNet(key, deny, sandkeep.ExecRequest{Argv: []string{testutil.ProbePath, "http", url}}); !strings.Contains(res.Stdout, "status 403") {
		t.Fatalf("appended negation: %s%s", res.Stdout, res.Stderr)
	}
	none := &sandkeep.Network{Mode: "none", Inherit: "replace"}
	if res := w.runNet(key, none, sandkeep.ExecRequest{Argv: []string{"sh", "-c", "echo [$HTTPS_PROXY]"}}); trim(res.Stdout) != "[]" {
		t.Fatalf("replaced by none: %q", res.Stdout)
	}
	_, err := w.m.ExecWith(t.Context(), sandkeep.RunRequest{Key: key, Network: &sandkeep.Network{Preset: "nope"}}, sandkeep.ExecRequest{Argv: []string{"true"}})
	if sandkeep.CodeOf(err) != "NETWORK_INVALID" || !strings.Contains(err.Error(), "nope") {
		t.Errorf("unknown preset: %v", err)
	}
}

// TestEgressBundleKeepsImageRoots: with TLS inspection, the bundle the sandbox trusts holds the proxy's CA and
// the image's own trust store, so a client pointed at it still trusts what it trusted before.
func TestEgressBundleKeepsImageRoots(t *testing.T) {
	t.Parallel()
	imageRoot := testCert(t, "image-root.test")
	block := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: imageRoot.Certificate[0]})
	cfg := baseConfig(t)
	if !onKube { // on kubernetes the bundle is the proxy's CA alone (the driver does not read the image's roots)
		cfg.Image = testutil.ImageWithFiles(t, testutil.TestImage(t), map[string]testutil.ImageFile{
			"/etc/ssl/certs/ca-certificates.crt": {Data: append([]byte("# an image's trust store\n"), block...)},
		})
	}
	cfg.Network = &sandkeep.Network{Mode: "allowlist", Rules: []string{"api.example.test"}, Inspect: "on"}
	s := newSuite(t, cfg)
	key := s.key("acme", "bundle")
	out := s.sh(key, "cat $SSL_CERT_FILE")
	var subjects []string
	for rest := []byte(out); ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatalf("the bundle holds a block that is not a certificate: %v", err)
		}
		subjects = append(subjects, c.Subject.CommonName)
	}
	if onKube {
		// Placed by the agent on the pod's secrets tmpfs, where no secret file may go; a recreated pod gets it
		// again (its tmpfs starts empty).
		if len(subjects) != 1 || !strings.Contains(subjects[0], "sandkeep") {
			t.Errorf("bundle subjects = %q, want the proxy's CA", subjects)
		}
		if err := s.m.Stop(t.Context(), key); err != nil {
			t.Fatal(err)
		}
		if out := s.sh(key, "cat $SSL_CERT_FILE"); !strings.Contains(out, "BEGIN CERTIFICATE") {
			t.Errorf("the bundle after the pod was made again: %q", out)
		}
		return
	}
	if len(subjects) != 2 || subjects[1] != "image-root.test" || !strings.Contains(subjects[0], "sandkeep") {
		t.Errorf("bundle subjects = %q, want the proxy's CA then the image's root", subjects)
	}
}

// kubeObjects is the sandbox's pod and record (ConfigMap) as JSON, what `kubectl get -o yaml` shows.
func (s *suite) kubeObjects(key sandkeep.Key) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pod, err := s.kc.API.CoreV1().Pods(s.ns).Get(ctx, key.ContainerName(), metav1.GetOptions{})
	if err != nil {
		s.t.Fatalf("get pod %s: %v", key.ContainerName(), err)
	}
	cm, err := s.kc.API.CoreV1().ConfigMaps(s.ns).Get(ctx, key.ContainerName(), metav1.GetOptions{})
	if err != nil {
		s.t.Fatalf("get record %s: %v", key.ContainerName(), err)
	}
	a, _ := json.Marshal(pod)
	b, _ := json.Marshal(cm)
	return string(a) + string(b)
}

// kubeLogs is what `kubectl logs` shows of the sandbox's pod (its containers, the init container's included).
func (s *suite) kubeLogs(key sandkeep.Key) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var all []byte
	for _, c := range []string{kube.ContainerName, kube.InitName} {
		b, err := s.kc.API.CoreV1().Pods(s.ns).GetLogs(key.ContainerName(), &corev1.PodLogOptions{Container: c}).DoRaw(ctx)
		if err != nil {
			s.t.Fatalf("logs of %s/%s: %v", key.ContainerName(), c, err)
		}
		all = append(all, b...)
	}
	return string(all)
}

// logs is the sandbox's container logs on Docker (io.EOF-terminated), an error on kubernetes (kubeLogs).
func (s *suite) logs(key sandkeep.Key) (io.ReadCloser, error) {
	if s.cli == nil {
		return nil, errors.New("no Docker on kubernetes")
	}
	return s.cli.ContainerLogs(context.Background(), key.ContainerName(), client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true})
}

func withStore(t *testing.T, cfg sandkeep.Config, dsn string) sandkeep.Config {
	st, err := stores.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cfg.Store = st
	return cfg
}

func bridgeGateway(t *testing.T, cli *client.Client) string {
	res, err := cli.NetworkInspect(context.Background(), "bridge", client.NetworkInspectOptions{})
	if err != nil {
		return ""
	}
	for _, c := range res.Network.IPAM.Config {
		if c.Gateway.IsValid() {
			return c.Gateway.String()
		}
	}
	return ""
}

func hostIPv4s(t *testing.T) []string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() {
			out = append(out, p.Addr().String())
		}
	}
	return out
}

// TestEgressPerCommand: a command's network policy and proxy token are its own and end with it. A later command
// without a network block, or one with another policy, cannot reach the first command's hosts by reusing the
// first command's proxy URL (what a process it left behind would hold), and each command gets a fresh token.
func TestEgressPerCommand(t *testing.T) {
	t.Parallel()
	w := newEgressWorld(t, nil)
	p := w.plain.port()
	key := w.key("acme", "percommand")
	allowed := &sandkeep.Network{Mode: "allowlist", Rules: []string{"allowed.test", "127.0.0.1:" + p}}
	other := &sandkeep.Network{Mode: "allowlist", Rules: []string{"other.test", "127.0.0.1:" + p}}
	url := "http://allowed.test:" + p + "/x"

	proxyOf := func(net *sandkeep.Network) string {
		res := w.runNet(key, net, sandkeep.ExecRequest{Argv: []string{"sh", "-c", "echo $HTTP_PROXY; " + testutil.ProbePath + " http " + url}})
		first, _, _ := strings.Cut(res.Stdout, "\n")
		return strings.TrimSpace(first)
	}
	first := proxyOf(allowed)
	if first == "" || w.plain.hits() != 1 {
		t.Fatalf("the first command: proxy %q, %d hits", first, w.plain.hits())
	}
	if second := proxyOf(allowed); second == first || second == "" {
		t.Errorf("two commands got the same proxy URL (token): %q", second)
	}
	hits := w.plain.hits()

	// The first command's proxy URL, used by a later command with no network or with another policy.
	for _, net := range []*sandkeep.Network{nil, {Mode: "none"}, other} {
		res := w.runNet(key, net, sandkeep.ExecRequest{Argv: []string{"sh", "-c", "HTTP_PROXY=" + first + " " + testutil.ProbePath + " proxied " + url}})
		if !strings.Contains(res.Stdout, "status 407") {
			t.Errorf("network %+v: an earlier command's token: exit %d\n%s%s", net, res.ExitCode, res.Stdout, res.Stderr)
		}
	}
	// A command with no network block after one that had a policy does not inherit it through the proxy.
	res := w.runNet(key, other, sandkeep.ExecRequest{Argv: []string{testutil.ProbePath, "http", url}})
	if !strings.Contains(res.Stdout, "status 403 denied=not-allowlisted") {
		t.Errorf("another policy still allowed the earlier command's host: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	if got := w.plain.hits(); got != hits {
		t.Errorf("the earlier command's host got %d more requests after its command ended", got-hits)
	}
}

// TestEgressRefusalFlood: a command refused in a loop costs the store one network_blocked event for the host and
// one network_blocked_repeats counting the rest, not one write per refusal.
func TestEgressRefusalFlood(t *testing.T) {
	t.Parallel()
	w := newEgressWorld(t, nil)
	dsn := filepath.Join(t.TempDir(), "runs.db")
	w.m = w.open(withStore(t, w.cfg, dsn))
	p := w.plain.port()
	key := w.key("acme", "flood")
	const n = 40
	script := "i=0; while [ $i -lt " + strconv.Itoa(n) + " ]; do " + testutil.ProbePath + " http http://denied.test:" + p + "/x >/dev/null; i=$((i+1)); done"
	w.runNet(key, &sandkeep.Network{Mode: "allowlist", Rules: []string{"allowed.test"}}, sandkeep.ExecRequest{Argv: []string{"sh", "-c", script}})
	st, err := stores.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// The summary is written at the command's end by the store's group commit, after Exec returned: wait for it, briefly.
	var evs []store.Event
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if evs, err = st.ListEvents(t.Context(), store.EventFilter{}); err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(evs, func(ev store.Event) bool { return ev.Name == events.NameNetworkBlockedRepeat }) || time.Now().After(deadline) {
			break
		}
	}
	var blocked, repeats int
	for _, ev := range evs {
		switch ev.Name {
		case events.NameNetworkBlocked:
			blocked++
		case events.NameNetworkBlockedRepeat:
			var rep events.NetworkBlockedRepeats
			if err := json.Unmarshal(ev.Payload, &rep); err != nil {
				t.Fatal(err)
			}
			if len(rep.Repeats) != 1 || rep.Repeats[0].Host != "denied.test" || rep.Repeats[0].Count != n-1 {
				t.Errorf("repeats %+v, want denied.test %d times", rep, n-1)
			}
			repeats++
		}
	}
	if blocked != 1 || repeats != 1 {
		t.Errorf("%d refusals cost %d network_blocked and %d network_blocked_repeats writes, want 1 and 1", n, blocked, repeats)
	}
}

// TestEgressConcurrentSessions: two concurrent commands, each with its own value for the same credential (their
// runs' blocks), and a background process with the Config's value, send requests through the sandbox's proxy at
// the same time. The commands overlap (neither waits for the other), the process has a network for its whole
// life, and every request reaches the upstream with its own command's or process's value, never another's.
func TestEgressConcurrentSessions(t *testing.T) {
	if !processesHere() {
		t.Skip("concurrent commands and processes need the agent channel (TestProcessUnavailable)")
	}
	t.Parallel()
	cred := func(v string) *sandkeep.Network {
		return &sandkeep.Network{Mode: "allowlist", Rules: []string{"allowed.test", "127.0.0.1"}, Inherit: "replace",
			Credentials: []sandkeep.Credential{{Name: "API_TOKEN", Value: v, Hosts: []string{"allowed.test"}}}}
	}
	values := map[string]string{"p": "sk-live-process-" + randHex(8), "a": "sk-live-a-" + randHex(8), "b": "sk-live-b-" + randHex(8)}
	w := newEgressWorld(t, cred(values["p"]))
	key := w.key("acme", "sessions")
	sp := w.secure.port()
	w.sh(key, "true") // the sandbox exists
	loop := func(who string, n int) []string {
		return []string{"sh", "-c", fmt.Sprintf(`for i in $(seq %d); do %s http https://allowed.test:%s/%s/$i "Authorization=Bearer $API_TOKEN"; sleep 0.4; done`,
			n, testutil.ProbePath, sp, who)}
	}
	var log eventLog
	p, err := processes.Start(t.Context(), w.m, key, processes.StartRequest{Argv: loop("p", 8), OnEvent: log.add})
	if onKube {
		// A pod has one fixed path for the CA bundle, so a process whose network inspects TLS (credentials do) is
		// refused there, before anything starts, with the way out (docs/E2B.md says so).
		if sandkeep.CodeOf(err) != "PROCESS_UNAVAILABLE" || !strings.Contains(err.Error(), "inspect: off") {
			t.Fatalf("a TLS-inspecting process on kubernetes: %+v %v, want PROCESS_UNAVAILABLE naming inspect: off", p, err)
		}
		return
	}
	if err != nil || !p.Running {
		t.Fatalf("the process: %+v %v", p, err)
	}
	// Each command waits (10 s at most) for the other to have started: one at a time, the first would give up.
	meet := func(who, other string) string {
		return fmt.Sprintf(`touch /tmp/meet-%s; for i in $(seq 100); do [ -e /tmp/meet-%s ] && break; sleep 0.1; done; [ -e /tmp/meet-%s ] || { echo alone; exit 3; }; `,
			who, other, other)
	}
	results := map[string]*sandkeep.ExecResult{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for who, other := range map[string]string{"a": "b", "b": "a"} {
		wg.Go(func() {
			argv := loop(who, 4)
			argv[2] = meet(who, other) + argv[2]
			res := w.execRun(w.m, sandkeep.RunRequest{Key: key, Network: cred(values[who])},
				sandkeep.ExecRequest{Argv: argv, Concurrent: true, Timeout: time.Minute})
			mu.Lock()
			results[who] = res
			mu.Unlock()
		})
	}
	wg.Wait()
	end := log.ended(t, p.PID)
	for who, res := range results {
		if res.ExitCode != 0 || strings.Count(res.Stdout, "status 200") != 4 {
			t.Errorf("command %s: exit %d\n%s%s", who, res.ExitCode, res.Stdout, res.Stderr)
		}
	}
	if end.ExitCode != 0 {
		t.Errorf("the process ended %+v", end)
	}
	w.secure.mu.Lock()
	defer w.secure.mu.Unlock()
	count := map[string]int{}
	for i, req := range w.secure.reqs {
		who, _, _ := strings.Cut(strings.TrimPrefix(req.URL.Path, "/"), "/")
		count[who]++
		if got := w.secure.auth[i]; got != "Bearer "+values[who] {
			t.Errorf("request %s carried %q, want %s's own value", req.URL.Path, got, who)
		}
	}
	if count["p"] != 8 || count["a"] != 4 || count["b"] != 4 {
		t.Errorf("the upstream saw %v requests, want p 8, a 4, b 4", count)
	}
}
