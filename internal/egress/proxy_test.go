package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
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

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// After an error response the server lingers on the connection (closeWriteAndWait: a fixed 500 ms sleep
		// so the client reads the response before the reset). The goroutine is net/http's, ends by itself, and
		// http.Server.Close cannot wait for it.
		goleak.IgnoreAnyFunction("net/http.(*conn).closeWriteAndWait"),
	)
}

const testToken = "s3cret-token-for-tests"

// testNet is the tests' "internet": 192.88.99.0/24 (the retired 6to4 relay range) stands for public hosts, and the dialer
// sends those to the same port on 127.0.0.1, where the httptest servers listen. Nothing else is ever dialed:
// a dial of any other address (a forbidden one the proxy should have refused) fails the test.
var testNet = netip.MustParsePrefix("192.88.99.0/24")

// recorder is a fake Resolver and a guarded Dial that record what the proxy asked for.
type recorder struct {
	t *testing.T

	mu      sync.Mutex
	answers map[string][][]netip.Addr // name -> answer per call (the last one repeats)
	lookups map[string]int
	dials   []string
}

func newRecorder(t *testing.T, answers map[string][]string) *recorder {
	r := &recorder{t: t, answers: map[string][][]netip.Addr{}, lookups: map[string]int{}}
	for name, addrs := range answers {
		r.set(name, addrs...)
	}
	return r
}

// set makes name answer addrs; calling it again for the same name adds the answer for the next lookup.
func (r *recorder) set(name string, addrs ...string) {
	var answer []netip.Addr
	for _, a := range addrs {
		answer = append(answer, netip.MustParseAddr(a))
	}
	r.mu.Lock()
	r.answers[name] = append(r.answers[name], answer)
	r.mu.Unlock()
}

func (r *recorder) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if network != "ip" {
		r.t.Errorf("lookup %q with network %q, want ip", host, network)
	}
	n := r.lookups[host]
	r.lookups[host]++
	answers, ok := r.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return append([]netip.Addr(nil), answers[min(n, len(answers)-1)]...), nil
}

func (r *recorder) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		r.t.Errorf("proxy dialed %q, which is not an ip:port", addr)
		return nil, err
	}
	r.mu.Lock()
	r.dials = append(r.dials, addr)
	r.mu.Unlock()
	switch {
	case testNet.Contains(ap.Addr()):
		addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ap.Port()).String()
	case ap.Addr().Unmap().IsLoopback():
	default:
		r.t.Errorf("proxy dialed %s, which it must have refused", addr)
		return nil, errors.New("test dialer: forbidden address")
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

func (r *recorder) lookupCount(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lookups[name]
}

func (r *recorder) dialed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.dials...)
}

// harness is a serving proxy on 127.0.0.1 with its recorder and the blocks it reported.
type harness struct {
	t    *testing.T
	p    *Proxy
	addr string // the proxy's listener
	rec  *recorder

	mu     sync.Mutex
	blocks []Block
}

func rules(t *testing.T, in ...string) []Rule {
	t.Helper()
	rs, errs := ParseRules(in)
	if errs != nil {
		t.Fatalf("ParseRules(%q): %v", in, errs)
	}
	return rs
}

func newHarness(t *testing.T, pol Policy, rec *recorder, self ...netip.Addr) *harness {
	t.Helper()
	h := &harness{t: t, rec: rec}
	p, err := New(Config{
		Policy: pol, Token: testToken, Resolver: rec, Dial: rec.Dial, Self: self,
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

func (h *harness) start(p *Proxy) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		h.t.Fatal(err)
	}
	h.p, h.addr = p, l.Addr().String()
	errc := make(chan error, 1)
	go func() { errc <- p.Serve(l) }()
	h.t.Cleanup(func() {
		if err := p.Close(); err != nil {
			h.t.Errorf("Close: %v", err)
		}
		if err := <-errc; err != nil {
			h.t.Errorf("Serve: %v", err)
		}
	})
}

func (h *harness) reported() []Block {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Block(nil), h.blocks...)
}

func bearer() string { return "Bearer " + testToken }

// connect sends a CONNECT for target and returns the response and, on 200, the tunnel.
func (h *harness) connect(target, auth string) (*http.Response, net.Conn, *bufio.Reader) {
	h.t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n"
	if auth != "" {
		req += "Proxy-Authorization: " + auth + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		h.t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		h.t.Fatalf("CONNECT %s: %v", target, err)
	}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp, nil, nil
	}
	return resp, c, br
}

// raw sends one raw request to the proxy and returns the response, its body read.
func (h *harness) raw(req string) (*http.Response, string) {
	h.t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		h.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		h.t.Fatalf("response to %q: %v", req, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// get forwards "GET http://target/path" with auth.
func (h *harness) get(target, auth string) (*http.Response, string) {
	h.t.Helper()
	req := "GET http://" + target + "/path?q=1 HTTP/1.1\r\nHost: " + target + "\r\nConnection: close\r\n"
	if auth != "" {
		req += "Proxy-Authorization: " + auth + "\r\n"
	}
	return h.raw(req + "\r\n")
}

// echoServer answers every request with "hello <Host>" and records the request headers.
type echoServer struct {
	*httptest.Server
	mu      sync.Mutex
	headers []http.Header
}

func newEcho(t *testing.T, tlsOn bool) *echoServer {
	e := &echoServer{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.headers = append(e.headers, r.Header.Clone())
		e.mu.Unlock()
		fmt.Fprintf(w, "hello %s %s", r.Host, r.URL.RequestURI())
	})
	if tlsOn {
		e.Server = httptest.NewTLSServer(handler)
	} else {
		e.Server = httptest.NewServer(handler)
	}
	t.Cleanup(e.Close)
	return e
}

func (e *echoServer) port() string {
	return strconv.Itoa(int(netip.MustParseAddrPort(e.Listener.Addr().String()).Port()))
}

func (e *echoServer) seen() []http.Header {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]http.Header(nil), e.headers...)
}

// TestConnectAllowed goes through the proxy the way a sandboxed client does: an https request through an
// HTTP proxy with Basic credentials in its URL, so a CONNECT tunnel carries TLS to a local server. The name
// resolves to 127.0.0.1, which is refused by default and reachable only because a rule names it.
func TestConnectAllowed(t *testing.T) {
	up := newUpstream(t, true) // its certificate names allowed.test: the hello's name must be the CONNECT host
	rec := newRecorder(t, map[string][]string{"allowed.test": {"127.0.0.1"}})
	h := newHarness(t, Policy{Mode: ModeAllowlist, Rules: rules(t, "allowed.test", "127.0.0.1/32")}, rec)

	roots := testPKI(t).roots
	proxyURL := &url.URL{Scheme: "http", User: url.UserPassword("anyone", testToken), Host: h.addr}
	tr := &http.Transport{
		Proxy:           http.ProxyURL(proxyURL),
		TLSClientConfig: &tls.Config{RootCAs: roots},
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://allowed.test:" + up.port() + "/x")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), "hello allowed.test:") {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if got := rec.dialed(); len(got) != 1 || got[0] != "127.0.0.1:"+up.port() {
		t.Errorf("dialed %v, want the checked 127.0.0.1:%s once", got, up.port())
	}
	if b := h.reported(); len(b) != 0 {
		t.Errorf("blocks %v, want none", b)
	}
}

// TestForwardAllowed forwards plain HTTP: the upstream sees the request without the proxy's credentials or
// the client's hop-by-hop headers, with Host from the URL.
func TestForwardAllowed(t *testing.T) {
	up := newEcho(t, false)
	rec := newRecorder(t, map[string][]string{"allowed.test": {"127.0.0.1"}})
	h := newHarness(t, Policy{Mode: ModeAllowlist, Rules: rules(t, "allowed.test", "127.0.0.1/32")}, rec)

	target := "Allowed.TEST:" + up.port()
	resp, body := h.raw("GET http://" + target + "/path?q=1 HTTP/1.1\r\nHost: elsewhere.test\r\n" +
		"Proxy-Authorization: " + bearer() + "\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nX-Keep: 2\r\n" +
		"Proxy-Connection: keep-alive\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n")
	if resp.StatusCode != http.StatusOK || body != "hello allowed.test:"+up.port()+" /path?q=1" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	seen := up.seen()
	if len(seen) != 1 {
		t.Fatalf("upstream saw %d requests", len(seen))
	}
	for _, k := range []string{"Proxy-Authorization", "X-Hop", "Proxy-Connection", "X-Forwarded-For"} {
		if v := seen[0].Get(k); v != "" {
			t.Errorf("upstream got %s: %q", k, v)
		}
	}
	if seen[0].Get("X-Keep") != "2" {
		t.Errorf("upstream lost an end-to-end header: %v", seen[0])
	}
	if n := rec.lookupCount("allowed.test"); n != 1 {
		t.Errorf("%d lookups, want 1", n)
	}
}

// TestRefusals sends CONNECT and plain-HTTP requests the policy or the address checks refuse. Every one is
// refused before any dial (the recorder fails the test on a dial of a forbidden address, and no dial is
// expected at all) and reported, with the reason in the response header.
func TestRefusals(t *testing.T) {
	answers := map[string][]string{
		"good.example.test": {"192.88.99.10"},
		"bad.example.test":  {"192.88.99.11"},
		"priv.test":         {"10.0.0.1"},
		"meta.test":         {"169.254.169.254"},
		"mapped.test":       {"::ffff:169.254.169.254"},
		"nat64.test":        {"64:ff9b::a9fe:a9fe"},
		"sixtofour.test":    {"2002:a9fe:a9fe::1"},
		"meta6.test":        {"fd00:ec2::254"},
		"loop.test":         {"127.0.0.1"},
		"cgnat.test":        {"100.64.0.1"},
		"multi.test":        {"192.88.99.10", "10.0.0.1"},
		"self.test":         {"192.88.99.99"},
		"ula.test":          {"fd12::1"},
		"linklocal.test":    {"fe80::1"},
		"mcast.test":        {"224.0.0.1"},
		"zero.test":         {"0.0.0.0"},
	}
	self := netip.MustParseAddr("192.88.99.99")
	tests := []struct {
		name   string
		mode   string
		rules  []string
		target string // host:port
		status int
		reason string
		rule   string
		addr   string // the refused address the block names
	}{
		{name: "unlisted", mode: ModeAllowlist, rules: []string{"good.example.test"}, target: "other.test:443", status: 403, reason: ReasonUnlisted},
		{name: "negated", mode: ModeAllowlist, rules: []string{"**.example.test", "!bad.example.test"}, target: "bad.example.test:443", status: 403, reason: ReasonRule, rule: "!bad.example.test"},
		{name: "negated port", mode: ModeOpen, rules: []string{"!**.example.test:25"}, target: "good.example.test:25", status: 403, reason: ReasonRule, rule: "!**.example.test:25"},
		{name: "negated CIDR on a resolved address", mode: ModeOpen, rules: []string{"!192.88.99.0/28"}, target: "good.example.test:443", status: 403, reason: ReasonRule, rule: "!192.88.99.0/28", addr: "192.88.99.10"},
		{name: "mode none", mode: ModeNone, rules: []string{"**"}, target: "good.example.test:443", status: 403, reason: ReasonModeNone},
		{name: "private", mode: ModeOpen, target: "priv.test:443", status: 403, reason: ClassPrivate, addr: "10.0.0.1"},
		{name: "metadata", mode: ModeAllowlist, rules: []string{"**"}, target: "meta.test:80", status: 403, reason: ClassMetadata, addr: "169.254.169.254"},
		{name: "metadata mapped", mode: ModeAllowlist, rules: []string{"**"}, target: "mapped.test:80", status: 403, reason: ClassMetadata, addr: "169.254.169.254"},
		{name: "metadata NAT64", mode: ModeAllowlist, rules: []string{"**"}, target: "nat64.test:80", status: 403, reason: ClassMetadata, addr: "64:ff9b::a9fe:a9fe"},
		{name: "metadata 6to4", mode: ModeAllowlist, rules: []string{"**"}, target: "sixtofour.test:80", status: 403, reason: ClassMetadata, addr: "2002:a9fe:a9fe::1"},
		{name: "metadata IPv6", mode: ModeAllowlist, rules: []string{"**"}, target: "meta6.test:80", status: 403, reason: ClassMetadata, addr: "fd00:ec2::254"},
		{name: "loopback, ** does not unlock", mode: ModeAllowlist, rules: []string{"**"}, target: "loop.test:80", status: 403, reason: ClassLoopback, addr: "127.0.0.1"},
		{name: "loopback, a name rule does not unlock", mode: ModeAllowlist, rules: []string{"loop.test"}, target: "loop.test:80", status: 403, reason: ClassLoopback, addr: "127.0.0.1"},
		{name: "cgnat", mode: ModeOpen, target: "cgnat.test:80", status: 403, reason: ClassCGNAT, addr: "100.64.0.1"},
		{name: "ula", mode: ModeOpen, target: "ula.test:80", status: 403, reason: ClassPrivate, addr: "fd12::1"},
		{name: "link-local v6", mode: ModeOpen, target: "linklocal.test:80", status: 403, reason: ClassLinkLocal, addr: "fe80::1"},
		{name: "multicast", mode: ModeOpen, target: "mcast.test:80", status: 403, reason: ClassMulticast, addr: "224.0.0.1"},
		{name: "unspecified", mode: ModeOpen, target: "zero.test:80", status: 403, reason: ClassUnspecified, addr: "0.0.0.0"},
		{name: "one of several forbidden", mode: ModeOpen, target: "multi.test:443", status: 403, reason: ClassPrivate, addr: "10.0.0.1"},
		{name: "self", mode: ModeOpen, target: "self.test:443", status: 403, reason: ClassSelf, addr: "192.88.99.99"},
		{name: "self by IP", mode: ModeOpen, target: "192.88.99.99:443", status: 403, reason: ClassSelf, addr: "192.88.99.99"},
		{name: "metadata dotted", mode: ModeOpen, target: "169.254.169.254:80", status: 403, reason: ClassMetadata, addr: "169.254.169.254"},
		{name: "metadata decimal", mode: ModeOpen, target: "2852039166:80", status: 403, reason: ClassMetadata, addr: "169.254.169.254"},
		{name: "metadata hex", mode: ModeOpen, target: "0xa9.0xfe.0xa9.0xfe:80", status: 403, reason: ClassMetadata, addr: "169.254.169.254"},
		{name: "metadata octal short", mode: ModeOpen, target: "0251.0376.43518:80", status: 403, reason: ClassMetadata, addr: "169.254.169.254"},
		{name: "metadata mapped literal", mode: ModeOpen, target: "[::ffff:a9fe:a9fe]:80", status: 403, reason: ClassMetadata, addr: "169.254.169.254"},
		{name: "metadata NAT64 literal", mode: ModeOpen, target: "[64:ff9b::a9fe:a9fe]:80", status: 403, reason: ClassMetadata, addr: "64:ff9b::a9fe:a9fe"},
		{name: "loopback short", mode: ModeAllowlist, rules: []string{"**"}, target: "127.1:80", status: 403, reason: ClassLoopback, addr: "127.0.0.1"},
		{name: "invalid host", mode: ModeOpen, target: "a..b:443", status: 400, reason: ReasonInvalidHost},
		{name: "name ending in a number", mode: ModeOpen, target: "a.1:443", status: 400, reason: ReasonInvalidHost},
	}
	for _, tt := range tests {
		for _, via := range []string{"connect", "forward"} {
			t.Run(tt.name+"/"+via, func(t *testing.T) {
				rec := newRecorder(t, answers)
				h := newHarness(t, Policy{Mode: tt.mode, Rules: rules(t, tt.rules...)}, rec, self)
				var resp *http.Response
				if via == "connect" {
					resp, _, _ = h.connect(tt.target, bearer())
				} else {
					resp, _ = h.get(tt.target, bearer())
				}
				if resp.StatusCode != tt.status || resp.Header.Get(DeniedHeader) != tt.reason {
					t.Fatalf("got %d %s=%q, want %d %q", resp.StatusCode, DeniedHeader, resp.Header.Get(DeniedHeader), tt.status, tt.reason)
				}
				if d := rec.dialed(); len(d) != 0 {
					t.Errorf("dialed %v before refusing", d)
				}
				blocks := h.reported()
				if len(blocks) != 1 {
					t.Fatalf("blocks %+v, want one", blocks)
				}
				b := blocks[0]
				if b.Reason != tt.reason || b.Rule != tt.rule {
					t.Errorf("block %+v, want reason %q rule %q", b, tt.reason, tt.rule)
				}
				if tt.addr != "" && b.Addr != netip.MustParseAddr(tt.addr) {
					t.Errorf("block address %v, want %s", b.Addr, tt.addr)
				}
				if tt.status == 403 {
					_, wantPort, _ := SplitHostPort(tt.target)
					if b.Port != wantPort || b.Host == "" {
						t.Errorf("block %+v, want port %d and a host", b, wantPort)
					}
				}
			})
		}
	}
}

// TestAllowedByRule reaches a local server through names and rules the policy allows.
func TestAllowedByRule(t *testing.T) {
	up := newEcho(t, false)
	answers := map[string][]string{
		"good.example.test": {"192.88.99.10"},
		"local.test":        {"127.0.0.1"},
		"both.test":         {"192.88.99.10", "192.88.99.11"},
	}
	tests := []struct {
		name   string
		mode   string
		rules  []string
		target string
	}{
		{name: "any depth", mode: ModeAllowlist, rules: []string{"**.example.test", "!bad.example.test"}, target: "good.example.test"},
		{name: "denylist unmatched", mode: ModeDenylist, rules: []string{"!bad.example.test"}, target: "good.example.test"},
		{name: "open", mode: ModeOpen, target: "good.example.test"},
		{name: "loopback named by CIDR", mode: ModeAllowlist, rules: []string{"local.test", "127.0.0.0/8"}, target: "local.test"},
		{name: "loopback named by IP and port", mode: ModeAllowlist, rules: []string{"127.0.0.1:" + up.port()}, target: "127.0.0.1"},
		{name: "several addresses", mode: ModeOpen, target: "both.test"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := newRecorder(t, answers)
			h := newHarness(t, Policy{Mode: tt.mode, Rules: rules(t, tt.rules...)}, rec)
			target := tt.target + ":" + up.port()
			resp, body := h.get(target, bearer())
			if resp.StatusCode != http.StatusOK || body != "hello "+target+" /path?q=1" {
				t.Fatalf("forward: got %d %q", resp.StatusCode, body)
			}
			resp, c, br := h.connect(target, bearer())
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("CONNECT: got %d %s", resp.StatusCode, resp.Header.Get(DeniedHeader))
			}
			if got := tunnelGet(t, c, br, target); got != "hello "+target+" /t" {
				t.Errorf("through the tunnel: %q", got)
			}
			if b := h.reported(); len(b) != 0 {
				t.Errorf("blocks %+v, want none", b)
			}
		})
	}
}

// tunnelGet sends a plain HTTP request through an open tunnel and returns the body.
func tunnelGet(t *testing.T, c net.Conn, br *bufio.Reader, host string) string {
	t.Helper()
	if _, err := io.WriteString(c, "GET /t HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestAuth: no credentials or wrong ones get 407 with a challenge and no event; Bearer and Basic (any user)
// with the token pass.
func TestAuth(t *testing.T) {
	up := newEcho(t, false)
	rec := newRecorder(t, map[string][]string{"good.test": {"192.88.99.10"}})
	h := newHarness(t, Policy{Mode: ModeAllowlist, Rules: rules(t, "good.test")}, rec)
	basic := func(user, pass string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	tests := []struct {
		name string
		auth string
		ok   bool
	}{
		{name: "missing", auth: ""},
		{name: "bearer", auth: bearer(), ok: true},
		{name: "bearer lower case scheme", auth: "bearer " + testToken, ok: true},
		{name: "bearer wrong", auth: "Bearer " + testToken + "x"},
		{name: "bearer prefix", auth: "Bearer " + testToken[:5]},
		{name: "bearer empty", auth: "Bearer "},
		{name: "basic", auth: basic("sandbox", testToken), ok: true},
		{name: "basic empty user", auth: basic("", testToken), ok: true},
		{name: "basic token as user", auth: basic(testToken, "")},
		{name: "basic wrong", auth: basic("sandbox", "nope")},
		{name: "basic not base64", auth: "Basic !!!"},
		{name: "basic no colon", auth: "Basic " + base64.StdEncoding.EncodeToString([]byte(testToken))},
		{name: "other scheme", auth: "Digest " + testToken},
		{name: "token alone", auth: testToken},
	}
	for _, tt := range tests { // one harness, so no t.Run: its helpers report on this test's t
		target := "good.test:" + up.port()
		want := http.StatusProxyAuthRequired
		if tt.ok {
			want = http.StatusOK
		}
		resp, _, _ := h.connect(target, tt.auth)
		if resp.StatusCode != want {
			t.Errorf("%s: CONNECT: %d, want %d", tt.name, resp.StatusCode, want)
		}
		resp, _ = h.get(target, tt.auth)
		if resp.StatusCode != want {
			t.Errorf("%s: forward: %d, want %d", tt.name, resp.StatusCode, want)
		}
		if !tt.ok && len(resp.Header.Values("Proxy-Authenticate")) != 2 {
			t.Errorf("%s: 407 with Proxy-Authenticate %q, want a Bearer and a Basic challenge", tt.name, resp.Header.Values("Proxy-Authenticate"))
		}
	}
	if b := h.reported(); len(b) != 0 {
		t.Errorf("blocks %+v, want none for authentication failures", b)
	}
}

// TestBadRequests: requests without a usable target get 400.
func TestBadRequests(t *testing.T) {
	rec := newRecorder(t, nil)
	h := newHarness(t, Policy{Mode: ModeOpen}, rec)
	auth := "Proxy-Authorization: " + bearer() + "\r\n"
	tests := []struct {
		name string
		req  string
	}{
		{name: "origin form", req: "GET /path HTTP/1.1\r\nHost: good.test\r\n" + auth + "\r\n"},
		{name: "https in absolute form", req: "GET https://good.test/ HTTP/1.1\r\nHost: good.test\r\n" + auth + "\r\n"},
		{name: "CONNECT without a port", req: "CONNECT good.test HTTP/1.1\r\nHost: good.test\r\n" + auth + "\r\n"},
		{name: "CONNECT with a bad port", req: "CONNECT good.test:99999 HTTP/1.1\r\nHost: good.test\r\n" + auth + "\r\n"},
	}
	for _, tt := range tests {
		if resp, _ := h.raw(tt.req); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: got %d, want 400", tt.name, resp.StatusCode)
		}
	}
	if d := rec.dialed(); len(d) != 0 {
		t.Errorf("dialed %v", d)
	}
}

// TestRebinding: the name answers a test "public" address first and the metadata address after. The proxy
// resolves once per request and dials exactly what it checked, so the first request reaches the test server
// and the second is refused; the metadata address is never dialed.
func TestRebinding(t *testing.T) {
	up := newEcho(t, false)
	for _, via := range []string{"connect", "forward"} {
		t.Run(via, func(t *testing.T) {
			rec := newRecorder(t, nil)
			rec.set("rebind.test", "192.88.99.10")
			rec.set("rebind.test", "169.254.169.254")
			h := newHarness(t, Policy{Mode: ModeAllowlist, Rules: rules(t, "rebind.test")}, rec)
			target := "rebind.test:" + up.port()
			var status int
			if via == "connect" {
				resp, c, br := h.connect(target, bearer())
				status = resp.StatusCode
				if status == http.StatusOK {
					if got := tunnelGet(t, c, br, target); got != "hello "+target+" /t" {
						t.Errorf("through the tunnel: %q", got)
					}
				}
			} else {
				resp, _ := h.get(target, bearer())
				status = resp.StatusCode
			}
			if status != http.StatusOK {
				t.Fatalf("first request: %d", status)
			}
			if n := rec.lookupCount("rebind.test"); n != 1 {
				t.Errorf("%d lookups for one request, want 1", n)
			}
			if d := rec.dialed(); len(d) != 1 || d[0] != "192.88.99.10:"+up.port() {
				t.Errorf("dialed %v, want the checked address once", d)
			}
			resp, _, _ := h.connect(target, bearer())
			if resp.StatusCode != http.StatusForbidden || resp.Header.Get(DeniedHeader) != ClassMetadata {
				t.Errorf("second request: %d %q, want 403 metadata", resp.StatusCode, resp.Header.Get(DeniedHeader))
			}
			if n := rec.lookupCount("rebind.test"); n != 2 {
				t.Errorf("%d lookups for two requests, want 2", n)
			}
		})
	}
}

// TestConnectToSelf: the proxy's own listener is refused even when a rule allows its address.
func TestConnectToSelf(t *testing.T) {
	rec := newRecorder(t, map[string][]string{"me.test": {"127.0.0.1"}})
	h := newHarness(t, Policy{Mode: ModeAllowlist, Rules: rules(t, "me.test", "127.0.0.0/8")}, rec)
	port := netip.MustParseAddrPort(h.addr).Port()
	for _, target := range []string{h.addr, "me.test:" + strconv.Itoa(int(port)), "2130706433:" + strconv.Itoa(int(port))} {
		resp, _, _ := h.connect(target, bearer())
		if resp.StatusCode != http.StatusForbidden || resp.Header.Get(DeniedHeader) != ReasonProxyLoop {
			t.Errorf("CONNECT %s: %d %q, want 403 %s", target, resp.StatusCode, resp.Header.Get(DeniedHeader), ReasonProxyLoop)
		}
		resp, _ = h.get(target, bearer())
		if resp.StatusCode != http.StatusForbidden || resp.Header.Get(DeniedHeader) != ReasonProxyLoop {
			t.Errorf("GET %s: %d %q, want 403 %s", target, resp.StatusCode, resp.Header.Get(DeniedHeader), ReasonProxyLoop)
		}
	}
	if d := rec.dialed(); len(d) != 0 {
		t.Errorf("dialed %v", d)
	}
}

// TestSilent: a host on the silent list is refused, with no event and no lookup, even in open mode.
func TestSilent(t *testing.T) {
	rec := newRecorder(t, map[string][]string{"telemetry.example.test": {"192.88.99.10"}})
	h := newHarness(t, Policy{Mode: ModeOpen, Silent: []string{"**.example.test"}}, rec)
	for _, target := range []string{"telemetry.example.test:443", "TELEMETRY.example.test.:443"} {
		resp, _, _ := h.connect(target, bearer())
		if resp.StatusCode != http.StatusForbidden || resp.Header.Get(DeniedHeader) != ReasonSilent {
			t.Errorf("CONNECT %s: %d %q", target, resp.StatusCode, resp.Header.Get(DeniedHeader))
		}
	}
	if b := h.reported(); len(b) != 0 {
		t.Errorf("blocks %+v, want none", b)
	}
	if n := rec.lookupCount("telemetry.example.test"); n != 0 {
		t.Errorf("%d lookups, want none", n)
	}
}

// TestUpstreamDown: an allowed target that refuses connections, or a name that does not resolve, is a 502
// and not a policy refusal.
func TestUpstreamDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(int(netip.MustParseAddrPort(l.Addr().String()).Port()))
	_ = l.Close()
	rec := newRecorder(t, map[string][]string{"down.test": {"127.0.0.1"}})
	h := newHarness(t, Policy{Mode: ModeAllowlist, Rules: rules(t, "down.test", "nxdomain.test", "127.0.0.1/32")}, rec)
	for _, target := range []string{"down.test:" + port, "nxdomain.test:" + port} {
		resp, _, _ := h.connect(target, bearer())
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("CONNECT %s: %d, want 502", target, resp.StatusCode)
		}
		resp, _ = h.get(target, bearer())
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("GET %s: %d, want 502", target, resp.StatusCode)
		}
	}
	if b := h.reported(); len(b) != 0 {
		t.Errorf("blocks %+v, want none", b)
	}
}

// rawUpstream is a TCP server for tunnel tests: each connection is handed to serve.
func rawUpstream(t *testing.T, serve func(net.Conn)) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return strconv.Itoa(int(netip.MustParseAddrPort(l.Addr().String()).Port()))
}

// TestTunnelEnds: a tunnel carries pipelined bytes, and when one end closes the other end sees EOF.
func TestTunnelEnds(t *testing.T) {
	upstreamSaw := make(chan string, 1)
	port := rawUpstream(t, func(c net.Conn) {
		b := make([]byte, 5)
		_, _ = io.ReadFull(c, b)
		_, _ = io.WriteString(c, "got "+string(b))
		_, err := c.Read(b) // the client closes: EOF here
		upstreamSaw <- fmt.Sprint(err)
	})
	rec := newRecorder(t, map[string][]string{"raw.test": {"192.88.99.10"}})
	h := newHarness(t, Policy{Mode: ModeOpen}, rec)

	// The client sends its first bytes in the same write as the CONNECT request.
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "CONNECT raw.test:"+port+" HTTP/1.1\r\nProxy-Authorization: "+bearer()+"\r\n\r\nhello"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	b := make([]byte, 9)
	if _, err := io.ReadFull(br, b); err != nil || string(b) != "got hello" {
		t.Fatalf("read %q, %v", b, err)
	}
	_ = c.Close()
	select {
	case got := <-upstreamSaw:
		if got != io.EOF.Error() {
			t.Errorf("upstream read after the client closed: %s, want EOF", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("upstream not closed after the client closed")
	}

	// And the other way: the upstream closes, the client sees EOF.
	port2 := rawUpstream(t, func(c net.Conn) { _, _ = io.WriteString(c, "bye") })
	resp, c2, br2 := h.connect("raw.test:"+port2, bearer())
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %d", resp.StatusCode)
	}
	all, err := io.ReadAll(br2)
	if err != nil || string(all) != "bye" {
		t.Errorf("client read %q, %v; want bye then EOF", all, err)
	}
	_ = c2.Close()
}

// TestTunnelIdle: a tunnel where nothing moves is closed after the idle timeout; one where bytes move one
// way only stays open.
func TestTunnelIdle(t *testing.T) {
	port := rawUpstream(t, func(c net.Conn) {
		b := make([]byte, 1)
		for {
			if _, err := c.Read(b); err != nil {
				return
			}
			if b[0] == 's' { // stream: one byte every 20ms for 600ms, the client silent meanwhile
				for range 30 {
					time.Sleep(20 * time.Millisecond)
					if _, err := c.Write([]byte{'.'}); err != nil {
						return
					}
				}
				_, _ = c.Write([]byte{'!'})
			}
		}
	})
	rec := newRecorder(t, map[string][]string{"raw.test": {"192.88.99.10"}})
	p, err := New(Config{Policy: Policy{Mode: ModeOpen}, Token: testToken, Resolver: rec, Dial: rec.Dial})
	if err != nil {
		t.Fatal(err)
	}
	p.tunnelIdle = 250 * time.Millisecond
	h := &harness{t: t, rec: rec}
	h.start(p)

	resp, c, br := h.connect("raw.test:"+port, bearer())
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %d", resp.StatusCode)
	}
	if _, err := c.Write([]byte{'s'}); err != nil {
		t.Fatal(err)
	}
	got, err := br.ReadString('!')
	if err != nil || len(got) != 31 {
		t.Fatalf("one-way stream: read %q, %v", got, err)
	}
	start := time.Now()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle tunnel: read %v, want EOF", err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("idle tunnel closed after %v, before its timeout", d)
	}
}

// TestCloseEndsTunnels: Close ends open tunnels and in-flight requests and waits for them.
func TestCloseEndsTunnels(t *testing.T) {
	port := rawUpstream(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	rec := newRecorder(t, map[string][]string{"raw.test": {"192.88.99.10"}})
	h := newHarness(t, Policy{Mode: ModeOpen}, rec)
	var conns []*bufio.Reader
	for range 3 {
		resp, _, br := h.connect("raw.test:"+port, bearer())
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("CONNECT: %d", resp.StatusCode)
		}
		conns = append(conns, br)
	}
	if err := h.p.Close(); err != nil {
		t.Fatal(err)
	}
	for _, br := range conns {
		if _, err := br.ReadByte(); err == nil {
			t.Error("tunnel still open after Close")
		}
	}
	if err := h.p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestHeaderLimit: a request header block over the bound is refused by the server, not read whole.
func TestHeaderLimit(t *testing.T) {
	rec := newRecorder(t, nil)
	h := newHarness(t, Policy{Mode: ModeOpen}, rec)
	big := strings.Repeat("x", maxHeaderBytes+8192)
	resp, _ := h.raw("GET http://good.test/ HTTP/1.1\r\nHost: good.test\r\nX-Big: " + big + "\r\n\r\n")
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("got %d, want 431", resp.StatusCode)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{name: "no token", cfg: Config{Policy: Policy{Mode: ModeOpen}}},
		{name: "unknown mode", cfg: Config{Policy: Policy{Mode: "allow"}, Token: "t"}},
		{name: "bad silent rule", cfg: Config{Policy: Policy{Mode: ModeOpen, Silent: []string{"a..b"}}, Token: "t"}},
		{name: "negated silent rule", cfg: Config{Policy: Policy{Mode: ModeOpen, Silent: []string{"!x.test"}}, Token: "t"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if p, err := New(tt.cfg); err == nil {
				_ = p.Close()
				t.Error("New accepted it")
			}
		})
	}
}

func TestClassify(t *testing.T) {
	self := []netip.Addr{netip.MustParseAddr("198.51.100.7")}
	tests := []struct {
		addr string
		want string
	}{
		{"8.8.8.8", ""},
		{"192.88.99.10", ""},
		{"2001:db8::1", ClassDocumentation}, // was let through before issue 12
		{"2606:4700::1111", ""},
		{"64:ff9b::808:808", ""}, // NAT64 of a public address
		{"2002:808:808::1", ""},  // 6to4 of a public address
		{"0.0.0.0", ClassUnspecified},
		{"0.1.2.3", ClassUnspecified},
		{"::", ClassUnspecified},
		{"127.0.0.1", ClassLoopback},
		{"127.255.255.254", ClassLoopback},
		{"::1", ClassLoopback},
		{"::ffff:127.0.0.1", ClassLoopback},
		{"10.1.2.3", ClassPrivate},
		{"172.16.0.1", ClassPrivate},
		{"172.31.255.255", ClassPrivate},
		{"172.32.0.1", ""},
		{"192.168.1.1", ClassPrivate},
		{"fc00::1", ClassPrivate},
		{"fdff::1", ClassPrivate},
		{"fec0::1", ClassPrivate},
		{"64:ff9b:1::1", ClassPrivate},
		{"100.64.0.1", ClassCGNAT},
		{"100.127.255.255", ClassCGNAT},
		{"100.128.0.1", ""},
		{"169.254.1.1", ClassLinkLocal},
		{"fe80::1", ClassLinkLocal},
		{"fe80::1%eth0", ClassLinkLocal},
		{"169.254.169.254", ClassMetadata},
		{"::ffff:169.254.169.254", ClassMetadata},
		{"64:ff9b::a9fe:a9fe", ClassMetadata},
		{"::ffff:0:a9fe:a9fe", ClassMetadata}, // IPv4-translated
		{"::a9fe:a9fe", ClassMetadata},        // IPv4-compatible
		{"::808:808", ClassReserved},          // IPv4-compatible, public: still not routed
		{"2002:a9fe:a9fe::1", ClassMetadata},
		{"2001:0:a9fe:a9fe::1", ClassMetadata},         // Teredo server
		{"2001:0:808:808:0:0:f5ff:fffe", ClassPrivate}, // Teredo client 10.0.0.1, inverted
		{"fd00:ec2::254", ClassMetadata},
		{"224.0.0.1", ClassMulticast},
		{"239.255.255.250", ClassMulticast},
		{"ff02::1", ClassMulticast},
		{"240.0.0.1", ClassReserved},
		{"255.255.255.255", ClassReserved},
		{"198.51.100.7", ClassSelf},
		{"::ffff:198.51.100.7", ClassSelf},
		{"64:ff9b::c633:6407", ClassSelf},
		// Unclassified before issue 12: not private, but no public host either.
		{"192.0.0.1", ClassProtocol},
		{"192.0.0.192", ClassProtocol},
		{"192.0.2.1", ClassDocumentation},
		{"198.51.100.8", ClassDocumentation},
		{"203.0.113.10", ClassDocumentation},
		{"198.18.0.1", ClassBenchmarking},
		{"198.19.255.255", ClassBenchmarking},
		{"198.20.0.1", ""},
		{"2001:db8:ffff::1", ClassDocumentation},
		{"2001:2::1", ClassBenchmarking},
		{"100::1", ClassProtocol},
		{"2001:10::1", ClassProtocol},
		{"2001:1f::1", ClassProtocol},
		{"2001:20::1", ClassProtocol},
		{"2001:2f:ffff::1", ClassProtocol},
		{"2001:30::1", ""},
		{"168.63.129.16", ClassMetadata},
		{"100.100.100.200", ClassMetadata},
		{"::ffff:168.63.129.16", ClassMetadata},
		{"64:ff9b::c000:201", ClassDocumentation}, // NAT64 of 192.0.2.1
	}
	for _, tt := range tests {
		if got := classify(netip.MustParseAddr(tt.addr), self); got != tt.want {
			t.Errorf("classify(%s) = %q, want %q", tt.addr, got, tt.want)
		}
	}
	if got := classify(netip.Addr{}, nil); got != ClassInvalid {
		t.Errorf("classify(zero) = %q", got)
	}
}

// TestDecideUnlock: only an IP or CIDR rule unlocks a refused address class, and only the addresses it
// covers; decide returns exactly the checked addresses.
func TestDecideUnlock(t *testing.T) {
	rec := newRecorder(t, map[string][]string{
		"corp.test":  {"10.1.2.3"},
		"mixed.test": {"10.1.2.3", "10.2.0.1"},
		"meta.test":  {"169.254.169.254"},
	})
	tests := []struct {
		name   string
		rules  []string
		host   string
		port   uint16
		reason string // "" allowed
		addrs  []string
	}{
		{name: "name rule only", rules: []string{"corp.test"}, host: "corp.test", port: 80, reason: ClassPrivate},
		{name: "CIDR", rules: []string{"corp.test", "10.1.0.0/16"}, host: "corp.test", port: 80, addrs: []string{"10.1.2.3:80"}},
		{name: "CIDR with another port", rules: []string{"corp.test", "10.1.0.0/16:443"}, host: "corp.test", port: 80, reason: ClassPrivate},
		{name: "CIDR covers one of two", rules: []string{"mixed.test", "10.1.0.0/16"}, host: "mixed.test", port: 80, reason: ClassPrivate},
		{name: "negated after", rules: []string{"corp.test", "10.0.0.0/8", "!10.1.2.3"}, host: "corp.test", port: 80, reason: ReasonRule},
		{name: "metadata named", rules: []string{"169.254.169.254"}, host: "169.254.169.254", port: 80, addrs: []string{"169.254.169.254:80"}},
		{name: "metadata by name, IP named", rules: []string{"meta.test", "169.254.169.254/32"}, host: "meta.test", port: 80, addrs: []string{"169.254.169.254:80"}},
		{name: "** with a mapped literal", rules: []string{"**"}, host: "[::ffff:a9fe:a9fe]", port: 80, reason: ClassMetadata},
		{name: "documentation range named", rules: []string{"192.0.2.0/24"}, host: "192.0.2.1", port: 80, addrs: []string{"192.0.2.1:80"}},
		{name: "provider endpoint named", rules: []string{"168.63.129.16"}, host: "168.63.129.16", port: 80, addrs: []string{"168.63.129.16:80"}},
		{name: "** does not unlock a documentation range", rules: []string{"**"}, host: "203.0.113.5", port: 443, reason: ClassDocumentation},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Config{Policy: Policy{Mode: ModeAllowlist, Rules: rules(t, tt.rules...)}, Token: testToken, Resolver: rec, Dial: rec.Dial})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			host, _, _ := SplitHostPort(tt.host)
			v := p.decide(context.Background(), host, tt.port)
			if v.block.Reason != tt.reason {
				t.Fatalf("reason %q, want %q", v.block.Reason, tt.reason)
			}
			var got []string
			for _, a := range v.addrs {
				got = append(got, a.String())
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.addrs) {
				t.Errorf("addrs %v, want %v", got, tt.addrs)
			}
		})
	}
}

// oracleRefused is an independent statement of the address classes, written as ranges: an IPv4 address
// (or one embedded in IPv6 by mapping, NAT64, IPv4-translation or -compatibility, 6to4 or Teredo) in one of
// these, or an IPv6 address in one of those, must never be dialed without an IP or CIDR rule naming it.
func oracleRefused(a netip.Addr, self []netip.Addr) bool {
	v4 := []string{"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
		"192.168.0.0/16", "224.0.0.0/3"}
	v6 := []string{"::/127", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8", "64:ff9b:1::/48"}
	a = a.WithZone("")
	for _, s := range self {
		if s == a.Unmap() {
			return true
		}
	}
	in := func(list []string, x netip.Addr) bool {
		for _, p := range list {
			if netip.MustParsePrefix(p).Contains(x) {
				return true
			}
		}
		return false
	}
	if a.Is4In6() || a.Is4() {
		x := a.Unmap()
		return in(v4, x) || slicesContains(self, x)
	}
	if in(v6, a) {
		return true
	}
	b := a.As16()
	var embedded []netip.Addr
	switch {
	case netip.MustParsePrefix("64:ff9b::/96").Contains(a), netip.MustParsePrefix("::ffff:0:0:0/96").Contains(a), netip.MustParsePrefix("::/96").Contains(a):
		embedded = append(embedded, netip.AddrFrom4([4]byte(b[12:16])))
	case b[0] == 0x20 && b[1] == 0x02:
		embedded = append(embedded, netip.AddrFrom4([4]byte(b[2:6])))
	case b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0:
		embedded = append(embedded, netip.AddrFrom4([4]byte(b[4:8])), netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]}))
	}
	for _, e := range embedded {
		if in(v4, e) || slicesContains(self, e) {
			return true
		}
	}
	return false
}

func slicesContains(s []netip.Addr, a netip.Addr) bool {
	for _, x := range s {
		if x == a {
			return true
		}
	}
	return false
}

// fuzzAnswers are what the fuzz resolver answers, chosen by the pick argument.
var fuzzAnswers = [][]string{
	{"192.88.99.10"},
	{"10.0.0.1"},
	{"169.254.169.254"},
	{"::ffff:169.254.169.254"},
	{"64:ff9b::a9fe:a9fe"},
	{"192.88.99.10", "127.0.0.1"},
	{"2002:a9fe:a9fe::1"},
	{"10.1.2.3"},
	{"fd00:ec2::254"},
	{"2001:db8::1", "fe80::1%eth0"},
	{"198.51.100.7"},
	{"2001:0:a9fe:a9fe::1"},
	{"::a00:1"},
	{"100.100.100.200"},
	{"127.0.0.1"},
	{},
}

// fuzzResolver answers every name with fuzzAnswers[pick].
type fuzzResolver struct{ answer []netip.Addr }

func (r fuzzResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	if len(r.answer) == 0 {
		return nil, errors.New("no answer")
	}
	return r.answer, nil
}

// FuzzDecide: decide never panics, and every address it allows is either outside the refused classes (by an
// independent oracle) or named by an IP or CIDR rule that allows it; an allowed verdict always has an address.
func FuzzDecide(f *testing.F) {
	for _, s := range []string{
		"169.254.169.254", "2852039166", "0xa9.0xfe.0xa9.0xfe", "[::ffff:a9fe:a9fe]", "::ffff:a9fe:a9fe", "127.1",
		"0177.0.0.1", "10.1.2.3", "good.test", "deny.test", "corp.test", "[64:ff9b::a9fe:a9fe]", "0", "0x0", "[::]",
		"Bücher.test", "a..b", "", "[fe80::1%25eth0]", "198.51.100.7", "::1",
	} {
		for _, pick := range []uint8{0, 1, 2, 5, 9} {
			f.Add(s, uint16(80), pick)
		}
	}
	self := []netip.Addr{netip.MustParseAddr("198.51.100.7")}
	ruleSets := [][]string{
		{"**"},
		{"**", "!deny.test", "10.1.0.0/16", "127.0.0.1:8080", "[::ffff:0:0/96]:443"},
		{"corp.test", "10.0.0.0/8", "!10.0.0.1"},
	}
	f.Fuzz(func(t *testing.T, host string, port uint16, pick uint8) {
		answer := fuzzAnswers[int(pick)%len(fuzzAnswers)]
		var addrs []netip.Addr
		for _, a := range answer {
			addrs = append(addrs, netip.MustParseAddr(a))
		}
		rs := rules(t, ruleSets[int(pick>>4)%len(ruleSets)]...)
		p, err := New(Config{
			Policy: Policy{Mode: ModeOpen, Rules: rs}, Token: testToken, Self: self,
			Resolver: fuzzResolver{addrs},
			Dial: func(context.Context, string, string) (net.Conn, error) {
				t.Error("decide dialed")
				return nil, errors.New("no")
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		p.listeners = []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:3128")}
		v := p.decide(context.Background(), host, port)
		if v.status != 0 {
			if v.addrs != nil {
				t.Fatalf("refused with addresses %v", v.addrs)
			}
			return
		}
		if len(v.addrs) == 0 {
			t.Fatalf("allowed %q with no address", host)
		}
		var ipRules []Rule
		for _, r := range rs {
			if r.IP.IsValid() || r.Prefix.IsValid() {
				ipRules = append(ipRules, r)
			}
		}
		for _, ap := range v.addrs {
			if ap.Port() != port {
				t.Fatalf("allowed %v for port %d", ap, port)
			}
			if ap == netip.MustParseAddrPort("127.0.0.1:3128") {
				t.Fatalf("allowed the proxy's own listener")
			}
			if !oracleRefused(ap.Addr(), self) {
				continue
			}
			if r, ok := MatchAddr(ipRules, ap.Addr(), port); r == nil || !ok {
				t.Fatalf("allowed %q -> %v, a refused address no IP rule names", host, ap)
			}
		}
	})
}

// TestUnclassifiedRefused: every range issue 12 found let through, and a range the operator adds, is refused like
// a private one, by address or by a name that resolves there, before anything is dialed: the recorder's Dial
// fails the test for any of these addresses, and no dial is recorded.
func TestUnclassifiedRefused(t *testing.T) {
	targets := map[string]string{
		"192.0.0.9": ClassProtocol, "192.0.2.1": ClassDocumentation, "198.51.100.1": ClassDocumentation,
		"203.0.113.1": ClassDocumentation, "198.18.0.1": ClassBenchmarking, "168.63.129.16": ClassMetadata,
		"[2001:db8::1]": ClassDocumentation, "[100::1]": ClassProtocol, "[2001:10::1]": ClassProtocol,
		"[2001:20::1]": ClassProtocol, "192.88.99.77": ClassOperator,
	}
	answers := map[string][]string{}
	for addr := range targets {
		answers["n"+strings.Trim(strings.NewReplacer(".", "-", ":", "-").Replace(addr), "[]")+".test"] = []string{strings.Trim(addr, "[]")}
	}
	rec := newRecorder(t, answers)
	h := &harness{t: t, rec: rec}
	p, err := New(Config{
		Policy: Policy{Mode: ModeOpen}, Token: testToken, Resolver: rec, Dial: rec.Dial,
		Refused: []netip.Prefix{netip.MustParsePrefix("192.88.99.64/26")}, // the operator's own NAT range, say
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
	for addr, class := range targets {
		name := "n" + strings.Trim(strings.NewReplacer(".", "-", ":", "-").Replace(addr), "[]") + ".test"
		for _, target := range []string{addr, name} {
			resp, _, _ := h.connect(target+":443", bearer())
			if resp.StatusCode != http.StatusForbidden || resp.Header.Get(DeniedHeader) != class {
				t.Errorf("CONNECT %s: %d %q, want 403 %s", target, resp.StatusCode, resp.Header.Get(DeniedHeader), class)
			}
			resp, _ = h.get(target+":80", bearer())
			if resp.StatusCode != http.StatusForbidden || resp.Header.Get(DeniedHeader) != class {
				t.Errorf("GET %s: %d %q, want 403 %s", target, resp.StatusCode, resp.Header.Get(DeniedHeader), class)
			}
		}
	}
	if d := rec.dialed(); len(d) != 0 {
		t.Errorf("dialed %v", d)
	}
	// The operator's range does not swallow the rest of the test internet.
	if v := p.decide(context.Background(), "192.88.99.10", 443); v.status == http.StatusForbidden {
		t.Errorf("192.88.99.10 refused %q: the operator's range is 192.88.99.64/26 only", v.block.Reason)
	}
}
