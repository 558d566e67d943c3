package egress

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// upstreamPKI is the tests' "public" PKI: a CA the proxy's UpstreamRoots trusts (and the sandbox does not)
// and one server certificate for every test name.
type upstreamPKI struct {
	roots *x509.CertPool
	cert  tls.Certificate
}

var (
	pkiOnce sync.Once
	pki     upstreamPKI
)

func testPKI(t testing.TB) upstreamPKI {
	t.Helper()
	pkiOnce.Do(func() {
		caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		caTmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test upstream CA"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		}
		caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
		if err != nil {
			panic(err)
		}
		ca, _ := x509.ParseCertificate(caDER)
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "upstream"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			DNSNames:    []string{"api.test", "other.test", "allowed.test"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			panic(err)
		}
		pki.roots = x509.NewCertPool()
		pki.roots.AddCert(ca)
		pki.cert = tls.Certificate{Certificate: [][]byte{der, caDER}, PrivateKey: key}
	})
	return pki
}

// hit is one request an upstream received.
type hit struct {
	proto  string
	host   string
	uri    string
	header http.Header
	body   string
}

// upstream is a recording "internet" server over TLS (HTTP/1.1 and HTTP/2) or plain HTTP. It answers
// "hello <host> <uri>" and echoes the request's Authorization in X-Echo.
type upstream struct {
	*httptest.Server
	mu   sync.Mutex
	hits []hit
}

func newUpstream(t testing.TB, tlsOn bool) *upstream {
	u := &upstream{}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.hits = append(u.hits, hit{proto: r.Proto, host: r.Host, uri: r.RequestURI, header: r.Header.Clone(), body: string(body)})
		u.mu.Unlock()
		if a := r.Header.Get("Authorization"); a != "" {
			w.Header().Set("X-Echo", a)
		}
		fmt.Fprintf(w, "hello %s %s", r.Host, r.URL.RequestURI())
	}))
	if tlsOn {
		u.EnableHTTP2 = true
		u.TLS = &tls.Config{Certificates: []tls.Certificate{testPKI(t).cert}}
		u.StartTLS()
	} else {
		u.Start()
	}
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) port() string {
	return strconv.Itoa(int(netip.MustParseAddrPort(u.Listener.Addr().String()).Port()))
}

func (u *upstream) seen() []hit {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]hit(nil), u.hits...)
}

// newInspectHarness is newHarness with the upstream PKI trusted by the proxy.
func newInspectHarness(t *testing.T, pol Policy, rec *recorder) *harness {
	t.Helper()
	h := &harness{t: t, rec: rec}
	p, err := New(Config{
		Policy: pol, Token: testToken, Resolver: rec, Dial: rec.Dial, UpstreamRoots: testPKI(t).roots,
		OnBlocked: func(b Block) {
			h.mu.Lock()
			h.blocks = append(h.blocks, b)
			h.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h.start(p)
	return h
}

// client is an HTTP client that goes through the harness's proxy and trusts roots (the proxy's CA when
// inspecting; nil: trusts anything), speaking only HTTP/2 or only HTTP/1.1 to the far end.
func (h *harness) client(roots *x509.CertPool, h2 bool) *http.Client {
	proxyURL := &url.URL{Scheme: "http", User: url.UserPassword("sandbox", testToken), Host: h.addr}
	tr := &http.Transport{
		Proxy:           http.ProxyURL(proxyURL),
		TLSClientConfig: &tls.Config{RootCAs: roots, InsecureSkipVerify: roots == nil},
	}
	tr.Protocols = new(http.Protocols)
	if h2 {
		tr.Protocols.SetHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
	}
	h.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// waitBlocks returns the blocks once there are n, or after a few seconds: a refusal after the handshake may
// be reported just after the client saw it fail.
func (h *harness) waitBlocks(n int) []Block {
	deadline := time.Now().Add(5 * time.Second)
	for {
		b := h.reported()
		if len(b) >= n || time.Now().After(deadline) {
			return b
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// proxyRoots is a pool holding the proxy's current CA.
func proxyRoots(t *testing.T, p *Proxy) *x509.CertPool {
	t.Helper()
	pemCA := p.CACert()
	if pemCA == nil {
		t.Fatal("CACert is nil with inspection on")
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemCA) {
		t.Fatal("CACert is not a PEM certificate")
	}
	return roots
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestInspect: with inspection on, an HTTPS request through the proxy is answered by the real upstream,
// over HTTP/1.1 and HTTP/2 on the client side, with a certificate from the proxy's CA (so a client that
// trusts only that CA succeeds); the upstream is reached at the checked address and verified against
// UpstreamRoots.
func TestInspect(t *testing.T) {
	up := newUpstream(t, true)
	for _, tt := range []struct {
		name  string
		h2    bool
		proto string
	}{{"h1", false, "HTTP/1.1"}, {"h2", true, "HTTP/2.0"}} {
		t.Run(tt.name, func(t *testing.T) {
			rec := newRecorder(t, map[string][]string{"api.test": {"192.88.99.10"}})
			h := newInspectHarness(t, Policy{Mode: ModeAllowlist, Rules: rules(t, "api.test"), Inspect: InspectOn}, rec)
			c := h.client(proxyRoots(t, h.p), tt.h2)
			for i := range 3 { // keep-alive: several requests on one decrypted connection
				resp, err := c.Get("https://api.test:" + up.port() + "/x?i=" + strconv.Itoa(i))
				if err != nil {
					t.Fatal(err)
				}
				body := readAll(t, resp)
				if resp.StatusCode != http.StatusOK || body != "hello api.test:"+up.port()+" /x?i="+strconv.Itoa(i) {
					t.Fatalf("got %d %q", resp.StatusCode, body)
				}
				if resp.Proto != tt.proto {
					t.Errorf("client spoke %s, want %s", resp.Proto, tt.proto)
				}
				if got := resp.TLS.PeerCertificates[0]; got.Issuer.CommonName == "test upstream CA" || len(got.DNSNames) != 1 || got.DNSNames[0] != "api.test" {
					t.Errorf("client saw certificate for %v from %q, want a proxy leaf for api.test", got.DNSNames, got.Issuer.CommonName)
				}
			}
			if n := len(up.seen()); n < 3 {
				t.Errorf("upstream saw %d requests, want 3", n)
			}
			for _, d := range rec.dialed() {
				if d != "192.88.99.10:"+up.port() {
					t.Errorf("dialed %s, want only the checked 192.88.99.10:%s", d, up.port())
				}
			}
			if b := h.reported(); len(b) != 0 {
				t.Errorf("blocks %+v", b)
			}
		})
	}
}

// TestInspectUpstreamUntrusted: an upstream whose certificate UpstreamRoots does not vouch for is a 502.
func TestInspectUpstreamUntrusted(t *testing.T) {
	up := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("the untrusted upstream got a request")
	}))
	defer up.Close()
	port := strconv.Itoa(int(netip.MustParseAddrPort(up.Listener.Addr().String()).Port()))
	rec := newRecorder(t, map[string][]string{"api.test": {"192.88.99.10"}})
	h := newInspectHarness(t, Policy{Mode: ModeAllowlist, Rules: rules(t, "api.test"), Inspect: InspectOn}, rec)
	resp, err := h.client(proxyRoots(t, h.p), false).Get("https://api.test:" + port + "/")
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "certificate") {
		t.Errorf("got %d %q, want 502 naming the certificate", resp.StatusCode, body)
	}
}

// tlsThrough opens a CONNECT to target and starts TLS in it with serverName, trusting the proxy's CA.
func (h *harness) tlsThrough(target, serverName string, nextProtos ...string) (*tls.Conn, error) {
	h.t.Helper()
	resp, c, br := h.connect(target, bearer())
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("CONNECT %s: %d", target, resp.StatusCode)
	}
	if br.Buffered() > 0 {
		h.t.Fatal("bytes after the CONNECT response")
	}
	tc := tls.Client(c, &tls.Config{ServerName: serverName, RootCAs: proxyRoots(h.t, h.p), NextProtos: nextProtos})
	h.t.Cleanup(func() { _ = tc.Close() })
	return tc, tc.Handshake()
}

// TestInspectSNI: a TLS hello naming another host than the CONNECT is refused (handshake fails, a
// sni-mismatch Block names the hello's host) and nothing reaches the upstream; the same host spelled
// differently, or no SNI at all, is the CONNECT host.
func TestInspectSNI(t *testing.T) {
	up := newUpstream(t, true)
	rec := newRecorder(t, map[string][]string{"api.test": {"192.88.99.10"}, "other.test": {"192.88.99.11"}})
	h := newInspectHarness(t, Policy{Mode: ModeAllowlist, Rules: rules(t, "api.test", "other.test"), Inspect: InspectOn}, rec)
	target := "api.test:" + up.port()

	if _, err := h.tlsThrough(target, "other.test"); err == nil {
		t.Fatal("handshake with SNI other.test in a CONNECT to api.test succeeded")
	}
	// Reported before the client learns of the failure: a command that exits on it must find the refusal in
	// its run (the lifecycle routes refusals to the running command's run only while it runs).
	if got := h.reported(); len(got) != 1 {
		t.Errorf("when the client's handshake failed, %d refusals were reported, want 1 already", len(got))
	}
	if n := len(up.seen()); n != 0 {
		t.Errorf("upstream got %d requests", n)
	}
	blocks := h.waitBlocks(1)
	if len(blocks) != 1 || blocks[0].Reason != ReasonSNIMismatch || blocks[0].Host != "other.test" || strconv.Itoa(int(blocks[0].Port)) != up.port() {
		t.Errorf("blocks %+v, want one sni-mismatch for other.test", blocks)
	}

	for _, sni := range []string{"API.test.", ""} {
		// No SNI: Go sends none when ServerName is empty; then verify against api.test by hand.
		resp, c, _ := h.connect(target, bearer())
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("CONNECT: %d", resp.StatusCode)
		}
		cfg := &tls.Config{ServerName: sni, RootCAs: proxyRoots(t, h.p)}
		if sni == "" {
			cfg.InsecureSkipVerify = true // checked below, against api.test
		}
		tc := tls.Client(c, cfg)
		if err := tc.Handshake(); err != nil {
			t.Fatalf("SNI %q: %v", sni, err)
		}
		leafCert := tc.ConnectionState().PeerCertificates[0]
		if err := leafCert.VerifyHostname("api.test"); err != nil {
			t.Errorf("SNI %q: %v", sni, err)
		}
		if got := tunnelGetTLS(t, tc, "api.test"); got != "hello api.test:"+up.port()+" /t" {
			t.Errorf("SNI %q: %q", sni, got)
		}
		_ = tc.Close()
	}
	if n := len(h.reported()); n != 1 {
		t.Errorf("%d blocks, want still 1", n)
	}
}

// tunnelGetTLS sends GET /t with host over an established TLS connection and returns the body, or the status
// and reason of a refusal.
func tunnelGetTLS(t *testing.T, tc *tls.Conn, host string) string {
	t.Helper()
	return rawTLS(t, tc, "GET /t HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
}

func rawTLS(t *testing.T, tc *tls.Conn, req string) string {
	t.Helper()
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(tc, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		return strconv.Itoa(resp.StatusCode) + " " + resp.Header.Get(DeniedHeader)
	}
	return body
}

// TestInspectRefusesInside: inside a decrypted tunnel, a request for another Host is refused
// (host-mismatch), and a CONNECT or an absolute-form request for elsewhere (proxy chaining) is refused
// (proxy-loop); none reaches an upstream, each is reported.
func TestInspectRefusesInside(t *testing.T) {
	up := newUpstream(t, true)
	rec := newRecorder(t, map[string][]string{"api.test": {"192.88.99.10"}, "other.test": {"192.88.99.11"}})
	h := newInspectHarness(t, Policy{Mode: ModeAllowlist, Rules: rules(t, "api.test", "other.test"), Inspect: InspectOn}, rec)
	target := "api.test:" + up.port()
	tests := []struct {
		name   string
		req    string
		want   string
		host   string
		reason string
	}{
		{name: "other Host", req: "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n", want: "403 " + ReasonHostMismatch, host: "other.test", reason: ReasonHostMismatch},
		{name: "other port", req: "GET / HTTP/1.1\r\nHost: api.test:1\r\n\r\n", want: "403 " + ReasonHostMismatch, host: "api.test", reason: ReasonHostMismatch},
		{name: "CONNECT inside", req: "CONNECT other.test:443 HTTP/1.1\r\nHost: other.test:443\r\n\r\n", want: "403 " + ReasonProxyLoop, host: "other.test", reason: ReasonProxyLoop},
		{name: "absolute form elsewhere", req: "GET http://other.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", want: "403 " + ReasonProxyLoop, host: "other.test", reason: ReasonProxyLoop},
		{name: "absolute form, plain http", req: "GET http://api.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", want: "403 " + ReasonProxyLoop, host: "api.test", reason: ReasonProxyLoop},
		{name: "absolute form, same host", req: "GET https://api.test:" + up.port() + "/t HTTP/1.1\r\nHost: api.test\r\n\r\n", want: "hello api.test:" + up.port() + " /t"},
	}
	for _, tt := range tests {
		before := len(h.reported())
		hits := len(up.seen())
		tc, err := h.tlsThrough(target, "api.test")
		if err != nil {
			t.Fatal(err)
		}
		if got := rawTLS(t, tc, tt.req); got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
		_ = tc.Close()
		blocks := h.reported()[before:]
		if tt.reason == "" {
			if len(blocks) != 0 || len(up.seen()) != hits+1 {
				t.Errorf("%s: blocks %+v, %d hits, want none and one", tt.name, blocks, len(up.seen())-hits)
			}
			continue
		}
		if len(blocks) != 1 || blocks[0].Reason != tt.reason || blocks[0].Host != tt.host {
			t.Errorf("%s: blocks %+v, want one %s for %s", tt.name, blocks, tt.reason, tt.host)
		}
		if n := len(up.seen()) - hits; n != 0 {
			t.Errorf("%s: upstream got %d requests", tt.name, n)
		}
	}
}

// TestInspectNotTLS: inspecting, a client that speaks plain text in its tunnel is cut off and reported.
func TestInspectNotTLS(t *testing.T) {
	up := newUpstream(t, false)
	rec := newRecorder(t, map[string][]string{"api.test": {"192.88.99.10"}})
	h := newInspectHarness(t, Policy{Mode: ModeAllowlist, Rules: rules(t, "api.test"), Inspect: InspectOn}, rec)
	resp, c, br := h.connect("api.test:"+up.port(), bearer())
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %d", resp.StatusCode)
	}
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if rest, _ := io.ReadAll(br); strings.Contains(string(rest), "hello") {
		t.Errorf("plain text went through: %q", rest)
	}
	if n := len(up.seen()); n != 0 {
		t.Errorf("upstream got %d requests", n)
	}
	if b := h.waitBlocks(1); len(b) != 1 || b[0].Reason != ReasonNotTLS || b[0].Host != "api.test" {
		t.Errorf("blocks %+v, want one not-tls", b)
	}
}

// TestInspectOff: with inspection off, CONNECT is a plain tunnel even with credentials: the client sees the
// upstream's own certificate, the placeholder goes through unchanged, and there is no CA.
func TestInspectOff(t *testing.T) {
	up := newUpstream(t, true)
	rec := newRecorder(t, map[string][]string{"api.test": {"192.88.99.10"}})
	ph := NewPlaceholder("KEY")
	pol := Policy{
		Mode: ModeAllowlist, Rules: rules(t, "api.test"), Inspect: InspectOff,
		Credentials: []Credential{{Name: "KEY", Placeholder: ph, Value: "real-secret-value-1", Hosts: rules(t, "api.test")}},
	}
	h := newInspectHarness(t, pol, rec)
	if h.p.CACert() != nil || h.p.CAGeneration() != 0 {
		t.Errorf("a CA with inspection off")
	}
	req, _ := http.NewRequest(http.MethodGet, "https://api.test:"+up.port()+"/", nil)
	req.Header.Set("Authorization", "Bearer "+ph)
	resp, err := h.client(testPKI(t).roots, false).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if got := resp.TLS.PeerCertificates[0].Issuer.CommonName; got != "test upstream CA" {
		t.Errorf("client saw a certificate from %q, want the upstream's own", got)
	}
	if hits := up.seen(); len(hits) != 1 || hits[0].header.Get("Authorization") != "Bearer "+ph {
		t.Errorf("upstream got %+v, want the placeholder unchanged", hits)
	}
}

// TestPolicyPerRequest: a decrypted connection is decided again per request, under the policy current then.
func TestPolicyPerRequest(t *testing.T) {
	up := newUpstream(t, true)
	rec := newRecorder(t, map[string][]string{"api.test": {"192.88.99.10"}})
	allow := Policy{Mode: ModeAllowlist, Rules: rules(t, "api.test"), Inspect: InspectOn}
	h := newInspectHarness(t, allow, rec)
	c := h.client(proxyRoots(t, h.p), true)
	get := func() int {
		resp, err := c.Get("https://api.test:" + up.port() + "/")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		return resp.StatusCode
	}
	if s := get(); s != http.StatusOK {
		t.Fatalf("first: %d", s)
	}
	// The same policy again (set before every command) keeps the connection's decision: no new lookup.
	if err := h.p.SetPolicy(allow); err != nil {
		t.Fatal(err)
	}
	if s := get(); s != http.StatusOK || rec.lookupCount("api.test") != 1 {
		t.Fatalf("same policy: %d, %d lookups, want 200 and still 1", s, rec.lookupCount("api.test"))
	}
	// The same rules with a negation: the CA (constrained to api.test) stays, the connection stays open.
	gen := h.p.CAGeneration()
	if err := h.p.SetPolicy(Policy{Mode: ModeAllowlist, Rules: rules(t, "api.test", "!api.test"), Inspect: InspectOn}); err != nil {
		t.Fatal(err)
	}
	if h.p.CAGeneration() != gen {
		t.Errorf("a negated rule changed the CA")
	}
	if s := get(); s != http.StatusForbidden {
		t.Errorf("after SetPolicy denied it: %d", s)
	}
	if b := h.reported(); len(b) != 1 || b[0].Reason != ReasonRule {
		t.Errorf("blocks %+v", b)
	}
	if err := h.p.SetPolicy(allow); err != nil {
		t.Fatal(err)
	}
	if s := get(); s != http.StatusOK || rec.lookupCount("api.test") != 2 {
		t.Errorf("allowed again: %d, %d lookups, want 200 and a second (a new decision)", s, rec.lookupCount("api.test"))
	}
}

// TestSetOnBlocked: refusals go to the function set last; nil reports nothing.
func TestSetOnBlocked(t *testing.T) {
	rec := newRecorder(t, nil)
	h := newHarness(t, Policy{Mode: ModeAllowlist}, rec)
	var mu sync.Mutex
	var second []Block
	h.p.SetOnBlocked(func(b Block) { mu.Lock(); second = append(second, b); mu.Unlock() })
	h.connect("a.test:443", bearer())
	h.p.SetOnBlocked(nil)
	h.connect("b.test:443", bearer())
	if len(h.reported()) != 0 || len(second) != 1 || second[0].Host != "a.test" {
		t.Errorf("first %+v, second %+v", h.reported(), second)
	}
}

// TestSetPolicyRace swaps policies (allow, deny, inspection on and off) while requests run, under -race;
// every answer is an allowed 200 or a 403, and the last policy set is the one in force afterwards.
func TestSetPolicyRace(t *testing.T) {
	up := newUpstream(t, true)
	plain := newUpstream(t, false)
	rec := newRecorder(t, map[string][]string{"api.test": {"192.88.99.10"}})
	ph := NewPlaceholder("KEY")
	cred := []Credential{{Name: "KEY", Placeholder: ph, Value: "real-secret-value-1", Hosts: rules(t, "api.test")}}
	pols := []Policy{
		{Mode: ModeAllowlist, Rules: rules(t, "api.test"), Inspect: InspectOn},
		{Mode: ModeAllowlist, Rules: rules(t, "api.test"), Credentials: cred},
		{Mode: ModeAllowlist, Rules: rules(t, "other.test")},
		{Mode: ModeOpen, Rules: rules(t, "!api.test")},
		{Mode: ModeAllowlist, Rules: rules(t, "**.test"), Credentials: cred, Inspect: InspectOn},
	}
	h := newInspectHarness(t, pols[0], rec)

	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			if err := h.p.SetPolicy(pols[i%len(pols)]); err != nil {
				t.Error(err)
				return
			}
			_ = h.p.CACert()
			h.p.SetOnBlocked(func(Block) {})
			time.Sleep(time.Millisecond)
		}
	})
	for w := range 4 {
		wg.Go(func() {
			c := h.client(nil, w%2 == 0) // the CA changes under the clients: verification is TestInspect's
			for range 25 {
				var resp *http.Response
				var err error
				if w == 3 {
					resp, err = c.Get("http://api.test:" + plain.port() + "/")
				} else {
					resp, err = c.Get("https://api.test:" + up.port() + "/")
				}
				if err != nil {
					continue // a CONNECT refused, or a CA replaced under the client: not a proxy answer
				}
				readAll(t, resp)
				if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusForbidden {
					t.Errorf("status %d", resp.StatusCode)
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	close(done)
	wg.Wait()

	if err := h.p.SetPolicy(Policy{Mode: ModeAllowlist, Rules: rules(t, "other.test")}); err != nil {
		t.Fatal(err)
	}
	if resp, _ := h.get("api.test:"+plain.port(), bearer()); resp.StatusCode != http.StatusForbidden {
		t.Errorf("after the last SetPolicy: %d, want 403", resp.StatusCode)
	}
}

// TestTunnelIntegrity pushes 16 MiB of random bytes through a tunnel to an echo server and back, with the
// proxy served on TCP and on a Unix socket (how a sandbox reaches it), while a short idle timeout makes the
// copy return often and the reader pauses past a copy's read deadline: every byte comes back, in order.
func TestTunnelIntegrity(t *testing.T) {
	port := rawUpstream(t, func(c net.Conn) { _, _ = io.Copy(c, c) })
	data := make([]byte, 16<<20)
	_, _ = rand.Read(data)
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			rec := newRecorder(t, map[string][]string{"echo.test": {"192.88.99.10"}})
			p, err := New(Config{Policy: Policy{Mode: ModeOpen}, Token: testToken, Resolver: rec, Dial: rec.Dial})
			if err != nil {
				t.Fatal(err)
			}
			p.tunnelIdle = time.Second // a copy returns every 250ms
			addr := "127.0.0.1:0"
			if network == "unix" {
				addr = t.TempDir() + "/proxy.sock"
			}
			l, err := net.Listen(network, addr)
			if err != nil {
				t.Fatal(err)
			}
			served := make(chan error, 1)
			go func() { served <- p.Serve(l) }()
			defer func() { _ = p.Close(); <-served }()

			c, err := net.Dial(network, l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.WriteString(c, "CONNECT echo.test:"+port+" HTTP/1.1\r\nProxy-Authorization: "+bearer()+"\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			if resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect}); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("CONNECT: %v %v", resp, err)
			}
			werr := make(chan error, 1)
			go func() {
				_, err := c.Write(data)
				werr <- err
			}()
			got := make([]byte, 0, len(data))
			buf := make([]byte, 64<<10)
			next := 4 << 20
			for len(got) < len(data) {
				n, err := br.Read(buf)
				got = append(got, buf[:n]...)
				if err != nil {
					t.Fatalf("after %d bytes: %v", len(got), err)
				}
				if len(got) >= next {
					time.Sleep(300 * time.Millisecond) // longer than a copy's read deadline, shorter than idle
					next += 4 << 20
				}
			}
			if err := <-werr; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatal("the bytes that came back differ from those sent")
			}
		})
	}
}
